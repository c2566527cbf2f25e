/* The CPU backend's elementwise and row-wise ops: OpenMP loops, reductions in
 * double where the reference needs it, sums in a fixed order (cpu_backend.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_simd.h"

int cpu_embedding_fwd(OLMO_BE, float *out, const float *table, const int32_t *tokens, int n, int dim) {
    (void)be;
#pragma omp parallel for if ((size_t)n * dim >= PAR_MIN)
    for (int i = 0; i < n; i++)
        memcpy(out + (size_t)i * dim, table + (size_t)tokens[i] * dim, sizeof(float) * (size_t)dim);
    return 0;
}

/* Columns per task of the column-parallel loops: a multiple of the SIMD width. */
enum { COL_BLOCK = 64 };

int cpu_embedding_bwd(OLMO_BE, float *dtable, const float *dout, const int32_t *tokens, int n, int dim) {
    (void)be;
    /* Parallel over columns, tokens in order inside: repeated ids never race
     * and every sum has the same order whatever the thread count. */
    const int blocks = (dim + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for schedule(static) if ((size_t)n * dim >= PAR_MIN)
    for (int cb = 0; cb < blocks; cb++) {
        const int j0 = cb * COL_BLOCK, j1 = j0 + COL_BLOCK < dim ? j0 + COL_BLOCK : dim;
        for (int i = 0; i < n; i++) {
            float *row = dtable + (size_t)tokens[i] * dim;
            const float *g = dout + (size_t)i * dim;
#pragma omp simd
            for (int j = j0; j < j1; j++) row[j] += g[j];
        }
    }
    return 0;
}

int cpu_rmsnorm_fwd(OLMO_BE, float *y, float *rstd, const float *x, const float *w, int n, int dim,
                            float eps) {
    (void)be;
#pragma omp parallel for if ((size_t)n * dim >= PAR_MIN)
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * dim;
        float *yi = y + (size_t)i * dim;
        double ss = 0.0;
#pragma omp simd reduction(+ : ss)
        for (int j = 0; j < dim; j++) ss += (double)xi[j] * xi[j];
        float r = (float)(1.0 / sqrt(ss / dim + eps));
        rstd[i] = r;
#pragma omp simd
        for (int j = 0; j < dim; j++) yi[j] = w[j] * (xi[j] * r);
    }
    return 0;
}

/* rmsnorm_bwd's dw: each column's rows summed in order, in fp32 within runs of NORM_RUN rows, the runs' sums
 * in double (every term in double, the conversions bound the loop); the run sums of at most NORM_PANEL_BYTES
 * are kept at a time. */
enum { NORM_RUN = 8, NORM_PANEL_BYTES = 2 << 20 };

int cpu_rmsnorm_bwd(OLMO_BE, float *dx, float *dw, const float *dy, const float *x, const float *w,
                            const float *rstd, int n, int dim) {
    const bool par = (size_t)n * dim >= PAR_MIN;
    /* One pass over the rows, parallel over runs: a run adds its rows' dy * xhat into its own row of run
     * sums and sets their dx (dx may alias dy: a row's dy is read before its dx is written); then the run
     * sums are added into dw's double sums in run order, parallel over columns.  The same sums in the same
     * order for any thread count, and the same bits as when each column's rows were summed by a loop of its
     * own, which read x and dy by 64-column blocks and then again by rows for dx (the 20m step at T=512,
     * 2 threads, forced AVX2, three runs alternating: rmsnorm 3.9-4.7% -> 3.1-3.3% of the op time).  The dot
     * stays in double: in fp32 it was faster, but test_fidelity's parameters after 3 AdamW steps moved from
     * 9.3e-5 to 1.02e-4 of PyTorch's float64, past its 1e-4. */
    /* run-sum rows 64-byte aligned (and not 0 wide: dim 0 leaves dx and dw as they are) */
    const int runs = (n + NORM_RUN - 1) / NORM_RUN, ld = dim > 0 ? (dim + 15) / 16 * 16 : 16;
    int panel = (int)(NORM_PANEL_BYTES / (sizeof(float) * (size_t)ld)); /* runs whose sums are kept at a time */
    panel = panel > runs ? runs : panel;
    panel = panel < 1 ? 1 : panel;
    float *sums = cpu_cached_scratch(CPU_STATE(be), SLOT_NORM_RUNS, sizeof(float) * (size_t)ld * (size_t)panel);
    double *acc = sums ? cpu_scratch(sizeof(double) * (size_t)(dim > 0 ? dim : 1)) : NULL;
    if (!acc) return -1;
    for (int j = 0; j < dim; j++) acc[j] = 0.0;
    const int blocks = (dim + COL_BLOCK - 1) / COL_BLOCK;
    for (int g0 = 0; g0 < runs; g0 += panel) {
        const int g1 = g0 + panel < runs ? g0 + panel : runs;
#pragma omp parallel for schedule(static) if (par)
        for (int g = g0; g < g1; g++) {
            float *run = sums + (size_t)(g - g0) * ld;
            for (int j = 0; j < dim; j++) run[j] = 0.0f;
            const int i0 = g * NORM_RUN, i1 = n - i0 < NORM_RUN ? n : i0 + NORM_RUN;
            for (int i = i0; i < i1; i++) {
                const float *xi = x + (size_t)i * dim, *dyi = dy + (size_t)i * dim;
                float *dxi = dx + (size_t)i * dim;
                const float r = rstd[i];
                double dot = 0.0; /* sum_j (dy_j * w_j) * xhat_j */
#pragma omp simd reduction(+ : dot)
                for (int j = 0; j < dim; j++) {
                    const float xr = xi[j] * r;
                    run[j] += dyi[j] * xr;
                    dot += (double)dyi[j] * w[j] * xr;
                }
                const float mean = (float)(dot / dim);
#pragma omp simd
                for (int j = 0; j < dim; j++) dxi[j] = r * (dyi[j] * w[j] - xi[j] * r * mean);
            }
        }
#pragma omp parallel for schedule(static) if (par && blocks > 1)
        for (int cb = 0; cb < blocks; cb++) {
            const int j0 = cb * COL_BLOCK, j1 = j0 + COL_BLOCK < dim ? j0 + COL_BLOCK : dim;
            for (int g = 0; g < g1 - g0; g++) {
                const float *run = sums + (size_t)g * ld;
#pragma omp simd
                for (int j = j0; j < j1; j++) acc[j] += run[j];
            }
        }
    }
    for (int j = 0; j < dim; j++) dw[j] += (float)acc[j];
    free(acc);
    return 0;
}

/* sign = +1 rotates forward, -1 applies the transpose (the backward pass). */
static void rope_apply(float *x, const float *cos_t, const float *sin_t, int n_rows, int seq_len,
                       int heads, int head_dim, float sign) {
    int half = head_dim / 2;
#pragma omp parallel for if ((size_t)n_rows * heads * head_dim >= PAR_MIN)
    for (int r = 0; r < n_rows; r++) {
        int pos = r % seq_len;
        const float *c = cos_t + (size_t)pos * half, *s = sin_t + (size_t)pos * half;
        for (int h = 0; h < heads; h++) {
            float *xh = x + ((size_t)r * heads + h) * head_dim;
#pragma omp simd
            for (int i = 0; i < half; i++) {
                float a = xh[i], b = xh[i + half];
                xh[i] = a * c[i] - sign * b * s[i];
                xh[i + half] = b * c[i] + sign * a * s[i];
            }
        }
    }
}

int cpu_rope_fwd(OLMO_BE, float *x, const float *cos_t, const float *sin_t, int n_rows, int seq_len,
                         int heads, int head_dim) {
    (void)be;
    rope_apply(x, cos_t, sin_t, n_rows, seq_len, heads, head_dim, 1.0f);
    return 0;
}

int cpu_rope_bwd(OLMO_BE, float *dx, const float *cos_t, const float *sin_t, int n_rows, int seq_len,
                         int heads, int head_dim) {
    (void)be;
    rope_apply(dx, cos_t, sin_t, n_rows, seq_len, heads, head_dim, -1.0f);
    return 0;
}

/* silu(x) = x / (1 + exp(-x)).  On AVX2 without AVX-512, gcc leaves these loops scalar ("control flow
 * in loop": fast_expf's selects), so they are written with fast_exp8: the same operations in the same
 * order, bitwise the same results (test_ops checks it against the scalar form). */
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#define SWIGLU_AVX2 1
#endif

static inline float silu_mul(float g, float u) { return g / (1.0f + fast_expf(-g)) * u; }

static inline void swiglu_bwd1(float *dg, float *du, float ds, float g, float u) {
    float sig = 1.0f / (1.0f + fast_expf(-g));
    float sl = g * sig;
    *du = ds * sl;
    *dg = ds * u * sig * (1.0f + g * (1.0f - sig));
}

int cpu_swiglu_fwd(OLMO_BE, float *out, const float *g, const float *u, size_t n) {
    (void)be;
#ifdef SWIGLU_AVX2
    const size_t nv = n / 8;
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
#pragma omp parallel for if (n >= PAR_MIN)
    for (size_t k = 0; k < nv; k++) {
        const __m256 gv = _mm256_loadu_ps(g + 8 * k);
        const __m256 e = fast_exp8(_mm256_sub_ps(zero, gv));
        _mm256_storeu_ps(out + 8 * k,
                         _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + 8 * k)));
    }
    for (size_t i = 8 * nv; i < n; i++) out[i] = silu_mul(g[i], u[i]);
#else
#pragma omp parallel for simd if (parallel : n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) out[i] = silu_mul(g[i], u[i]);
#endif
    return 0;
}

int cpu_swiglu_bwd(OLMO_BE, float *dg, float *du, const float *ds, const float *g, const float *u,
                           size_t n) {
    (void)be;
#ifdef SWIGLU_AVX2
    const size_t nv = n / 8;
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
#pragma omp parallel for if (n >= PAR_MIN)
    for (size_t k = 0; k < nv; k++) {
        const __m256 gv = _mm256_loadu_ps(g + 8 * k), dsv = _mm256_loadu_ps(ds + 8 * k);
        const __m256 sig = _mm256_div_ps(one, _mm256_add_ps(one, fast_exp8(_mm256_sub_ps(zero, gv))));
        _mm256_storeu_ps(du + 8 * k, _mm256_mul_ps(dsv, _mm256_mul_ps(gv, sig)));
        const __m256 a = _mm256_mul_ps(_mm256_mul_ps(dsv, _mm256_loadu_ps(u + 8 * k)), sig);
        const __m256 b = _mm256_add_ps(one, _mm256_mul_ps(gv, _mm256_sub_ps(one, sig)));
        _mm256_storeu_ps(dg + 8 * k, _mm256_mul_ps(a, b));
    }
    for (size_t i = 8 * nv; i < n; i++) swiglu_bwd1(dg + i, du + i, ds[i], g[i], u[i]);
#else
#pragma omp parallel for simd if (parallel : n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) swiglu_bwd1(dg + i, du + i, ds[i], g[i], u[i]);
#endif
    return 0;
}

int cpu_add(OLMO_BE, float *y, const float *a, const float *b, size_t n) {
    (void)be;
#pragma omp parallel for simd if (parallel : n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) y[i] = a[i] + b[i];
    return 0;
}

int cpu_cross_entropy(OLMO_BE, float *logits, const int32_t *targets, int n, int vocab, float grad_scale,
                              float z_mult, double *ce_sum, double *z_sum) {
    (void)be;
    /* per-row results, summed in row order afterwards: deterministic */
    double *row_ce = cpu_scratch(sizeof(double) * 2 * (size_t)(n > 0 ? n : 1)), *row_z = row_ce + n;
    if (!row_ce) return -1;
#pragma omp parallel for if ((size_t)n * vocab >= PAR_MIN)
    for (int i = 0; i < n; i++) {
        float *row = logits + (size_t)i * vocab;
        row_ce[i] = row_z[i] = 0.0;
        if (targets[i] < 0) {
            memset(row, 0, sizeof(float) * (size_t)vocab);
            continue;
        }
        const float mx = max_of(row, vocab);
        const float target_logit = row[targets[i]];
        /* fp32 exponentials (vectorised), then their double sum in index order */
        exp_shifted(row, vocab, mx);
        double sum = 0.0;
        for (int j = 0; j < vocab; j++) sum += row[j];
        double lse = mx + log(sum);
        row_ce[i] = lse - target_logit;
        row_z[i] = lse * lse;
        /* d/dlogit of (ce + z*lse^2) = softmax * (1 + 2 z lse) - onehot */
        const float mult = (float)(grad_scale * (1.0 + 2.0 * z_mult * lse) / sum);
#pragma omp simd
        for (int j = 0; j < vocab; j++) row[j] *= mult;
        row[targets[i]] -= grad_scale;
    }
    double ce = 0.0, zz = 0.0;
    for (int i = 0; i < n; i++) {
        ce += row_ce[i];
        zz += row_z[i];
    }
    free(row_ce);
    *ce_sum = ce;
    *z_sum = zz;
    return 0;
}

/* Fixed-size chunks (not per-thread) so the sum is the same for any thread count. */
enum { SUM_CHUNK = 1 << 16 };

int cpu_sum_squares(OLMO_BE, const float *x, size_t n, double *out) {
    (void)be;
    const size_t chunks = (n + SUM_CHUNK - 1) / SUM_CHUNK;
    if (chunks == 0) {
        *out = 0.0;
        return 0;
    }
    double *part = cpu_scratch(sizeof(double) * chunks);
    if (!part) return -1;
#pragma omp parallel for if (chunks > 1)
    for (size_t c = 0; c < chunks; c++) {
        const size_t i0 = c * SUM_CHUNK, i1 = i0 + SUM_CHUNK < n ? i0 + SUM_CHUNK : n;
        double acc = 0.0;
#pragma omp simd reduction(+ : acc)
        for (size_t i = i0; i < i1; i++) acc += (double)x[i] * x[i];
        part[c] = acc;
    }
    double total = 0.0;
    for (size_t c = 0; c < chunks; c++) total += part[c];
    free(part);
    *out = total;
    return 0;
}

int cpu_scale(OLMO_BE, float *x, size_t n, float s) {
    (void)be;
#pragma omp parallel for simd if (parallel : n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) x[i] *= s;
    return 0;
}

int cpu_adamw(OLMO_BE, float *param, const float *grad, float *m, float *v, size_t n, double lr,
                      float beta1, float beta2, float eps, double weight_decay, long step) {
    (void)be;
    /* Same operation order as torch.optim.AdamW (single-tensor path). */
    /* torch computes these scalars in Python (double) before the fp32 loop. */
    const double bc1 = 1.0 - pow(beta1, (double)step);
    const float bc2_sqrt = (float)sqrt(1.0 - pow(beta2, (double)step));
    const float step_size = (float)(lr / bc1);
    const float decay = (float)(1.0 - lr * weight_decay);
#pragma omp parallel for simd if (parallel : n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        float g = grad[i];
        float p = param[i] * decay;
        float mi = m[i] + (g - m[i]) * (1.0f - beta1);
        float vi = v[i] * beta2 + (1.0f - beta2) * g * g;
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        m[i] = mi;
        v[i] = vi;
        param[i] = p - step_size * mi / denom;
    }
    return 0;
}


int cpu_convert(OLMO_BE, void *dst, enum olmo_float_type dst_type, const void *src, enum olmo_float_type src_type, size_t n) {
    (void)be;
    if (dst_type == src_type) {
        cpu_move_bytes(dst, src, n * olmo_float_type_size(dst_type));
    } else if (dst_type == OLMO_BF16) {
        uint16_t *d = dst;
        const float *x = src;
#pragma omp parallel for simd if (parallel : n >= PAR_MIN)
        for (size_t i = 0; i < n; i++) d[i] = to_bf16(x[i]);
    } else {
        float *d = dst;
        const uint16_t *x = src;
#pragma omp parallel for simd if (parallel : n >= PAR_MIN)
        for (size_t i = 0; i < n; i++) d[i] = from_bf16(x[i]);
    }
    return 0;
}
