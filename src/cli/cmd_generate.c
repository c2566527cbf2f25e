/* olmoc generate: sampling from a model with a KV cache. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "model/generate.h"
#include "tokenizer/tokenizer.h"
#include "train/source.h"
#include "util/fs.h"
#include "util/error.h"
#include "util/json.h"

static int parse_ids(const char *text, int32_t **ids, int *n) {
    int cap = 16;
    *n = 0;
    *ids = malloc(sizeof(int32_t) * (size_t)cap);
    if (!*ids) return olmo_error("out of memory");
    const char *p = text;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > 2147483647L) return olmo_error("--ids expects comma-separated token ids, got '%s'", text);
        if (*n == cap) {
            cap *= 2;
            int32_t *q = realloc(*ids, sizeof(int32_t) * (size_t)cap);
            if (!q) return olmo_error("out of memory");
            *ids = q;
        }
        (*ids)[(*n)++] = (int32_t)v;
        p = end;
        while (*p == ' ') p++;
        if (*p == ',') p++;
        else if (*p) return olmo_error("--ids expects comma-separated token ids, got '%s'", text);
    }
    if (!*n) return olmo_error("--ids is empty");
    return 0;
}

static void print_stats(int n_prompt, const struct olmo_sample_result *r) {
    fprintf(stderr, "olmoc generate: %d prompt tokens in %.3fs, %d new tokens in %.3fs (%.1f tok/s)\n", n_prompt,
            r->prefill_s, r->n_new, r->decode_s, r->n_new > 0 && r->decode_s > 0 ? r->n_new / r->decode_s : 0.0);
}

static int stream_token(void *user, int32_t id) { return olmo_text_stream_push(user, (uint32_t)id); }

struct gen_args {
    const char *src, *config_path, *ids_text, *prompt, *prompt_file, *tokenizer, *backend_name;
    int output; /* an index into outputs, or -1: text for a text prompt, ids for --ids */
    long max_new;
    double temperature, top_p;
    unsigned long long seed;
    bool ignore_eos, json;
    struct olmo_cli_list sets;
};

static const char *const outputs[] = {"text", "ids", NULL};

#define ARG(field) offsetof(struct gen_args, field)
static const struct olmo_cli_option generate_options[] = {
    {.kind = OLMO_CLI_ARG, .name = "SRC", .offset = ARG(src)},
    {.kind = OLMO_CLI_STRING, .name = "--prompt", .offset = ARG(prompt), .metavar = "TEXT",
     .help = "the prompt as text (UTF-8), tokenized with the tokenizer"},
    {.kind = OLMO_CLI_STRING, .name = "--prompt-file", .offset = ARG(prompt_file), .metavar = "FILE",
     .help = "the prompt as the text of a file"},
    {.kind = OLMO_CLI_STRING, .name = "--ids", .offset = ARG(ids_text), .metavar = "LIST",
     .help = "the prompt as comma-separated token ids"},
    {.kind = OLMO_CLI_CHOICE, .name = "--output", .offset = ARG(output), .metavar = "FORMAT", .choices = outputs,
     .expects = "expects text or ids",
     .help = "text (the default for a text prompt) or ids: the generated token ids,\n"
             "comma-separated (the default for --ids)"},
    {.kind = OLMO_CLI_STRING, .name = "--tokenizer", .offset = ARG(tokenizer), .metavar = "FILE",
     .help = "tokenizer.json (default: the config's data.tokenizer, else\n"
             "SRC/tokenizer.json of a Hugging Face directory)"},
    {.kind = OLMO_CLI_LONG, .name = "--max-new-tokens", .offset = ARG(max_new), .metavar = "N", .min = 0,
     .max = 1000000,
     .help = "tokens to generate (default 32, fewer when the prompt leaves less room\n"
             "in the context); the prompt and N together must fit in the model's\n"
             "context, train.seq_len (a Hugging Face directory: its\n"
             "max_position_embeddings, at most 4096), else generate refuses;\n"
             "--set train.seq_len=N allows a longer one"},
    {.kind = OLMO_CLI_DOUBLE, .name = "--temperature", .offset = ARG(temperature), .metavar = "T", .min = 0,
     .max = HUGE_VAL, .help = "0 = greedy (default); > 0 samples from softmax(logits / T)"},
    {.kind = OLMO_CLI_DOUBLE, .name = "--top-p", .offset = ARG(top_p), .metavar = "P", .min = 0, .min_open = true,
     .max = 1, .help = "nucleus sampling: only the most likely tokens up to mass P (default 1)"},
    {.kind = OLMO_CLI_U64, .name = "--seed", .offset = ARG(seed), .metavar = "S",
     .help = "sampling seed (default 0)"},
    {.kind = OLMO_CLI_FLAG, .name = "--ignore-eos", .offset = ARG(ignore_eos),
     .help = "keep going after model.eos_token_id (default: stop after it)"},
    {.kind = OLMO_CLI_FLAG, .name = "--json", .offset = ARG(json),
     .help = "print {\"prompt\": [...], \"generated\": [...], \"text\": \"...\" (with a\n"
             "tokenizer), \"prefill_s\", \"decode_s\"} at the end instead"},
    {.kind = OLMO_CLI_STRING, .name = "--config", .offset = ARG(config_path), .metavar = "CFG.yaml",
     .help = "the model config (required for a bare .safetensors file)"},
    {.kind = OLMO_CLI_LIST, .name = "--set", .offset = ARG(sets), .metavar = "KEY=VALUE",
     .help = "override a config value"},
    {.kind = OLMO_CLI_STRING, .name = "--backend", .offset = ARG(backend_name), .metavar = "NAME",
     .help = OLMO_CLI_BACKEND_HELP},
    {.kind = OLMO_CLI_END},
};
#undef ARG

static const struct olmo_cli_command generate_command = {
    "generate",
    "olmoc generate SRC (--prompt TEXT | --prompt-file FILE | --ids ID,ID,...) [options]",
    "Continues a prompt with a KV cache.  SRC is a checkpoint (step-NNNNNN/), a run directory\n"
    "(its newest checkpoint), a Hugging Face directory, or a .safetensors file with --config.\n"
    "The text is streamed to stdout as it is generated (each complete character as soon as its\n"
    "last token is drawn), followed by a newline; timings go to stderr.  Generation stops after\n"
    "model.eos_token_id (not printed) unless --ignore-eos.",
    generate_options,
    NULL,
};

/* Returns -1 to go on, else the exit code. */
static int parse_args(int argc, char **argv, struct gen_args *a) {
    *a = (struct gen_args){.backend_name = "cpu", .output = -1, .max_new = -1, .top_p = 1.0};
    int status;
    if (olmo_cli_parse(&generate_command, a, argc, argv, &status)) return status;
    const int n_prompts = !!a->ids_text + !!a->prompt + !!a->prompt_file;
    if (!a->src || n_prompts == 0) return olmo_cli_usage_error(&generate_command);
    if (n_prompts > 1) return olmo_cli_error(&generate_command, "give one of --prompt, --prompt-file and --ids");
    return -1;
}

/* The tokenizer: --tokenizer, else data.tokenizer, else SRC/tokenizer.json of a Hugging Face directory; "" if none. */
static void tokenizer_path(const struct gen_args *a, const struct olmo_model_source *src, const struct olmo_config *cfg,
                           char *out, size_t n) {
    out[0] = 0;
    if (a->tokenizer) snprintf(out, n, "%s", a->tokenizer);
    else if (cfg->data.tokenizer[0]) snprintf(out, n, "%s", cfg->data.tokenizer);
    else if (src->kind == OLMO_SRC_HF_DIR) {
        snprintf(out, n, "%s/tokenizer.json", src->dir);
        if (!olmo_is_file(out)) out[0] = 0;
    }
}

/* The prompt's ids: parsed from --ids, or the text of --prompt / --prompt-file encoded. */
static int prompt_ids(const struct gen_args *a, const struct olmo_tokenizer *tok, int32_t **ids, int *n) {
    if (a->ids_text) return parse_ids(a->ids_text, ids, n);
    char *file_text = NULL;
    size_t len;
    const char *text = a->prompt;
    if (a->prompt_file) {
        if (olmo_read_file(a->prompt_file, (size_t)1 << 30, &file_text, &len)) return -1;
        text = file_text;
    } else {
        len = strlen(text);
    }
    struct olmo_encoder *enc = olmo_encoder_new(tok);
    struct olmo_ids v = {0};
    int rc = enc ? olmo_encode(enc, text, len, 0, &v, NULL, NULL) : -1;
    olmo_encoder_free(enc);
    free(file_text);
    if (!rc && v.n == 0) rc = olmo_error("the prompt is empty (it has no tokens)");
    if (!rc && v.n > (size_t)1 << 30) rc = olmo_error("the prompt has too many tokens (%zu)", v.n);
    if (!rc && !(*ids = olmo_malloc(sizeof(int32_t) * v.n, "prompt"))) rc = -1;
    for (size_t i = 0; !rc && i < v.n; i++) (*ids)[i] = (int32_t)v.ids[i];
    if (!rc) *n = (int)v.n;
    olmo_ids_free(&v);
    return rc;
}

/* The prompt and the new tokens within the model's context (train.seq_len), so that the work is bounded
 * by what the model was made for: an explicit --max-new-tokens beyond it is refused, the default of 32
 * shortened to the room left. */
#define DEFAULT_MAX_NEW 32
static int fit_context(struct gen_args *a, int n_prompt, int context) {
    if (n_prompt > context || (n_prompt == context && a->max_new != 0))
        return olmo_error("the prompt has %d tokens, %s the model's context of %d (train.seq_len; --set "
                          "train.seq_len=N for a longer one)",
                          n_prompt, n_prompt > context ? "more than" : "all of", context);
    if (a->max_new < 0) {
        a->max_new = context - n_prompt < DEFAULT_MAX_NEW ? context - n_prompt : DEFAULT_MAX_NEW;
        return 0;
    }
    if (n_prompt + a->max_new > context)
        return olmo_error("the prompt (%d tokens) and --max-new-tokens %ld make %ld positions, more than the "
                          "model's context of %d (train.seq_len): at most %d new tokens fit (--set "
                          "train.seq_len=N for a longer context)",
                          n_prompt, a->max_new, n_prompt + a->max_new, context, context - n_prompt);
    return 0;
}

int cmd_generate(int argc, char **argv) {
    struct gen_args a;
    int code = parse_args(argc, argv, &a);
    if (code >= 0) return code;
    struct olmo_config cfg;
    struct olmo_model_source source;
    struct olmo_model model = {0};
    struct olmo_backend *backend = NULL; /* destroyed after the model */
    struct olmo_tokenizer *tok = NULL;
    int32_t *ids = NULL;
    char *text = NULL;
    int n_prompt;
    char tokpath[4200];
    if (olmo_source_resolve(a.src, a.config_path, &source, &cfg)) goto fail;
    if (olmo_cli_apply_sets(&a.sets, &cfg)) goto fail;
    if (olmo_config_validate(&cfg)) goto fail;
    tokenizer_path(&a, &source, &cfg, tokpath, sizeof tokpath);
    const bool text_prompt = !a.ids_text;
    const bool want_text = a.output >= 0 ? a.output == 0 : text_prompt; /* --ids: ids, as before */
    if ((text_prompt || want_text) && !tokpath[0]) {
        olmo_error("%s needs a tokenizer: give --tokenizer FILE or set data.tokenizer",
                   text_prompt ? "a text prompt" : "--output text");
        goto fail;
    }
    if (tokpath[0] && (text_prompt || want_text || a.json) && olmo_tokenizer_load(&tok, tokpath)) goto fail;
    if (prompt_ids(&a, tok, &ids, &n_prompt) || fit_context(&a, n_prompt, cfg.train.seq_len)) goto fail;
    if (!(backend = olmo_backend_create(a.backend_name)) || olmo_model_create(&model, &cfg.model, backend) ||
        olmo_source_load_weights(&source, &model))
        goto fail;
    const int total = n_prompt + (int)a.max_new;
    int32_t *all = realloc(ids, sizeof(int32_t) * (size_t)(total > 0 ? total : 1));
    if (!all) {
        olmo_error("out of memory");
        goto fail;
    }
    ids = all;
    struct olmo_text_stream stream;
    olmo_text_stream_init(&stream, tok, stdout, true);
    const bool streaming = want_text && !a.json;
    const struct olmo_sample_options so = {(int)a.max_new, a.temperature, a.top_p, a.seed, cfg.model.eos_token_id,
                                           a.ignore_eos, streaming ? stream_token : NULL, &stream};
    struct olmo_sample_result res;
    if (olmo_generate_tokens(&model, ids, n_prompt, &so, &res)) goto fail;
    if (streaming) {
        if (olmo_text_stream_finish(&stream)) goto fail;
        printf("\n");
        print_stats(n_prompt, &res);
    } else if (a.json) {
        cJSON *o = cJSON_CreateObject();
        cJSON *prompt = cJSON_AddArrayToObject(o, "prompt"), *generated = cJSON_AddArrayToObject(o, "generated");
        for (int i = 0; i < n_prompt; i++) olmo_json_append_int(prompt, ids[i]);
        for (int i = n_prompt; i < n_prompt + res.n_new; i++) olmo_json_append_int(generated, ids[i]);
        if (tok) {
            uint32_t *gen = olmo_malloc(sizeof(uint32_t) * (size_t)(res.n_new + 1), "generated ids");
            size_t k = 0;
            for (int i = 0; gen && i < res.n_new; i++) /* ids the tokenizer does not know are skipped, as tokenizers does */
                if (olmo_tokenizer_token_bytes(tok, (uint32_t)ids[n_prompt + i], &(size_t){0}))
                    gen[k++] = (uint32_t)ids[n_prompt + i];
            if (!gen || olmo_decode(tok, gen, k, true, &text, NULL)) {
                free(gen);
                cJSON_Delete(o);
                goto fail;
            }
            free(gen);
            cJSON_AddStringToObject(o, "text", text);
        }
        olmo_json_add_num(o, "prefill_s", "%.6f", res.prefill_s);
        olmo_json_add_num(o, "decode_s", "%.6f", res.decode_s);
        if (olmo_json_write_line(stdout, o, "the output")) goto fail;
    } else {
        for (int i = n_prompt; i < n_prompt + res.n_new; i++) printf(i > n_prompt ? ",%d" : "%d", ids[i]);
        printf("\n");
        print_stats(n_prompt, &res);
    }
    if (fflush(stdout)) {
        olmo_error("writing the output failed");
        goto fail;
    }
    free(text);
    olmo_model_destroy(&model);
    olmo_backend_destroy(backend);
    olmo_tokenizer_free(tok);
    free(ids);
    return 0;
fail:
    fflush(stdout);
    fprintf(stderr, "olmoc generate: %s\n", olmo_last_error());
    free(text);
    olmo_model_destroy(&model);
    olmo_backend_destroy(backend);
    olmo_tokenizer_free(tok);
    free(ids);
    return 1;
}
