/* olmoc generate: sampling from a model with a KV cache. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "cli/commands.h"
#include "model/source.h"
#include "model/sample.h"
#include "tokenizer/tokenizer.h"
#include "util/fs.h"
#include "util/error.h"
#include "util/json.h"

static void generate_usage(FILE *out) {
    fprintf(out,
            "usage: olmoc generate SRC (--prompt TEXT | --prompt-file FILE | --ids ID,ID,...) [options]\n\n"
            "Continues a prompt with a KV cache.  SRC is a checkpoint (step-NNNNNN/), a run directory\n"
            "(its newest checkpoint), a Hugging Face directory, or a .safetensors file with --config.\n"
            "The text is streamed to stdout as it is generated (each complete character as soon as its\n"
            "last token is drawn), followed by a newline; timings go to stderr.  Generation stops after\n"
            "model.eos_token_id (not printed) unless --ignore-eos.\n\n"
            "  --prompt TEXT         the prompt as text (UTF-8), tokenized with the tokenizer\n"
            "  --prompt-file FILE    the prompt as the text of a file\n"
            "  --ids LIST            the prompt as comma-separated token ids\n"
            "  --output FORMAT       text (the default for a text prompt) or ids: the generated token ids,\n"
            "                        comma-separated (the default for --ids)\n"
            "  --tokenizer FILE      tokenizer.json (default: the config's data.tokenizer, else\n"
            "                        SRC/tokenizer.json of a Hugging Face directory)\n"
            "  --max-new-tokens N    tokens to generate (default 32)\n"
            "  --temperature T       0 = greedy (default); > 0 samples from softmax(logits / T)\n"
            "  --top-p P             nucleus sampling: only the most likely tokens up to mass P (default 1)\n"
            "  --seed S              sampling seed (default 0)\n"
            "  --ignore-eos          keep going after model.eos_token_id (default: stop after it)\n"
            "  --json                print {\"prompt\": [...], \"generated\": [...], \"text\": \"...\" (with a\n"
            "                        tokenizer), \"prefill_s\", \"decode_s\"} at the end instead\n"
            "  --config CFG.yaml     the model config (required for a bare .safetensors file)\n"
            "  --set KEY=VALUE       override a config value\n"
            "  --backend NAME        cpu (default), cpu-openblas, cpu-onednn, cpu-bf16, or in a CUDA\n"
            "                        build cuda, cuda-tf32, cuda-bf16, cuda-bf16-cublas (see olmoc train --help)\n");
}

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
    const char *src, *config_path, *ids_text, *prompt, *prompt_file, *tokenizer, *backend_name, *output;
    long max_new;
    double temperature, top_p;
    unsigned long long seed;
    bool ignore_eos, json;
};

/* Returns -1 to go on, else the exit code. */
static int parse_args(int argc, char **argv, struct gen_args *a) {
    *a = (struct gen_args){.backend_name = "cpu", .max_new = 32, .top_p = 1.0};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            generate_usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--ignore-eos")) a->ignore_eos = true;
        else if (!strcmp(argv[i], "--json")) a->json = true;
        else if (!strcmp(argv[i], "--set") || !strcmp(argv[i], "--config") || !strcmp(argv[i], "--ids") ||
                 !strcmp(argv[i], "--prompt") || !strcmp(argv[i], "--prompt-file") ||
                 !strcmp(argv[i], "--tokenizer") || !strcmp(argv[i], "--output") ||
                 !strcmp(argv[i], "--max-new-tokens") || !strcmp(argv[i], "--temperature") ||
                 !strcmp(argv[i], "--top-p") || !strcmp(argv[i], "--seed") || !strcmp(argv[i], "--backend")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "olmoc generate: %s needs a value\n", argv[i]);
                return 2;
            }
            const char *opt = argv[i], *v = argv[++i];
            char *end = NULL;
            if (!strcmp(opt, "--config")) a->config_path = v;
            else if (!strcmp(opt, "--backend")) a->backend_name = v;
            else if (!strcmp(opt, "--ids")) a->ids_text = v;
            else if (!strcmp(opt, "--prompt")) a->prompt = v;
            else if (!strcmp(opt, "--prompt-file")) a->prompt_file = v;
            else if (!strcmp(opt, "--tokenizer")) a->tokenizer = v;
            else if (!strcmp(opt, "--output")) {
                if (strcmp(v, "text") && strcmp(v, "ids")) {
                    fprintf(stderr, "olmoc generate: --output expects text or ids, got '%s'\n", v);
                    return 2;
                }
                a->output = v;
            } else if (!strcmp(opt, "--max-new-tokens")) {
                a->max_new = strtol(v, &end, 10);
                if (!*v || *end || a->max_new < 0 || a->max_new > 1000000) {
                    fprintf(stderr, "olmoc generate: --max-new-tokens expects an integer >= 0, got '%s'\n", v);
                    return 2;
                }
            } else if (!strcmp(opt, "--temperature")) {
                a->temperature = strtod(v, &end);
                if (!*v || *end || !(a->temperature >= 0)) {
                    fprintf(stderr, "olmoc generate: --temperature expects a number >= 0, got '%s'\n", v);
                    return 2;
                }
            } else if (!strcmp(opt, "--top-p")) {
                a->top_p = strtod(v, &end);
                if (!*v || *end || !(a->top_p > 0 && a->top_p <= 1)) {
                    fprintf(stderr, "olmoc generate: --top-p expects a number in (0, 1], got '%s'\n", v);
                    return 2;
                }
            } else if (!strcmp(opt, "--seed")) {
                a->seed = strtoull(v, &end, 10);
                if (!*v || *end || v[0] == '-') {
                    fprintf(stderr, "olmoc generate: --seed expects a non-negative integer, got '%s'\n", v);
                    return 2;
                }
            }
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "olmoc generate: unknown option '%s' (see --help)\n", argv[i]);
            return 2;
        } else if (a->src) {
            fprintf(stderr, "olmoc generate: unexpected argument '%s' (see --help)\n", argv[i]);
            return 2;
        } else {
            a->src = argv[i];
        }
    }
    const int n_prompts = !!a->ids_text + !!a->prompt + !!a->prompt_file;
    if (!a->src || n_prompts == 0) {
        generate_usage(stderr);
        return 2;
    }
    if (n_prompts > 1) {
        fprintf(stderr, "olmoc generate: give one of --prompt, --prompt-file and --ids\n");
        return 2;
    }
    return -1;
}

/* The tokenizer: --tokenizer, else data.tokenizer, else SRC/tokenizer.json of a Hugging Face directory; "" if none. */
static void tokenizer_path(const struct gen_args *a, const struct olmo_model_source *src, const struct olmo_config *cfg,
                           char *out, size_t n) {
    out[0] = 0;
    if (a->tokenizer) snprintf(out, n, "%s", a->tokenizer);
    else if (cfg->data.tokenizer[0]) snprintf(out, n, "%s", cfg->data.tokenizer);
    else if (src->kind == SRC_HF_DIR) {
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
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--set") && olmo_config_set(&cfg, argv[++i])) goto fail;
    if (olmo_config_validate(&cfg)) goto fail;
    tokenizer_path(&a, &source, &cfg, tokpath, sizeof tokpath);
    const bool text_prompt = !a.ids_text;
    const bool want_text = a.output ? !strcmp(a.output, "text") : text_prompt; /* --ids: ids, as before */
    if ((text_prompt || want_text) && !tokpath[0]) {
        olmo_error("%s needs a tokenizer: give --tokenizer FILE or set data.tokenizer",
                   text_prompt ? "a text prompt" : "--output text");
        goto fail;
    }
    if (tokpath[0] && (text_prompt || want_text || a.json) && olmo_tokenizer_load(&tok, tokpath)) goto fail;
    if (prompt_ids(&a, tok, &ids, &n_prompt)) goto fail;
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
