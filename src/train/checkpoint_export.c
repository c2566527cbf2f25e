/* Whole tensors under Hugging Face names, gathered a chunk at a time from
 * every rank's shard to rank 0, which writes one safetensors file: a
 * one-rank checkpoint's model.safetensors and optim.safetensors, and
 * olmo_ckpt_export_weights. */
#include "train/checkpoint.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "train/checkpoint_internal.h"
#include "util/error.h"

struct piece_table {
    struct olmo_shard_range *p; /* all ranks' pieces, concatenated */
    int *first, *count;         /* per rank */
};

static int gather_pieces(const struct olmo_trainer *tr, struct piece_table *t) {
    const struct olmo_dist *d = tr->dist;
    const int world = world_of(d);
    memset(t, 0, sizeof *t);
    void *recv = NULL;
    size_t *counts = calloc((size_t)world, sizeof *counts);
    if (!counts) return olmo_error("out of memory");
    int rc = olmo_dist_gather_bytes(or_one(d), tr->opt.ranges, sizeof *tr->opt.ranges * (size_t)saved_ranges(tr), 0, &recv,
                                    counts);
    if (!rc && rank_of(d) == 0) {
        t->p = recv;
        recv = NULL;
        t->first = calloc((size_t)world, sizeof(int));
        t->count = calloc((size_t)world, sizeof(int));
        if (!t->first || !t->count) rc = olmo_error("out of memory");
        for (int r = 0, at = 0; r < world && !rc; r++) {
            t->first[r] = at;
            t->count[r] = (int)(counts[r] / sizeof *t->p);
            at += t->count[r];
        }
    }
    free(recv);
    free(counts);
    return rc;
}

static void free_pieces(struct piece_table *t) {
    free(t->p);
    free(t->first);
    free(t->count);
    memset(t, 0, sizeof *t);
}

struct gather_buf {
    float *send, *out;
};

/* The parts of flat [g0, g1) this rank holds, packed in piece order. */
static int pack_range(const struct olmo_trainer *tr, const float *src, size_t g0, size_t g1, float *send, size_t *n) {
    const struct olmo_backend *be = tr->model.be;
    *n = 0;
    for (int i = 0; i < saved_ranges(tr); i++) {
        const struct olmo_shard_range *r = &tr->opt.ranges[i];
        const size_t a = r->global > g0 ? r->global : g0, b = r->global + r->len < g1 ? r->global + r->len : g1;
        if (a >= b) continue;
        if (be->to_host(be, send + *n, src + r->local + (a - r->global), (b - a) * sizeof(float))) return -1;
        *n += b - a;
    }
    return 0;
}

/* Root: places every rank's packed parts of [g0, g1) into out. */
static int unpack_range(const struct piece_table *t, int world, const float *recv, const size_t *counts, size_t g0,
                        size_t g1, float *out) {
    size_t at = 0, covered = 0;
    for (int r = 0; r < world; r++) {
        size_t used = 0;
        for (int i = 0; i < t->count[r]; i++) {
            const struct olmo_shard_range *p = &t->p[t->first[r] + i];
            const size_t a = p->global > g0 ? p->global : g0, b = p->global + p->len < g1 ? p->global + p->len : g1;
            if (a >= b) continue;
            if ((used + b - a) * sizeof(float) > counts[r])
                return olmo_error("internal: rank %d sent fewer values than its pieces hold", r);
            memcpy(out + (a - g0), recv + at + used, (b - a) * sizeof(float));
            used += b - a;
            covered += b - a;
        }
        at += counts[r] / sizeof(float);
    }
    if (covered != g1 - g0)
        return olmo_error("the ranks' shards hold %zu of the %zu values of flat parameters [%zu, %zu): they do not "
                          "tile the parameters",
                          covered, g1 - g0, g0, g1);
    return 0;
}

/* Streams the tensors of one quantity, under Hugging Face names (+ suffix),
 * in parameter order, into s (root only): for each chunk of a tensor every
 * rank sends root the parts its pieces hold, so no rank holds more than a
 * chunk beyond its shard.  all_pieces: every rank's pieces (root only),
 * by rank.  Collective; errors are carried to the end so every rank joins
 * every gather. */
static int stream_quantity(const struct olmo_trainer *tr, const struct piece_table *t, int q, struct gather_buf *gb,
                           struct olmo_st_stream *s, int rc) {
    const struct olmo_model *m = &tr->model;
    const struct olmo_dist *d = tr->dist;
    const int world = world_of(d), root = rank_of(d) == 0;
    const float *src = q_buffer(tr, q);
    size_t *counts = calloc((size_t)world, sizeof *counts);
    if (!counts) return olmo_error("out of memory"); /* a few bytes: the job is lost anyway */
    for (int i = 0; i < m->n_tensors; i++) {
        const struct olmo_param *p = &m->params[i];
        for (size_t c = 0; c < p->numel; c += CHUNK_FLOATS) {
            const size_t g0 = p->offset + c, g1 = g0 + (p->numel - c < CHUNK_FLOATS ? p->numel - c : CHUNK_FLOATS);
            size_t n = 0;
            if (!rc) rc = pack_range(tr, src, g0, g1, gb->send, &n);
            void *recv = NULL;
            if (olmo_dist_gather_bytes(or_one(d), gb->send, n * sizeof(float), 0, &recv, counts)) rc = -1;
            if (root && !rc) rc = unpack_range(t, world, recv, counts, g0, g1, gb->out);
            if (root && !rc) rc = olmo_st_stream_write(s, gb->out, (g1 - g0) * sizeof(float));
            free(recv);
        }
    }
    free(counts);
    return rc;
}

static int declare_quantity(struct olmo_st_writer *w, const struct olmo_model *m, int q) {
    for (int i = 0; i < m->n_tensors; i++) {
        const struct olmo_param *p = &m->params[i];
        int64_t shape[2] = {p->rows, p->cols};
        char name[200];
        snprintf(name, sizeof name, "%s%s", p->name, q_suffix[q]);
        if (olmo_st_writer_declare(w, name, OLMO_ST_F32, p->cols == 1 ? 1 : 2, shape)) return -1;
    }
    return 0;
}

/* A safetensors file of whole tensors (Hugging Face names) gathered from every
 * rank's shard: the weights (q_list {Q_MASTER}) or the optimizer moments
 * ({Q_M, Q_V} and "step").  Collective; root writes path. */
int ckpt_write_gathered(const struct olmo_trainer *tr, const int *q_list, int n_q, const struct olmo_ckpt_state *st,
                        const char *path,
                        struct written *out) {
    const bool root = rank_of(tr->dist) == 0;
    struct piece_table t;
    struct gather_buf gb = {0};
    struct olmo_st_writer w = {0};
    struct olmo_st_stream s = {0};
    struct ckpt_hash hs = {0};
    s.fd = -1;
    int rc = gather_pieces(tr, &t);
    gb.send = malloc(CHUNK_FLOATS * sizeof(float));
    if (root) gb.out = malloc(CHUNK_FLOATS * sizeof(float));
    if (!gb.send || (root && !gb.out)) rc = olmo_error("out of memory writing '%s'", path);
    const bool with_step = st != NULL;
    if (root && !rc && st) { /* the run state, under the content hash, as a shard records it */
        char *state = ckpt_state_record(st);
        rc = !state || olmo_st_writer_set_metadata(&w, "state", state);
        free(state);
    }
    if (root && !rc) {
        for (int k = 0; k < n_q && !rc; k++) rc = declare_quantity(&w, &tr->model, q_list[k]);
        int64_t one = 1;
        if (!rc && with_step) rc = olmo_st_writer_declare(&w, "step", OLMO_ST_I64, 1, &one);
        if (!rc) rc = ckpt_stream_begin_hashed(&s, &w, &hs, path, &out->bytes);
    }
    for (int k = 0; k < n_q; k++) rc = stream_quantity(tr, &t, q_list[k], &gb, &s, rc);
    if (root && !rc && with_step) {
        int64_t step = tr->opt.step;
        rc = olmo_st_stream_write(&s, &step, sizeof step);
    }
    if (root && !rc) rc = olmo_st_stream_finish(&s);
    if (root && rc) olmo_st_stream_abort(&s);
    if (root && !rc) out->hash = ckpt_hash_end(&hs);
    ckpt_hash_free(&hs);
    olmo_st_writer_free(&w);
    free(gb.send);
    free(gb.out);
    free_pieces(&t);
    return rc;
}

int ckpt_write_whole_host(const struct olmo_model *m, const float *const *host, const int *q_list, int n_q,
                          const struct olmo_ckpt_state *st, int64_t step, const char *path, struct written *out) {
    struct olmo_st_writer w = {0};
    struct olmo_st_stream s = {0};
    struct ckpt_hash hs = {0};
    s.fd = -1;
    int rc = 0;
    if (st) { /* the run state, under the content hash, as ckpt_write_gathered records it */
        char *state = ckpt_state_record(st);
        rc = !state || olmo_st_writer_set_metadata(&w, "state", state);
        free(state);
    }
    for (int k = 0; k < n_q && !rc; k++) rc = declare_quantity(&w, m, q_list[k]);
    int64_t one = 1;
    if (!rc && st) rc = olmo_st_writer_declare(&w, "step", OLMO_ST_I64, 1, &one);
    if (!rc) rc = ckpt_stream_begin_hashed(&s, &w, &hs, path, &out->bytes);
    for (int k = 0; k < n_q && !rc; k++)
        for (int i = 0; i < m->n_tensors && !rc; i++)
            rc = olmo_st_stream_write(&s, host[k] + m->params[i].offset, m->params[i].numel * sizeof(float));
    if (!rc && st) rc = olmo_st_stream_write(&s, &step, sizeof step);
    if (!rc) rc = olmo_st_stream_finish(&s);
    else olmo_st_stream_abort(&s);
    if (!rc) out->hash = ckpt_hash_end(&hs);
    ckpt_hash_free(&hs);
    olmo_st_writer_free(&w);
    return rc;
}

int olmo_ckpt_export_weights(const struct olmo_trainer *tr, const char *path) {
    const int q = Q_MASTER;
    struct written wr;
    int rc = ckpt_write_gathered(tr, &q, 1, NULL, path, &wr);
    return ckpt_agree(tr->dist, rc, "writing the weights");
}
