/* Evaluation: held-out loss / perplexity on validation token files, and
 * downstream ranked classification (multiple choice scored by the
 * log-likelihood of each choice's tokens, as OLMo's in-loop evaluators do).
 *
 * Task file format (JSONL, pre-tokenized so no tokenizer is needed), one
 * example per line:
 *   {"context": [ids...], "choices": [[ids...], [ids...], ...], "label": k}
 * Each choice is scored as the sum of log p(token | everything before it)
 * over the choice's tokens, given the context.  Reported: acc (argmax of the
 * sum) and acc_per_token (argmax of the sum divided by the choice's token
 * count, the length normalisation available without text).  A row longer
 * than the model's seq_len loses context tokens from the left as OLMo's
 * in-loop evaluator cuts its query (the context and the choice without its
 * last token, which is never an input; the last seq_len tokens kept): the
 * context keeps seq_len - len + 1 tokens. */
#ifndef OLMOC_EVAL_EVALUATE_H
#define OLMOC_EVAL_EVALUATE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "data/token_file.h"
#include "model/model.h"

/* How far a long evaluation is: report(ctx, done, total) after each batch
 * (eval/evaluator.c turns it into progress lines).  NULL: no reports. */
struct olmo_eval_progress {
    void (*report)(void *ctx, long done, long total);
    void *ctx;
};
static inline void olmo_eval_progress_tick(const struct olmo_eval_progress *p, long done, long total) {
    if (p && p->report) p->report(p->ctx, done, total);
}

struct olmo_val_set {
    char name[256]; /* LABEL of a LABEL=PATH entry, else the file name without .npy */
    struct olmo_token_file file;
    size_t n_instances; /* consecutive seq_len windows, in file order (no shuffle) */
    /* documents mode (olmo_val_set_documents): one instance per document */
    size_t n_docs;
    size_t *doc_start;
    int *doc_len; /* tokens kept: min(document length, seq_len) */
    /* OLMo-core's LMEvaluator order (olmo_val_sets_order); batch_docs 0: every document, in file order */
    size_t batch_docs; /* documents per global batch */
    size_t n_read;     /* documents of this set in the batches read */
    size_t *read_doc;  /* their indices, in the order read */
    size_t *read_pos;  /* their positions in the evaluator's order (ascending) */
};

/* Opens every entry of a comma-separated list (empty list: *n = 0); an entry
 * is PATH or LABEL=PATH (LABEL names the set, e.g. OLMo-core's
 * c4_en-validation; it holds no '/').  Raw (headerless) files are read as
 * dtype (data.dtype; OLMo-core's validation files are raw). */
int olmo_val_sets_open(const char *paths, int seq_len, enum olmo_dtype dtype, struct olmo_val_set **sets, int *n);
void olmo_val_sets_close(struct olmo_val_set *sets, int n);
/* Mean next-token cross-entropy over the first max_batches micro-batches of
 * the set (m is reserved as micro_batch x seq_len); labels as in training.
 * progress counts micro-batches. */
int olmo_eval_val_set(struct olmo_model *m, const struct olmo_val_set *s, int max_batches, bool doc_masking,
                      double *loss, long *n_tokens, const struct olmo_eval_progress *progress);

/* OLMo-core's LM evaluator (olmo_core.eval.LMEvaluator over a
 * NumpyPaddedFSLDataset): documents end at each eos_id (tokens after the last
 * EOS belong to none), each one is an instance of its first seq_len tokens
 * padded to seq_len, every token but an instance's first is a label, and the
 * metric ("CE loss") is OLMo-core's mean of the un-reduced loss over every
 * instance token (label_mask): the sum of the labels' cross-entropies divided
 * by the instances' tokens, the last token of each, which has no label,
 * counting with a loss of 0; "PPL" = exp(CE loss).  Scans the file for the
 * document boundaries. */
int olmo_val_set_documents(struct olmo_val_set *s, int eos_id, int seq_len, int vocab_size);

/* Which documents OLMo-core's LMEvaluator reads (LMEvaluatorCallbackConfig
 * with the sets as one eval_dataset; LMEvaluator.from_numpy_dataset): the
 * sets' documents (documents mode) form one dataset, the sets in order and
 * each in file order; its NumpyFSLDataLoader (seed 0, reshuffled with epoch 1)
 * visits np.random.Generator(PCG64(1)).shuffle(arange(N)) in whole global
 * batches of batch_docs documents (the eval micro-batch x the data-parallel
 * ranks), the last incomplete batch dropped.  Each set records the documents
 * read and their positions; a set none of whose documents is read, or fewer
 * documents than one global batch, is an error. */
int olmo_val_sets_order(struct olmo_val_set *sets, int n, size_t batch_docs);

struct olmo_val_result {
    double loss, ppl;          /* OLMo-core's CE loss (nats; see above), exp(loss) */
    double bpb;                /* bits per byte: CE sum / ln 2 / UTF-8 bytes of the label tokens; < 0 when unknown */
    long tokens, labels, docs; /* instance tokens (the CE loss's weight), label tokens, documents */
    long long bytes;     /* UTF-8 bytes of the label tokens (special tokens count 0); -1 when unknown */
};
struct olmo_tokenizer;
/* Evaluates a documents-mode set: the documents of the first max_batches
 * global batches (<= 0: all) that olmo_val_sets_order chose, in the order
 * read; without that order every document, in file order (max_batches
 * micro-batches of them).  tok (may be NULL) gives each label token's bytes
 * for bits per byte.  When none of the set's documents is in the global
 * batches read (OLMo-core reports NaN for it), r->docs is 0 and the rest of
 * r is zero.  progress counts documents. */
int olmo_eval_val_documents(struct olmo_model *m, const struct olmo_val_set *s, int max_batches, int pad_id,
                            const struct olmo_tokenizer *tok, struct olmo_val_result *r,
                            const struct olmo_eval_progress *progress);
/* OLMo-core's metric name for a set: "eval/lm/<set>/<metric>" (metric "CE loss", "PPL"). */
void olmo_val_metric_name(char *out, size_t n, const char *set, const char *metric);

struct olmo_mc_example {
    int32_t *context;
    int n_context;
    int n_choices;
    int32_t **choices;
    int *choice_len;
    int label;
};

struct olmo_mc_task {
    char name[256];
    int n;
    struct olmo_mc_example *ex;
};

int olmo_mc_task_load(const char *path, int vocab_size, struct olmo_mc_task *t);
void olmo_mc_task_free(struct olmo_mc_task *t);
/* Loads every .jsonl file of a comma-separated list; the other entries
 * (OLMo-eval task names, sets, directories) are eval/olmo_tasks.h's and skipped here. */
int olmo_mc_tasks_load(const char *paths, int vocab_size, struct olmo_mc_task **tasks, int *n);
void olmo_mc_tasks_free(struct olmo_mc_task *tasks, int n);

struct olmo_mc_result {
    int n;
    double acc, acc_per_token;
    int nonfinite; /* choices whose log-likelihood is NaN or infinite */
};

/* Scores every example with the model (reserved as batch x seq_len rows).
 * scores: when non-NULL, one JSON line per example with each choice's log-likelihood.
 * progress counts scored choices. */
int olmo_mc_eval(struct olmo_model *m, const struct olmo_mc_task *t, int pad_id, struct olmo_mc_result *r,
                 FILE *scores, const struct olmo_eval_progress *progress);

#endif
