/* OLMo-eval tasks: scoring with the model and OLMo's in-loop metrics (see olmo_tasks.h). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "eval/evaluate.h"
#include "eval/olmo_tasks.h"
#include "model/generate.h"
#include "util/error.h"
#include "util/json.h"

#define LOG_2_OF_E 1.44269504089 /* OLMo's constant (olmo_eval/metrics.py) */

/* The query the model reads for an instance: context + continuation without
 * its last token, cut from the left to T tokens. */
static int query_len(const struct olmo_eval_instance *in, int T) {
    int full = in->n_ctx + in->n_cont - 1;
    return full < T ? full : T;
}
static int32_t query_token(const struct olmo_eval_instance *in, int T, int p) {
    int k = p + (in->n_ctx + in->n_cont - 1 - query_len(in, T));
    return k < in->n_ctx ? in->ctx[k] : in->cont[k - in->n_ctx];
}

static const struct olmo_eval_task *sort_task;
static int sort_T;
static int cmp_query(const void *a, const void *b) {
    const struct olmo_eval_instance *x = &sort_task->inst[*(const int *)a], *y = &sort_task->inst[*(const int *)b];
    int lx = query_len(x, sort_T), ly = query_len(y, sort_T);
    if (lx != ly) return lx < ly ? -1 : 1;
    for (int p = 0; p < lx; p++) {
        int32_t u = query_token(x, sort_T, p), v = query_token(y, sort_T, p);
        if (u != v) return u < v ? -1 : 1;
    }
    return *(const int *)a - *(const int *)b;
}

/* *lp += log p(target | row position), from the logits on the device. */
static int add_token_logprob(struct olmo_model *m, size_t pos, int32_t target, float *row, double *lp) {
    const int V = m->cfg.vocab_size;
    if (olmo_model_logits_rows(m, (int)pos, 1, row)) return -1;
    double mx = -INFINITY, s = 0.0;
    for (int v = 0; v < V; v++)
        if (row[v] > mx) mx = row[v];
    for (int v = 0; v < V; v++) s += exp((double)row[v] - mx);
    *lp += (double)row[target] - (mx + log(s));
    return 0;
}

/* log-softmax(row)[target] in double. */
static double row_logprob(const float *row, int V, int32_t target) {
    double mx = -INFINITY, s = 0.0;
    for (int v = 0; v < V; v++)
        if (row[v] > mx) mx = row[v];
    for (int v = 0; v < V; v++) s += exp((double)row[v] - mx);
    return (double)row[target] - (mx + log(s));
}

/* The prefix an instance's continuation is scored after: its query without
 * the continuation tokens it holds (the context, or what is left of it when
 * the query is cut to T tokens). */
static int prefix_len(const struct olmo_eval_instance *in, int T) { return query_len(in, T) - (in->n_cont - 1); }
static int cmp_prefix(const void *a, const void *b) {
    const struct olmo_eval_instance *x = &sort_task->inst[*(const int *)a], *y = &sort_task->inst[*(const int *)b];
    int lx = prefix_len(x, sort_T), ly = prefix_len(y, sort_T);
    if (lx != ly) return lx < ly ? -1 : 1;
    for (int p = 0; p < lx; p++) {
        int32_t u = query_token(x, sort_T, p), v = query_token(y, sort_T, p);
        if (u != v) return u < v ? -1 : 1;
    }
    return *(const int *)a - *(const int *)b;
}

/* One forward per distinct prefix: the prefix fills a KV cache once and each
 * continuation of it is fed after it (the cache rewound to the prefix), which
 * is what the batched forward computes for each query, without recomputing
 * the shared context for every choice or the padding up to T.  Returns 1
 * (nothing done) when the cache cannot be allocated. */
static int score_cached(struct olmo_model *m, const struct olmo_eval_task *t, double *logprob,
                        const struct olmo_eval_progress *progress) {
    const int T = m->seq_len, V = m->cfg.vocab_size;
    struct olmo_gen gen;
    if (olmo_gen_create(&gen, m, T, T)) return 1; /* no room for the cache: the caller uses the batched forward */
    const int all_max = gen.chunk < OLMO_GEN_FEED_ALL_MAX ? gen.chunk : OLMO_GEN_FEED_ALL_MAX;
    int *order = olmo_malloc(sizeof(int) * (size_t)(t->n + 1), "score order");
    int32_t *buf = olmo_malloc(sizeof(int32_t) * (size_t)T, "prefix");
    float *last = olmo_malloc(sizeof(float) * (size_t)V, "logit row");
    float *rows = olmo_malloc(sizeof(float) * (size_t)all_max * V, "logit rows");
    int rc = (!order || !buf || !last || !rows) ? -1 : 0;
    if (!rc) {
        for (int i = 0; i < t->n; i++) order[i] = i;
        sort_task = t;
        sort_T = T;
        qsort(order, (size_t)t->n, sizeof *order, cmp_prefix);
    }
    for (int k0 = 0, k1; k0 < t->n && !rc; k0 = k1) {
        const struct olmo_eval_instance *first = &t->inst[order[k0]];
        const int P = prefix_len(first, T);
        for (k1 = k0 + 1; k1 < t->n; k1++) { /* the instances sharing this prefix */
            const struct olmo_eval_instance *y = &t->inst[order[k1]];
            bool same = prefix_len(y, T) == P;
            for (int p = 0; same && p < P; p++) same = query_token(first, T, p) == query_token(y, T, p);
            if (!same) break;
        }
        for (int p = 0; p < P; p++) buf[p] = query_token(first, T, p);
        olmo_gen_reset(&gen);
        if ((rc = olmo_gen_feed(&gen, buf, P, last))) break;
        for (int k = k0; k < k1 && !rc; k++) {
            const struct olmo_eval_instance *in = &t->inst[order[k]];
            double sum = row_logprob(last, V, in->cont[0]);
            if ((rc = olmo_gen_rewind(&gen, P))) break;
            for (int j0 = 0; j0 < in->n_cont - 1 && !rc; j0 += all_max) { /* cont[j0..] predicts cont[j0 + 1..] */
                const int n = in->n_cont - 1 - j0 < all_max ? in->n_cont - 1 - j0 : all_max;
                if ((rc = olmo_gen_feed_all(&gen, in->cont + j0, n, rows))) break;
                for (int j = 0; j < n; j++) sum += row_logprob(rows + (size_t)j * V, V, in->cont[j0 + j + 1]);
            }
            logprob[order[k]] = sum;
        }
        if (!rc) olmo_eval_progress_tick(progress, k1, t->n);
    }
    olmo_gen_destroy(&gen);
    free(order);
    free(buf);
    free(last);
    free(rows);
    return rc ? olmo_error_context("task '%s'", t->name) : 0;
}

/* Whether to score with the KV cache (one forward per distinct prefix): yes
 * when the backend has cached attention, unless OLMOC_EVAL_SCORING=batched
 * (the batched forward of every padded query, kept for comparison). */
static bool use_cached(const struct olmo_model *m) {
    const char *e = getenv("OLMOC_EVAL_SCORING");
    return m->be->attention_cached && !(e && !strcmp(e, "batched"));
}

int olmo_eval_score(struct olmo_model *m, const struct olmo_eval_task *t, int pad_id, double *logprob,
                    const struct olmo_eval_progress *progress) {
    const int B = m->batch, T = m->seq_len;
    if (use_cached(m)) {
        for (int i = 0; i < t->n; i++)
            if (t->inst[i].n_cont > T)
                return olmo_error("task '%s' doc %ld: the continuation has %d tokens, more than seq_len %d", t->name,
                                  t->inst[i].doc_id, t->inst[i].n_cont, T);
        const int rc = t->n ? score_cached(m, t, logprob, progress) : 0;
        if (rc <= 0) return rc;
    }
    for (int i = 0; i < t->n; i++)
        if (t->inst[i].n_cont > T)
            return olmo_error("task '%s' doc %ld: the continuation has %d tokens, more than seq_len %d", t->name,
                              t->inst[i].doc_id, t->inst[i].n_cont, T);
    int *order = olmo_malloc(sizeof(int) * (size_t)(t->n + 1), "score order");
    int *row_start = olmo_malloc(sizeof(int) * (size_t)(t->n + 1), "score rows");
    int32_t *tokens = olmo_malloc(sizeof(int32_t) * (size_t)B * T, "score batch");
    float *row = olmo_malloc(sizeof(float) * (size_t)m->cfg.vocab_size, "logit row");
    int rc = (!order || !row_start || !tokens || !row) ? -1 : 0;
    int n_rows = 0;
    if (!rc) { /* one row per distinct query (e.g. all choices of a multiple-choice question) */
        for (int i = 0; i < t->n; i++) order[i] = i;
        sort_task = t;
        sort_T = T;
        qsort(order, (size_t)t->n, sizeof *order, cmp_query);
        for (int k = 0; k < t->n; k++) {
            if (k == 0) {
                row_start[n_rows++] = 0;
                continue;
            }
            const struct olmo_eval_instance *x = &t->inst[order[k - 1]], *y = &t->inst[order[k]];
            int lx = query_len(x, T);
            bool same = lx == query_len(y, T);
            for (int p = 0; same && p < lx; p++) same = query_token(x, T, p) == query_token(y, T, p);
            if (!same) row_start[n_rows++] = k;
        }
        row_start[n_rows] = t->n;
    }
    for (int r0 = 0; r0 < n_rows && !rc; r0 += B) {
        int nb = n_rows - r0 < B ? n_rows - r0 : B;
        for (size_t j = 0; j < (size_t)B * T; j++) tokens[j] = pad_id;
        for (int b = 0; b < nb; b++) {
            const struct olmo_eval_instance *in = &t->inst[order[row_start[r0 + b]]];
            for (int p = 0; p < query_len(in, T); p++) tokens[(size_t)b * T + p] = query_token(in, T, p);
        }
        if ((rc = olmo_model_forward(m, tokens, false))) break;
        for (int b = 0; b < nb; b++)
            for (int k = row_start[r0 + b]; k < row_start[r0 + b + 1]; k++) {
                const struct olmo_eval_instance *in = &t->inst[order[k]];
                int ctx_len = query_len(in, T) - in->n_cont + 1; /* the first continuation token's position */
                double sum = 0.0;
                for (int j = 0; j < in->n_cont && !rc; j++)
                    rc = add_token_logprob(m, (size_t)b * T + (size_t)(ctx_len - 1 + j), in->cont[j], row, &sum);
                logprob[order[k]] = sum;
            }
        if (!rc) olmo_eval_progress_tick(progress, row_start[r0 + nb], t->n);
    }
    free(order);
    free(row_start);
    free(tokens);
    free(row);
    return rc ? olmo_error_context("task '%s'", t->name) : 0;
}

static const struct olmo_eval_task *doc_task;
static int cmp_doc_cont(const void *a, const void *b) {
    const struct olmo_eval_instance *x = &doc_task->inst[*(const int *)a], *y = &doc_task->inst[*(const int *)b];
    if (x->doc_id != y->doc_id) return x->doc_id < y->doc_id ? -1 : 1;
    if (x->cont_id != y->cont_id) return x->cont_id < y->cont_id ? -1 : 1;
    return *(const int *)a - *(const int *)b;
}
struct doc_group {
    int start, end, first;
};
static int cmp_first(const void *a, const void *b) {
    return ((const struct doc_group *)a)->first - ((const struct doc_group *)b)->first;
}

int olmo_eval_documents(const struct olmo_eval_task *t, int **order, int **start, int *n_docs) {
    int *o = olmo_malloc(sizeof(int) * (size_t)(t->n + 1), "documents");
    int *st = olmo_malloc(sizeof(int) * (size_t)(t->n + 1), "documents");
    struct doc_group *g = olmo_malloc(sizeof *g * (size_t)(t->n + 1), "documents");
    int *o2 = olmo_malloc(sizeof(int) * (size_t)(t->n + 1), "documents");
    if (!o || !st || !g || !o2) {
        free(o), free(st), free(g), free(o2);
        return -1;
    }
    for (int i = 0; i < t->n; i++) o[i] = i;
    doc_task = t;
    qsort(o, (size_t)t->n, sizeof *o, cmp_doc_cont);
    int ng = 0;
    for (int k = 0; k < t->n; k++) {
        if (k == 0 || t->inst[o[k]].doc_id != t->inst[o[k - 1]].doc_id) g[ng++] = (struct doc_group){k, k, o[k]};
        g[ng - 1].end = k + 1;
        if (o[k] < g[ng - 1].first) g[ng - 1].first = o[k];
    }
    qsort(g, (size_t)ng, sizeof *g, cmp_first); /* documents in order of first appearance */
    int k = 0;
    for (int d = 0; d < ng; d++) {
        st[d] = k;
        for (int j = g[d].start; j < g[d].end; j++) o2[k++] = o[j];
    }
    st[ng] = k;
    free(o);
    free(g);
    *order = o2;
    *start = st;
    *n_docs = ng;
    return 0;
}

struct doc_acc {
    double correct, ce1, ce2, bpb1, bpb2, soft1, soft2, slog1, slog2;
};

/* One document's choices (instances idx[0..k), ordered by continuation id). */
static int score_doc(const struct olmo_eval_task *t, const double *lp, const int *idx, int k, struct doc_acc *a) {
    /* the label is the document's first request's (file order); with fast_mc the lowest continuation's */
    int first = idx[0];
    for (int c = 1; c < k && !t->fast_mc; c++)
        if (idx[c] < first) first = idx[c];
    const struct olmo_eval_instance *in0 = &t->inst[first];
    bool normed = t->metric != OLMO_METRIC_ACC;
    int label = in0->label;
    if (t->metric == OLMO_METRIC_BPB || t->metric == OLMO_METRIC_CE_LOSS) label = 0;
    if (label < 0 || label >= k)
        return olmo_error("task '%s' doc %ld: label %d but %d continuations", t->name, in0->doc_id, label, k);
    const struct olmo_eval_instance *g = NULL;
    int best = 0;
    float best_v = 0;
    double mx1 = -INFINITY, mx2 = -INFINITY;
    for (int c = 0; c < k; c++) {
        const struct olmo_eval_instance *in = &t->inst[idx[c]];
        if (in->cont_id == label) g = in;
        /* OLMo keeps the per-choice values in float32 tensors: argmax on them (first maximum wins) */
        float v = (float)(normed ? lp[idx[c]] / (double)in->chars : lp[idx[c]]);
        if (c == 0 || v > best_v) best = c, best_v = v;
        double l1 = (float)(normed ? lp[idx[c]] / (double)in->chars_nls : lp[idx[c]]);
        if ((double)v > mx2) mx2 = v;
        if (l1 > mx1) mx1 = l1;
    }
    if (!g) return olmo_error("task '%s' doc %ld: no continuation %d", t->name, in0->doc_id, label);
    double glp = lp[g - t->inst];
    a->correct = best == label;
    a->ce1 = -glp / (double)g->chars_nls;
    a->ce2 = -glp / (double)g->chars;
    a->bpb1 = -glp / (double)g->bytes_nls * LOG_2_OF_E;
    a->bpb2 = -glp / (double)g->bytes * LOG_2_OF_E;
    double s1 = 0, s2 = 0, g1 = 0, g2 = 0;
    for (int c = 0; c < k; c++) {
        const struct olmo_eval_instance *in = &t->inst[idx[c]];
        double l2 = (float)(normed ? lp[idx[c]] / (double)in->chars : lp[idx[c]]);
        double l1 = (float)(normed ? lp[idx[c]] / (double)in->chars_nls : lp[idx[c]]);
        s1 += exp(l1 - mx1);
        s2 += exp(l2 - mx2);
        if (in == g) g1 = l1, g2 = l2;
    }
    a->slog1 = g1 - mx1 - log(s1);
    a->slog2 = g2 - mx2 - log(s2);
    a->soft1 = exp(a->slog1);
    a->soft2 = exp(a->slog2);
    return 0;
}

int olmo_eval_metrics(const struct olmo_eval_task *t, const double *logprob, struct olmo_eval_result *r) {
    memset(r, 0, sizeof *r);
    r->metric = t->metric;
    int *order, *start, nd;
    if (olmo_eval_documents(t, &order, &start, &nd)) return -1;
    int rc = 0;
    double sum[9] = {0};
    int counted = 0;
    for (int d = 0; d < nd && !rc; d++) {
        const int *idx = order + start[d];
        int k = start[d + 1] - start[d];
        /* the continuation ids must be 0..k-1, else OLMo skips the document */
        if (t->inst[idx[k - 1]].cont_id >= k) continue;
        struct doc_acc a = {0};
        if ((rc = score_doc(t, logprob, idx, k, &a))) break;
        double v[9] = {a.correct, a.ce1, a.ce2, a.bpb1, a.bpb2, a.soft1, a.soft2, a.slog1, a.slog2};
        for (int j = 0; j < 9; j++) sum[j] += v[j];
        counted++;
    }
    free(order);
    free(start);
    if (rc) return rc;
    if (!counted) return olmo_error("task '%s': no complete document to score", t->name);
    r->n_docs = counted;
    r->acc = sum[0] / counted;
    r->ce_loss_v1 = sum[1] / counted, r->ce_loss_v2 = sum[2] / counted;
    r->bpb_v1 = sum[3] / counted, r->bpb_v2 = sum[4] / counted;
    r->soft_v1 = sum[5] / counted, r->soft_v2 = sum[6] / counted;
    r->soft_log_v1 = sum[7] / counted, r->soft_log_v2 = sum[8] / counted;
    return 0;
}

static void put(FILE *fp, const char *key, double v, bool *first) {
    fprintf(fp, "%s%s %.6g", *first ? "" : " | ", key, v);
    *first = false;
}

void olmo_eval_result_print(FILE *fp, const char *task, const struct olmo_eval_result *r, bool json) {
    bool first = true;
    const char *mn = olmo_metric_name(r->metric);
    if (json) {
        cJSON *rec = cJSON_CreateObject();
        cJSON_AddStringToObject(rec, "type", "downstream");
        cJSON_AddStringToObject(rec, "task", task);
        olmo_eval_result_add_json(rec, r);
        char *text = cJSON_PrintUnformatted(rec);
        cJSON_Delete(rec);
        if (text) fprintf(fp, "%s\n", text);
        free(text);
        return;
    }
    fprintf(fp, "%s (%s, %d docs): ", task, mn, r->n_docs);
    if (r->metric == OLMO_METRIC_BPB) {
        put(fp, "bpb_v1", r->bpb_v1, &first);
        put(fp, "bpb_v2", r->bpb_v2, &first);
    } else if (r->metric == OLMO_METRIC_CE_LOSS) {
        put(fp, "ce_loss_v1", r->ce_loss_v1, &first);
        put(fp, "ce_loss_v2", r->ce_loss_v2, &first);
    } else {
        char k1[32], k2[32];
        snprintf(k1, sizeof k1, "%s_v1", mn);
        snprintf(k2, sizeof k2, "%s_v2", mn);
        put(fp, k1, r->acc, &first);
        put(fp, k2, r->acc, &first);
        put(fp, "ce_loss_v1", r->ce_loss_v1, &first);
        put(fp, "ce_loss_v2", r->ce_loss_v2, &first);
        put(fp, "bpb_v1", r->bpb_v1, &first);
        put(fp, "bpb_v2", r->bpb_v2, &first);
        put(fp, "soft_v1", r->soft_v1, &first);
        put(fp, "soft_v2", r->soft_v2, &first);
        put(fp, "soft_log_v1", r->soft_log_v1, &first);
        put(fp, "soft_log_v2", r->soft_log_v2, &first);
    }
    fprintf(fp, "\n");
}

static void add_num(cJSON *rec, const char *key, double v) { olmo_json_add_num(rec, key, "%.17g", v); }

void olmo_eval_result_add_json(struct cJSON *rec, const struct olmo_eval_result *r) {
    const char *mn = olmo_metric_name(r->metric);
    cJSON_AddStringToObject(rec, "metric", mn);
    cJSON_AddNumberToObject(rec, "n", r->n_docs);
    if (r->metric == OLMO_METRIC_BPB) {
        add_num(rec, "bpb_v1", r->bpb_v1);
        add_num(rec, "bpb_v2", r->bpb_v2);
        return;
    }
    if (r->metric == OLMO_METRIC_CE_LOSS) {
        add_num(rec, "ce_loss_v1", r->ce_loss_v1);
        add_num(rec, "ce_loss_v2", r->ce_loss_v2);
        return;
    }
    char k[32];
    snprintf(k, sizeof k, "%s_v1", mn);
    add_num(rec, k, r->acc);
    snprintf(k, sizeof k, "%s_v2", mn);
    add_num(rec, k, r->acc);
    add_num(rec, "ce_loss_v1", r->ce_loss_v1);
    add_num(rec, "ce_loss_v2", r->ce_loss_v2);
    add_num(rec, "bpb_v1", r->bpb_v1);
    add_num(rec, "bpb_v2", r->bpb_v2);
    add_num(rec, "soft_v1", r->soft_v1);
    add_num(rec, "soft_v2", r->soft_v2);
    add_num(rec, "soft_log_v1", r->soft_log_v1);
    add_num(rec, "soft_log_v2", r->soft_log_v2);
}
