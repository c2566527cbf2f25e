/* olmoc tokenize: the command line of the tokenize pipeline (src/data/tokenize_pipeline.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"
#include "data/tokenize_pipeline.h"
#include "util/error.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: olmoc tokenize --tokenizer TOKENIZER.json -o OUT.npy [options] INPUT...\n\n"
            "Tokenizes documents into an OLMo token file: each document's token ids followed\n"
            "by the EOS token, all concatenated.  Multithreaded and streaming (constant memory);\n"
            "the output is the same for any thread count.\n\n"
            "input:\n"
            "  INPUT...             files, read in order ('-' = standard input); gzip-compressed\n"
            "                       files (.gz) are decompressed on the fly (offsets in errors are\n"
            "                       then offsets in the decompressed text)\n"
            "  --format FMT         jsonl (default for *.jsonl / *.json[.gz]) or text (otherwise)\n"
            "  --text-key KEY       JSONL: the field holding the document (default: text)\n"
            "  --no-strip           JSONL: keep leading/trailing whitespace (default: strip it\n"
            "                       and skip documents left empty, as dolma does; counted)\n"
            "  --skip-bad-lines     JSONL: skip malformed lines and lines without the text field\n"
            "                       (counted) instead of stopping with an error\n"
            "  --docs UNIT          text: what one document is: file (default), paragraph\n"
            "                       (separated by blank lines) or line; empty documents are\n"
            "                       skipped and counted\n"
            "output:\n"
            "  -o, --output FILE    the token file to write (via FILE.tmp, renamed when complete)\n"
            "  --raw                write a headerless array (OLMo / dolma memmap) instead of .npy\n"
            "  --dtype T            uint16 or uint32 (default: uint16 when the vocabulary fits)\n"
            "  --eos TOKEN|ID       appended after every document (default: <|endoftext|>)\n"
            "  --bos TOKEN|ID       also put this token before every document (default: none)\n"
            "  --parse-special      match special tokens written in the text (default: encode them\n"
            "                       as plain text, like dolma's --tokenizer.encode_special_tokens)\n"
            "  --threads N          tokenizer threads (default: number of CPUs)\n"
            "  --quiet              no progress line\n"
            "  --help               show this help\n\n"
            "Invalid UTF-8 is replaced by U+FFFD (counted).  The progress line on stderr shows\n"
            "MB read, MB/s, documents and tokens.\n");
}

static int parse_args(struct olmo_tokenize_options *o, int argc, char **argv) {
    memset(o, 0, sizeof *o);
    o->text_key = "text";
    o->strip = true;
    o->eos = "<|endoftext|>";
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    o->threads = ncpu > 0 ? (int)ncpu : 1;
    o->inputs = calloc((size_t)argc, sizeof(char *));
    if (!o->inputs) return olmo_error("out of memory");
    bool fmt_given = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEED_VALUE \
    if (!v) return olmo_error("%s needs a value", a); \
    i++
        if (!strcmp(a, "--tokenizer")) { NEED_VALUE; o->tokenizer = v; }
        else if (!strcmp(a, "-o") || !strcmp(a, "--output")) { NEED_VALUE; o->output = v; }
        else if (!strcmp(a, "--text-key")) { NEED_VALUE; o->text_key = v; }
        else if (!strcmp(a, "--eos")) { NEED_VALUE; o->eos = v; }
        else if (!strcmp(a, "--bos")) { NEED_VALUE; o->bos = v; }
        else if (!strcmp(a, "--format")) {
            NEED_VALUE;
            fmt_given = true;
            if (!strcmp(v, "jsonl")) o->format = OLMO_FMT_JSONL;
            else if (!strcmp(v, "text")) o->format = OLMO_FMT_TEXT;
            else return olmo_error("--format must be jsonl or text, got '%s'", v);
        } else if (!strcmp(a, "--docs")) {
            NEED_VALUE;
            if (!strcmp(v, "file")) o->docs = OLMO_DOCS_FILE;
            else if (!strcmp(v, "paragraph")) o->docs = OLMO_DOCS_PARAGRAPH;
            else if (!strcmp(v, "line")) o->docs = OLMO_DOCS_LINE;
            else return olmo_error("--docs must be file, paragraph or line, got '%s'", v);
        } else if (!strcmp(a, "--dtype")) {
            NEED_VALUE;
            if (!strcmp(v, "uint16")) o->elem_size = 2;
            else if (!strcmp(v, "uint32")) o->elem_size = 4;
            else if (!strcmp(v, "auto")) o->elem_size = 0;
            else return olmo_error("--dtype must be uint16, uint32 or auto, got '%s'", v);
        } else if (!strcmp(a, "--threads")) {
            NEED_VALUE;
            char *end;
            long t = strtol(v, &end, 10);
            if (*end || t < 1 || t > 1024) return olmo_error("--threads must be 1..1024, got '%s'", v);
            o->threads = (int)t;
        } else if (!strcmp(a, "--no-strip")) o->strip = false;
        else if (!strcmp(a, "--skip-bad-lines")) o->skip_bad = true;
        else if (!strcmp(a, "--raw")) o->raw = true;
        else if (!strcmp(a, "--parse-special")) o->parse_special = true;
        else if (!strcmp(a, "--quiet")) o->quiet = true;
        else if (a[0] == '-' && a[1]) return olmo_error("unknown option '%s' (see olmoc tokenize --help)", a);
        else o->inputs[o->n_inputs++] = a;
#undef NEED_VALUE
    }
    if (!o->tokenizer) return olmo_error("--tokenizer TOKENIZER.json is required");
    if (!o->output) return olmo_error("-o OUTPUT is required");
    if (!o->n_inputs) return olmo_error("no input files");
    if (!fmt_given) {
        const char *f = o->inputs[0];
        size_t n = strlen(f);
        if (n >= 3 && !strcmp(f + n - 3, ".gz")) n -= 3;
        bool j = (n >= 6 && !strncmp(f + n - 6, ".jsonl", 6)) || (n >= 5 && !strncmp(f + n - 5, ".json", 5));
        o->format = j ? OLMO_FMT_JSONL : OLMO_FMT_TEXT;
    }
    return 0;
}

int cmd_tokenize(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
    struct olmo_tokenize_options o;
    if (parse_args(&o, argc, argv)) {
        fprintf(stderr, "olmoc tokenize: %s\n", olmo_last_error());
        usage(stderr);
        free(o.inputs);
        return 2;
    }
    int rc = olmo_tokenize(&o);
    if (rc) fprintf(stderr, "olmoc tokenize: %s\n", olmo_last_error());
    free(o.inputs);
    return rc ? 1 : 0;
}
