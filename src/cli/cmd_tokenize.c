/* olmoc tokenize: the command line of the tokenize pipeline (src/data/tokenize_pipeline.c). */
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "data/tokenize_pipeline.h"
#include "util/error.h"

struct tokenize_args {
    struct olmo_tokenize_options o;
    int format, docs, dtype; /* indices into the choices below; format -1: from the first input's name */
    bool no_strip;
    double max_line; /* --max-line-bytes; -1: not given (the default) */
    struct olmo_cli_list inputs;
};

static const char *const formats[] = {"jsonl", "text", NULL};
static const enum olmo_input_format format_values[] = {OLMO_FMT_JSONL, OLMO_FMT_TEXT};
static const char *const doc_units[] = {"file", "paragraph", "line", NULL};
static const enum olmo_doc_unit doc_unit_values[] = {OLMO_DOCS_FILE, OLMO_DOCS_PARAGRAPH, OLMO_DOCS_LINE};
static const char *const dtypes[] = {"uint16", "uint32", "auto", NULL};
static const int dtype_sizes[] = {2, 4, 0};

#define ARG(field) offsetof(struct tokenize_args, field)
static const struct olmo_cli_option tokenize_options[] = {
    {.kind = OLMO_CLI_SECTION, .help = "input:"},
    {.kind = OLMO_CLI_STRING, .name = "--tokenizer", .offset = ARG(o.tokenizer), .metavar = "TOKENIZER.json",
     .help = "the tokenizer (required)"},
    {.kind = OLMO_CLI_ARGS, .name = "INPUT...", .offset = ARG(inputs),
     .help = "files, read in order ('-' = standard input); gzip-compressed\n"
             "files (.gz) are decompressed on the fly (offsets in errors are\n"
             "then offsets in the decompressed text)"},
    {.kind = OLMO_CLI_CHOICE, .name = "--format", .offset = ARG(format), .metavar = "FMT", .choices = formats,
     .help = "jsonl (default for *.jsonl / *.json[.gz]) or text (otherwise)"},
    {.kind = OLMO_CLI_STRING, .name = "--text-key", .offset = ARG(o.text_key), .metavar = "KEY",
     .help = "JSONL: the field holding the document (default: text)"},
    {.kind = OLMO_CLI_FLAG, .name = "--no-strip", .offset = ARG(no_strip),
     .help = "JSONL: keep leading/trailing whitespace (default: strip it\n"
             "and skip documents left empty, as dolma does; counted)"},
    {.kind = OLMO_CLI_FLAG, .name = "--skip-bad-lines", .offset = ARG(o.skip_bad),
     .help = "JSONL: skip malformed lines and lines without the text field\n"
             "(counted) instead of stopping with an error"},
    {.kind = OLMO_CLI_SIZE, .name = "--max-line-bytes", .offset = ARG(max_line), .metavar = "SIZE",
     .help = "JSONL: the longest line accepted, as 64MiB (the default) or\n"
             "200MB; a longer line stops the run with an error naming the\n"
             "file and line (a line is held whole: it costs about ten\n"
             "times its size in memory)"},
    {.kind = OLMO_CLI_CHOICE, .name = "--docs", .offset = ARG(docs), .metavar = "UNIT", .choices = doc_units,
     .help = "text: what one document is: file (default), paragraph\n"
             "(separated by blank lines) or line; empty documents are\n"
             "skipped and counted"},
    {.kind = OLMO_CLI_SECTION, .help = "output:"},
    {.kind = OLMO_CLI_STRING, .name = "--output", .alias = "-o", .offset = ARG(o.output), .metavar = "FILE",
     .help = "the token file to write (via FILE.tmp, renamed when complete;\n"
             "an existing FILE that is not a regular file, such as a device\n"
             "or a FIFO, is refused)"},
    {.kind = OLMO_CLI_FLAG, .name = "--raw", .offset = ARG(o.raw),
     .help = "write a headerless array (OLMo / dolma memmap) instead of .npy"},
    {.kind = OLMO_CLI_CHOICE, .name = "--dtype", .offset = ARG(dtype), .metavar = "T", .choices = dtypes,
     .help = "uint16 or uint32 (default: uint16 when the vocabulary fits)"},
    {.kind = OLMO_CLI_STRING, .name = "--eos", .offset = ARG(o.eos), .metavar = "TOKEN|ID",
     .help = "appended after every document (default: <|endoftext|>)"},
    {.kind = OLMO_CLI_STRING, .name = "--bos", .offset = ARG(o.bos), .metavar = "TOKEN|ID",
     .help = "also put this token before every document (default: none)"},
    {.kind = OLMO_CLI_FLAG, .name = "--parse-special", .offset = ARG(o.parse_special),
     .help = "match special tokens written in the text (default: encode them\n"
             "as plain text, like dolma's --tokenizer.encode_special_tokens)"},
    {.kind = OLMO_CLI_INT, .name = "--threads", .offset = ARG(o.threads), .metavar = "N", .min = 1, .max = 1024,
     .help = "tokenizer threads (default: number of CPUs)"},
    {.kind = OLMO_CLI_FLAG, .name = "--quiet", .offset = ARG(o.quiet), .help = "no progress line"},
    {.kind = OLMO_CLI_END},
};
#undef ARG

static const struct olmo_cli_command tokenize_command = {
    "tokenize",
    "olmoc tokenize --tokenizer TOKENIZER.json -o OUT.npy [options] INPUT...",
    "Tokenizes documents into an OLMo token file: each document's token ids followed\n"
    "by the EOS token, all concatenated.  Multithreaded and streaming (constant memory);\n"
    "the output is the same for any thread count.",
    tokenize_options,
    "Invalid UTF-8 is replaced by U+FFFD (counted).  The progress line on stderr shows\n"
    "MB read, MB/s, documents and tokens.",
};

static int add_input(void *o, const char *path) {
    struct olmo_tokenize_options *t = o;
    t->inputs[t->n_inputs++] = path;
    return 0;
}

/* Returns -1 to go on, else the exit code (0 after --help, 2 after an error, printed). */
static int parse_args(struct tokenize_args *a, int argc, char **argv) {
    memset(a, 0, sizeof *a);
    struct olmo_tokenize_options *o = &a->o;
    o->text_key = "text";
    o->eos = "<|endoftext|>";
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    o->threads = ncpu > 0 ? (int)ncpu : 1;
    a->format = -1;
    a->docs = 0;
    a->dtype = 2;
    a->max_line = -1;
    int status;
    if (olmo_cli_parse(&tokenize_command, a, argc, argv, &status)) return status;
    o->strip = !a->no_strip;
    o->docs = doc_unit_values[a->docs];
    o->elem_size = dtype_sizes[a->dtype];
    if (a->max_line != -1 && !(a->max_line >= 1 && a->max_line <= 1e15))
        return olmo_cli_error(&tokenize_command, "--max-line-bytes must be at least 1 byte");
    o->max_line_bytes = a->max_line == -1 ? 0 : (size_t)a->max_line;
    if (!o->tokenizer) return olmo_cli_error(&tokenize_command, "--tokenizer TOKENIZER.json is required");
    if (!o->output) return olmo_cli_error(&tokenize_command, "-o OUTPUT is required");
    if (!a->inputs.n) return olmo_cli_error(&tokenize_command, "no input files");
    if (!(o->inputs = calloc((size_t)a->inputs.n, sizeof(char *)))) {
        fprintf(stderr, "olmoc tokenize: out of memory\n");
        return 1;
    }
    olmo_cli_each(&a->inputs, add_input, o);
    if (a->format >= 0) {
        o->format = format_values[a->format];
    } else {
        const char *f = o->inputs[0];
        size_t n = strlen(f);
        if (n >= 3 && !strcmp(f + n - 3, ".gz")) n -= 3;
        bool j = (n >= 6 && !strncmp(f + n - 6, ".jsonl", 6)) || (n >= 5 && !strncmp(f + n - 5, ".json", 5));
        o->format = j ? OLMO_FMT_JSONL : OLMO_FMT_TEXT;
    }
    return -1;
}

int cmd_tokenize(int argc, char **argv) {
    struct tokenize_args a;
    const int code = parse_args(&a, argc, argv);
    if (code >= 0) {
        free(a.o.inputs);
        return code;
    }
    int rc = olmo_tokenize(&a.o);
    if (rc) fprintf(stderr, "olmoc tokenize: %s\n", olmo_last_error());
    free(a.o.inputs);
    return rc ? 1 : 0;
}
