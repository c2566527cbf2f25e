/* CPU backend: GEMMs from oneDNN or OpenBLAS (attention's tiles: its own
 * AVX-512 kernel, else OpenBLAS), OpenMP loops for everything else.
 *
 * Numerics: reductions are done in double where an fp32 sum over a long axis
 * would lose the 1e-5 agreement with the PyTorch reference; exponentials use
 * a vectorisable exp (fast_expf, within 2 ulp of expf).
 *
 * Determinism: every result is the same from run to run with the same
 * thread count.  No floating-point reduction depends on OpenMP's reduction
 * clause (whose combination order is unspecified) or on which thread ran
 * what under dynamic scheduling: partial sums live in per-row, per-chunk or
 * per-column slots that are combined in a fixed order.  Except for
 * attention's dq (per-thread partials under a fixed task-to-thread
 * assignment, summed in thread order), results do not even depend on the
 * thread count. */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef OLMOC_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#endif

#include "backend/backend.h"
#include "util/error.h"

/* Loops over fewer elements than this run on the calling thread: waking the
 * team costs more than the work. */
#define PAR_MIN 16384

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

/* Scratch memory inside an op, which has no error path: failing is fatal. */
static void *scratch(size_t bytes) {
    void *p = aligned_alloc(64, ((bytes + 63) & ~(size_t)63) + 64);
    if (!p) {
        fprintf(stderr, "olmoc: out of memory for %zu bytes of CPU scratch space\n", bytes);
        abort();
    }
    return p;
}

/* Large per-call buffers are kept between calls, one set per calling thread:
 * fresh multi-megabyte allocations come from mmap and pay a page fault per
 * 4 KiB on every call (10% of attention at seq_len 512).  Grow-only. */
enum {
    SLOT_KT, SLOT_VT, SLOT_DELTA, SLOT_DQ_PARTS, SLOT_BF16_A, SLOT_BF16_B,
    SLOT_Q16, SLOT_DO16, SLOT_QP, SLOT_DOP, SLOT_KP, SLOT_VP, /* cpu-bf16 attention's operands */
    N_SLOTS
};
static _Thread_local struct {
    void *p;
    size_t bytes;
} slots[N_SLOTS];

static void *cached_scratch(int slot, size_t bytes) {
    if (slots[slot].bytes < bytes) {
        free(slots[slot].p);
        slots[slot].p = scratch(bytes);
        slots[slot].bytes = bytes;
    }
    return slots[slot].p;
}

static void cpu_free(void *p) { free(p); }
static void cpu_copy(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }
static void cpu_zero(void *p, size_t bytes) { memset(p, 0, bytes); }

/* exp(x) for float x, vectorisable (no calls, no branches): x = n ln2 + r
 * with |r| <= ln2/2, exp(r) by its degree-7 Taylor polynomial (truncation
 * < 1e-8 relative), times 2^n built in the exponent bits.  Within 2 ulp of
 * glibc's expf for x >= -87.33; below that it returns 0 (expf gives
 * subnormals < 1.2e-38), exp(-inf) = 0, and x > 88.37 gives inf. */
static inline float fast_expf(float x) {
    const float hi = 88.3762626647949f, lo = -87.3365478515625f;
    float xc = x < lo ? lo : (x > hi ? hi : x);
    float n = rintf(xc * 1.44269504088896341f);
    float r = fmaf(n, -0.693145751953125f, xc); /* ln2 split in two for an exact n*ln2_hi */
    r = fmaf(n, -1.428606765330187045e-06f, r);
    float p = 1.98412698e-4f;
    p = fmaf(p, r, 1.38888889e-3f);
    p = fmaf(p, r, 8.33333333e-3f);
    p = fmaf(p, r, 4.16666667e-2f);
    p = fmaf(p, r, 1.66666667e-1f);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    int32_t bits = ((int32_t)n + 127) * (1 << 23);
    float two_n;
    memcpy(&two_n, &bits, sizeof two_n);
    float y = p * two_n;
    y = x > hi ? INFINITY : y;
    return x < lo ? 0.0f : y;
}

/* fp32 -> bf16, rounded to nearest even: the operands of cpu-bf16's GEMMs and attention products. */
static inline uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* NaN stays a (quiet) NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* max of x[0..n), n >= 1; 16 running maxima so that gcc and clang both vectorise it. */
static float max_of(const float *x, int n) {
    float lanes[16];
    int i = 0;
    for (int l = 0; l < 16; l++) lanes[l] = x[0];
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) lanes[l] = x[i + l] > lanes[l] ? x[i + l] : lanes[l];
    float mx = lanes[0];
    for (int l = 1; l < 16; l++) mx = lanes[l] > mx ? lanes[l] : mx;
    for (; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    return mx;
}

static void gemm_openblas(bool ta, bool tb, int m, int n, int k, float alpha, const float *a, int lda,
                          const float *b, int ldb, float beta, float *c, int ldc) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k,
                alpha, a, lda, b, ldb, beta, c, ldc);
}

#ifdef OLMOC_HAVE_ONEDNN
/* dnnl_sgemm is row-major with BLAS semantics (C is not read when beta is 0). */
static void gemm_onednn(bool ta, bool tb, int m, int n, int k, float alpha, const float *a, int lda,
                        const float *b, int ldb, float beta, float *c, int ldc) {
    dnnl_status_t status = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    if (status != dnnl_success) { /* only invalid arguments fail: a bug of ours, and the op has no error path */
        fprintf(stderr, "olmoc: oneDNN sgemm(%c%c, m %d n %d k %d, lda %d ldb %d ldc %d) failed with status %d\n",
                ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, lda, ldb, ldc, (int)status);
        abort();
    }
}

/* cpu-bf16: GEMM operands rounded to bf16 (round to nearest even) and
 * multiplied with fp32 accumulation and fp32 output by oneDNN's matmul
 * primitive (AVX512-BF16 or AMX kernels where the processor has them); every
 * other op, the weights, gradients and AdamW state stay fp32: the numerics
 * of cuda-bf16.  The matmul API used here is oneDNN 2.x's. */
#if DNNL_VERSION_MAJOR == 2
#define OLMOC_CPU_BF16 1

/* rows x cols of src (leading dimension ld), times scale, packed into dst[rows][cols] as bf16. */
static void pack_bf16(uint16_t *dst, const float *src, int rows, int cols, int ld, float scale) {
#pragma omp parallel for schedule(static) if ((size_t)rows * cols >= PAR_MIN)
    for (int r = 0; r < rows; r++) {
        const float *in = src + (size_t)r * ld;
        uint16_t *out = dst + (size_t)r * cols;
        for (int c = 0; c < cols; c++) out[c] = to_bf16(in[c] * scale);
    }
}

/* One matmul primitive per GEMM shape (a model has a dozen or two), made on first use. */
struct bf16_matmul {
    bool ta, tb, accumulate;
    int m, n, k, ldc;
    dnnl_memory_desc_t a_md, b_md, c_md;
    dnnl_primitive_t prim;
};
static struct {
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    struct bf16_matmul *items;
    int count, cap;
    char impl[64]; /* the implementation oneDNN chose for the probe shape */
} bf16;
static pthread_mutex_t bf16_lock = PTHREAD_MUTEX_INITIALIZER;

/* NULL with *status set when oneDNN has no bf16 matmul for this processor. */
static struct bf16_matmul *bf16_matmul_for(bool ta, bool tb, int m, int n, int k, int ldc, bool accumulate,
                                           dnnl_status_t *status) {
    for (int i = 0; i < bf16.count; i++) {
        struct bf16_matmul *it = &bf16.items[i];
        if (it->ta == ta && it->tb == tb && it->accumulate == accumulate && it->m == m && it->n == n &&
            it->k == k && it->ldc == ldc)
            return it;
    }
    if ((*status = bf16.engine ? dnnl_success : dnnl_engine_create(&bf16.engine, dnnl_cpu, 0)) != dnnl_success)
        return NULL;
    if (!bf16.stream &&
        (*status = dnnl_stream_create(&bf16.stream, bf16.engine, dnnl_stream_default_flags)) != dnnl_success)
        return NULL;
    if (bf16.count == bf16.cap) {
        int cap = bf16.cap ? 2 * bf16.cap : 32;
        struct bf16_matmul *items = realloc(bf16.items, sizeof *items * (size_t)cap);
        if (!items) {
            *status = dnnl_out_of_memory;
            return NULL;
        }
        bf16.items = items;
        bf16.cap = cap;
    }
    struct bf16_matmul it = {.ta = ta, .tb = tb, .accumulate = accumulate, .m = m, .n = n, .k = k, .ldc = ldc};
    /* the packed operands keep their stored layout; a transpose is a stride swap */
    const dnnl_dims_t a_dims = {m, k}, a_strides = {ta ? 1 : k, ta ? m : 1};
    const dnnl_dims_t b_dims = {k, n}, b_strides = {tb ? 1 : n, tb ? k : 1};
    const dnnl_dims_t c_dims = {m, n}, c_strides = {ldc, 1};
    dnnl_matmul_desc_t desc;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t post_ops = NULL;
    dnnl_primitive_desc_t pd = NULL;
    if ((*status = dnnl_memory_desc_init_by_strides(&it.a_md, 2, a_dims, dnnl_bf16, a_strides)) ||
        (*status = dnnl_memory_desc_init_by_strides(&it.b_md, 2, b_dims, dnnl_bf16, b_strides)) ||
        (*status = dnnl_memory_desc_init_by_strides(&it.c_md, 2, c_dims, dnnl_f32, c_strides)) ||
        (*status = dnnl_matmul_desc_init(&desc, &it.a_md, &it.b_md, NULL, &it.c_md)) ||
        (*status = dnnl_primitive_attr_create(&attr)))
        return NULL;
    if (accumulate) { /* C += product: the sum post-op adds the C already there */
        if ((*status = dnnl_post_ops_create(&post_ops)) == dnnl_success &&
            (*status = dnnl_post_ops_append_sum(post_ops, 1.0f)) == dnnl_success)
            *status = dnnl_primitive_attr_set_post_ops(attr, post_ops);
    }
    if (*status == dnnl_success) *status = dnnl_primitive_desc_create(&pd, &desc, attr, bf16.engine, NULL);
    if (*status == dnnl_success) *status = dnnl_primitive_create(&it.prim, pd);
    if (*status == dnnl_success && !bf16.impl[0]) {
        const char *impl = NULL;
        if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl)
            snprintf(bf16.impl, sizeof bf16.impl, "%s", impl);
    }
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (post_ops) dnnl_post_ops_destroy(post_ops);
    dnnl_primitive_attr_destroy(attr);
    if (*status != dnnl_success) return NULL;
    bf16.items[bf16.count] = it;
    return &bf16.items[bf16.count++];
}

/* alpha is folded into A before its rounding; beta other than 0 and 1 scales C first. */
static void gemm_onednn_bf16(bool ta, bool tb, int m, int n, int k, float alpha, const float *a, int lda,
                             const float *b, int ldb, float beta, float *c, int ldc) {
    if (m <= 0 || n <= 0) return;
    if (beta != 0.0f && beta != 1.0f)
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) c[(size_t)i * ldc + j] *= beta;
    if (k <= 0) { /* an empty product: C = beta C */
        if (beta == 0.0f)
            for (int i = 0; i < m; i++) memset(c + (size_t)i * ldc, 0, sizeof(float) * (size_t)n);
        return;
    }
    uint16_t *pa = cached_scratch(SLOT_BF16_A, sizeof(uint16_t) * (size_t)m * k);
    uint16_t *pb = cached_scratch(SLOT_BF16_B, sizeof(uint16_t) * (size_t)k * n);
    pack_bf16(pa, a, ta ? k : m, ta ? m : k, lda, alpha);
    pack_bf16(pb, b, tb ? n : k, tb ? k : n, ldb, 1.0f);
    dnnl_status_t status = dnnl_success;
    pthread_mutex_lock(&bf16_lock);
    struct bf16_matmul *mm = bf16_matmul_for(ta, tb, m, n, k, ldc, beta != 0.0f, &status);
    dnnl_memory_t mem_a = NULL, mem_b = NULL, mem_c = NULL;
    if (mm && !(status = dnnl_memory_create(&mem_a, &mm->a_md, bf16.engine, pa)) &&
        !(status = dnnl_memory_create(&mem_b, &mm->b_md, bf16.engine, pb)) &&
        !(status = dnnl_memory_create(&mem_c, &mm->c_md, bf16.engine, c))) {
        const dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, mem_a}, {DNNL_ARG_WEIGHTS, mem_b}, {DNNL_ARG_DST, mem_c}};
        if (!(status = dnnl_primitive_execute(mm->prim, bf16.stream, 3, args))) status = dnnl_stream_wait(bf16.stream);
    }
    if (mem_a) dnnl_memory_destroy(mem_a);
    if (mem_b) dnnl_memory_destroy(mem_b);
    if (mem_c) dnnl_memory_destroy(mem_c);
    pthread_mutex_unlock(&bf16_lock);
    if (status != dnnl_success) { /* the backend was probed when chosen: a bug of ours, and no error path */
        fprintf(stderr, "olmoc: oneDNN bf16 matmul (%c%c, m %d n %d k %d, ldc %d) failed with status %d\n",
                ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, ldc, (int)status);
        abort();
    }
}

/* Whether oneDNN has a bf16 matmul here (not on processors without AVX-512). */
static bool bf16_available(void) {
    dnnl_status_t status = dnnl_success;
    pthread_mutex_lock(&bf16_lock);
    const bool ok = bf16_matmul_for(false, true, 64, 64, 64, 64, false, &status) != NULL;
    pthread_mutex_unlock(&bf16_lock);
    if (!ok)
        olmo_error("backend 'cpu-bf16': oneDNN has no bf16 matmul on this processor (status %d); use cpu",
                   (int)status);
    return ok;
}
#endif /* DNNL_VERSION_MAJOR == 2 */
#endif /* OLMOC_HAVE_ONEDNN */

static void cpu_embedding_fwd(float *out, const float *table, const int32_t *tokens, int n, int dim) {
#pragma omp parallel for if ((size_t)n * dim >= PAR_MIN)
    for (int i = 0; i < n; i++)
        memcpy(out + (size_t)i * dim, table + (size_t)tokens[i] * dim, sizeof(float) * (size_t)dim);
}

/* Columns per task of the column-parallel loops: a multiple of the SIMD width. */
enum { COL_BLOCK = 64 };

static void cpu_embedding_bwd(float *dtable, const float *dout, const int32_t *tokens, int n, int dim) {
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
}

static void cpu_rmsnorm_fwd(float *y, float *rstd, const float *x, const float *w, int n, int dim,
                            float eps) {
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
}

static void cpu_rmsnorm_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w,
                            const float *rstd, int n, int dim) {
    const bool par = (size_t)n * dim >= PAR_MIN;
    /* dw first (dx may alias dy): parallel over columns, rows summed in order. */
    const int blocks = (dim + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for schedule(static) if (par)
    for (int cb = 0; cb < blocks; cb++) {
        const int j0 = cb * COL_BLOCK, nj = j0 + COL_BLOCK < dim ? COL_BLOCK : dim - j0;
        double acc[COL_BLOCK] = {0};
        for (int i = 0; i < n; i++) {
            const float *xi = x + (size_t)i * dim + j0, *dyi = dy + (size_t)i * dim + j0;
            const float r = rstd[i];
#pragma omp simd
            for (int j = 0; j < nj; j++) acc[j] += (double)dyi[j] * (xi[j] * r);
        }
        for (int j = 0; j < nj; j++) dw[j0 + j] += (float)acc[j];
    }
#pragma omp parallel for if (par)
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * dim, *dyi = dy + (size_t)i * dim;
        float *dxi = dx + (size_t)i * dim;
        const float r = rstd[i];
        double dot = 0.0; /* sum_j (dy_j * w_j) * xhat_j */
#pragma omp simd reduction(+ : dot)
        for (int j = 0; j < dim; j++) dot += (double)dyi[j] * w[j] * (xi[j] * r);
        const float mean = (float)(dot / dim);
#pragma omp simd
        for (int j = 0; j < dim; j++) dxi[j] = r * (dyi[j] * w[j] - xi[j] * r * mean);
    }
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

static void cpu_rope_fwd(float *x, const float *cos_t, const float *sin_t, int n_rows, int seq_len,
                         int heads, int head_dim) {
    rope_apply(x, cos_t, sin_t, n_rows, seq_len, heads, head_dim, 1.0f);
}

static void cpu_rope_bwd(float *dx, const float *cos_t, const float *sin_t, int n_rows, int seq_len,
                         int heads, int head_dim) {
    rope_apply(dx, cos_t, sin_t, n_rows, seq_len, heads, head_dim, -1.0f);
}

/* ---- attention -------------------------------------------------------------
 * Flash-style, with tile products (tile_gemm, single-threaded inside the
 * OpenMP region) and softmax in between:
 *   forward: a task per (batch, head, block of ATT_QB queries) walks the
 *     visible keys in chunks of ATT_KC with an online softmax;
 *   backward: a task per (batch, kv head, block of ATT_KB keys) walks the
 *     queries that see them in chunks of ATT_QC (FlashAttention-2 order).
 * K and V are first transposed per head ([D][T]) so every score tile is a
 * plain NN product.  Memory beyond inputs and outputs is O(seq_len) per head
 * (bounds, delta, the transposed K/V, dq partials) plus tiles of at most
 * ATT_QC x ATT_KC per thread: no seq_len^2 buffer.
 * Query t sees keys lo[t]..t, lo[t] = max(t - window + 1, start of t's
 * document): documents are runs of equal doc ids, as the model builds them.
 * lo is non-decreasing in t, which the block bounds below rely on.
 *
 * cpu-bf16 runs the seven products (S = Q K^T, O += P V; S, dP = dO V^T,
 * dV += P^T dO, dK += dS^T Q, dQ += dS K) on bf16 operands with fp32
 * accumulation, as cuda-bf16 does on tensor cores, when the build has
 * AVX512-BF16 (vdpbf16ps) and head_dim is even; softmax, lse, delta and the
 * accumulators stay fp32.  Its operands are rounded to bf16 (to nearest
 * even, as the GEMMs round them) and packed in pairs along the product's k:
 * elements k = 2p and 2p + 1 in the low and high half of one 32-bit word. */
enum { ATT_QB = 64, ATT_KC = 256, ATT_KB = 64, ATT_QC = 64 };

/* lo[b * T + t]: first key visible from query t of sequence b. */
static int *attn_bounds(const struct olmo_attn_shape *s, const int32_t *doc_ids) {
    const int T = s->seq_len;
    int *lo = scratch(sizeof(int) * (size_t)s->batch * T);
    for (int b = 0; b < s->batch; b++) {
        const int32_t *docs = doc_ids ? doc_ids + (size_t)b * T : NULL;
        int run_start = 0;
        for (int t = 0; t < T; t++) {
            if (docs && t > 0 && docs[t] != docs[t - 1]) run_start = t;
            int first = s->window > 0 && t - s->window + 1 > run_start ? t - s->window + 1 : run_start;
            lo[(size_t)b * T + t] = first;
        }
    }
    return lo;
}

/* C[m x n] = alpha * op(A) B + beta * C for attention's tiles (row-major,
 * beta 0 or 1, op(A) = A or A^T).  With AVX-512, a register-blocked kernel
 * (4 rows x 64 columns of C in 16 registers, B rows loaded once per 4 rows,
 * masked column tails): on these small shapes (k = 64..256) it beats
 * OpenBLAS, whose small-matrix path and packing cost a third of the
 * time.  Otherwise OpenBLAS.  With AVX512-BF16 the same kernel multiplies
 * bf16 pairs with vdpbf16ps (tile_product, bf16: k counts pairs). */
#if defined(__AVX512F__)
#include <immintrin.h>

static inline __mmask16 col_mask(int left) {
    return left >= 16 ? (__mmask16)0xFFFF : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1u);
}

#if defined(__AVX512BF16__)
#define OLMOC_ATTN_BF16 1
#endif

/* acc + a b on 16 lanes of fp32 values or of bf16 pairs (bf16 is a constant in each caller) */
static inline __attribute__((always_inline)) __m512 tile_mac(bool bf16, __m512 acc, __m512i a, __m512i b) {
#ifdef OLMOC_ATTN_BF16
    if (bf16) return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
#else
    (void)bf16;
#endif
    return _mm512_fmadd_ps(_mm512_castsi512_ps(a), _mm512_castsi512_ps(b), acc);
}

#define TILE_ROWS 4
/* 32-bit elements of the operands: floats, or bf16 pairs (read through this type, so may_alias) */
typedef int32_t __attribute__((may_alias)) tile_word;

static inline __attribute__((always_inline)) void tile_kernel(bool bf16, bool ta, int m, int n, int k, float alpha,
                                                              const tile_word *a, int lda, const tile_word *b, int ldb,
                                                              float beta, float *c, int ldc) {
    const __m512 valpha = _mm512_set1_ps(alpha);
    for (int c0 = 0; c0 < n; c0 += 64) {
        const __mmask16 m0 = col_mask(n - c0), m1 = col_mask(n - c0 - 16), m2 = col_mask(n - c0 - 32),
                        m3 = col_mask(n - c0 - 48);
        const tile_word *bc = b + c0;
        int r0 = 0;
        for (; r0 + TILE_ROWS <= m; r0 += TILE_ROWS) {
            __m512 x00 = _mm512_setzero_ps(), x01 = x00, x02 = x00, x03 = x00, x10 = x00, x11 = x00, x12 = x00,
                   x13 = x00, x20 = x00, x21 = x00, x22 = x00, x23 = x00, x30 = x00, x31 = x00, x32 = x00, x33 = x00;
            for (int kk = 0; kk < k; kk++) {
                const tile_word *br = bc + (size_t)kk * ldb;
                const __m512i b0 = _mm512_maskz_loadu_epi32(m0, br), b1 = _mm512_maskz_loadu_epi32(m1, br + 16),
                              b2 = _mm512_maskz_loadu_epi32(m2, br + 32), b3 = _mm512_maskz_loadu_epi32(m3, br + 48);
                const tile_word *ar = ta ? a + (size_t)kk * lda + r0 : a + (size_t)r0 * lda + kk;
                const size_t step = ta ? 1 : (size_t)lda;
                __m512i av = _mm512_set1_epi32(ar[0]);
                x00 = tile_mac(bf16, x00, av, b0), x01 = tile_mac(bf16, x01, av, b1);
                x02 = tile_mac(bf16, x02, av, b2), x03 = tile_mac(bf16, x03, av, b3);
                av = _mm512_set1_epi32(ar[step]);
                x10 = tile_mac(bf16, x10, av, b0), x11 = tile_mac(bf16, x11, av, b1);
                x12 = tile_mac(bf16, x12, av, b2), x13 = tile_mac(bf16, x13, av, b3);
                av = _mm512_set1_epi32(ar[2 * step]);
                x20 = tile_mac(bf16, x20, av, b0), x21 = tile_mac(bf16, x21, av, b1);
                x22 = tile_mac(bf16, x22, av, b2), x23 = tile_mac(bf16, x23, av, b3);
                av = _mm512_set1_epi32(ar[3 * step]);
                x30 = tile_mac(bf16, x30, av, b0), x31 = tile_mac(bf16, x31, av, b1);
                x32 = tile_mac(bf16, x32, av, b2), x33 = tile_mac(bf16, x33, av, b3);
            }
            __m512 rows[TILE_ROWS][4] = {{x00, x01, x02, x03}, {x10, x11, x12, x13}, {x20, x21, x22, x23},
                                         {x30, x31, x32, x33}};
            const __mmask16 masks[4] = {m0, m1, m2, m3};
            for (int r = 0; r < TILE_ROWS; r++) {
                float *cr = c + (size_t)(r0 + r) * ldc + c0;
                for (int v = 0; v < 4; v++) {
                    __m512 val = _mm512_mul_ps(rows[r][v], valpha);
                    if (beta != 0.0f) val = _mm512_add_ps(val, _mm512_maskz_loadu_ps(masks[v], cr + 16 * v));
                    _mm512_mask_storeu_ps(cr + 16 * v, masks[v], val);
                }
            }
        }
        for (; r0 < m; r0++) { /* leftover rows, one at a time */
            __m512 x0 = _mm512_setzero_ps(), x1 = x0, x2 = x0, x3 = x0;
            for (int kk = 0; kk < k; kk++) {
                const tile_word *br = bc + (size_t)kk * ldb;
                const __m512i av = _mm512_set1_epi32(ta ? a[(size_t)kk * lda + r0] : a[(size_t)r0 * lda + kk]);
                x0 = tile_mac(bf16, x0, av, _mm512_maskz_loadu_epi32(m0, br));
                x1 = tile_mac(bf16, x1, av, _mm512_maskz_loadu_epi32(m1, br + 16));
                x2 = tile_mac(bf16, x2, av, _mm512_maskz_loadu_epi32(m2, br + 32));
                x3 = tile_mac(bf16, x3, av, _mm512_maskz_loadu_epi32(m3, br + 48));
            }
            const __m512 xs[4] = {x0, x1, x2, x3};
            const __mmask16 masks[4] = {m0, m1, m2, m3};
            float *cr = c + (size_t)r0 * ldc + c0;
            for (int v = 0; v < 4; v++) {
                __m512 val = _mm512_mul_ps(xs[v], valpha);
                if (beta != 0.0f) val = _mm512_add_ps(val, _mm512_maskz_loadu_ps(masks[v], cr + 16 * v));
                _mm512_mask_storeu_ps(cr + 16 * v, masks[v], val);
            }
        }
    }
}

static void tile_gemm(bool ta, int m, int n, int k, float alpha, const float *a, int lda, const float *b, int ldb,
                      float beta, float *c, int ldc) {
    tile_kernel(false, ta, m, n, k, alpha, (const tile_word *)a, lda, (const tile_word *)b, ldb, beta, c, ldc);
}
#else
static void tile_gemm(bool ta, int m, int n, int k, float alpha, const float *a, int lda, const float *b, int ldb,
                      float beta, float *c, int ldc) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c,
                ldc);
}
#endif

/* Whether attention of this shape runs its products in bf16 (cpu-bf16 asks for it). */
static bool attn_bf16(bool requested, const struct olmo_attn_shape *s) {
#ifdef OLMOC_ATTN_BF16
    return requested && s->head_dim % 2 == 0;
#else
    (void)requested, (void)s;
    return false;
#endif
}

/* C = alpha * op(A) B + beta * C with fp32 operands, or with bf16 pairs (k is
 * then the number of k elements; the pairs are (k + 1) / 2, zero-padded). */
static void tile_product(bool bf16, bool ta, int m, int n, int k, float alpha, const void *a, int lda, const void *b,
                         int ldb, float beta, float *c, int ldc) {
#ifdef OLMOC_ATTN_BF16
    if (bf16) {
        tile_kernel(true, ta, m, n, (k + 1) / 2, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
#endif
    (void)bf16;
    tile_gemm(ta, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/* dst[r][c] = bf16(src[r][c]) for c < cols, and a zero at c = cols when cols is odd. */
static void pack_bf16_rows(uint16_t *dst, int ldd, const float *src, int lds, int rows, int cols) {
    for (int r = 0; r < rows; r++) {
        const float *in = src + (size_t)r * lds;
        uint16_t *out = dst + (size_t)r * ldd;
        for (int c = 0; c < cols; c++) out[c] = to_bf16(in[c]);
        if (cols % 2) out[cols] = 0;
    }
}

/* dst[p][c] = the pair (src[2p][c], src[2p+1][c]) for p < (rows + 1) / 2, c < cols; a missing row is zero. */
static void pack_bf16_pairs(uint32_t *dst, int ldd, const float *src, int lds, int rows, int cols) {
    for (int p = 0; p < (rows + 1) / 2; p++) {
        const float *r0 = src + (size_t)2 * p * lds;
        uint32_t *out = dst + (size_t)p * ldd;
        if (2 * p + 1 < rows) {
            const float *r1 = r0 + lds;
            for (int c = 0; c < cols; c++) out[c] = (uint32_t)to_bf16(r0[c]) | (uint32_t)to_bf16(r1[c]) << 16;
        } else {
            for (int c = 0; c < cols; c++) out[c] = to_bf16(r0[c]);
        }
    }
}

/* The row pairs of x [B*T][width] per sequence: [B][(T + 1) / 2][width] (B operands whose k is the position). */
static uint32_t *bf16_position_pairs(int slot, const float *x, int B, int T, int width) {
    const int pairs = (T + 1) / 2, blocks = (pairs + 31) / 32;
    uint32_t *xp = cached_scratch(slot, sizeof(uint32_t) * (size_t)B * pairs * width);
#pragma omp parallel for if ((size_t)B * T * width >= PAR_MIN)
    for (int job = 0; job < B * blocks; job++) {
        const int b = job / blocks, p0 = job % blocks * 32, t0 = 2 * p0, rows = T - t0 < 64 ? T - t0 : 64;
        pack_bf16_pairs(xp + ((size_t)b * pairs + p0) * width, width, x + ((size_t)b * T + t0) * width, width, rows,
                        width);
    }
    return xp;
}

/* x [B*T][heads*D] as bf16 rows, the same layout (A operands whose k is head_dim; D even). */
static uint32_t *bf16_rows(int slot, const float *x, int B, int T, int width) {
    uint16_t *xb = cached_scratch(slot, sizeof(uint16_t) * (size_t)B * T * width);
#pragma omp parallel for if ((size_t)B * T * width >= PAR_MIN)
    for (int r0 = 0; r0 < B * T; r0 += 64)
        pack_bf16_rows(xb + (size_t)r0 * width, width, x + (size_t)r0 * width, width, B * T - r0 < 64 ? B * T - r0 : 64,
                       width);
    return (uint32_t *)xb;
}

/* Keys j0+a .. j0+e of a tile of nk keys are visible from query t (empty when e < a). */
static inline void row_visible(const int *lo, int t, int j0, int nk, int *a, int *e) {
    int first = lo[t] - j0, last = t - j0;
    *a = first > 0 ? first : 0;
    *e = last < nk - 1 ? last : nk - 1;
}

/* row[c] = exp(row[c] - shift) for a <= c <= e, 0 for the other c < n;
 * returns the sum of the row.  The masked columns are few (the tiles on the
 * diagonal and at the window's edge), so the AVX-512 version handles them
 * with lane masks on 16 columns at a time rather than a test per column. */
#if defined(__AVX512F__)
/* fast_expf on 16 lanes, the same operations in the same order: bitwise equal results. */
static inline __m512 fast_exp16(__m512 x) {
    const __m512 hi = _mm512_set1_ps(88.3762626647949f), lo = _mm512_set1_ps(-87.3365478515625f);
    /* max/min return their second operand when one is NaN: a NaN x stays NaN, as in fast_expf */
    const __m512 xc = _mm512_min_ps(hi, _mm512_max_ps(lo, x));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693145751953125f), xc);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(-1.428606765330187045e-06f), r);
    __m512 p = _mm512_set1_ps(1.98412698e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.38888889e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.33333333e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.16666667e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.66666667e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23);
    __m512 y = _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
    y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, hi, _CMP_GT_OQ), _mm512_set1_ps(INFINITY));
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, lo, _CMP_NLT_UQ), y);
}

static float exp_visible(float *row, int n, int a, int e, float shift) {
    const __m512 vshift = _mm512_set1_ps(shift);
    __m512 sum = _mm512_setzero_ps();
    for (int c0 = 0; c0 < n; c0 += 16) {
        const __mmask16 in_row = col_mask(n - c0);
        /* lanes c0 + l with a <= c0 + l <= e */
        const __mmask16 visible = in_row & col_mask(e - c0 + 1) & (__mmask16)~col_mask(a - c0);
        __m512 p = _mm512_setzero_ps();
        if (visible) {
            p = fast_exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(visible, row + c0), vshift));
            p = _mm512_maskz_mov_ps(visible, p);
            sum = _mm512_add_ps(sum, p);
        }
        _mm512_mask_storeu_ps(row + c0, in_row, p);
    }
    return _mm512_reduce_add_ps(sum);
}
#else
static float exp_visible(float *row, int n, int a, int e, float shift) {
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int c = 0; c < n; c++) {
        const float p = c >= a && c <= e ? fast_expf(row[c] - shift) : 0.0f;
        row[c] = p;
        sum += p;
    }
    return sum;
}
#endif

/* Leading dimension of the transposed K/V rows: T rounded up to 16 floats,
 * plus 16 so that the rows do not all map to the same cache sets when T is
 * a power of two. */
static int transposed_ld(int T) { return (T + 15) / 16 * 16 + 16; }

/* Each head of x [B*T][heads*D] transposed, ld = transposed_ld(T):
 *   fp32: xt[((b * heads + h) * D + d) * ld + t] = x[(b * T + t) * heads * D + h * D + d];
 *   bf16: xt[((b * heads + h) * D/2 + p) * ld + t] = the pair (d = 2p, 2p + 1) of the same row
 *   (B operands whose k is head_dim). */
static void *transpose_heads(int slot, bool bf16, const float *x, int B, int T, int heads, int D) {
    const size_t ld = (size_t)transposed_ld(T);
    const int rows = bf16 ? D / 2 : D; /* per head */
    void *xt = cached_scratch(slot, sizeof(float) * (size_t)B * ld * heads * rows);
    const int tiles = (T + 63) / 64;
#pragma omp parallel for if ((size_t)B * T * heads * D >= PAR_MIN)
    for (int job = 0; job < B * heads * tiles; job++) {
        const int tt = job % tiles, h = (job / tiles) % heads, b = job / (tiles * heads);
        const int t0 = tt * 64, t1 = t0 + 64 < T ? t0 + 64 : T;
        const size_t head = ((size_t)b * heads + h) * rows * ld;
        for (int t = t0; t < t1; t++) {
            const float *src = x + ((size_t)b * T + t) * heads * D + (size_t)h * D;
            if (bf16) {
                uint32_t *dst = (uint32_t *)xt + head;
                for (int p = 0; p < rows; p++)
                    dst[(size_t)p * ld + t] = (uint32_t)to_bf16(src[2 * p]) | (uint32_t)to_bf16(src[2 * p + 1]) << 16;
            } else {
                float *dst = (float *)xt + head;
                for (int d = 0; d < D; d++) dst[(size_t)d * ld + t] = src[d];
            }
        }
    }
    return xt;
}

/* &base[offset] for arrays of 4-byte elements (floats or bf16 pairs) */
static inline const void *word_at(const void *base, size_t offset) { return (const char *)base + 4 * offset; }

static void attention_fwd(bool bf16_products, float *out, float *lse, const float *q, const float *k, const float *v,
                          const int32_t *doc_ids, const struct olmo_attn_shape *s) {
    const int T = s->seq_len, H = s->n_heads, HK = s->n_kv_heads, D = s->head_dim;
    const int group = H / HK, qblocks = (T + ATT_QB - 1) / ATT_QB;
    const int q_stride = H * D, kv_stride = HK * D;
    const bool bf16 = attn_bf16(bf16_products, s);
    const int wq = bf16 ? 2 : 1; /* floats per element of Q's operand (a bf16 pair holds two) */
    const int kt_rows = D / wq, ldt = transposed_ld(T), pairs = (T + 1) / 2;
    int *lo = attn_bounds(s, doc_ids);
    const void *kt = transpose_heads(SLOT_KT, bf16, k, s->batch, T, HK, D);
    const void *qa = bf16 ? (const void *)bf16_rows(SLOT_Q16, q, s->batch, T, q_stride) : q;
    const uint32_t *vp = bf16 ? bf16_position_pairs(SLOT_VP, v, s->batch, T, kv_stride) : NULL;
    const int tasks = s->batch * H * qblocks;
    /* Each task owns its output rows, so any schedule gives the same result. */
#pragma omp parallel if (tasks > 1)
    {
        float *sc = scratch(sizeof(float) * ATT_QB * ATT_KC);
        float *acc = scratch(sizeof(float) * ATT_QB * (size_t)D);
        uint16_t *pb = bf16 ? scratch(sizeof(uint16_t) * ATT_QB * ATT_KC) : NULL; /* P as bf16 */
        float mrow[ATT_QB];
        double lrow[ATT_QB];
#pragma omp for schedule(dynamic)
        for (int task = 0; task < tasks; task++) {
            const int qb = qblocks - 1 - task % qblocks; /* longest (latest) blocks first */
            const int h = (task / qblocks) % H, b = task / (qblocks * H), kh = h / group;
            const int i0 = qb * ATT_QB, nq = i0 + ATT_QB < T ? ATT_QB : T - i0, i1 = i0 + nq;
            const int *lob = lo + (size_t)b * T;
            const size_t qoff = ((size_t)b * T + i0) * q_stride + (size_t)h * D;
            const size_t kth = ((size_t)b * HK + kh) * kt_rows * ldt;
            memset(acc, 0, sizeof(float) * (size_t)nq * D);
            for (int r = 0; r < nq; r++) {
                mrow[r] = -INFINITY;
                lrow[r] = 0.0;
            }
            /* keys from lob[i0] (rounded down to even, for the bf16 pairs) to i1-1, in chunks */
            for (int j0 = lob[i0] & ~1, nk; j0 < i1; j0 += nk) {
                nk = i1 - j0 < ATT_KC ? i1 - j0 : ATT_KC;
                tile_product(bf16, false, nq, nk, D, s->scale, word_at(qa, qoff / wq), q_stride / wq,
                             word_at(kt, kth + j0), ldt, 0.0f, sc, ATT_KC);
                for (int r = 0; r < nq; r++) {
                    float *row = sc + (size_t)r * ATT_KC;
                    int a, e;
                    row_visible(lob, i0 + r, j0, nk, &a, &e);
                    if (e < a) {
                        memset(row, 0, sizeof(float) * (size_t)nk);
                        continue;
                    }
                    float mx = max_of(row + a, e - a + 1);
                    mx = mx > mrow[r] ? mx : mrow[r];
                    const float alpha = fast_expf(mrow[r] - mx); /* exp(-inf) = 0 on the first chunk */
                    const float sum = exp_visible(row, nk, a, e, mx);
                    if (mx != mrow[r]) {
                        float *ar = acc + (size_t)r * D;
#pragma omp simd
                        for (int d = 0; d < D; d++) ar[d] *= alpha;
                        lrow[r] *= alpha;
                    }
                    lrow[r] += sum;
                    mrow[r] = mx;
                }
                if (bf16) { /* O += P V: P's rows and V's position pairs (j0 is even) */
                    pack_bf16_rows(pb, ATT_KC, sc, ATT_KC, nq, nk);
                    tile_product(true, false, nq, D, nk, 1.0f, pb, ATT_KC / 2,
                                 vp + ((size_t)b * pairs + j0 / 2) * kv_stride + (size_t)kh * D, kv_stride, 1.0f,
                                 acc, D);
                } else {
                    tile_gemm(false, nq, D, nk, 1.0f, sc, ATT_KC, v + ((size_t)b * T + j0) * kv_stride + (size_t)kh * D,
                              kv_stride, 1.0f, acc, D);
                }
            }
            for (int r = 0; r < nq; r++) {
                float *orow = out + ((size_t)b * T + i0 + r) * q_stride + (size_t)h * D;
                const float *ar = acc + (size_t)r * D, inv = (float)(1.0 / lrow[r]);
#pragma omp simd
                for (int d = 0; d < D; d++) orow[d] = ar[d] * inv;
                lse[((size_t)b * H + h) * T + i0 + r] = mrow[r] + (float)log(lrow[r]);
            }
        }
        free(sc);
        free(acc);
        free(pb);
    }
    free(lo);
}

/* Backward: a task per (batch, kv head, key block) owns dk/dv of those keys
 * and walks every query chunk (of every query head in the GQA group) that
 * sees them; P and dS are recomputed per tile from lse.  dq gets
 * contributions from many key blocks: each thread adds into its own dq
 * copy, and the copies are summed in thread order.  Tasks go to threads by
 * a fixed (cost-balanced) assignment, so the sums do not depend on timing. */
struct attn_task {
    int b, kh, kb;
    double cost;
};

static int task_cost_desc(const void *pa, const void *pb) {
    const struct attn_task *a = pa, *b = pb;
    if (a->cost != b->cost) return a->cost < b->cost ? 1 : -1;
    /* ties: by position, so the order is total and the assignment fixed */
    if (a->b != b->b) return a->b - b->b;
    if (a->kh != b->kh) return a->kh - b->kh;
    return a->kb - b->kb;
}

static void attention_bwd(bool bf16_products, float *dq, float *dk, float *dv, const float *dout, const float *out,
                          const float *lse, const float *q, const float *k, const float *v, const int32_t *doc_ids,
                          const struct olmo_attn_shape *s) {
    const int T = s->seq_len, H = s->n_heads, HK = s->n_kv_heads, D = s->head_dim, B = s->batch;
    const int group = H / HK, kblocks = (T + ATT_KB - 1) / ATT_KB;
    const int q_stride = H * D, kv_stride = HK * D;
    const size_t n_q = (size_t)B * T * q_stride;
    const bool bf16 = attn_bf16(bf16_products, s);
    const int wq = bf16 ? 2 : 1; /* floats per element of the operands with k = head_dim */
    const int kt_rows = D / wq, ldt = transposed_ld(T), pairs = (T + 1) / 2;
    int *lo = attn_bounds(s, doc_ids);
    const void *kt = transpose_heads(SLOT_KT, bf16, k, B, T, HK, D);
    const void *vt = transpose_heads(SLOT_VT, bf16, v, B, T, HK, D);
    /* bf16 only: Q and dO as rows (S, dP), and Q, dO, K as position pairs (dK, dV, dQ) */
    const void *qa = bf16 ? (const void *)bf16_rows(SLOT_Q16, q, B, T, q_stride) : q;
    const void *doa = bf16 ? (const void *)bf16_rows(SLOT_DO16, dout, B, T, q_stride) : dout;
    const uint32_t *qp = bf16 ? bf16_position_pairs(SLOT_QP, q, B, T, q_stride) : NULL;
    const uint32_t *dop = bf16 ? bf16_position_pairs(SLOT_DOP, dout, B, T, q_stride) : NULL;
    const uint32_t *kp = bf16 ? bf16_position_pairs(SLOT_KP, k, B, T, kv_stride) : NULL;
    /* delta[(b*H + h)*T + t] = dO . O (= sum_j p_j dO . v_j) */
    float *delta = cached_scratch(SLOT_DELTA, sizeof(float) * (size_t)B * H * T);
#pragma omp parallel for if (n_q >= PAR_MIN)
    for (int bt = 0; bt < B * T; bt++)
        for (int h = 0; h < H; h++) {
            const float *o = out + (size_t)bt * q_stride + (size_t)h * D, *g = dout + (size_t)bt * q_stride + (size_t)h * D;
            float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
            for (int d = 0; d < D; d++) acc += g[d] * o[d];
            delta[((size_t)(bt / T) * H + h) * T + bt % T] = acc;
        }

    /* Tasks and their fixed assignment: longest first to the least-loaded thread. */
    const int n_tasks = B * HK * kblocks;
    struct attn_task *tasks = scratch(sizeof *tasks * (size_t)(n_tasks > 0 ? n_tasks : 1));
    for (int b = 0, i = 0; b < B; b++)
        for (int kh = 0; kh < HK; kh++)
            for (int kb = 0; kb < kblocks; kb++, i++) {
                const int j0 = kb * ATT_KB, j1 = j0 + ATT_KB < T ? j0 + ATT_KB : T;
                int rows = 0; /* queries that see a key of this block */
                for (int t = j0; t < T && lo[(size_t)b * T + t] < j1; t++) rows++;
                tasks[i] = (struct attn_task){b, kh, kb, (double)rows * (j1 - j0) + 1.0};
            }
    qsort(tasks, (size_t)n_tasks, sizeof *tasks, task_cost_desc);
    int nth = omp_get_max_threads();
    if (nth > n_tasks) nth = n_tasks > 0 ? n_tasks : 1;
    int *owner = scratch(sizeof(int) * (size_t)(n_tasks > 0 ? n_tasks : 1));
    {
        double *load = scratch(sizeof(double) * (size_t)nth);
        for (int t = 0; t < nth; t++) load[t] = 0.0;
        for (int i = 0; i < n_tasks; i++) {
            int best = 0;
            for (int t = 1; t < nth; t++)
                if (load[t] < load[best]) best = t;
            owner[i] = best;
            load[best] += tasks[i].cost;
        }
        free(load);
    }
    /* dq copies: thread 0 writes dq itself, the others their own zeroed buffer */
    float **dq_part = scratch(sizeof(float *) * (size_t)nth);
    dq_part[0] = dq;
    memset(dq, 0, sizeof(float) * n_q);
    float *parts = nth > 1 ? cached_scratch(SLOT_DQ_PARTS, sizeof(float) * n_q * (size_t)(nth - 1)) : NULL;
    for (int t = 1; t < nth; t++) {
        dq_part[t] = parts + n_q * (size_t)(t - 1);
        memset(dq_part[t], 0, sizeof(float) * n_q);
    }

#pragma omp parallel num_threads(nth) if (nth > 1)
    {
        const int tid = omp_get_thread_num(), team = omp_get_num_threads();
        float *p = scratch(sizeof(float) * ATT_QC * ATT_KB), *ds = scratch(sizeof(float) * ATT_QC * ATT_KB);
        /* bf16: P^T and dS^T as query pairs, dS as rows */
        uint32_t *pt = bf16 ? scratch(sizeof(uint32_t) * ATT_QC / 2 * ATT_KB) : NULL;
        uint32_t *dst = bf16 ? scratch(sizeof(uint32_t) * ATT_QC / 2 * ATT_KB) : NULL;
        uint16_t *dsr = bf16 ? scratch(sizeof(uint16_t) * ATT_QC * ATT_KB) : NULL;
        for (int i = 0; i < n_tasks; i++) {
            /* a smaller team than asked for (nested parallelism) still covers every task */
            if (owner[i] % team != tid) continue;
            const int b = tasks[i].b, kh = tasks[i].kh, j0 = tasks[i].kb * ATT_KB;
            const int nk = j0 + ATT_KB < T ? ATT_KB : T - j0;
            const int *lob = lo + (size_t)b * T;
            const size_t koff = ((size_t)b * T + j0) * kv_stride + (size_t)kh * D;
            const float *kblk = k + koff;
            const size_t kth = ((size_t)b * HK + kh) * kt_rows * ldt + j0; /* of kt and vt */
            float *dkblk = dk + koff, *dvblk = dv + koff, *dqt = dq_part[tid];
            for (int j = 0; j < nk; j++) {
                memset(dkblk + (size_t)j * kv_stride, 0, sizeof(float) * (size_t)D);
                memset(dvblk + (size_t)j * kv_stride, 0, sizeof(float) * (size_t)D);
            }
            /* queries j0 .. tend-1 see some of these keys (lo non-decreasing) */
            int tend = j0;
            while (tend < T && lob[tend] < j0 + nk) tend++;
            for (int h = kh * group; h < (kh + 1) * group; h++) {
                const float *lse_bh = lse + ((size_t)b * H + h) * T, *delta_bh = delta + ((size_t)b * H + h) * T;
                for (int i0 = j0; i0 < tend; i0 += ATT_QC) {
                    const int nq = i0 + ATT_QC < tend ? ATT_QC : tend - i0;
                    const size_t qoff = ((size_t)b * T + i0) * q_stride + (size_t)h * D;
                    const float *qblk = q + qoff, *doblk = dout + qoff;
                    tile_product(bf16, false, nq, nk, D, s->scale, word_at(qa, qoff / wq), q_stride / wq,
                                 word_at(kt, kth), ldt, 0.0f, p, ATT_KB);
                    for (int r = 0; r < nq; r++) {
                        float *row = p + (size_t)r * ATT_KB;
                        int a, e;
                        row_visible(lob, i0 + r, j0, nk, &a, &e);
                        const float l = lse_bh[i0 + r];
                        exp_visible(row, nk, a, e, l);
                    }
                    /* dV += P^T dO (i0 is even: dO's pairs start at i0 / 2) */
                    const size_t qpairs = ((size_t)b * pairs + i0 / 2) * q_stride + (size_t)h * D;
                    if (bf16) {
                        pack_bf16_pairs(pt, ATT_KB, p, ATT_KB, nq, nk);
                        tile_product(true, true, nk, D, nq, 1.0f, pt, ATT_KB, dop + qpairs, q_stride, 1.0f, dvblk,
                                     kv_stride);
                    } else {
                        tile_gemm(true, nk, D, nq, 1.0f, p, ATT_KB, doblk, q_stride, 1.0f, dvblk, kv_stride);
                    }
                    /* dP = dO V^T, then dS = P * (dP - delta) * scale */
                    tile_product(bf16, false, nq, nk, D, 1.0f, word_at(doa, qoff / wq), q_stride / wq,
                                 word_at(vt, kth), ldt, 0.0f, ds, ATT_KB);
                    for (int r = 0; r < nq; r++) {
                        const float *pr = p + (size_t)r * ATT_KB;
                        float *dr = ds + (size_t)r * ATT_KB;
                        const float dl = delta_bh[i0 + r];
#pragma omp simd
                        for (int c = 0; c < nk; c++) dr[c] = pr[c] * (dr[c] - dl) * s->scale;
                    }
                    /* dK += dS^T Q;  dQ += dS K (j0 is even: K's pairs start at j0 / 2) */
                    if (bf16) {
                        pack_bf16_pairs(dst, ATT_KB, ds, ATT_KB, nq, nk);
                        tile_product(true, true, nk, D, nq, 1.0f, dst, ATT_KB, qp + qpairs, q_stride, 1.0f, dkblk,
                                     kv_stride);
                        pack_bf16_rows(dsr, ATT_KB, ds, ATT_KB, nq, nk);
                        tile_product(true, false, nq, D, nk, 1.0f, dsr, ATT_KB / 2,
                                     kp + ((size_t)b * pairs + j0 / 2) * kv_stride + (size_t)kh * D, kv_stride, 1.0f,
                                     dqt + qoff, q_stride);
                    } else {
                        tile_gemm(true, nk, D, nq, 1.0f, ds, ATT_KB, qblk, q_stride, 1.0f, dkblk, kv_stride);
                        tile_gemm(false, nq, D, nk, 1.0f, ds, ATT_KB, kblk, kv_stride, 1.0f, dqt + qoff, q_stride);
                    }
                }
            }
        }
        free(p);
        free(ds);
        free(pt);
        free(dst);
        free(dsr);
    }
    if (nth > 1) {
#pragma omp parallel for if (n_q >= PAR_MIN)
        for (size_t i = 0; i < n_q; i++) {
            float acc = dq[i];
            for (int t = 1; t < nth; t++) acc += dq_part[t][i];
            dq[i] = acc;
        }
    }
    free(dq_part);
    free(owner);
    free(tasks);
    free(lo);
}

static void cpu_attention_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
                              const int32_t *doc_ids, const struct olmo_attn_shape *s) {
    attention_fwd(false, out, lse, q, k, v, doc_ids, s);
}

static void cpu_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *out,
                              const float *lse, const float *q, const float *k, const float *v,
                              const int32_t *doc_ids, const struct olmo_attn_shape *s) {
    attention_bwd(false, dq, dk, dv, dout, out, lse, q, k, v, doc_ids, s);
}

#ifdef OLMOC_CPU_BF16
/* cpu-bf16: the products on bf16 operands (see the top of this section) */
static void cpu_attention_fwd_bf16(float *out, float *lse, const float *q, const float *k, const float *v,
                                   const int32_t *doc_ids, const struct olmo_attn_shape *s) {
    attention_fwd(true, out, lse, q, k, v, doc_ids, s);
}

static void cpu_attention_bwd_bf16(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                   const float *lse, const float *q, const float *k, const float *v,
                                   const int32_t *doc_ids, const struct olmo_attn_shape *s) {
    attention_bwd(true, dq, dk, dv, dout, out, lse, q, k, v, doc_ids, s);
}
#endif

/* silu(x) = x / (1 + exp(-x)) */
static void cpu_swiglu_fwd(float *out, const float *g, const float *u, size_t n) {
#pragma omp parallel for simd if (parallel : n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) out[i] = g[i] / (1.0f + fast_expf(-g[i])) * u[i];
}

static void cpu_swiglu_bwd(float *dg, float *du, const float *ds, const float *g, const float *u,
                           size_t n) {
#pragma omp parallel for simd if (parallel : n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        float sig = 1.0f / (1.0f + fast_expf(-g[i]));
        float sl = g[i] * sig;
        du[i] = ds[i] * sl;
        dg[i] = ds[i] * u[i] * sig * (1.0f + g[i] * (1.0f - sig));
    }
}

static void cpu_add(float *y, const float *a, const float *b, size_t n) {
#pragma omp parallel for simd if (parallel : n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) y[i] = a[i] + b[i];
}

static void cpu_cross_entropy(float *logits, const int32_t *targets, int n, int vocab, float grad_scale,
                              float z_mult, double *ce_sum, double *z_sum) {
    /* per-row results, summed in row order afterwards: deterministic */
    double *row_ce = scratch(sizeof(double) * 2 * (size_t)(n > 0 ? n : 1)), *row_z = row_ce + n;
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
        double sum = 0.0; /* fp32 exponentials, double accumulation */
#pragma omp simd reduction(+ : sum)
        for (int j = 0; j < vocab; j++) {
            float e = fast_expf(row[j] - mx);
            row[j] = e;
            sum += e;
        }
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
}

/* Fixed-size chunks (not per-thread) so the sum is the same for any thread count. */
enum { SUM_CHUNK = 1 << 16 };

static double cpu_sum_squares(const float *x, size_t n) {
    const size_t chunks = (n + SUM_CHUNK - 1) / SUM_CHUNK;
    if (chunks == 0) return 0.0;
    double *part = scratch(sizeof(double) * chunks);
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
    return total;
}

static void cpu_scale(float *x, size_t n, float s) {
#pragma omp parallel for simd if (parallel : n >= PAR_MIN)
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
}

/* Inference attention over a KV cache (olmoc generate): a few query rows
 * against cached keys, so the plain per-row loop is fast enough. */
static float cached_dot(const float *a, const float *b, int n) {
    float acc = 0.0f;
    for (int i = 0; i < n; i++) acc += a[i] * b[i];
    return acc;
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
                    float sc = cached_dot(qt, kj, D) * s->scale;
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

/* ------------------------------------------------------- GEMM libraries */

static bool has_avx512(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#else
    return false;
#endif
}

/* OpenBLAS names its kernel family ("Haswell", "SkylakeX", ...): chosen for the
 * processor when it loads, or by OPENBLAS_CORETYPE.  Haswell and Zen are AVX2:
 * on a processor with full-width AVX-512 that is half the peak at best. */
static const char *describe_openblas(void) {
    static char text[256];
    const char *kernels = openblas_get_corename();
    const bool avx2_only = !strcmp(kernels, "Haswell") || !strcmp(kernels, "Zen");
#ifdef OLMOC_HAVE_ONEDNN
    const char *warning = ": AVX2 on an AVX-512 processor, half its peak at best; backend cpu has oneDNN's AVX-512 ones";
#else
    const char *warning = ": AVX2 on an AVX-512 processor, half its peak at best; README: CPU performance";
#endif
    snprintf(text, sizeof text, "GEMMs: OpenBLAS, %s kernels%s", kernels, avx2_only && has_avx512() ? warning : "");
    return text;
}

#ifdef OLMOC_HAVE_ONEDNN
static const char *onednn_isa_name(dnnl_cpu_isa_t isa) {
    switch (isa) {
    case dnnl_cpu_isa_sse41: return "SSE4.1";
    case dnnl_cpu_isa_avx: return "AVX";
    case dnnl_cpu_isa_avx2: return "AVX2";
    case dnnl_cpu_isa_avx2_vnni: return "AVX2-VNNI";
    case dnnl_cpu_isa_avx512_core: return "AVX-512";
    case dnnl_cpu_isa_avx512_core_vnni: return "AVX-512 VNNI";
    case dnnl_cpu_isa_avx512_core_bf16: return "AVX-512 BF16";
    case dnnl_cpu_isa_avx512_core_amx: return "AVX-512 AMX";
    default: return "other";
    }
}

static const char *describe_onednn(void) {
    static char text[128];
    const dnnl_version_t *v = dnnl_version();
    snprintf(text, sizeof text, "GEMMs: oneDNN %d.%d.%d, %s JIT kernels", v->major, v->minor, v->patch,
             onednn_isa_name(dnnl_get_effective_cpu_isa()));
    return text;
}

#ifdef OLMOC_CPU_BF16
static const char *describe_onednn_bf16(void) {
    static char text[256];
    const dnnl_version_t *v = dnnl_version();
#ifdef OLMOC_ATTN_BF16
    const char *attention = "attention products: bf16 operands (AVX512-BF16) for even head_dim";
#else
    const char *attention = "attention: fp32 (this build has no AVX512-BF16)";
#endif
    snprintf(text, sizeof text, "GEMMs: oneDNN %d.%d.%d matmul, bf16 operands, fp32 accumulation, %s; %s", v->major,
             v->minor, v->patch, bf16.impl[0] ? bf16.impl : "kernels chosen on first use", attention);
    return text;
}
#endif
#endif

/* Every op but the GEMM and attention's precision is the same in all CPU variants. */
#define CPU_OPS(attn_fwd, attn_bwd)                                                                                \
    .host_memory = true, .alloc = cpu_alloc, .free = cpu_free, .to_device = cpu_copy, .to_host = cpu_copy,         \
    .zero = cpu_zero, .copy = cpu_copy, .embedding_fwd = cpu_embedding_fwd, .embedding_bwd = cpu_embedding_bwd,    \
    .rmsnorm_fwd = cpu_rmsnorm_fwd, .rmsnorm_bwd = cpu_rmsnorm_bwd, .rope_fwd = cpu_rope_fwd,                      \
    .rope_bwd = cpu_rope_bwd, .attention_fwd = attn_fwd, .attention_bwd = attn_bwd, .swiglu_fwd = cpu_swiglu_fwd,  \
    .swiglu_bwd = cpu_swiglu_bwd, .add = cpu_add, .cross_entropy = cpu_cross_entropy,                              \
    .sum_squares = cpu_sum_squares, .scale = cpu_scale, .adamw = cpu_adamw, .attention_cached = cpu_attention_cached
#define CPU_FP32_OPS CPU_OPS(cpu_attention_fwd, cpu_attention_bwd)

const struct olmo_backend *olmo_backend_cpu_gemm(enum olmo_cpu_gemm_library library) {
    static const struct olmo_backend openblas = {
        .name = "cpu-openblas", .gemm = gemm_openblas, .describe = describe_openblas, CPU_FP32_OPS};
#ifdef OLMOC_HAVE_ONEDNN
    static const struct olmo_backend onednn = {
        .name = "cpu-onednn", .gemm = gemm_onednn, .describe = describe_onednn, CPU_FP32_OPS};
    static const struct olmo_backend best = {
        .name = "cpu", .gemm = gemm_onednn, .describe = describe_onednn, CPU_FP32_OPS};
#else
    static const struct olmo_backend best = {
        .name = "cpu", .gemm = gemm_openblas, .describe = describe_openblas, CPU_FP32_OPS};
#endif
#ifdef OLMOC_CPU_BF16
    static const struct olmo_backend onednn_bf16 = {
        .name = "cpu-bf16", .gemm = gemm_onednn_bf16, .describe = describe_onednn_bf16,
        CPU_OPS(cpu_attention_fwd_bf16, cpu_attention_bwd_bf16)};
#endif
    switch (library) {
    case OLMO_CPU_GEMM_BEST: return &best;
    case OLMO_CPU_GEMM_OPENBLAS: return &openblas;
    case OLMO_CPU_GEMM_ONEDNN:
#ifdef OLMOC_HAVE_ONEDNN
        return &onednn;
#else
        olmo_error("backend 'cpu-onednn': this build has no oneDNN (install libdnnl-dev and reconfigure)");
        return NULL;
#endif
    case OLMO_CPU_GEMM_ONEDNN_BF16:
#ifdef OLMOC_CPU_BF16
        return bf16_available() ? &onednn_bf16 : NULL;
#elif defined(OLMOC_HAVE_ONEDNN)
        olmo_error("backend 'cpu-bf16' needs oneDNN 2.x's matmul API (this build has oneDNN %d)", DNNL_VERSION_MAJOR);
        return NULL;
#else
        olmo_error("backend 'cpu-bf16': this build has no oneDNN (install libdnnl-dev and reconfigure)");
        return NULL;
#endif
    }
    return NULL;
}

const struct olmo_backend *olmo_backend_cpu(void) { return olmo_backend_cpu_gemm(OLMO_CPU_GEMM_BEST); }
