/* olmoc generate: sampling from a model with a KV cache. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "cli/commands.h"
#include "model/source.h"
#include "model/sample.h"
#include "util/error.h"

static void generate_usage(FILE *out) {
    fprintf(out,
            "usage: olmoc generate SRC --ids ID,ID,... [options]\n\n"
            "Continues a prompt of token ids with a KV cache.  SRC is a checkpoint (step-NNNNNN/), a run\n"
            "directory (its newest checkpoint), a Hugging Face directory, or a .safetensors file with\n"
            "--config.  Prints the generated token ids (comma-separated) on stdout.\n\n"
            "  --ids LIST            the prompt, comma-separated token ids\n"
            "  --max-new-tokens N    tokens to generate (default 32)\n"
            "  --temperature T       0 = greedy (default); > 0 samples from softmax(logits / T)\n"
            "  --top-p P             nucleus sampling: only the most likely tokens up to mass P (default 1)\n"
            "  --seed S              sampling seed (default 0)\n"
            "  --ignore-eos          keep going after model.eos_token_id (default: stop after it)\n"
            "  --json                print {\"prompt\": [...], \"generated\": [...], ...} instead\n"
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

static void print_result(const int32_t *ids, int n_prompt, const struct olmo_sample_result *r, bool json) {
    const int len = n_prompt + r->n_new;
    if (json) {
        printf("{\"prompt\":[");
        for (int i = 0; i < n_prompt; i++) printf(i ? ",%d" : "%d", ids[i]);
        printf("],\"generated\":[");
        for (int i = n_prompt; i < len; i++) printf(i > n_prompt ? ",%d" : "%d", ids[i]);
        printf("],\"prefill_s\":%.6f,\"decode_s\":%.6f}\n", r->prefill_s, r->decode_s);
        return;
    }
    for (int i = n_prompt; i < len; i++) printf(i > n_prompt ? ",%d" : "%d", ids[i]);
    printf("\n");
    fprintf(stderr, "olmoc generate: %d prompt tokens in %.3fs, %d new tokens in %.3fs (%.1f tok/s)\n", n_prompt,
            r->prefill_s, r->n_new, r->decode_s, r->n_new > 0 && r->decode_s > 0 ? r->n_new / r->decode_s : 0.0);
}

int cmd_generate(int argc, char **argv) {
    const char *src = NULL, *config_path = NULL, *ids_text = NULL, *backend_name = "cpu";
    long max_new = 32;
    double temperature = 0.0, top_p = 1.0;
    unsigned long long seed = 0;
    bool ignore_eos = false, json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            generate_usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--ignore-eos")) ignore_eos = true;
        else if (!strcmp(argv[i], "--json")) json = true;
        else if (!strcmp(argv[i], "--set") || !strcmp(argv[i], "--config") || !strcmp(argv[i], "--ids") ||
                 !strcmp(argv[i], "--max-new-tokens") || !strcmp(argv[i], "--temperature") ||
                 !strcmp(argv[i], "--top-p") || !strcmp(argv[i], "--seed") || !strcmp(argv[i], "--backend")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "olmoc generate: %s needs a value\n", argv[i]);
                return 2;
            }
            const char *opt = argv[i], *v = argv[++i];
            char *end = NULL;
            if (!strcmp(opt, "--config")) config_path = v;
            else if (!strcmp(opt, "--backend")) backend_name = v;
            else if (!strcmp(opt, "--ids")) ids_text = v;
            else if (!strcmp(opt, "--max-new-tokens")) {
                max_new = strtol(v, &end, 10);
                if (*end || max_new < 0 || max_new > 1000000) {
                    fprintf(stderr, "olmoc generate: --max-new-tokens expects an integer >= 0, got '%s'\n", v);
                    return 2;
                }
            } else if (!strcmp(opt, "--temperature")) {
                temperature = strtod(v, &end);
                if (*end || !(temperature >= 0)) {
                    fprintf(stderr, "olmoc generate: --temperature expects a number >= 0, got '%s'\n", v);
                    return 2;
                }
            } else if (!strcmp(opt, "--top-p")) {
                top_p = strtod(v, &end);
                if (*end || !(top_p > 0 && top_p <= 1)) {
                    fprintf(stderr, "olmoc generate: --top-p expects a number in (0, 1], got '%s'\n", v);
                    return 2;
                }
            } else if (!strcmp(opt, "--seed")) {
                seed = strtoull(v, &end, 10);
                if (*end || v[0] == '-') {
                    fprintf(stderr, "olmoc generate: --seed expects a non-negative integer, got '%s'\n", v);
                    return 2;
                }
            }
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "olmoc generate: unknown option '%s' (see --help)\n", argv[i]);
            return 2;
        } else if (src) {
            fprintf(stderr, "olmoc generate: unexpected argument '%s' (see --help)\n", argv[i]);
            return 2;
        } else {
            src = argv[i];
        }
    }
    if (!src || !ids_text) {
        generate_usage(stderr);
        return 2;
    }
    struct olmo_config cfg;
    struct olmo_model_source source;
    struct olmo_model model = {0};
    int32_t *ids = NULL;
    int n_prompt;
    if (parse_ids(ids_text, &ids, &n_prompt)) goto fail;
    if (olmo_source_resolve(src, config_path, &source, &cfg)) goto fail;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--set") && olmo_config_set(&cfg, argv[++i])) goto fail;
    if (olmo_config_validate(&cfg)) goto fail;
    const struct olmo_backend *be = olmo_backend_by_name(backend_name);
    if (!be || olmo_model_create(&model, &cfg.model, be) || olmo_source_load_weights(&source, &model)) goto fail;
    int32_t *all = realloc(ids, sizeof(int32_t) * (size_t)(n_prompt + max_new));
    if (!all) {
        olmo_error("out of memory");
        goto fail;
    }
    ids = all;
    const struct olmo_sample_options so = {(int)max_new, temperature, top_p, seed, cfg.model.eos_token_id, ignore_eos};
    struct olmo_sample_result res;
    if (olmo_generate_tokens(&model, ids, n_prompt, &so, &res)) goto fail;
    print_result(ids, n_prompt, &res, json);
    olmo_model_destroy(&model);
    free(ids);
    return 0;
fail:
    fprintf(stderr, "olmoc generate: %s\n", olmo_last_error());
    olmo_model_destroy(&model);
    free(ids);
    return 1;
}
