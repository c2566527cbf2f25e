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
 * than the model's seq_len loses context tokens from the left. */
#ifndef OLMOC_EVALUATE_H
#define OLMOC_EVALUATE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "data/token_file.h"
#include "model/model.h"

struct olmo_val_set {
    char name[256];
    struct olmo_token_file file;
    size_t n_instances; /* consecutive seq_len windows, in file order (no shuffle) */
};

/* Opens every file of a comma-separated list (empty list: *n = 0). */
int olmo_val_sets_open(const char *paths, int seq_len, struct olmo_val_set **sets, int *n);
void olmo_val_sets_close(struct olmo_val_set *sets, int n);
/* Mean next-token cross-entropy over the first max_batches micro-batches of
 * the set (m is reserved as micro_batch x seq_len); labels as in training. */
int olmo_eval_val_set(struct olmo_model *m, const struct olmo_val_set *s, int max_batches, bool doc_masking,
                      double *loss, long *n_tokens);

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
};

/* Scores every example with the model (reserved as batch x seq_len rows).
 * scores: when non-NULL, one JSON line per example with each choice's log-likelihood. */
int olmo_mc_eval(struct olmo_model *m, const struct olmo_mc_task *t, int pad_id, struct olmo_mc_result *r,
                 FILE *scores);

#endif
