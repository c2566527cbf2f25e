#include "backend/profile.h"
#include "util/clock.h"

#include <stdbool.h>

enum {
    P_GEMM, P_EMBED, P_RMSNORM, P_ROPE, P_ATTN_FWD, P_ATTN_BWD, P_SWIGLU, P_ADD, P_CE, P_OPTIM, P_COPY, P_COUNT
};
static const char *const names[P_COUNT] = {"gemm", "embedding", "rmsnorm", "rope", "attention fwd", "attention bwd",
                                           "swiglu", "add", "cross-entropy", "optimizer + norm", "copy/zero"};
static double seconds[P_COUNT], gemm_flops;
static long calls[P_COUNT];
/* attention's model FLOPs and the seconds of the calls they were counted for (no document masking) */
static double attn_flops[2], attn_counted_seconds[2];
static long attn_uncounted;
static const struct olmo_backend *in;
static bool enabled = true;

/* A device runs ops asynchronously: wait for the queue before reading the clock, on both sides. */
static double clock_after_queue(void) {
    if (in->synchronize) in->synchronize();
    return olmo_now_seconds();
}

#define TIMED(slot, call)                                   \
    do {                                                    \
        if (!enabled) {                                     \
            call;                                           \
            break;                                          \
        }                                                   \
        const double t0_ = clock_after_queue();             \
        call;                                               \
        seconds[slot] += clock_after_queue() - t0_;         \
        calls[slot]++;                                      \
    } while (0)

static void p_zero(void *p, size_t bytes) { TIMED(P_COPY, in->zero(p, bytes)); }
static void p_copy(void *dst, const void *src, size_t bytes) { TIMED(P_COPY, in->copy(dst, src, bytes)); }

/* per GEMM shape: the first MAX_SHAPES distinct (m, n, k, ta, tb, beta != 0) */
enum { MAX_SHAPES = 64 };
static struct shape_stat {
    int m, n, k, ta, tb, beta;
    long calls;
    double seconds;
} shapes[MAX_SHAPES];
static int n_shapes;

static void p_gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float *a, int lda, const float *b,
                   int ldb, float beta, float *c, int ldc) {
    if (!enabled) {
        in->gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
    const double t0 = clock_after_queue();
    in->gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    const double t = clock_after_queue() - t0;
    seconds[P_GEMM] += t;
    calls[P_GEMM]++;
    gemm_flops += 2.0 * m * n * (double)k;
    struct shape_stat key = {m, n, k, ta, tb, beta != 0.0f, 0, 0.0};
    int i = 0;
    while (i < n_shapes && !(shapes[i].m == m && shapes[i].n == n && shapes[i].k == k && shapes[i].ta == ta &&
                             shapes[i].tb == tb && shapes[i].beta == key.beta))
        i++;
    if (i == n_shapes && n_shapes < MAX_SHAPES) shapes[n_shapes++] = key;
    if (i < n_shapes) {
        shapes[i].calls++;
        shapes[i].seconds += t;
    }
}

static void p_embedding_fwd(float *out, const float *table, const int32_t *tokens, int n, int dim) {
    TIMED(P_EMBED, in->embedding_fwd(out, table, tokens, n, dim));
}
static void p_embedding_bwd(float *dtable, const float *dout, const int32_t *tokens, int n, int dim) {
    TIMED(P_EMBED, in->embedding_bwd(dtable, dout, tokens, n, dim));
}
static void p_rmsnorm_fwd(float *y, float *rstd, const float *x, const float *w, int n, int dim, float eps) {
    TIMED(P_RMSNORM, in->rmsnorm_fwd(y, rstd, x, w, n, dim, eps));
}
static void p_rmsnorm_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w, const float *rstd,
                          int n, int dim) {
    TIMED(P_RMSNORM, in->rmsnorm_bwd(dx, dw, dy, x, w, rstd, n, dim));
}
static void p_rope_fwd(float *x, const float *c, const float *s, int rows, int seq, int heads, int hd) {
    TIMED(P_ROPE, in->rope_fwd(x, c, s, rows, seq, heads, hd));
}
static void p_rope_bwd(float *x, const float *c, const float *s, int rows, int seq, int heads, int hd) {
    TIMED(P_ROPE, in->rope_bwd(x, c, s, rows, seq, heads, hd));
}
/* Query-key pairs that attention computes: sum over positions t of the keys t sees, min(t + 1, window). */
static double visible_pairs(const struct olmo_attn_shape *s) {
    const double T = s->seq_len, w = s->window > 0 && s->window < s->seq_len ? s->window : s->seq_len;
    return (double)s->batch * (w * (w + 1) / 2.0 + (T - w) * w);
}

/* Model FLOPs as olmo_model_flops_per_token counts them: 2 products of 2 FLOPs per pair, head and
 * head_dim element forward (S = QK^T, PV), twice that backward.  Document masking hides pairs that
 * only the device knows (doc_ids is device memory), so those calls are timed but not counted. */
static void count_attention(int pass, const int32_t *doc_ids, const struct olmo_attn_shape *s, double t) {
    if (doc_ids) {
        attn_uncounted++;
        return;
    }
    attn_flops[pass] += (pass ? 8.0 : 4.0) * visible_pairs(s) * s->n_heads * s->head_dim;
    attn_counted_seconds[pass] += t;
}

static void p_attention_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
                            const int32_t *doc_ids, const struct olmo_attn_shape *s) {
    const double before = seconds[P_ATTN_FWD];
    TIMED(P_ATTN_FWD, in->attention_fwd(out, lse, q, k, v, doc_ids, s));
    if (enabled) count_attention(0, doc_ids, s, seconds[P_ATTN_FWD] - before);
}
static void p_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                            const float *q, const float *k, const float *v, const int32_t *doc_ids,
                            const struct olmo_attn_shape *s) {
    const double before = seconds[P_ATTN_BWD];
    TIMED(P_ATTN_BWD, in->attention_bwd(dq, dk, dv, dout, out, lse, q, k, v, doc_ids, s));
    if (enabled) count_attention(1, doc_ids, s, seconds[P_ATTN_BWD] - before);
}
static void p_swiglu_fwd(float *s, const float *g, const float *u, size_t n) {
    TIMED(P_SWIGLU, in->swiglu_fwd(s, g, u, n));
}
static void p_swiglu_bwd(float *dg, float *du, const float *ds, const float *g, const float *u, size_t n) {
    TIMED(P_SWIGLU, in->swiglu_bwd(dg, du, ds, g, u, n));
}
static void p_add(float *y, const float *a, const float *b, size_t n) { TIMED(P_ADD, in->add(y, a, b, n)); }
static void p_cross_entropy(float *logits, const int32_t *targets, int n, int vocab, float grad_scale, float z_mult,
                            double *ce_sum, double *z_sum) {
    TIMED(P_CE, in->cross_entropy(logits, targets, n, vocab, grad_scale, z_mult, ce_sum, z_sum));
}
static double p_sum_squares(const float *x, size_t n) {
    double r;
    TIMED(P_OPTIM, r = in->sum_squares(x, n));
    return r;
}
static void p_scale(float *x, size_t n, float s) { TIMED(P_OPTIM, in->scale(x, n, s)); }
static void p_adamw(float *param, const float *grad, float *m, float *v, size_t n, double lr, float beta1,
                    float beta2, float eps, double weight_decay, long step) {
    TIMED(P_OPTIM, in->adamw(param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, step));
}

const struct olmo_backend *olmo_backend_profiled(const struct olmo_backend *inner) {
    static struct olmo_backend be;
    in = inner;
    be = *inner;
    be.name = inner->name; /* callers dispatch on it */
    be.zero = p_zero;
    be.copy = p_copy;
    be.gemm = p_gemm;
    be.embedding_fwd = p_embedding_fwd;
    be.embedding_bwd = p_embedding_bwd;
    be.rmsnorm_fwd = p_rmsnorm_fwd;
    be.rmsnorm_bwd = p_rmsnorm_bwd;
    be.rope_fwd = p_rope_fwd;
    be.rope_bwd = p_rope_bwd;
    be.attention_fwd = p_attention_fwd;
    be.attention_bwd = p_attention_bwd;
    be.swiglu_fwd = p_swiglu_fwd;
    be.swiglu_bwd = p_swiglu_bwd;
    be.add = p_add;
    be.cross_entropy = p_cross_entropy;
    be.sum_squares = p_sum_squares;
    be.scale = p_scale;
    be.adamw = p_adamw;
    return &be;
}

void olmo_profile_enable(bool on) { enabled = on; }

void olmo_profile_reset(void) {
    for (int i = 0; i < P_COUNT; i++) {
        seconds[i] = 0.0;
        calls[i] = 0;
    }
    gemm_flops = 0.0;
    n_shapes = 0;
    for (int pass = 0; pass < 2; pass++) attn_flops[pass] = attn_counted_seconds[pass] = 0.0;
    attn_uncounted = 0;
}

void olmo_profile_report(FILE *out) {
    double total = 0.0;
    for (int i = 0; i < P_COUNT; i++) total += seconds[i];
    fprintf(out, "profile: %-18s %8s %9s %6s\n", "op", "calls", "seconds", "share");
    for (int i = 0; i < P_COUNT; i++)
        fprintf(out, "profile: %-18s %8ld %9.3f %5.1f%%\n", names[i], calls[i], seconds[i],
                total > 0 ? 100.0 * seconds[i] / total : 0.0);
    for (int i = 0; i < n_shapes; i++) {
        const struct shape_stat *g = &shapes[i];
        fprintf(out, "profile:   gemm m %5d n %5d k %5d %c%c%s %5ld calls %8.3f s %6.1f GFLOP/s\n", g->m, g->n, g->k,
                g->ta ? 'T' : 'N', g->tb ? 'T' : 'N', g->beta ? " +C" : "   ", g->calls, g->seconds,
                g->seconds > 0 ? 2.0 * g->m * g->n * (double)g->k * g->calls / g->seconds * 1e-9 : 0.0);
    }
    fprintf(out, "profile: gemm %.1f GFLOP/s over %.3g FLOP; ops total %.3f s\n",
            seconds[P_GEMM] > 0 ? gemm_flops / seconds[P_GEMM] * 1e-9 : 0.0, gemm_flops, total);
    for (int pass = 0; pass < 2; pass++) {
        if (attn_flops[pass] <= 0) continue;
        const double rate = attn_counted_seconds[pass] > 0 ? attn_flops[pass] / attn_counted_seconds[pass] : 0.0;
        fprintf(out, "profile: attention %s %.1f GFLOP/s over %.3g model FLOP (%d x visible pairs x heads x "
                "head_dim)\n", pass ? "bwd" : "fwd", rate * 1e-9, attn_flops[pass], pass ? 8 : 4);
    }
    if (attn_uncounted)
        fprintf(out, "profile: attention: %ld calls with document masking are timed, not in GFLOP/s\n",
                attn_uncounted);
}
