/* olmoc eval: held-out loss / perplexity and ranked-classification accuracy of a checkpoint. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "cli/commands.h"
#include "model/source.h"
#include "train/evaluate.h"
#include "util/error.h"

static void eval_usage(FILE *out) {
    fprintf(out,
            "usage: olmoc eval SRC [--val A.npy,B.npy] [--task T.jsonl,...] [options]\n\n"
            "Evaluates a model: SRC is a checkpoint (step-NNNNNN/), a run directory (its newest\n"
            "checkpoint), a Hugging Face directory, or a .safetensors file with --config.\n\n"
            "  --val LIST          validation token files (.npy, comma-separated): mean next-token\n"
            "                      loss and perplexity over the first --batches micro-batches of\n"
            "                      train.seq_len tokens, in file order\n"
            "  --task LIST         multiple-choice task files (.jsonl, comma-separated), one example\n"
            "                      per line:\n"
            "                        {\"context\": [ids], \"choices\": [[ids], [ids], ...], \"label\": k}\n"
            "                      each choice scored by the sum of its tokens' log-probabilities;\n"
            "                      reports acc and acc_per_token (length-normalised)\n"
            "                      (without --val and --task: the config's data.val_paths and\n"
            "                      data.eval_tasks)\n"
            "  --batches N         micro-batches per validation set (default train.eval_batches)\n"
            "  --scores-out FILE   per-example choice log-likelihoods as JSONL\n"
            "  --json              print results as JSON lines only\n"
            "  --config CFG.yaml   the model config (required for a bare .safetensors file)\n"
            "  --set KEY=VALUE     override a config value (e.g. train.micro_batch, train.seq_len)\n"
            "  --backend NAME      cpu (default), cpu-openblas, cpu-onednn, cpu-bf16, or in a CUDA\n"
            "                      build cuda, cuda-tf32, cuda-bf16, cuda-bf16-cublas (see olmoc train --help)\n");
}

int cmd_eval(int argc, char **argv) {
    const char *src = NULL, *config_path = NULL, *val = NULL, *tasks_arg = NULL, *scores_path = NULL,
               *backend_name = "cpu";
    int batches = 0;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            eval_usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--json")) {
            json = true;
        } else if (!strcmp(argv[i], "--set") || !strcmp(argv[i], "--config") || !strcmp(argv[i], "--val") ||
                   !strcmp(argv[i], "--task") || !strcmp(argv[i], "--batches") || !strcmp(argv[i], "--scores-out") ||
                   !strcmp(argv[i], "--backend")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "olmoc eval: %s needs a value\n", argv[i]);
                return 2;
            }
            const char *v = argv[i + 1];
            if (!strcmp(argv[i], "--config")) config_path = v;
            else if (!strcmp(argv[i], "--val")) val = v;
            else if (!strcmp(argv[i], "--task")) tasks_arg = v;
            else if (!strcmp(argv[i], "--scores-out")) scores_path = v;
            else if (!strcmp(argv[i], "--backend")) backend_name = v;
            else if (!strcmp(argv[i], "--batches")) {
                char *end;
                long b = strtol(v, &end, 10);
                if (*end || b <= 0 || b > 1000000) {
                    fprintf(stderr, "olmoc eval: --batches expects a positive integer, got '%s'\n", v);
                    return 2;
                }
                batches = (int)b;
            }
            i++;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "olmoc eval: unknown option '%s' (see --help)\n", argv[i]);
            return 2;
        } else if (src) {
            fprintf(stderr, "olmoc eval: unexpected argument '%s' (see --help)\n", argv[i]);
            return 2;
        } else {
            src = argv[i];
        }
    }
    if (!src) {
        eval_usage(stderr);
        return 2;
    }
    struct olmo_config cfg;
    struct olmo_model_source source;
    struct olmo_model model = {0};
    struct olmo_val_set *sets = NULL;
    struct olmo_mc_task *tasks = NULL;
    int n_sets = 0, n_tasks = 0;
    FILE *scores = NULL;
    if (olmo_source_resolve(src, config_path, &source, &cfg)) goto fail;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--set") && olmo_config_set(&cfg, argv[++i])) goto fail;
    if (olmo_config_validate(&cfg)) goto fail;
    if (!val && !tasks_arg) { /* nothing named on the command line: what the run evaluated */
        val = cfg.data.val_paths;
        tasks_arg = cfg.data.eval_tasks;
    }
    if (!val) val = "";
    if (!tasks_arg) tasks_arg = "";
    if (!batches) batches = cfg.train.eval_batches;
    if (olmo_val_sets_open(val, cfg.train.seq_len, &sets, &n_sets)) goto fail;
    if (olmo_mc_tasks_load(tasks_arg, cfg.model.vocab_size, &tasks, &n_tasks)) goto fail;
    if (!n_sets && !n_tasks) {
        olmo_error("nothing to evaluate: give --val and/or --task (or set data.val_paths / data.eval_tasks)");
        goto fail;
    }
    const struct olmo_backend *be = olmo_backend_by_name(backend_name);
    if (!be || olmo_model_create(&model, &cfg.model, be) || olmo_source_load_weights(&source, &model) ||
        olmo_model_reserve(&model, cfg.train.micro_batch, cfg.train.seq_len))
        goto fail;
    if (scores_path && !(scores = fopen(scores_path, "w"))) {
        olmo_error("cannot write '%s': %s", scores_path, strerror(errno));
        goto fail;
    }
    if (!json)
        printf("olmoc eval: %s %s | %zu params | micro-batch %d x %d tokens\n", olmo_source_kind_name(source.kind),
               src, olmo_model_count_params(&cfg.model, true), cfg.train.micro_batch, cfg.train.seq_len);
    for (int i = 0; i < n_sets; i++) {
        double loss;
        long tokens;
        if (olmo_eval_val_set(&model, &sets[i], batches, cfg.train.intra_doc_masking, &loss, &tokens)) goto fail;
        if (json)
            printf("{\"type\":\"eval\",\"set\":\"%s\",\"loss\":%.17g,\"ppl\":%.17g,\"tokens\":%ld}\n", sets[i].name, loss,
                   exp(loss), tokens);
        else printf("%s: loss %.6f | ppl %.4f | %ld tokens\n", sets[i].name, loss, exp(loss), tokens);
    }
    int pad = cfg.model.pad_token_id >= 0 && cfg.model.pad_token_id < cfg.model.vocab_size ? cfg.model.pad_token_id
                                                                                           : cfg.model.eos_token_id;
    for (int i = 0; i < n_tasks; i++) {
        struct olmo_mc_result r;
        if (olmo_mc_eval(&model, &tasks[i], pad, &r, scores)) goto fail;
        if (json)
            printf("{\"type\":\"downstream\",\"task\":\"%s\",\"acc\":%.17g,\"acc_per_token\":%.17g,\"n\":%d}\n",
                   tasks[i].name, r.acc, r.acc_per_token, r.n);
        else printf("%s: acc %.4f | acc_per_token %.4f | %d examples\n", tasks[i].name, r.acc, r.acc_per_token, r.n);
    }
    if (scores && fclose(scores)) {
        scores = NULL;
        olmo_error("writing '%s' failed", scores_path);
        goto fail;
    }
    olmo_val_sets_close(sets, n_sets);
    olmo_mc_tasks_free(tasks, n_tasks);
    olmo_model_destroy(&model);
    return 0;
fail:
    fprintf(stderr, "olmoc eval: %s\n", olmo_last_error());
    if (scores) fclose(scores);
    olmo_val_sets_close(sets, n_sets);
    olmo_mc_tasks_free(tasks, n_tasks);
    olmo_model_destroy(&model);
    return 1;
}
