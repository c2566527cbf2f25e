#include "backend/profile.h"
#include "util/clock.h"

#include <stdbool.h>
#include <stdlib.h>

#include "util/error.h"

enum {
    P_GEMM, P_EMBED, P_RMSNORM_FWD, P_RMSNORM_BWD, P_ROPE, P_ATTN_FWD, P_ATTN_BWD, P_SWIGLU_FWD, P_SWIGLU_BWD, P_ADD, P_CE,
    P_OPTIM, P_COPY, P_COUNT
};
static const char *const names[P_COUNT] = {"gemm",          "embedding",     "rmsnorm fwd",   "rmsnorm bwd",
                                           "rope",          "attention fwd", "attention bwd", "swiglu fwd",
                                           "swiglu bwd",    "add",           "cross-entropy", "optimizer + norm",
                                           "copy/zero/convert"};
/* per GEMM shape: the first MAX_SHAPES distinct (m, n, k, ta, tb, beta != 0) */
enum { MAX_SHAPES = 64 };
struct shape_stat {
    int m, n, k, ta, tb, beta;
    long calls;
    double seconds;
};

/* The wrapper instance's state: the inner instance and the counters. */
struct prof {
    const struct olmo_backend *in;
    bool enabled;
    double seconds[P_COUNT], gemm_flops;
    long calls[P_COUNT];
    /* attention's model FLOPs and the seconds of the calls they were counted for (no document masking) */
    double attn_flops[2], attn_counted_seconds[2];
    long attn_uncounted;
    struct shape_stat shapes[MAX_SHAPES];
    int n_shapes;
};
#define PROF(be) ((struct prof *)(be)->state)

/* A device runs ops asynchronously: wait for the queue before reading the clock, on both sides. */
static double clock_after_queue(const struct prof *p) {
    if (p->in->synchronize) p->in->synchronize(p->in);
    return olmo_now_seconds();
}

/* rc = the inner op, timed into slot when enabled */
#define TIMED(slot, call)                                   \
    struct prof *p_ = PROF(be);                             \
    const struct olmo_backend *in = p_->in;                 \
    int rc;                                                 \
    do {                                                    \
        if (!p_->enabled) {                                 \
            rc = call;                                      \
            break;                                          \
        }                                                   \
        const double t0_ = clock_after_queue(p_);           \
        rc = call;                                          \
        p_->seconds[slot] += clock_after_queue(p_) - t0_;   \
        p_->calls[slot]++;                                  \
    } while (0)

static int p_zero(OLMO_BE, void *p, size_t bytes) {
    TIMED(P_COPY, in->zero(in, p, bytes));
    return rc;
}
static int p_copy(OLMO_BE, void *dst, const void *src, size_t bytes) {
    TIMED(P_COPY, in->copy(in, dst, src, bytes));
    return rc;
}
static int p_convert(OLMO_BE, void *dst, enum olmo_float_type dst_type, const void *src, enum olmo_float_type src_type,
                     size_t n) {
    TIMED(P_COPY, in->convert(in, dst, dst_type, src, src_type, n));
    return rc;
}

static void count_gemm(struct prof *p, bool ta, bool tb, int m, int n, int k, bool accumulate, double t) {
    p->gemm_flops += 2.0 * m * n * (double)k;
    struct shape_stat key = {m, n, k, ta, tb, accumulate, 0, 0.0};
    int i = 0;
    while (i < p->n_shapes && !(p->shapes[i].m == m && p->shapes[i].n == n && p->shapes[i].k == k &&
                                p->shapes[i].ta == ta && p->shapes[i].tb == tb && p->shapes[i].beta == key.beta))
        i++;
    if (i == p->n_shapes && p->n_shapes < MAX_SHAPES) p->shapes[p->n_shapes++] = key;
    if (i < p->n_shapes) {
        p->shapes[i].calls++;
        p->shapes[i].seconds += t;
    }
}

static int p_gemm(OLMO_BE, bool ta, bool tb, int m, int n, int k, float alpha, const void *a, enum olmo_float_type a_type,
                  int lda, const void *b, enum olmo_float_type b_type, int ldb, float beta, float *c, int ldc) {
    const double before = PROF(be)->seconds[P_GEMM];
    TIMED(P_GEMM, in->gemm(in, ta, tb, m, n, k, alpha, a, a_type, lda, b, b_type, ldb, beta, c, ldc));
    if (p_->enabled) count_gemm(p_, ta, tb, m, n, k, beta != 0.0f, p_->seconds[P_GEMM] - before);
    return rc;
}

static int p_embedding_fwd(OLMO_BE, float *out, const float *table, const int32_t *tokens, int n, int dim) {
    TIMED(P_EMBED, in->embedding_fwd(in, out, table, tokens, n, dim));
    return rc;
}
static int p_embedding_bwd(OLMO_BE, float *dtable, const float *dout, const int32_t *tokens, int n, int dim) {
    TIMED(P_EMBED, in->embedding_bwd(in, dtable, dout, tokens, n, dim));
    return rc;
}
static int p_embedding_bwd_ids(OLMO_BE, float *dtable, const float *dout, const int32_t *host_tokens, int n,
                               int dim) {
    TIMED(P_EMBED, in->embedding_bwd_ids(in, dtable, dout, host_tokens, n, dim));
    return rc;
}
static int p_rmsnorm_fwd(OLMO_BE, float *y, float *rstd, const float *x, const float *w, int n, int dim, float eps) {
    TIMED(P_RMSNORM_FWD, in->rmsnorm_fwd(in, y, rstd, x, w, n, dim, eps));
    return rc;
}
static int p_rmsnorm_bwd(OLMO_BE, float *dx, float *dw, const float *dy, const float *x, const float *w,
                         const float *rstd, int n, int dim) {
    TIMED(P_RMSNORM_BWD, in->rmsnorm_bwd(in, dx, dw, dy, x, w, rstd, n, dim));
    return rc;
}
static int p_rope_fwd(OLMO_BE, float *x, const float *c, const float *s, int rows, int seq, int heads, int hd) {
    TIMED(P_ROPE, in->rope_fwd(in, x, c, s, rows, seq, heads, hd));
    return rc;
}
static int p_rope_bwd(OLMO_BE, float *x, const float *c, const float *s, int rows, int seq, int heads, int hd) {
    TIMED(P_ROPE, in->rope_bwd(in, x, c, s, rows, seq, heads, hd));
    return rc;
}
double olmo_attention_visible_pairs(const struct olmo_attn_shape *s) {
    const double T = s->seq_len, w = s->window > 0 && s->window < s->seq_len ? s->window : s->seq_len;
    return (double)s->batch * (w * (w + 1) / 2.0 + (T - w) * w);
}

/* Model FLOPs as olmo_model_flops_per_token counts them: 2 products of 2 FLOPs per pair, head and
 * head_dim element forward (S = QK^T, PV), twice that backward.  Document masking hides pairs that
 * only the device knows (doc_ids is device memory), so those calls are timed but not counted. */
static void count_attention(struct prof *p, int pass, const int32_t *doc_ids, const struct olmo_attn_shape *s,
                            double t) {
    if (doc_ids) {
        p->attn_uncounted++;
        return;
    }
    p->attn_flops[pass] += (pass ? 8.0 : 4.0) * olmo_attention_visible_pairs(s) * s->n_heads * s->head_dim;
    p->attn_counted_seconds[pass] += t;
}

static int p_attention_fwd(OLMO_BE, float *out, float *lse, const float *q, const float *k, const float *v,
                           const int32_t *doc_ids, const struct olmo_attn_shape *s) {
    const double before = PROF(be)->seconds[P_ATTN_FWD];
    TIMED(P_ATTN_FWD, in->attention_fwd(in, out, lse, q, k, v, doc_ids, s));
    if (p_->enabled) count_attention(p_, 0, doc_ids, s, p_->seconds[P_ATTN_FWD] - before);
    return rc;
}
static int p_attention_bwd(OLMO_BE, float *dq, float *dk, float *dv, const float *dout, const float *out,
                           const float *lse, const float *q, const float *k, const float *v, const int32_t *doc_ids,
                           const struct olmo_attn_shape *s) {
    const double before = PROF(be)->seconds[P_ATTN_BWD];
    TIMED(P_ATTN_BWD, in->attention_bwd(in, dq, dk, dv, dout, out, lse, q, k, v, doc_ids, s));
    if (p_->enabled) count_attention(p_, 1, doc_ids, s, p_->seconds[P_ATTN_BWD] - before);
    return rc;
}
static int p_swiglu_fwd(OLMO_BE, float *s, const float *g, const float *u, size_t n) {
    TIMED(P_SWIGLU_FWD, in->swiglu_fwd(in, s, g, u, n));
    return rc;
}
static int p_swiglu_bwd(OLMO_BE, float *dg, float *du, const float *ds, const float *g, const float *u, size_t n) {
    TIMED(P_SWIGLU_BWD, in->swiglu_bwd(in, dg, du, ds, g, u, n));
    return rc;
}
static int p_add(OLMO_BE, float *y, const float *a, const float *b, size_t n) {
    TIMED(P_ADD, in->add(in, y, a, b, n));
    return rc;
}
static int p_cross_entropy(OLMO_BE, float *logits, const int32_t *targets, int n, int vocab, float grad_scale,
                           float z_mult, double *ce_sum, double *z_sum) {
    TIMED(P_CE, in->cross_entropy(in, logits, targets, n, vocab, grad_scale, z_mult, ce_sum, z_sum));
    return rc;
}
static int p_cross_entropy_bf16(OLMO_BE, float *logits, void *dlogits, size_t ld, const int32_t *targets, int n,
                                int vocab, float grad_scale, float z_mult, int row0, int n_total, double *ce_sum,
                                double *z_sum) {
    TIMED(P_CE, in->cross_entropy_bf16(in, logits, dlogits, ld, targets, n, vocab, grad_scale, z_mult, row0, n_total,
                                       ce_sum, z_sum));
    return rc;
}
static int p_swiglu_fwd_bf16(OLMO_BE, void *s, const float *g, const float *u, size_t n) {
    TIMED(P_SWIGLU_FWD, in->swiglu_fwd_bf16(in, s, g, u, n));
    return rc;
}
static int p_swiglu_bwd_bf16(OLMO_BE, void *dg, void *du, const float *ds, const float *g, const float *u, size_t n) {
    TIMED(P_SWIGLU_BWD, in->swiglu_bwd_bf16(in, dg, du, ds, g, u, n));
    return rc;
}
static int p_rmsnorm_bwd_bf16(OLMO_BE, void *dx, float *dw, const float *dy, const float *x, const float *w,
                              const float *rstd, int n, int dim) {
    TIMED(P_RMSNORM_BWD, in->rmsnorm_bwd_bf16(in, dx, dw, dy, x, w, rstd, n, dim));
    return rc;
}
/* counted as a norm: the add is a pass over what the norm writes */
static int p_rmsnorm_add_fwd(OLMO_BE, float *y, float *rstd, const float *resid, const float *x, const float *w, int n,
                             int dim, float eps) {
    TIMED(P_RMSNORM_FWD, in->rmsnorm_add_fwd(in, y, rstd, resid, x, w, n, dim, eps));
    return rc;
}
static int p_sum_squares(OLMO_BE, const float *x, size_t n, double *out) {
    TIMED(P_OPTIM, in->sum_squares(in, x, n, out));
    return rc;
}
static int p_scale(OLMO_BE, float *x, size_t n, float s) {
    TIMED(P_OPTIM, in->scale(in, x, n, s));
    return rc;
}
static int p_adamw(OLMO_BE, float *param, const float *grad, float *m, float *v, size_t n, double lr, float beta1,
                   float beta2, float eps, double weight_decay, long step) {
    TIMED(P_OPTIM, in->adamw(in, param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, step));
    return rc;
}

/* The untimed ops forward to the inner instance. */
static const char *p_describe(OLMO_BE) { return PROF(be)->in->describe ? PROF(be)->in->describe(PROF(be)->in) : NULL; }
static void *p_alloc(OLMO_BE, size_t bytes) { return PROF(be)->in->alloc(PROF(be)->in, bytes); }
static void p_free(OLMO_BE, void *ptr) { PROF(be)->in->free(PROF(be)->in, ptr); }
static void p_mem_stats(OLMO_BE, struct olmo_mem_stats *out) { PROF(be)->in->mem_stats(PROF(be)->in, out); }
static void *p_host_alloc(OLMO_BE, size_t bytes) { return PROF(be)->in->host_alloc(PROF(be)->in, bytes); }
static void p_host_free(OLMO_BE, void *p) { PROF(be)->in->host_free(PROF(be)->in, p); }
static int p_to_device(OLMO_BE, void *dst, const void *src, size_t bytes) {
    return PROF(be)->in->to_device(PROF(be)->in, dst, src, bytes);
}
static int p_to_host(OLMO_BE, void *dst, const void *src, size_t bytes) {
    return PROF(be)->in->to_host(PROF(be)->in, dst, src, bytes);
}
static int p_synchronize(OLMO_BE) { return PROF(be)->in->synchronize(PROF(be)->in); }
static int p_check_attention(OLMO_BE, const struct olmo_attn_shape *s) {
    return PROF(be)->in->check_attention(PROF(be)->in, s);
}
static int p_attention_cached(OLMO_BE, float *out, const float *q, const float *k_cache, const float *v_cache, int n,
                              int pos0, int cap, const struct olmo_attn_shape *s) {
    return PROF(be)->in->attention_cached(PROF(be)->in, out, q, k_cache, v_cache, n, pos0, cap, s);
}
static int p_comm_init(OLMO_BE, const struct olmo_dist *dist) { return PROF(be)->in->comm_init(PROF(be)->in, dist); }
static int p_comm_allreduce_sum(OLMO_BE, float *buf, size_t n) {
    return PROF(be)->in->comm_allreduce_sum(PROF(be)->in, buf, n);
}
static int p_comm_allgather(OLMO_BE, float *buf, const size_t *offsets) {
    return PROF(be)->in->comm_allgather(PROF(be)->in, buf, offsets);
}
static void p_comm_destroy(OLMO_BE) { PROF(be)->in->comm_destroy(PROF(be)->in); }
static void *p_comm_group_create(OLMO_BE, const struct olmo_dist *group) {
    return PROF(be)->in->comm_group_create(PROF(be)->in, group);
}
static int p_comm_group_allgather(OLMO_BE, void *comm, void *buf, size_t n) {
    return PROF(be)->in->comm_group_allgather(PROF(be)->in, comm, buf, n);
}
static int p_comm_group_reduce_scatter(OLMO_BE, void *comm, const float *in, float *out, size_t n) {
    return PROF(be)->in->comm_group_reduce_scatter(PROF(be)->in, comm, in, out, n);
}
static int p_comm_group_allreduce_sum(OLMO_BE, void *comm, float *buf, size_t n) {
    return PROF(be)->in->comm_group_allreduce_sum(PROF(be)->in, comm, buf, n);
}
static void p_comm_group_destroy(OLMO_BE, void *comm) { PROF(be)->in->comm_group_destroy(PROF(be)->in, comm); }
static int p_side_begin(OLMO_BE) { return PROF(be)->in->side_begin(PROF(be)->in); }
static int p_side_end(OLMO_BE, int slot) { return PROF(be)->in->side_end(PROF(be)->in, slot); }
static int p_side_wait(OLMO_BE, int slot) { return PROF(be)->in->side_wait(PROF(be)->in, slot); }
static int p_adamw_flat(OLMO_BE, float *param, const float *grad, float *m, float *v, size_t n, double lr,
                        float beta1, float beta2, float eps, const struct olmo_adamw_flat *f, long step) {
    TIMED(P_OPTIM, in->adamw_flat(in, param, grad, m, v, n, lr, beta1, beta2, eps, f, step));
    return rc;
}
static int p_loss_sums(OLMO_BE, double *ce_sum, double *z_sum) {
    return PROF(be)->in->loss_sums(PROF(be)->in, ce_sum, z_sum);
}
static int p_grad_begin(OLMO_BE) { return PROF(be)->in->grad_begin(PROF(be)->in); }
static int p_grad_end(OLMO_BE, int slot) { return PROF(be)->in->grad_end(PROF(be)->in, slot); }
static int p_grad_wait(OLMO_BE, int slot) { return PROF(be)->in->grad_wait(PROF(be)->in, slot); }

static void p_destroy(struct olmo_backend *be) {
    free(be->state);
    be->state = NULL;
}

struct olmo_backend *olmo_backend_profiled(const struct olmo_backend *inner) {
    struct olmo_backend *be = olmo_calloc(1, sizeof *be, "profiled backend");
    struct prof *p = be ? olmo_calloc(1, sizeof *p, "profile counters") : NULL;
    if (!p) {
        free(be);
        return NULL;
    }
    p->in = inner;
    p->enabled = true;
    /* the inner instance's optional ops stay optional (NULL) in the wrapper */
    *be = (struct olmo_backend){
        .name = inner->name, /* callers dispatch on it */
        .device = inner->device,
        .host_memory = inner->host_memory, .state = p, .compute_dtype = inner->compute_dtype, .destroy = p_destroy,
        .convert = p_convert,
        .describe = inner->describe ? p_describe : NULL, .alloc = p_alloc, .free = p_free,
        .mem_stats = inner->mem_stats ? p_mem_stats : NULL,
        .host_alloc = inner->host_alloc ? p_host_alloc : NULL, .host_free = inner->host_free ? p_host_free : NULL,
        .to_device = p_to_device, .to_host = p_to_host, .zero = p_zero, .copy = p_copy,
        .check_attention = inner->check_attention ? p_check_attention : NULL,
        .synchronize = inner->synchronize ? p_synchronize : NULL, .gemm = p_gemm,
        .embedding_fwd = p_embedding_fwd, .embedding_bwd = p_embedding_bwd, .rmsnorm_fwd = p_rmsnorm_fwd,
        .rmsnorm_bwd = p_rmsnorm_bwd, .rope_fwd = p_rope_fwd, .rope_bwd = p_rope_bwd,
        .attention_fwd = p_attention_fwd, .attention_bwd = p_attention_bwd, .swiglu_fwd = p_swiglu_fwd,
        .swiglu_bwd = p_swiglu_bwd, .add = p_add, .cross_entropy = p_cross_entropy, .sum_squares = p_sum_squares,
        .scale = p_scale, .adamw = p_adamw,
        .cross_entropy_bf16 = inner->cross_entropy_bf16 ? p_cross_entropy_bf16 : NULL,
        .swiglu_fwd_bf16 = inner->swiglu_fwd_bf16 ? p_swiglu_fwd_bf16 : NULL,
        .rmsnorm_add_fwd = inner->rmsnorm_add_fwd ? p_rmsnorm_add_fwd : NULL,
        .swiglu_bwd_bf16 = inner->swiglu_bwd_bf16 ? p_swiglu_bwd_bf16 : NULL,
        .rmsnorm_bwd_bf16 = inner->rmsnorm_bwd_bf16 ? p_rmsnorm_bwd_bf16 : NULL,
        .attention_cached = inner->attention_cached ? p_attention_cached : NULL,
        .comm_init = inner->comm_init ? p_comm_init : NULL,
        .comm_allreduce_sum = inner->comm_allreduce_sum ? p_comm_allreduce_sum : NULL,
        .comm_allgather = inner->comm_allgather ? p_comm_allgather : NULL,
        .comm_destroy = inner->comm_destroy ? p_comm_destroy : NULL,
        .comm_group_create = inner->comm_group_create ? p_comm_group_create : NULL,
        .comm_group_allgather = inner->comm_group_allgather ? p_comm_group_allgather : NULL,
        .comm_group_reduce_scatter = inner->comm_group_reduce_scatter ? p_comm_group_reduce_scatter : NULL,
        .comm_group_allreduce_sum = inner->comm_group_allreduce_sum ? p_comm_group_allreduce_sum : NULL,
        .comm_group_destroy = inner->comm_group_destroy ? p_comm_group_destroy : NULL,
        .side_begin = inner->side_begin ? p_side_begin : NULL, .side_end = inner->side_end ? p_side_end : NULL,
        .side_wait = inner->side_wait ? p_side_wait : NULL,
        .grad_begin = inner->grad_begin ? p_grad_begin : NULL, .grad_end = inner->grad_end ? p_grad_end : NULL,
        .grad_wait = inner->grad_wait ? p_grad_wait : NULL,
        .embedding_bwd_ids = inner->embedding_bwd_ids ? p_embedding_bwd_ids : NULL,
        .loss_sums = inner->loss_sums ? p_loss_sums : NULL,
        .adamw_flat = inner->adamw_flat ? p_adamw_flat : NULL};
    return be;
}

void olmo_profile_enable(const struct olmo_backend *profiled, bool on) { PROF(profiled)->enabled = on; }

void olmo_profile_reset(const struct olmo_backend *profiled) {
    struct prof *p = PROF(profiled);
    for (int i = 0; i < P_COUNT; i++) {
        p->seconds[i] = 0.0;
        p->calls[i] = 0;
    }
    p->gemm_flops = 0.0;
    p->n_shapes = 0;
    for (int pass = 0; pass < 2; pass++) p->attn_flops[pass] = p->attn_counted_seconds[pass] = 0.0;
    p->attn_uncounted = 0;
}

void olmo_profile_report(const struct olmo_backend *profiled, FILE *out) {
    const struct prof *p = PROF(profiled);
    double total = 0.0;
    for (int i = 0; i < P_COUNT; i++) total += p->seconds[i];
    fprintf(out, "profile: %-18s %8s %9s %6s\n", "op", "calls", "seconds", "share");
    for (int i = 0; i < P_COUNT; i++)
        fprintf(out, "profile: %-18s %8ld %9.3f %5.1f%%\n", names[i], p->calls[i], p->seconds[i],
                total > 0 ? 100.0 * p->seconds[i] / total : 0.0);
    for (int i = 0; i < p->n_shapes; i++) {
        const struct shape_stat *g = &p->shapes[i];
        fprintf(out, "profile:   gemm m %5d n %5d k %5d %c%c%s %5ld calls %8.3f s %6.1f GFLOP/s\n", g->m, g->n, g->k,
                g->ta ? 'T' : 'N', g->tb ? 'T' : 'N', g->beta ? " +C" : "   ", g->calls, g->seconds,
                g->seconds > 0 ? 2.0 * g->m * g->n * (double)g->k * g->calls / g->seconds * 1e-9 : 0.0);
    }
    fprintf(out, "profile: gemm %.1f GFLOP/s over %.3g FLOP; ops total %.3f s\n",
            p->seconds[P_GEMM] > 0 ? p->gemm_flops / p->seconds[P_GEMM] * 1e-9 : 0.0, p->gemm_flops, total);
    for (int pass = 0; pass < 2; pass++) {
        if (p->attn_flops[pass] <= 0) continue;
        const double secs = p->attn_counted_seconds[pass], rate = secs > 0 ? p->attn_flops[pass] / secs : 0.0;
        fprintf(out, "profile: attention %s %.1f GFLOP/s over %.3g model FLOP (%d x visible pairs x heads x "
                "head_dim)\n", pass ? "bwd" : "fwd", rate * 1e-9, p->attn_flops[pass], pass ? 8 : 4);
    }
    if (p->attn_uncounted)
        fprintf(out, "profile: attention: %ld calls with document masking are timed, not in GFLOP/s\n",
                p->attn_uncounted);
}
