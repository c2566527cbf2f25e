/* CPU backend: OpenBLAS for the GEMMs, OpenMP loops for everything else.
 * Reductions are done in double where an fp32 sum over a long axis would
 * lose the 1e-5 agreement with the PyTorch reference. */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "util/error.h"

static void *cpu_alloc(size_t bytes) {
    /* 64-byte alignment keeps SIMD loads aligned; round size up as required. */
    size_t rounded = (bytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, rounded ? rounded : 64);
    if (!p) {
        olmo_error("out of memory allocating %zu bytes", bytes);
        return NULL;
    }
    memset(p, 0, rounded);
    return p;
}

static void cpu_free(void *p) { free(p); }
static void cpu_copy(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }
static void cpu_zero(void *p, size_t bytes) { memset(p, 0, bytes); }

static void cpu_gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float *a, int lda,
                     const float *b, int ldb, float beta, float *c, int ldc) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k,
                alpha, a, lda, b, ldb, beta, c, ldc);
}

static void cpu_embedding_fwd(float *out, const float *table, const int32_t *tokens, int n, int dim) {
#pragma omp parallel for
    for (int i = 0; i < n; i++)
        memcpy(out + (size_t)i * dim, table + (size_t)tokens[i] * dim, sizeof(float) * (size_t)dim);
}

static void cpu_embedding_bwd(float *dtable, const float *dout, const int32_t *tokens, int n, int dim) {
    /* Serial over tokens: repeated ids would race; this is O(n*dim) and cheap. */
    for (int i = 0; i < n; i++) {
        float *row = dtable + (size_t)tokens[i] * dim;
        const float *g = dout + (size_t)i * dim;
        for (int j = 0; j < dim; j++) row[j] += g[j];
    }
}

static void cpu_rmsnorm_fwd(float *y, float *rstd, const float *x, const float *w, int n, int dim,
                            float eps) {
#pragma omp parallel for
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * dim;
        float *yi = y + (size_t)i * dim;
        double ss = 0.0;
        for (int j = 0; j < dim; j++) ss += (double)xi[j] * xi[j];
        float r = (float)(1.0 / sqrt(ss / dim + eps));
        rstd[i] = r;
        for (int j = 0; j < dim; j++) yi[j] = w[j] * (xi[j] * r);
    }
}

/* Rows per partial sum of the weight gradient.  The partials are combined in
 * chunk order, so dw is bit-identical whatever the thread count or schedule
 * (a prerequisite for bit-identical resumed training runs). */
#define RMS_DW_CHUNK 32

static void cpu_rmsnorm_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w,
                            const float *rstd, int n, int dim) {
    const int n_chunks = (n + RMS_DW_CHUNK - 1) / RMS_DW_CHUNK;
    double *partial = calloc((size_t)(n_chunks > 0 ? n_chunks : 1) * (size_t)dim, sizeof(double));
    if (!partial) {
        fprintf(stderr, "olmoc: out of memory in rmsnorm backward\n");
        abort();
    }
#pragma omp parallel for schedule(static)
    for (int c = 0; c < n_chunks; c++) {
        double *dw_local = partial + (size_t)c * dim;
        const int end = (c + 1) * RMS_DW_CHUNK < n ? (c + 1) * RMS_DW_CHUNK : n;
        for (int i = c * RMS_DW_CHUNK; i < end; i++) {
            const float *xi = x + (size_t)i * dim, *dyi = dy + (size_t)i * dim;
            float *dxi = dx + (size_t)i * dim;
            float r = rstd[i];
            double dot = 0.0; /* sum_j (dy_j * w_j) * xhat_j */
            for (int j = 0; j < dim; j++) {
                float xhat = xi[j] * r;
                dot += (double)dyi[j] * w[j] * xhat;
                dw_local[j] += (double)dyi[j] * xhat;
            }
            float mean = (float)(dot / dim);
            for (int j = 0; j < dim; j++) dxi[j] = r * (dyi[j] * w[j] - xi[j] * r * mean);
        }
    }
#pragma omp parallel for schedule(static)
    for (int j = 0; j < dim; j++) {
        double acc = 0.0;
        for (int c = 0; c < n_chunks; c++) acc += partial[(size_t)c * dim + j];
        dw[j] += (float)acc;
    }
    free(partial);
}

/* sign = +1 rotates forward, -1 applies the transpose (the backward pass). */
static void rope_apply(float *x, const float *cos_t, const float *sin_t, int n_rows, int seq_len,
                       int heads, int head_dim, float sign) {
    int half = head_dim / 2;
#pragma omp parallel for
    for (int r = 0; r < n_rows; r++) {
        int pos = r % seq_len;
        const float *c = cos_t + (size_t)pos * half, *s = sin_t + (size_t)pos * half;
        for (int h = 0; h < heads; h++) {
            float *xh = x + ((size_t)r * heads + h) * head_dim;
            for (int i = 0; i < half; i++) {
                float a = xh[i], b = xh[i + half];
                xh[i] = a * c[i] - sign * b * s[i];
                xh[i + half] = b * c[i] + sign * a * s[i];
            }
        }
    }
}

static void cpu_rope_fwd(float *x, const float *cos_t, const float *sin_t, int n_rows, int seq_len,
                         int heads, int head_dim) {
    rope_apply(x, cos_t, sin_t, n_rows, seq_len, heads, head_dim, 1.0f);
}

static void cpu_rope_bwd(float *dx, const float *cos_t, const float *sin_t, int n_rows, int seq_len,
                         int heads, int head_dim) {
    rope_apply(dx, cos_t, sin_t, n_rows, seq_len, heads, head_dim, -1.0f);
}

/* First key position visible from query position t. */
static int attn_first_key(const struct olmo_attn_shape *s, const int32_t *doc_ids_b, int t) {
    int lo = 0;
    if (s->window > 0 && t - s->window + 1 > lo) lo = t - s->window + 1;
    if (doc_ids_b)
        while (lo < t && doc_ids_b[lo] != doc_ids_b[t]) lo++;
    return lo;
}

static float dotf(const float *a, const float *b, int n) {
    float acc = 0.0f;
    for (int i = 0; i < n; i++) acc += a[i] * b[i];
    return acc;
}

static void cpu_attention_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
                              const int32_t *doc_ids, const struct olmo_attn_shape *s) {
    const int T = s->seq_len, H = s->n_heads, HK = s->n_kv_heads, D = s->head_dim;
    const int group = H / HK;
    const size_t q_stride = (size_t)H * D, kv_stride = (size_t)HK * D;
#pragma omp parallel
    {
        float *scores = malloc(sizeof(float) * (size_t)T);
#pragma omp for collapse(2) schedule(dynamic)
        for (int b = 0; b < s->batch; b++)
            for (int h = 0; h < H; h++) {
                const int kh = h / group;
                const int32_t *docs = doc_ids ? doc_ids + (size_t)b * T : NULL;
                for (int t = 0; t < T; t++) {
                    const float *qt = q + ((size_t)b * T + t) * q_stride + (size_t)h * D;
                    float *ot = out + ((size_t)b * T + t) * q_stride + (size_t)h * D;
                    int lo = attn_first_key(s, docs, t);
                    float mx = -INFINITY;
                    for (int j = lo; j <= t; j++) {
                        const float *kj = k + ((size_t)b * T + j) * kv_stride + (size_t)kh * D;
                        float sc = dotf(qt, kj, D) * s->scale;
                        scores[j - lo] = sc;
                        if (sc > mx) mx = sc;
                    }
                    double denom = 0.0;
                    for (int j = lo; j <= t; j++) {
                        float p = expf(scores[j - lo] - mx);
                        scores[j - lo] = p;
                        denom += p;
                    }
                    float inv = (float)(1.0 / denom);
                    memset(ot, 0, sizeof(float) * (size_t)D);
                    for (int j = lo; j <= t; j++) {
                        const float *vj = v + ((size_t)b * T + j) * kv_stride + (size_t)kh * D;
                        float p = scores[j - lo] * inv;
                        for (int d = 0; d < D; d++) ot[d] += p * vj[d];
                    }
                    lse[((size_t)b * H + h) * T + t] = mx + (float)log(denom);
                }
            }
        free(scores);
    }
}

static void cpu_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *out,
                              const float *lse, const float *q, const float *k, const float *v,
                              const int32_t *doc_ids, const struct olmo_attn_shape *s) {
    const int T = s->seq_len, H = s->n_heads, HK = s->n_kv_heads, D = s->head_dim;
    const int group = H / HK;
    const size_t q_stride = (size_t)H * D, kv_stride = (size_t)HK * D;
    /* One task per (batch, kv head): dk/dv of a kv head are only written by its
     * own group of query heads, so tasks never race. */
#pragma omp parallel for collapse(2) schedule(dynamic)
    for (int b = 0; b < s->batch; b++)
        for (int kh = 0; kh < HK; kh++) {
            const int32_t *docs = doc_ids ? doc_ids + (size_t)b * T : NULL;
            for (int t = 0; t < T; t++) {
                float *dkt = dk + ((size_t)b * T + t) * kv_stride + (size_t)kh * D;
                float *dvt = dv + ((size_t)b * T + t) * kv_stride + (size_t)kh * D;
                memset(dkt, 0, sizeof(float) * (size_t)D);
                memset(dvt, 0, sizeof(float) * (size_t)D);
            }
            for (int h = kh * group; h < (kh + 1) * group; h++)
                for (int t = 0; t < T; t++) {
                    size_t qoff = ((size_t)b * T + t) * q_stride + (size_t)h * D;
                    const float *qt = q + qoff, *dot_ = dout + qoff, *ot = out + qoff;
                    float *dqt = dq + qoff;
                    float row_lse = lse[((size_t)b * H + h) * T + t];
                    float delta = dotf(dot_, ot, D); /* sum_j p_j * (dO . v_j) */
                    memset(dqt, 0, sizeof(float) * (size_t)D);
                    int lo = attn_first_key(s, docs, t);
                    for (int j = lo; j <= t; j++) {
                        size_t koff = ((size_t)b * T + j) * kv_stride + (size_t)kh * D;
                        const float *kj = k + koff, *vj = v + koff;
                        float p = expf(dotf(qt, kj, D) * s->scale - row_lse);
                        float ds = p * (dotf(dot_, vj, D) - delta) * s->scale;
                        float *dkj = dk + koff, *dvj = dv + koff;
                        for (int d = 0; d < D; d++) {
                            dqt[d] += ds * kj[d];
                            dkj[d] += ds * qt[d];
                            dvj[d] += p * dot_[d];
                        }
                    }
                }
        }
}

static void cpu_attention_cached(float *out, const float *q, const float *k_cache, const float *v_cache, int n,
                                 int pos0, int cap, const struct olmo_attn_shape *s) {
    const int H = s->n_heads, HK = s->n_kv_heads, D = s->head_dim, group = H / HK;
    const size_t q_stride = (size_t)H * D, kv_stride = (size_t)HK * D;
#pragma omp parallel
    {
        const int max_keys = s->window > 0 && s->window < pos0 + n ? s->window : pos0 + n;
        float *scores = malloc(sizeof(float) * (size_t)max_keys);
#pragma omp for collapse(2) schedule(static)
        for (int i = 0; i < n; i++)
            for (int h = 0; h < H; h++) {
                const int t = pos0 + i, kh = h / group;
                const int lo = s->window > 0 && t - s->window + 1 > 0 ? t - s->window + 1 : 0;
                const float *qt = q + (size_t)i * q_stride + (size_t)h * D;
                float *ot = out + (size_t)i * q_stride + (size_t)h * D;
                float mx = -INFINITY;
                for (int j = lo; j <= t; j++) {
                    const float *kj = k_cache + (size_t)(j % cap) * kv_stride + (size_t)kh * D;
                    float sc = dotf(qt, kj, D) * s->scale;
                    scores[j - lo] = sc;
                    if (sc > mx) mx = sc;
                }
                double denom = 0.0;
                for (int j = lo; j <= t; j++) {
                    float p = expf(scores[j - lo] - mx);
                    scores[j - lo] = p;
                    denom += p;
                }
                float inv = (float)(1.0 / denom);
                memset(ot, 0, sizeof(float) * (size_t)D);
                for (int j = lo; j <= t; j++) {
                    const float *vj = v_cache + (size_t)(j % cap) * kv_stride + (size_t)kh * D;
                    float p = scores[j - lo] * inv;
                    for (int d = 0; d < D; d++) ot[d] += p * vj[d];
                }
            }
        free(scores);
    }
}

static float silu(float x) { return x / (1.0f + expf(-x)); }

static void cpu_swiglu_fwd(float *out, const float *g, const float *u, size_t n) {
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) out[i] = silu(g[i]) * u[i];
}

static void cpu_swiglu_bwd(float *dg, float *du, const float *ds, const float *g, const float *u,
                           size_t n) {
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float sig = 1.0f / (1.0f + expf(-g[i]));
        float sl = g[i] * sig;
        du[i] = ds[i] * sl;
        dg[i] = ds[i] * u[i] * sig * (1.0f + g[i] * (1.0f - sig));
    }
}

static void cpu_add(float *y, const float *a, const float *b, size_t n) {
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) y[i] = a[i] + b[i];
}

static void cpu_cross_entropy(float *logits, const int32_t *targets, int n, int vocab, float grad_scale,
                              float z_mult, double *ce_sum, double *z_sum) {
    /* Per-row terms, summed serially afterwards: an OpenMP reduction combines
     * thread partials in an unspecified order, which would break bit-identical
     * reruns. */
    double *rows = malloc(sizeof(double) * 2 * (size_t)(n > 0 ? n : 1));
    if (!rows) {
        fprintf(stderr, "olmoc: out of memory in cross-entropy\n");
        abort();
    }
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) {
        float *row = logits + (size_t)i * vocab;
        rows[2 * i] = rows[2 * i + 1] = 0.0;
        if (targets[i] < 0) {
            memset(row, 0, sizeof(float) * (size_t)vocab);
            continue;
        }
        float mx = -INFINITY;
        for (int j = 0; j < vocab; j++)
            if (row[j] > mx) mx = row[j];
        double sum = 0.0; /* fp32 exponentials, double accumulation */
        for (int j = 0; j < vocab; j++) sum += expf(row[j] - mx);
        double lse = mx + log(sum);
        rows[2 * i] = lse - row[targets[i]];
        rows[2 * i + 1] = lse * lse;
        /* d/dlogit of (ce + z*lse^2) = softmax * (1 + 2 z lse) - onehot */
        const float lse_f = (float)lse, soft_scale = (float)(grad_scale * (1.0 + 2.0 * z_mult * lse));
        for (int j = 0; j < vocab; j++) row[j] = expf(row[j] - lse_f) * soft_scale;
        row[targets[i]] -= grad_scale;
    }
    double ce = 0.0, zz = 0.0;
    for (int i = 0; i < n; i++) {
        ce += rows[2 * i];
        zz += rows[2 * i + 1];
    }
    free(rows);
    *ce_sum = ce;
    *z_sum = zz;
}

/* Elements per partial sum; partials are added in a fixed order (deterministic). */
#define SUMSQ_CHUNK 65536

static double cpu_sum_squares(const float *x, size_t n) {
    const size_t n_chunks = (n + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK;
    double stack[64], *partial = n_chunks <= 64 ? stack : malloc(sizeof(double) * n_chunks);
    if (!partial) {
        fprintf(stderr, "olmoc: out of memory in sum of squares\n");
        abort();
    }
#pragma omp parallel for schedule(static)
    for (size_t c = 0; c < n_chunks; c++) {
        const size_t end = (c + 1) * SUMSQ_CHUNK < n ? (c + 1) * SUMSQ_CHUNK : n;
        double acc = 0.0;
        for (size_t i = c * SUMSQ_CHUNK; i < end; i++) acc += (double)x[i] * x[i];
        partial[c] = acc;
    }
    double acc = 0.0;
    for (size_t c = 0; c < n_chunks; c++) acc += partial[c];
    if (partial != stack) free(partial);
    return acc;
}

static void cpu_scale(float *x, size_t n, float s) {
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

static void cpu_adamw(float *param, const float *grad, float *m, float *v, size_t n, double lr,
                      float beta1, float beta2, float eps, double weight_decay, long step) {
    /* Same operation order as torch.optim.AdamW (single-tensor path). */
    /* torch computes these scalars in Python (double) before the fp32 loop. */
    const double bc1 = 1.0 - pow(beta1, (double)step);
    const float bc2_sqrt = (float)sqrt(1.0 - pow(beta2, (double)step));
    const float step_size = (float)(lr / bc1);
    const float decay = (float)(1.0 - lr * weight_decay);
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float g = grad[i];
        param[i] *= decay;
        m[i] += (g - m[i]) * (1.0f - beta1);
        v[i] = v[i] * beta2 + (1.0f - beta2) * g * g;
        float denom = sqrtf(v[i]) / bc2_sqrt + eps;
        param[i] -= step_size * m[i] / denom;
    }
}

const struct olmo_backend *olmo_backend_cpu(void) {
    static const struct olmo_backend cpu = {
        .name = "cpu",
        .alloc = cpu_alloc,
        .free = cpu_free,
        .to_device = cpu_copy,
        .to_host = cpu_copy,
        .zero = cpu_zero,
        .copy = cpu_copy,
        .gemm = cpu_gemm,
        .embedding_fwd = cpu_embedding_fwd,
        .embedding_bwd = cpu_embedding_bwd,
        .rmsnorm_fwd = cpu_rmsnorm_fwd,
        .rmsnorm_bwd = cpu_rmsnorm_bwd,
        .rope_fwd = cpu_rope_fwd,
        .rope_bwd = cpu_rope_bwd,
        .attention_fwd = cpu_attention_fwd,
        .attention_bwd = cpu_attention_bwd,
        .swiglu_fwd = cpu_swiglu_fwd,
        .swiglu_bwd = cpu_swiglu_bwd,
        .add = cpu_add,
        .cross_entropy = cpu_cross_entropy,
        .sum_squares = cpu_sum_squares,
        .scale = cpu_scale,
        .adamw = cpu_adamw,
        .attention_cached = cpu_attention_cached,
    };
    return &cpu;
}
