/* The CPU backend's tiled flash attention, forward and backward, compiled
 * once per instruction set by the file that includes it:
 *   cpu_attention.c       with the build's flags (-march): AVX-512 kernels
 *                         where the build targets AVX-512, AVX2+FMA kernels
 *                         where it targets AVX2, else OpenBLAS tiles;
 *   cpu_attention_avx2.c  with -mavx2 -mfma -mno-avx512f (x86-64 builds):
 *                         the AVX2+FMA kernels, chosen at run time on a
 *                         processor without AVX-512 kernels in the build, or
 *                         forced with OLMOC_CPU_ISA=avx2 (cpu_attention.c).
 * Everything here is static: each including file gets its own copy, built
 * for its instruction set, and wraps attention_fwd and attention_bwd.
 * Within one copy the result is deterministic and the same for any thread
 * count; different copies may differ in the last bits (their elementwise
 * loops are vectorised at different widths). */
#ifndef OLMOC_CPU_ATTENTION_KERNELS_H
#define OLMOC_CPU_ATTENTION_KERNELS_H

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_simd.h"

/* ---- time by part, for studying the kernels ---------------------------------
 * Only where OLMOC_ATTN_PARTS is defined: tests/c/test_attention_parts.c includes this header so (its
 * --bench prints each part's share); the library's kernels are built without it, and every ATTN_ macro
 * below is then empty.  With it, a call adds to *attn_parts (when set) each thread's seconds in each
 * part (thread-seconds: summed over threads) and the FLOPs its tile products compute (whole kernel
 * vectors, masked column tails included; the column blocks and k ranges the kernels skip are not). */
#ifdef OLMOC_ATTN_PARTS
#include <time.h>
enum attn_part {
    ATTN_FWD_PACK,    /* fp32: K^T blocks and V rows copied for the task's products */
    ATTN_FWD_S,       /* S = scale Q K^T (fp32: with the rows' partial maxima) */
    ATTN_FWD_SOFTMAX, /* the rows' online softmax: maxima, exp, the output rows rescaled */
    ATTN_FWD_PV,      /* O += P V (bf16: P packed first) */
    ATTN_FWD_OUT,     /* the output rows and lse */
    ATTN_BWD_PREP,    /* before the tasks: bounds, delta, schedule (bf16: the operands' copies) */
    ATTN_BWD_PACK,    /* fp32: a key block's K^T, V^T and K, and its new queries' Q and dO rows */
    ATTN_BWD_S,       /* P = exp(scale Q K^T - lse) */
    ATTN_BWD_DV,      /* dV += P^T dO */
    ATTN_BWD_DS,      /* dP = dO V^T, dS = P (dP - delta) scale */
    ATTN_BWD_DK,      /* dK += dS^T Q */
    ATTN_BWD_DQ,      /* dQ += dS K */
    ATTN_BWD_DQSUM,   /* dq += its copies */
    ATTN_PARTS
};
struct attn_parts {
    double seconds[ATTN_PARTS], flops[ATTN_PARTS];
    double total[2]; /* forward, backward: the calls' wall time x omp_get_max_threads() */
    double model[2]; /* their model FLOPs: 4 (forward) or 8 x visible pairs x heads x head_dim */
    long calls[2];
};
static struct attn_parts *attn_parts; /* where calls add their counts; NULL: they do not count */
struct attn_timer {
    double s[ATTN_PARTS], f[ATTN_PARTS], t0;
    int part; /* the part running */
};
static _Thread_local struct attn_timer *attn_tm; /* this thread's, inside a counted call; else NULL */

static inline double attn_clock(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline void attn_begin(int part) {
    if (!attn_tm) return;
    attn_tm->part = part;
    attn_tm->t0 = attn_clock();
}

static inline void attn_end(void) {
    if (attn_tm) attn_tm->s[attn_tm->part] += attn_clock() - attn_tm->t0;
}

/* the thread's counts into *attn_parts */
static inline void attn_thread_end(void) {
    if (!attn_tm) return;
    for (int i = 0; i < ATTN_PARTS; i++) {
#pragma omp atomic
        attn_parts->seconds[i] += attn_tm->s[i];
#pragma omp atomic
        attn_parts->flops[i] += attn_tm->f[i];
    }
    attn_tm = NULL;
}

/* a call of pass 0 (forward) or 1 (backward) that began at t0 */
static void attn_call_end(int pass, double t0, const int *lo, const struct olmo_attn_shape *s) {
    if (!attn_parts) return;
    attn_parts->total[pass] += (attn_clock() - t0) * omp_get_max_threads();
    attn_parts->calls[pass]++;
    double pairs = 0.0;
    for (size_t t = 0; t < (size_t)s->batch * s->seq_len; t++) pairs += (double)(t % s->seq_len) - lo[t] + 1;
    attn_parts->model[pass] += (pass ? 8.0 : 4.0) * pairs * s->n_heads * s->head_dim;
}

/* a part outside the tasks (one thread, the others wait: its wall time x the team's threads) */
static inline void attn_serial(int part, double t0) {
    if (attn_parts) attn_parts->seconds[part] += (attn_clock() - t0) * omp_get_max_threads();
}

#define ATTN_BEGIN(part) attn_begin(part)
#define ATTN_END() attn_end()
#define ATTN_FLOPS(x) ((void)(attn_tm ? attn_tm->f[attn_tm->part] += (x) : 0.0))
#define ATTN_THREAD_BEGIN()                                                                                 \
    struct attn_timer attn_mine = {{0}, {0}, 0.0, 0};                                                       \
    attn_tm = attn_parts ? &attn_mine : NULL
#define ATTN_THREAD_END() attn_thread_end()
#define ATTN_CALL_BEGIN() const double attn_t_call = attn_clock()
#define ATTN_CALL_END(pass, lo, s) attn_call_end(pass, attn_t_call, lo, s)
#define ATTN_MARK(name) const double name = attn_clock()
#define ATTN_SERIAL(part, t0) attn_serial(part, t0)
#else
#define ATTN_BEGIN(part) ((void)0)
#define ATTN_END() ((void)0)
#define ATTN_FLOPS(x) ((void)0)
#define ATTN_THREAD_BEGIN() ((void)0)
#define ATTN_THREAD_END() ((void)0)
#define ATTN_CALL_BEGIN() ((void)0)
#define ATTN_CALL_END(pass, lo, s) ((void)0)
#define ATTN_MARK(name) ((void)0)
#define ATTN_SERIAL(part, t0) ((void)0)
#endif

/* ---- attention -------------------------------------------------------------
 * Flash-style, with tile products (tile_gemm, single-threaded inside the
 * OpenMP region) and softmax in between:
 *   forward: a task per (batch, kv head, run of blocks of ATT_QB queries)
 *     walks, for each block and each head of the group, the visible keys in
 *     chunks of ATT_KC with an online softmax;
 *   backward: a task per (batch, kv head, run of blocks of ATT_KB keys)
 *     walks the queries that see each block in chunks of ATT_QC
 *     (FlashAttention-2 order).
 * K is transposed (bf16: per head ahead, [D/2][ld] pairs, ld = T rounded up;
 * fp32: each key block as a task comes to it, the forward's as [D][64] per
 * block of 64 keys with the block's V rows beside it, the backward's as it
 * packs the block) so every score tile is a plain NN product; the fp32
 * backward's other row operands (Q and dO) are copied, contiguous per head of
 * the group, as its tasks come to them.  Memory beyond inputs and outputs is
 * O(seq_len) per head (bounds, delta, bf16: the transposed K and V and the
 * bf16 copies; dq copies: fewer than ATT_BWD_TASKS) plus per thread: tiles
 * (forward: ATT_QB x (ATT_KC + ATT_KTB) scores and ATT_QB x head_dim;
 * backward: ATT_QC x ATT_KB, and in fp32 the key block packed: 3 x ATT_KB x
 * head_dim) and, fp32, the forward's K^T blocks and V rows of one sequence
 * (2 x seq_len x head_dim) and the backward's Q and dO rows of one sequence
 * per head of a group (2 x group x seq_len x head_dim): no seq_len^2 buffer.  The AVX2 backward computes
 * P = exp(S - lse) and dS = P (dP - delta) scale in the S and dP tiles'
 * epilogues (the same operations as exp_visible and ds_row).
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
/* ATT_KC = 320: a block of 64 queries under a 256-key window sees 319 keys, one chunk (256 cut it in
 * two, the second of 63 keys with the whole per-chunk softmax cost: windowed forward 58% -> 60% of
 * the one-thread FMA peak at head_dim 64 on Zen 3, full attention unchanged) */
/* ATT_KTB: keys per block of the fp32 forward's K^T (attention_fwd) */
enum { ATT_QB = 64, ATT_KC = 320, ATT_KB = 64, ATT_QC = 64, ATT_KTB = 64 };

/* lo[b * T + t]: first key visible from query t of sequence b. */
static int *attn_bounds(const struct olmo_attn_shape *s, const int32_t *doc_ids) {
    const int T = s->seq_len;
    int *lo = cpu_scratch(sizeof(int) * (size_t)s->batch * T);
    if (!lo) return NULL;
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
/* The part of a tile product that matters, or NULL for all of it: row r of C needs only its
 * columns first[r] .. last[r] (over_k false: the rest is never read), or only the terms
 * k = first[r] .. last[r] of its sums (over_k true: the others are exact zeros of A, masked
 * scores); both non-decreasing in r.  Kernels may compute more: the AVX2 one skips whole
 * 16-column blocks and k ranges of 6-row groups, the AVX-512 one (fp32 products) 64-column
 * blocks and k ranges of 4-row groups, OpenBLAS tiles nothing.  Skipped terms are exact
 * zeros, so the sums are those of the whole product (but for the sign of a zero sum). */
struct tile_span {
    const int *first, *last;
    bool over_k;
};

/* Partial row maxima of the fused QK^T epilogue: one per lane of the kernel's vectors. */
#if defined(__AVX512F__)
#define ATT_MAXP 16
#else
#define ATT_MAXP 8
#endif
/* Epilogues of the fp32 tile kernels (beta 0), on the visible columns va[r] .. ve[r] of row r:
 *   maxp set: C = alpha op(A) B, and maxp[r][l] = the max of maxp[r][l] and the visible values of C's
 *             columns ATT_MAXP i + l (the forward's S and its row maxima; the other columns' values are kept);
 *   else, 0 on the other columns, and on the visible ones
 *   p NULL: C = exp(alpha op(A) B - shift[r])           (S -> P, exp_visible's operations);
 *   p set:  C = p[r][c] * (alpha op(A) B - shift[r]) * scale  (dP -> dS with shift = delta, ds_row's). */
struct tile_exp {
    const float *shift, *p;
    const int *va, *ve;
    float scale;
    float *maxp;
};

#if defined(__AVX512F__)
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

/* the k range of rows r0 .. r1-1 within the span; false: columns c0 .. c0+63 are not needed there */
static inline bool span_rows(const struct tile_span *span, int r0, int r1, int c0, int k, int *k0, int *k1) {
    *k0 = 0, *k1 = k;
    if (!span) return true;
    const int first = span->first[r0], last = span->last[r1 - 1];
    if (!span->over_k) return !(c0 + 64 <= first || c0 > last);
    *k0 = first > 0 ? first : 0, *k1 = last + 1 < k ? last + 1 : k;
    return true;
}

/* Row `row` of a tile, its 64 columns from c0 (acc[v]: columns c0 + 16v ..; masks: those inside C): alpha acc
 * (+ C when beta is not 0), or with an epilogue (ex, beta 0) as tile_exp says; the same operations as
 * the unfused exp_visible and ds_row, so the same bits. */
static inline __attribute__((always_inline)) void tile_row_out(const __m512 acc[4], const __mmask16 masks[4],
                                                               __m512 valpha, float beta, float *cr,
                                                               const struct tile_exp *ex, int row, int c0, int ldc) {
    if (!ex) {
        for (int v = 0; v < 4; v++) {
            __m512 val = _mm512_mul_ps(acc[v], valpha);
            if (beta != 0.0f) val = _mm512_add_ps(val, _mm512_maskz_loadu_ps(masks[v], cr + 16 * v));
            _mm512_mask_storeu_ps(cr + 16 * v, masks[v], val);
        }
        return;
    }
    const int va = ex->va[row] - c0, ve = ex->ve[row] - c0;
    if (ex->maxp) {
        __m512 mx = _mm512_set1_ps(-INFINITY);
        for (int v = 0; v < 4; v++) {
            const __m512 val = _mm512_mul_ps(acc[v], valpha);
            const __mmask16 vis = col_mask(ve + 1 - 16 * v) & (__mmask16)~col_mask(va - 16 * v);
            mx = _mm512_mask_max_ps(mx, vis, mx, val);
            _mm512_mask_storeu_ps(cr + 16 * v, masks[v], val);
        }
        float *mr = ex->maxp + (size_t)row * ATT_MAXP;
        _mm512_storeu_ps(mr, _mm512_max_ps(mx, _mm512_loadu_ps(mr)));
        return;
    }
    const __m512 sh = _mm512_set1_ps(ex->shift[row]), vs = _mm512_set1_ps(ex->scale);
    const float *pr = ex->p ? ex->p + (size_t)row * ldc + c0 : NULL;
    for (int v = 0; v < 4; v++) {
        const __mmask16 vis = col_mask(ve + 1 - 16 * v) & (__mmask16)~col_mask(va - 16 * v);
        __m512 val = _mm512_setzero_ps();
        if (vis) {
            val = _mm512_sub_ps(_mm512_mul_ps(acc[v], valpha), sh);
            val = pr ? _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(vis, pr + 16 * v), val), vs) : fast_exp16(val);
            val = _mm512_maskz_mov_ps(vis, val);
        }
        _mm512_mask_storeu_ps(cr + 16 * v, masks[v], val);
    }
}

/* Rows r0 .. r0+rows-1 of C, 64 columns from c0 (those inside C: masks), set to 0. */
static inline void tile_zero_rows(float *c, int ldc, int r0, int rows, int c0, const __mmask16 masks[4]) {
    for (int r = r0; r < r0 + rows; r++)
        for (int v = 0; v < 4; v++) _mm512_mask_storeu_ps(c + (size_t)r * ldc + c0 + 16 * v, masks[v], _mm512_setzero_ps());
}

static inline __attribute__((always_inline)) void tile_kernel(const struct tile_span *span, bool bf16, bool ta, int m,
                                                              int n, int k, float alpha, const tile_word *a, int lda,
                                                              const tile_word *b, int ldb, float beta, float *c,
                                                              int ldc, const struct tile_exp *ex) {
    const __m512 valpha = _mm512_set1_ps(alpha);
    for (int c0 = 0; c0 < n; c0 += 64) {
        const __mmask16 m0 = col_mask(n - c0), m1 = col_mask(n - c0 - 16), m2 = col_mask(n - c0 - 32),
                        m3 = col_mask(n - c0 - 48);
        const __mmask16 masks[4] = {m0, m1, m2, m3};
        const tile_word *bc = b + c0;
        int r0 = 0;
        for (; r0 + TILE_ROWS <= m; r0 += TILE_ROWS) {
            int k0, k1;
            if (!span_rows(span, r0, r0 + TILE_ROWS, c0, k, &k0, &k1)) { /* columns nobody reads: P, dS are 0 there */
                if (ex && !ex->maxp) tile_zero_rows(c, ldc, r0, TILE_ROWS, c0, masks);
                continue;
            }
            ATTN_FLOPS((bf16 ? 4.0 : 2.0) * TILE_ROWS * (k1 - k0) * 64);
            __m512 x00 = _mm512_setzero_ps(), x01 = x00, x02 = x00, x03 = x00, x10 = x00, x11 = x00, x12 = x00,
                   x13 = x00, x20 = x00, x21 = x00, x22 = x00, x23 = x00, x30 = x00, x31 = x00, x32 = x00, x33 = x00;
            /* whole 64-column blocks load B unmasked (a masked load costs an ALU uop beside the FMAs') */
#define TILE4_K_LOOP(LOAD)                                                                                  \
    for (int kk = k0; kk < k1; kk++) {                                                                      \
        const tile_word *br = bc + (size_t)kk * ldb;                                                        \
        const __m512i b0 = LOAD(m0, br), b1 = LOAD(m1, br + 16);                                            \
        const __m512i b2 = LOAD(m2, br + 32), b3 = LOAD(m3, br + 48);                                       \
        const tile_word *ar = ta ? a + (size_t)kk * lda + r0 : a + (size_t)r0 * lda + kk;                  \
        const size_t step = ta ? 1 : (size_t)lda;                                                           \
        __m512i av = _mm512_set1_epi32(ar[0]);                                                              \
        x00 = tile_mac(bf16, x00, av, b0), x01 = tile_mac(bf16, x01, av, b1);                               \
        x02 = tile_mac(bf16, x02, av, b2), x03 = tile_mac(bf16, x03, av, b3);                               \
        av = _mm512_set1_epi32(ar[step]);                                                                   \
        x10 = tile_mac(bf16, x10, av, b0), x11 = tile_mac(bf16, x11, av, b1);                               \
        x12 = tile_mac(bf16, x12, av, b2), x13 = tile_mac(bf16, x13, av, b3);                               \
        av = _mm512_set1_epi32(ar[2 * step]);                                                               \
        x20 = tile_mac(bf16, x20, av, b0), x21 = tile_mac(bf16, x21, av, b1);                               \
        x22 = tile_mac(bf16, x22, av, b2), x23 = tile_mac(bf16, x23, av, b3);                               \
        av = _mm512_set1_epi32(ar[3 * step]);                                                               \
        x30 = tile_mac(bf16, x30, av, b0), x31 = tile_mac(bf16, x31, av, b1);                               \
        x32 = tile_mac(bf16, x32, av, b2), x33 = tile_mac(bf16, x33, av, b3);                               \
    }
#define TILE_LOAD_FULL(m, p) ((void)(m), _mm512_loadu_si512(p))
            if (m3 == (__mmask16)0xFFFF) {
                TILE4_K_LOOP(TILE_LOAD_FULL)
            } else {
                TILE4_K_LOOP(_mm512_maskz_loadu_epi32)
            }
#undef TILE_LOAD_FULL
#undef TILE4_K_LOOP
            const __m512 rows[TILE_ROWS][4] = {{x00, x01, x02, x03}, {x10, x11, x12, x13}, {x20, x21, x22, x23},
                                               {x30, x31, x32, x33}};
            for (int r = 0; r < TILE_ROWS; r++)
                tile_row_out(rows[r], masks, valpha, beta, c + (size_t)(r0 + r) * ldc + c0, ex, r0 + r, c0, ldc);
        }
        for (; r0 < m; r0++) { /* leftover rows, one at a time */
            int k0, k1;
            if (!span_rows(span, r0, r0 + 1, c0, k, &k0, &k1)) {
                if (ex && !ex->maxp) tile_zero_rows(c, ldc, r0, 1, c0, masks);
                continue;
            }
            ATTN_FLOPS((bf16 ? 4.0 : 2.0) * (k1 - k0) * 64);
            __m512 x0 = _mm512_setzero_ps(), x1 = x0, x2 = x0, x3 = x0;
            for (int kk = k0; kk < k1; kk++) {
                const tile_word *br = bc + (size_t)kk * ldb;
                const __m512i av = _mm512_set1_epi32(ta ? a[(size_t)kk * lda + r0] : a[(size_t)r0 * lda + kk]);
                x0 = tile_mac(bf16, x0, av, _mm512_maskz_loadu_epi32(m0, br));
                x1 = tile_mac(bf16, x1, av, _mm512_maskz_loadu_epi32(m1, br + 16));
                x2 = tile_mac(bf16, x2, av, _mm512_maskz_loadu_epi32(m2, br + 32));
                x3 = tile_mac(bf16, x3, av, _mm512_maskz_loadu_epi32(m3, br + 48));
            }
            const __m512 xs[4] = {x0, x1, x2, x3};
            tile_row_out(xs, masks, valpha, beta, c + (size_t)r0 * ldc + c0, ex, r0, c0, ldc);
        }
    }
}

static void tile_gemm(const struct tile_span *span, bool ta, int m, int n, int k, float alpha, const float *a,
                      int lda, const float *b, int ldb, float beta, float *c, int ldc) {
    tile_kernel(span, false, ta, m, n, k, alpha, (const tile_word *)a, lda, (const tile_word *)b, ldb, beta, c, ldc,
                NULL);
}

/* C = alpha A B (fp32, beta 0) with the epilogue ex */
static void tile_gemm_ex(const struct tile_span *span, int m, int n, int k, float alpha, const float *a, int lda,
                         const float *b, int ldb, float *c, int ldc, const struct tile_exp *ex) {
    tile_kernel(span, false, false, m, n, k, alpha, (const tile_word *)a, lda, (const tile_word *)b, ldb, 0.0f, c, ldc,
                ex);
}
#elif defined(__AVX2__) && defined(__FMA__)
/* AVX2+FMA: 6 rows x 16 columns of C in 12 of the 16 ymm registers, two B
 * vectors and a broadcast A element per k (the classic Haswell/Zen shape:
 * 12 FMAs per 8 loads, 12 independent chains for the FMA latency); masked
 * loads and stores for a column tail.  Every element of C is, as in the
 * AVX-512 kernel, fma(a_k, b_k, acc) over k in order, times alpha, plus C. */
#define TILE_ROWS 6

static inline __attribute__((always_inline)) void tile_rows_avx2(int rows, bool ta, bool full, __m256i mask0,
                                                                 __m256i mask1, int k0, int k, float alpha, const float *a,
                                                                 int lda, const float *b, int ldb, float beta, float *c,
                                                                 int ldc, const struct tile_exp *ex, int r0, int c0,
                                                                 const float *pf) {
    __m256 x[TILE_ROWS][2];
#pragma GCC unroll 6
    for (int r = 0; r < rows; r++) x[r][0] = x[r][1] = _mm256_setzero_ps();
    const size_t step = ta ? 1 : (size_t)lda;
    /* two steps of k an iteration: half the loop's pointer and counter work, which shares the FMA ports on
     * Intel (one thread, forced AVX2, T=2048 and 4 x 512, head_dim 64 and 128, windowed and full, 15 rounds
     * alternating with one step: backward faster in 13, +2.4% on average; forward +1.8%) */
#pragma GCC unroll 2
    for (int kk = k0; kk < k; kk++) {
        const float *br = b + (size_t)kk * ldb;
        if (pf) _mm_prefetch((const char *)(pf + (size_t)kk * ldb), _MM_HINT_T0); /* the next block's row kk */
        const __m256 b0 = full ? _mm256_loadu_ps(br) : _mm256_maskload_ps(br, mask0);
        const __m256 b1 = full ? _mm256_loadu_ps(br + 8) : _mm256_maskload_ps(br + 8, mask1);
        const float *ar = ta ? a + (size_t)kk * lda : a + kk;
#pragma GCC unroll 6
        for (int r = 0; r < rows; r++) {
            const __m256 av = _mm256_broadcast_ss(ar + r * step);
            x[r][0] = _mm256_fmadd_ps(av, b0, x[r][0]);
            x[r][1] = _mm256_fmadd_ps(av, b1, x[r][1]);
        }
    }
    const __m256 valpha = _mm256_set1_ps(alpha);
#pragma GCC unroll 6
    for (int r = 0; r < rows; r++) {
        float *cr = c + (size_t)r * ldc;
        __m256 v0 = x[r][0], v1 = x[r][1];
        if (alpha != 1.0f) v0 = _mm256_mul_ps(v0, valpha), v1 = _mm256_mul_ps(v1, valpha); /* x * 1 is x */
        if (ex) {
            const int va = ex->va[r0 + r] - c0, ve = ex->ve[r0 + r] - c0;
            const __m256 sh = ex->maxp ? _mm256_setzero_ps() : _mm256_set1_ps(ex->shift[r0 + r]); /* no shift for maxp */
            /* every column of the row visible (the tiles inside the mask's band): no lane masks */
            const bool every = va <= 0 && ve >= 15;
            const __m256i vis0 = every ? _mm256_set1_epi32(-1) : _mm256_andnot_si256(lane_mask8(va), lane_mask8(ve + 1)),
                          vis1 = every ? _mm256_set1_epi32(-1) : _mm256_andnot_si256(lane_mask8(va - 8), lane_mask8(ve - 7));
            if (ex->maxp) {
                float *mr = ex->maxp + (size_t)(r0 + r) * ATT_MAXP;
                const __m256 none = _mm256_set1_ps(-INFINITY);
                const __m256 m = every ? _mm256_max_ps(v0, v1)
                                       : _mm256_max_ps(_mm256_blendv_ps(none, v0, _mm256_castsi256_ps(vis0)),
                                                       _mm256_blendv_ps(none, v1, _mm256_castsi256_ps(vis1)));
                _mm256_storeu_ps(mr, _mm256_max_ps(m, _mm256_loadu_ps(mr)));
            } else if (ex->p) {
                const float *pr = ex->p + (size_t)(r0 + r) * ldc + c0;
                const __m256 vs = _mm256_set1_ps(ex->scale);
                v0 = _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(pr), _mm256_sub_ps(v0, sh)), vs);
                v1 = _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(pr + 8), _mm256_sub_ps(v1, sh)), vs);
            } else {
                /* s - lse <= 0 on the visible lanes; a hidden lane may exceed the exp's range (garbage bits),
                 * which the mask below clears */
                v0 = attn_exp8(_mm256_sub_ps(v0, sh)), v1 = attn_exp8(_mm256_sub_ps(v1, sh));
            }
            if (!ex->maxp && !every) {
                v0 = _mm256_and_ps(_mm256_castsi256_ps(vis0), v0);
                v1 = _mm256_and_ps(_mm256_castsi256_ps(vis1), v1);
            }
        }
        if (full) {
            if (beta != 0.0f) v0 = _mm256_add_ps(v0, _mm256_loadu_ps(cr)), v1 = _mm256_add_ps(v1, _mm256_loadu_ps(cr + 8));
            _mm256_storeu_ps(cr, v0);
            _mm256_storeu_ps(cr + 8, v1);
        } else {
            if (beta != 0.0f)
                v0 = _mm256_add_ps(v0, _mm256_maskload_ps(cr, mask0)),
                v1 = _mm256_add_ps(v1, _mm256_maskload_ps(cr + 8, mask1));
            _mm256_maskstore_ps(cr, mask0, v0);
            _mm256_maskstore_ps(cr + 8, mask1, v1);
        }
    }
}

/* rows r0 .. r0+rows-1 of one 16-column block (columns c0 .. c0+15 of C), within the span */
static inline __attribute__((always_inline)) void tile_group_avx2(int rows, int r0, int c0, const struct tile_span *span,
                                                                  bool full, __m256i mask0, __m256i mask1, bool ta,
                                                                  int k, float alpha, const float *a, int lda,
                                                                  const float *b, int ldb, float beta, float *c,
                                                                  int ldc, const struct tile_exp *ex, const float *pf) {
    int k0 = 0, k1 = k;
    if (span) {
        const int first = span->first[r0], last = span->last[r0 + rows - 1];
        if (!span->over_k && (c0 + 16 <= first || c0 > last)) { /* columns nobody reads: P is 0 there */
            if (ex && !ex->maxp)
                for (int r = 0; r < rows; r++) {
                    float *cr = c + (size_t)(r0 + r) * ldc;
                    _mm256_maskstore_ps(cr, full ? _mm256_set1_epi32(-1) : mask0, _mm256_setzero_ps());
                    _mm256_maskstore_ps(cr + 8, full ? _mm256_set1_epi32(-1) : mask1, _mm256_setzero_ps());
                }
            return;
        }
        if (span->over_k) k0 = first > 0 ? first : 0, k1 = last + 1 < k ? last + 1 : k;
    }
    ATTN_FLOPS(2.0 * rows * (k1 - k0) * 16);
    tile_rows_avx2(rows, ta, full, mask0, mask1, k0, k1, alpha, ta ? a + r0 : a + (size_t)r0 * lda, lda, b, ldb, beta,
                   c + (size_t)r0 * ldc, ldc, ex, r0, c0, pf);
}

/* the rows of one 16-column block: whole groups of 6, then the rest; the first group of 6 also
 * prefetches the next block's B rows (next, or NULL; over its own k range) into L1 for the groups that
 * follow, none when it is skipped by the span or m < 6 (in training, 20m forced AVX2, two alternating
 * runs: attention's GFLOP/s forward +1-5%, backward +2-3%; tok/s within the noise) */
static inline __attribute__((always_inline)) void tile_cols_avx2(int c0, const struct tile_span *span, bool full,
                                                                 __m256i mask0, __m256i mask1, bool ta, int m, int k,
                                                                 float alpha, const float *a, int lda, const float *b,
                                                                 int ldb, float beta, float *c, int ldc,
                                                                 const struct tile_exp *ex, const float *next) {
    int r0 = 0;
    for (; r0 + TILE_ROWS <= m; r0 += TILE_ROWS)
        tile_group_avx2(TILE_ROWS, r0, c0, span, full, mask0, mask1, ta, k, alpha, a, lda, b, ldb, beta, c, ldc, ex,
                        r0 == 0 ? next : NULL);
    switch (m - r0) {
    case 5: tile_group_avx2(5, r0, c0, span, full, mask0, mask1, ta, k, alpha, a, lda, b, ldb, beta, c, ldc, ex, NULL); break;
    case 4: tile_group_avx2(4, r0, c0, span, full, mask0, mask1, ta, k, alpha, a, lda, b, ldb, beta, c, ldc, ex, NULL); break;
    case 3: tile_group_avx2(3, r0, c0, span, full, mask0, mask1, ta, k, alpha, a, lda, b, ldb, beta, c, ldc, ex, NULL); break;
    case 2: tile_group_avx2(2, r0, c0, span, full, mask0, mask1, ta, k, alpha, a, lda, b, ldb, beta, c, ldc, ex, NULL); break;
    case 1: tile_group_avx2(1, r0, c0, span, full, mask0, mask1, ta, k, alpha, a, lda, b, ldb, beta, c, ldc, ex, NULL); break;
    default: break;
    }
}

static inline __attribute__((always_inline)) void tile_gemm_avx2(const struct tile_span *span, bool ta, int m, int n,
                                                                 int k, float alpha, const float *a, int lda,
                                                                 const float *b, int ldb, float beta, float *c, int ldc,
                                                                 const struct tile_exp *ex) {
    const __m256i none = _mm256_setzero_si256();
    int c0 = 0;
    for (; c0 + 16 <= n; c0 += 16)
        tile_cols_avx2(c0, span, true, none, none, ta, m, k, alpha, a, lda, b + c0, ldb, beta, c + c0, ldc, ex,
                       c0 + 16 < n ? b + c0 + 16 : NULL);
    if (c0 < n)
        tile_cols_avx2(c0, span, false, lane_mask8(n - c0), lane_mask8(n - c0 - 8), ta, m, k, alpha, a, lda, b + c0,
                       ldb, beta, c + c0, ldc, ex, NULL);
}

static void tile_gemm(const struct tile_span *span, bool ta, int m, int n, int k, float alpha, const float *a,
                      int lda, const float *b, int ldb, float beta, float *c, int ldc) {
    tile_gemm_avx2(span, ta, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, NULL);
}

/* C = alpha A B (fp32, beta 0) with the epilogue ex */
static void tile_gemm_ex(const struct tile_span *span, int m, int n, int k, float alpha, const float *a, int lda,
                         const float *b, int ldb, float *c, int ldc, const struct tile_exp *ex) {
    tile_gemm_avx2(span, false, m, n, k, alpha, a, lda, b, ldb, 0.0f, c, ldc, ex);
}
#else
static void tile_gemm(const struct tile_span *span, bool ta, int m, int n, int k, float alpha, const float *a,
                      int lda, const float *b, int ldb, float beta, float *c, int ldc) {
    (void)span;
    ATTN_FLOPS(2.0 * m * n * k);
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c,
                ldc);
}
#endif

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
/* S = alpha A B, and row r's maximum over its visible columns (span) into maxp[r][0 .. ATT_MAXP-1]
 * (partial maxima, each raised from what it holds): S and its row maxima in one pass */
#define ATT_FUSED_MAX 1
static void tile_gemm_max(const struct tile_span *span, int m, int n, int k, float alpha, const float *a, int lda,
                          const float *b, int ldb, float *maxp, float *c, int ldc) {
    const struct tile_exp ex = {NULL, NULL, span->first, span->last, 0.0f, maxp};
    tile_gemm_ex(span, m, n, k, alpha, a, lda, b, ldb, c, ldc, &ex);
}

/* P = exp(alpha A B - shift[r]) on the visible columns (span), 0 elsewhere: S and exp_visible in one pass */
#define ATT_FUSED_EXP 1
static void tile_gemm_exp(const struct tile_span *span, int m, int n, int k, float alpha, const float *a, int lda,
                          const float *b, int ldb, const float *shift, float *c, int ldc) {
    const struct tile_exp ex = {shift, NULL, span->first, span->last, 0.0f, NULL};
    tile_gemm_ex(span, m, n, k, alpha, a, lda, b, ldb, c, ldc, &ex);
}

/* dS = P * (A B - delta[r]) * scale on the visible columns (span), 0 elsewhere: dP and ds_row in one pass
 * (P has C's layout) */
static void tile_gemm_ds(const struct tile_span *span, int m, int n, int k, const float *a, int lda, const float *b,
                         int ldb, const float *delta, const float *p, float scale, float *c, int ldc) {
    const struct tile_exp ex = {delta, p, span->first, span->last, scale, NULL};
    tile_gemm_ex(span, m, n, k, 1.0f, a, lda, b, ldb, c, ldc, &ex);
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
static void tile_product(const struct tile_span *span, bool bf16, bool ta, int m, int n, int k, float alpha,
                         const void *a, int lda, const void *b, int ldb, float beta, float *c, int ldc) {
#ifdef OLMOC_ATTN_BF16
    if (bf16) {
        tile_kernel(NULL, true, ta, m, n, (k + 1) / 2, alpha, a, lda, b, ldb, beta, c, ldc, NULL);
        return;
    }
#endif
    (void)bf16;
    tile_gemm(span, ta, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
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
static uint32_t *bf16_position_pairs(struct cpu_state *st, int slot, const float *x, int B, int T, int width) {
    const int pairs = (T + 1) / 2, blocks = (pairs + 31) / 32;
    uint32_t *xp = cpu_cached_scratch(st, slot, sizeof(uint32_t) * (size_t)B * pairs * width);
    if (!xp) return NULL;
#pragma omp parallel for if ((size_t)B * T * width >= PAR_MIN)
    for (int job = 0; job < B * blocks; job++) {
        const int b = job / blocks, p0 = job % blocks * 32, t0 = 2 * p0, rows = T - t0 < 64 ? T - t0 : 64;
        pack_bf16_pairs(xp + ((size_t)b * pairs + p0) * width, width, x + ((size_t)b * T + t0) * width, width, rows,
                        width);
    }
    return xp;
}

/* x [B*T][heads*D] as bf16 rows, the same layout (A operands whose k is head_dim; D even). */
static uint32_t *bf16_rows(struct cpu_state *st, int slot, const float *x, int B, int T, int width) {
    uint16_t *xb = cpu_cached_scratch(st, slot, sizeof(uint16_t) * (size_t)B * T * width);
    if (!xb) return NULL;
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
 * returns the sum of the row.  The shift is the row's maximum or its lse,
 * so row[c] - shift <= 0 (the AVX2 exp has no overflow clamp).  The masked columns are few (the tiles on the
 * diagonal and at the window's edge), so the AVX-512 version handles them
 * with lane masks on 16 columns at a time rather than a test per column; the
 * AVX2 one walks the runs (zeros, a first vector in part, whole vectors two at a
 * time, the last in part, zeros) instead of testing each vector, with attn_exp8
 * (one thread, 64 rows of 320 columns with 256 visible, warm: 287-319 -> 200-204
 * TSC ticks a row, against the loop of a test per vector with fast_exp8_softmax). */
#if defined(__AVX512F__)
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
#elif defined(__AVX2__) && defined(__FMA__)
static float exp_visible(float *row, int n, int a, int e, float shift) {
    const __m256 vshift = _mm256_set1_ps(shift), zero = _mm256_setzero_ps();
    __m256 sum0 = zero, sum1 = zero;
    int c0 = 0;
    if (e >= a) {
        for (; c0 + 8 <= a; c0 += 8) _mm256_storeu_ps(row + c0, zero); /* wholly before the visible columns */
        if (c0 < a || c0 + 7 > e) { /* the first visible vector, in part */
            const __m256i visible = _mm256_andnot_si256(lane_mask8(a - c0), lane_mask8(e - c0 + 1));
            const __m256 p = _mm256_and_ps(_mm256_castsi256_ps(visible),
                                           attn_exp8(_mm256_sub_ps(_mm256_maskload_ps(row + c0, visible), vshift)));
            sum0 = p;
            if (c0 + 8 <= n)
                _mm256_storeu_ps(row + c0, p);
            else
                _mm256_maskstore_ps(row + c0, lane_mask8(n - c0), p);
            c0 += 8;
        }
        for (; c0 + 15 <= e; c0 += 16) { /* two whole vectors */
            const __m256 p0 = attn_exp8(_mm256_sub_ps(_mm256_loadu_ps(row + c0), vshift));
            const __m256 p1 = attn_exp8(_mm256_sub_ps(_mm256_loadu_ps(row + c0 + 8), vshift));
            sum0 = _mm256_add_ps(sum0, p0), sum1 = _mm256_add_ps(sum1, p1);
            _mm256_storeu_ps(row + c0, p0);
            _mm256_storeu_ps(row + c0 + 8, p1);
        }
        for (; c0 <= e; c0 += 8) { /* the last visible vectors (the last maybe in part) */
            const __m256i visible = lane_mask8(e - c0 + 1);
            const __m256 p = _mm256_and_ps(_mm256_castsi256_ps(visible),
                                           attn_exp8(_mm256_sub_ps(_mm256_maskload_ps(row + c0, visible), vshift)));
            sum0 = _mm256_add_ps(sum0, p);
            if (c0 + 8 <= n)
                _mm256_storeu_ps(row + c0, p);
            else
                _mm256_maskstore_ps(row + c0, lane_mask8(n - c0), p);
        }
    }
    for (; c0 < n; c0 += 8) /* after them */
        if (c0 + 8 <= n)
            _mm256_storeu_ps(row + c0, zero);
        else
            _mm256_maskstore_ps(row + c0, lane_mask8(n - c0), zero);
    return hsum8(_mm256_add_ps(sum0, sum1));
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

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
/* dst[i * ldd + j] = src[j * lds + i] for i, j < 8 */
static inline void transpose8x8(float *dst, size_t ldd, const float *src, size_t lds) {
    __m256 r[8], u[8];
    for (int j = 0; j < 8; j++) r[j] = _mm256_loadu_ps(src + (size_t)j * lds);
    for (int j = 0; j < 8; j += 2) u[j] = _mm256_unpacklo_ps(r[j], r[j + 1]), u[j + 1] = _mm256_unpackhi_ps(r[j], r[j + 1]);
    for (int j = 0; j < 8; j += 4) {
        r[j] = _mm256_shuffle_ps(u[j], u[j + 2], _MM_SHUFFLE(1, 0, 1, 0));
        r[j + 1] = _mm256_shuffle_ps(u[j], u[j + 2], _MM_SHUFFLE(3, 2, 3, 2));
        r[j + 2] = _mm256_shuffle_ps(u[j + 1], u[j + 3], _MM_SHUFFLE(1, 0, 1, 0));
        r[j + 3] = _mm256_shuffle_ps(u[j + 1], u[j + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; i++) {
        _mm256_storeu_ps(dst + (size_t)i * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
        _mm256_storeu_ps(dst + (size_t)(i + 4) * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
    }
}
#endif

/* Each head of x [B*T][heads*D] transposed as bf16 pairs, ld = transposed_ld(T) (D even):
 *   xt[((b * heads + h) * D/2 + p) * ld + t] = the pair (d = 2p, 2p + 1) of x[(b * T + t) * heads * D + h * D + d]
 *   (B operands whose k is head_dim; the fp32 forward packs its K^T blocks as it goes: attention_fwd). */
static uint32_t *transpose_heads_pairs(struct cpu_state *st, int slot, const float *x, int B, int T, int heads, int D) {
    const size_t ld = (size_t)transposed_ld(T);
    const int rows = D / 2; /* per head */
    uint32_t *xt = cpu_cached_scratch(st, slot, sizeof(uint32_t) * (size_t)B * ld * heads * rows);
    if (!xt) return NULL;
    const int tiles = (T + 63) / 64;
#pragma omp parallel for if ((size_t)B * T * heads * D >= PAR_MIN)
    for (int job = 0; job < B * heads * tiles; job++) {
        const int tt = job % tiles, h = (job / tiles) % heads, b = job / (tiles * heads);
        const int t0 = tt * 64, t1 = t0 + 64 < T ? t0 + 64 : T;
        uint32_t *dst = xt + ((size_t)b * heads + h) * rows * ld;
        for (int t = t0; t < t1; t++) {
            const float *src = x + ((size_t)b * T + t) * heads * D + (size_t)h * D;
            for (int p = 0; p < rows; p++)
                dst[(size_t)p * ld + t] = (uint32_t)to_bf16(src[2 * p]) | (uint32_t)to_bf16(src[2 * p + 1]) << 16;
        }
    }
    return xt;
}

/* dst[d * ldd + j] = src[j * lds + d] for j < nk, d < D: a block of keys' K^T or V^T [D][ldd] */
static void pack_transposed(float *dst, int ldd, const float *src, int lds, int nk, int D) {
    int j0 = 0;
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
    if (D % 8 == 0) /* 8 keys at a time, 8x8 blocks in registers */
        for (; j0 + 8 <= nk; j0 += 8)
            for (int d0 = 0; d0 < D; d0 += 8)
                transpose8x8(dst + (size_t)d0 * ldd + j0, (size_t)ldd, src + (size_t)j0 * lds + d0, (size_t)lds);
#endif
    for (int j = j0; j < nk; j++)
        for (int d = 0; d < D; d++) dst[(size_t)d * ldd + j] = src[(size_t)j * lds + d];
}

/* dst[j * D + d] = src[j * lds + d] for j < n, d < D: n rows of one head, contiguous */
static void pack_rows(float *dst, const float *src, int lds, int n, int D) {
    for (int j = 0; j < n; j++) memcpy(dst + (size_t)j * D, src + (size_t)j * lds, sizeof(float) * (size_t)D);
}

/* &base[offset] for arrays of 4-byte elements (floats or bf16 pairs) */
static inline const void *word_at(const void *base, size_t offset) { return (const char *)base + 4 * offset; }

/* Per-thread tiles, allocated before a parallel region (which has no error
 * path): `floats` per thread, rounded up to 64 bytes, for every thread the
 * region may have. */
static float *thread_tiles(size_t floats, size_t *stride) {
    *stride = (floats + 15) / 16 * 16;
    return cpu_scratch(sizeof(float) * *stride * (size_t)omp_get_max_threads());
}

/* Forward tasks: query blocks qb0 .. qb1-1 of every head in kv head kh's group, sequence b. */
struct attn_fwd_task {
    int b, kh, qb0, qb1;
    double cost;
};

/* Forward tasks per thread that a shape aims for: fewer (batch, kv head) pairs than
 * ATT_FWD_TASKS x threads cut each pair's query blocks into runs of about equal cost. */
enum { ATT_FWD_TASKS = 4 };

static int fwd_task_cost_desc(const void *pa, const void *pb) {
    const struct attn_fwd_task *a = pa, *b = pb;
    if (a->cost != b->cost) return a->cost < b->cost ? 1 : -1;
    if (a->b != b->b) return a->b - b->b; /* ties: by position, so the order is total */
    if (a->kh != b->kh) return a->kh - b->kh;
    return a->qb0 - b->qb0;
}

/* A forward query block's cost for the schedule: its queries times the keys from its first one's first
 * visible key, plus a block's fixed work (lob: the sequence's bounds) */
static double fwd_block_cost(const int *lob, int qb, int T) {
    const int i0 = qb * ATT_QB, i1 = i0 + ATT_QB < T ? i0 + ATT_QB : T;
    return (double)(i1 - i0) * (i1 - lob[i0] + ATT_QB);
}

/* The forward's tasks, longest first: a (batch, kv head) pair's query blocks in `segs` runs of about
 * equal cost (keys seen, plus a block's fixed work); runs never change a result (each row is computed
 * whole by one task, the same way), so they may follow the thread count. */
static struct attn_fwd_task *attn_fwd_schedule(const struct olmo_attn_shape *s, const int *lo, int *n_tasks) {
    const int T = s->seq_len, HK = s->n_kv_heads, pairs = s->batch * HK, qblocks = (T + ATT_QB - 1) / ATT_QB;
    const int want = ATT_FWD_TASKS * omp_get_max_threads();
    int segs = pairs >= want ? 1 : (want + pairs - 1) / pairs;
    if (segs > qblocks) segs = qblocks;
    struct attn_fwd_task *tasks = cpu_scratch(sizeof *tasks * (size_t)pairs * segs);
    if (!tasks) return NULL;
    int n = 0;
    for (int pair = 0; pair < pairs; pair++) {
        const int b = pair / HK, kh = pair % HK;
        const int *lob = lo + (size_t)b * T;
        double total = 0;
        for (int qb = 0; qb < qblocks; qb++) total += fwd_block_cost(lob, qb, T);
        double sum = 0;
        for (int qb = 0, g = 0, qb0 = 0; qb < qblocks; qb++) {
            sum += fwd_block_cost(lob, qb, T);
            if (qb == qblocks - 1 || sum >= total * (g + 1) / segs) { /* run g ends with block qb */
                tasks[n++] = (struct attn_fwd_task){b, kh, qb0, qb + 1, sum};
                g++, qb0 = qb + 1, sum = 0;
            }
        }
    }
    qsort(tasks, (size_t)n, sizeof *tasks, fwd_task_cost_desc);
    *n_tasks = n;
    return tasks;
}

static int attention_fwd(struct cpu_state *st, bool bf16_products, float *out, float *lse, const float *q,
                          const float *k, const float *v, const int32_t *doc_ids, const struct olmo_attn_shape *s) {
    const int T = s->seq_len, H = s->n_heads, HK = s->n_kv_heads, D = s->head_dim;
    const int group = H / HK;
    const int q_stride = H * D, kv_stride = HK * D;
    const bool bf16 = attn_bf16(bf16_products, s);
    const int wq = bf16 ? 2 : 1; /* floats per element of Q's operand (a bf16 pair holds two) */
    const int kt_rows = D / wq, ldt = transposed_ld(T), pairs = (T + 1) / 2;
    ATTN_CALL_BEGIN();
    int *lo = attn_bounds(s, doc_ids);
    int n_tasks = 0;
    struct attn_fwd_task *tasks = lo ? attn_fwd_schedule(s, lo, &n_tasks) : NULL;
    /* bf16: K^T as [D/2][ld] pairs and V as position pairs, for every head ahead.  fp32: each task packs
     * the key blocks it reads, as it comes to them, into its thread's K^T blocks [D][ATT_KTB] and V rows
     * [ATT_KTB][D] (room for every block of a sequence), where its products then find them in cache: one
     * thread, T 2048, 6 heads of 64, forced AVX2, against K^T blocks and V rows per head made ahead in one
     * pass (three alternating rounds): window 256 68-70 -> 75 GFLOP/s, 4 x 512 window 256 65-66 -> 76. */
    const int nkb = (T + ATT_KTB - 1) / ATT_KTB;
    const size_t kv_floats = (size_t)nkb * ATT_KTB * D;
    float *kv_mine = !tasks || bf16 ? NULL
                                    : cpu_cached_scratch(st, SLOT_KT, sizeof(float) * 2 * kv_floats *
                                                                          (size_t)omp_get_max_threads());
    const void *kt = !tasks ? NULL : bf16 ? (const void *)transpose_heads_pairs(st, SLOT_KT, k, s->batch, T, HK, D)
                                          : kv_mine;
    const void *qa = !kt ? NULL : bf16 ? (const void *)bf16_rows(st, SLOT_Q16, q, s->batch, T, q_stride) : q;
    const uint32_t *vp = bf16 && qa ? bf16_position_pairs(st, SLOT_VP, v, s->batch, T, kv_stride) : NULL;
    /* per thread: scores (rows of ldsc, after ATT_KTB floats that the fp32 S product may write before
     * them), the output accumulator, and P as bf16 */
    const int ldsc = ATT_KC + ATT_KTB;
    size_t stride = 0;
    float *tiles = qa && (bf16 ? vp != NULL : true)
                       ? thread_tiles(ATT_KTB + (size_t)ATT_QB * ldsc + (size_t)ATT_QB * D +
                                          (bf16 ? (size_t)ATT_QB * ATT_KC / 2 : 0),
                                      &stride)
                       : NULL;
    if (!tiles) {
        free(tasks);
        free(lo);
        return -1;
    }
    /* Each task owns its output rows, so any schedule gives the same result. */
#pragma omp parallel if (n_tasks > 1)
    {
        float *sc = tiles + stride * (size_t)omp_get_thread_num() + ATT_KTB;
        float *acc = sc + (size_t)ATT_QB * ldsc;
        uint16_t *pb = bf16 ? (uint16_t *)(acc + (size_t)ATT_QB * D) : NULL; /* P as bf16 */
        float *ktb = bf16 ? NULL : kv_mine + 2 * kv_floats * (size_t)omp_get_thread_num();
        float *vrows = bf16 ? NULL : ktb + kv_floats;
        float mrow[ATT_QB], maxp[ATT_MAXP * ATT_QB]; /* partial maxima of each row of a chunk */
        double lrow[ATT_QB];
        int vis_a[ATT_QB], vis_e[ATT_QB]; /* each row's visible columns of the chunk */
        ATTN_THREAD_BEGIN();
#pragma omp for schedule(dynamic)
        for (int t = 0; t < n_tasks; t++) {
            const int b = tasks[t].b, kh = tasks[t].kh;
            const int *lob = lo + (size_t)b * T;
            /* fp32: key blocks base .. filled-1 packed so far (K^T block j - base at ktb + (j - base) D ATT_KTB,
             * key j's V row at vrows + (j - base ATT_KTB) D) */
            const int base = (lob[tasks[t].qb0 * ATT_QB] & ~1) / ATT_KTB;
            int filled = base;
            for (int qb = tasks[t].qb0; qb < tasks[t].qb1; qb++) {
                const int i0 = qb * ATT_QB, nq = i0 + ATT_QB < T ? ATT_QB : T - i0, i1 = i0 + nq;
                ATTN_BEGIN(ATTN_FWD_PACK);
                for (; !bf16 && filled * ATT_KTB < i1; filled++) { /* the blocks up to key i1-1 */
                    const int j0 = filled * ATT_KTB, nk = j0 + ATT_KTB < T ? ATT_KTB : T - j0;
                    const float *kr = k + ((size_t)b * T + j0) * kv_stride + (size_t)kh * D,
                                *vr = v + ((size_t)b * T + j0) * kv_stride + (size_t)kh * D;
                    pack_transposed(ktb + (size_t)(filled - base) * D * ATT_KTB, ATT_KTB, kr, kv_stride, nk, D);
                    pack_rows(vrows + (size_t)(filled - base) * ATT_KTB * D, vr, kv_stride, nk, D);
                }
                ATTN_END();
                for (int h = kh * group; h < (kh + 1) * group; h++) {
                    const size_t qoff = ((size_t)b * T + i0) * q_stride + (size_t)h * D;
                    const size_t kth = ((size_t)b * HK + kh) * kt_rows * ldt;
                    if (qb + 1 < tasks[t].qb1) /* the next block's Q rows of this head, into L2 ahead of it */
                        for (int r = i1; r < i1 + ATT_QB && r < T; r++)
                            for (int d = 0; d < D; d += 16)
                                __builtin_prefetch(q + ((size_t)b * T + r) * q_stride + (size_t)h * D + d, 0, 2);
                    memset(acc, 0, sizeof(float) * (size_t)nq * D);
                    for (int r = 0; r < nq; r++) {
                        mrow[r] = -INFINITY;
                        lrow[r] = 0.0;
                    }
                    /* keys from lob[i0] (rounded down to even, for the bf16 pairs) to i1-1, in chunks */
                    for (int j0 = lob[i0] & ~1, nk; j0 < i1; j0 += nk) {
                        nk = i1 - j0 < ATT_KC ? i1 - j0 : ATT_KC;
                        for (int r = 0; r < nq; r++) row_visible(lob, i0 + r, j0, nk, &vis_a[r], &vis_e[r]);
                        const struct tile_span cols = {vis_a, vis_e, false}, terms = {vis_a, vis_e, true};
#ifdef ATT_FUSED_MAX
                        const bool fused = !bf16; /* S and its rows' maxima in one pass */
#else
                        const bool fused = false;
#endif
                        ATTN_BEGIN(ATTN_FWD_S);
                        if (!bf16) { /* S, a block of K^T at a time */
                            if (fused)
                                for (int r = 0; r < ATT_MAXP * nq; r++) maxp[r] = -INFINITY;
                            /* from key j0a, the block's first: its columns before j0 land in the ATT_KTB floats
                             * before each row (not visible, never read) */
                            const int j0a = j0 / ATT_KTB * ATT_KTB, off = j0 - j0a;
                            int pa[ATT_QB], pe[ATT_QB];
                            const struct tile_span piece = {pa, pe, false};
                            for (int c = 0; c < off + nk; c += ATT_KTB) { /* columns c .. of S from key j0a */
                                const int w = off + nk - c < ATT_KTB ? off + nk - c : ATT_KTB;
                                const float *kblk = ktb + (size_t)((j0a + c) / ATT_KTB - base) * D * ATT_KTB;
                                for (int r = 0; r < nq; r++) pa[r] = vis_a[r] + off - c, pe[r] = vis_e[r] + off - c;
#ifdef ATT_FUSED_MAX
                                tile_gemm_max(&piece, nq, w, D, s->scale, q + qoff, q_stride, kblk, ATT_KTB, maxp,
                                              sc - off + c, ldsc);
#else
                                tile_product(&piece, false, false, nq, w, D, s->scale, q + qoff, q_stride, kblk,
                                             ATT_KTB, 0.0f, sc - off + c, ldsc);
#endif
                            }
                        } else {
                            tile_product(&cols, true, false, nq, nk, D, s->scale, word_at(qa, qoff / wq),
                                         q_stride / wq, word_at(kt, kth + j0), ldt, 0.0f, sc, ldsc);
                        }
                        ATTN_END();
                        ATTN_BEGIN(ATTN_FWD_SOFTMAX);
                        /* the last chunk: the output rows, which the block's last step writes, into L2 a row at a
                         * time among the softmax's work (one thread, T 2048, 6 heads of 64, window 256, forced
                         * AVX2: their stores had taken 5-7% of the forward, waiting for the lines) */
                        const bool last = j0 + nk == i1;
                        for (int r = 0; r < nq; r++) {
                            if (last)
                                for (int d = 0; d < D; d += 16)
                                    __builtin_prefetch(out + ((size_t)b * T + i0 + r) * q_stride + (size_t)h * D + d, 1, 2);
                            float *row = sc + (size_t)r * ldsc;
                            const int a = vis_a[r], e = vis_e[r];
                            if (e < a) {
                                memset(row, 0, sizeof(float) * (size_t)nk);
                                continue;
                            }
                            float mx = fused ? max_of(maxp + (size_t)ATT_MAXP * r, ATT_MAXP) : max_of(row + a, e - a + 1);
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
                        ATTN_END();
                        ATTN_BEGIN(ATTN_FWD_PV);
                        if (bf16) { /* O += P V: P's rows and V's position pairs (j0 is even) */
                            pack_bf16_rows(pb, ATT_KC, sc, ldsc, nq, nk);
                            tile_product(&terms, true, false, nq, D, nk, 1.0f, pb, ATT_KC / 2,
                                         vp + ((size_t)b * pairs + j0 / 2) * kv_stride + (size_t)kh * D, kv_stride,
                                         1.0f, acc, D);
                        } else {
                            tile_gemm(&terms, false, nq, D, nk, 1.0f, sc, ldsc,
                                      vrows + (size_t)(j0 - base * ATT_KTB) * D, D, 1.0f, acc, D);
                        }
                        ATTN_END();
                    }
                    ATTN_BEGIN(ATTN_FWD_OUT);
                    for (int r = 0; r < nq; r++) {
                        float *orow = out + ((size_t)b * T + i0 + r) * q_stride + (size_t)h * D;
                        const float *ar = acc + (size_t)r * D, inv = (float)(1.0 / lrow[r]);
#pragma omp simd
                        for (int d = 0; d < D; d++) orow[d] = ar[d] * inv;
                        lse[((size_t)b * H + h) * T + i0 + r] = mrow[r] + (float)log(lrow[r]);
                    }
                    ATTN_END();
                }
            }
        }
        ATTN_THREAD_END();
    }
    ATTN_CALL_END(0, lo, s);
    free(tiles);
    free(tasks);
    free(lo);
    return 0;
}

/* Backward: a task per (batch, kv head, run of consecutive key blocks) owns
 * dk/dv of those keys and walks every query chunk (of every query head in
 * the GQA group) that sees them; P and dS are recomputed per tile from lse.
 * dq gets contributions from every key block: a (batch, kv head)'s key
 * blocks are cut into runs (attn_bwd_segments), the same for any thread count
 * (they follow the shape and the masks only), and the task of run s adds
 * its blocks' contributions, in key order, into dq itself for the queries
 * that no earlier run sees, and into dq copy s for the others (under a
 * window, only the queries near the run's first key); the copies are then
 * added to dq in run order.  Each region of dq and of a copy belongs to one
 * task, so the tasks can run on any thread in any order: every result, dq
 * included, has the same bits for any thread count.  A task's keys in order also keep its heads' Q, dO and dq
 * rows in cache from one key block to the next.  Nothing is zeroed ahead:
 * the first product into a dK, dV or dQ row sets it (beta 0), the later
 * ones add to it; zeroing them first (separate passes over cold rows) cost
 * the backward 7-9% at window 256 (one thread, head_dim 64, 6 heads). */
struct attn_task {
    int b, kh, kb0, kb1, seg; /* key blocks kb0 .. kb1-1, dq copy seg */
    double cost;
};

/* Tasks that a backward aims for: a shape with fewer (batch, kv head) pairs than this cuts each pair's
 * key blocks into several runs (and dq copies), so that a few long sequences still fill several threads.
 * Each copy costs the sum of its rows into dq: on one head of T = 2048 (one thread, Zen 3) 16 runs cost
 * the backward about 6%, 8 runs 1-2% (backward over forward time, against one task per pair's whole
 * sequence; measured when each copy's rows were also zeroed first).  A machine with more threads than
 * tasks leaves some idle in the backward. */
enum { ATT_BWD_TASKS = 8 };

static int task_cost_desc(const void *pa, const void *pb) {
    const struct attn_task *a = pa, *b = pb;
    if (a->cost != b->cost) return a->cost < b->cost ? 1 : -1;
    /* ties: by position, so the order is total */
    if (a->b != b->b) return a->b - b->b;
    if (a->kh != b->kh) return a->kh - b->kh;
    return a->seg - b->seg;
}

/* What backward's tasks share: the shape's constants, and the inputs in the
 * layouts the products read (bf16 only: Q and dO as rows for S and dP; Q, dO
 * and K as position pairs for dK, dV and dQ). */
struct attn_bwd {
    const struct olmo_attn_shape *s;
    int T, H, HK, D, group, q_stride, kv_stride, wq, kt_rows, ldt, pairs;
    bool bf16;
    const int *lo;
    int segs;
    const int *dq_rows; /* each run's rows in its dq copy (attn_bwd_schedule's rows) */
    float *dq;
    const float *q, *k, *v, *dout, *lse, *delta;
    const void *kt, *vt, *qa, *doa;
    const uint32_t *qp, *dop, *kp;
    float *dk, *dv;
};

/* A thread's tiles: P and dS; bf16 only: P^T and dS^T as query pairs, dS as rows; fp32 only:
 * the key block's K^T, V^T [D][ATT_KB] and K [ATT_KB][D], packed once per block (K^T and V^T
 * transposed from K and V rows) so that the products read them contiguous, and the task's Q and dO
 * rows per head of the group, contiguous: query t of the group's head g at qr / dor + (g T + t - qbase) D,
 * from the task's first query qbase, packed as its key blocks come to them (attn_bwd_block). */
struct attn_bwd_tiles {
    float *p, *ds, *kt, *vt, *kr, *qr, *dor;
    uint32_t *pt, *dst;
    uint16_t *dsr;
    int qbase;
};

/* delta[(b*H + h)*T + t] = dO . O (= sum_j p_j dO . v_j) */
static float *attn_delta(struct cpu_state *st, const float *out, const float *dout, const struct olmo_attn_shape *s) {
    const int T = s->seq_len, H = s->n_heads, D = s->head_dim, B = s->batch, q_stride = H * D;
    float *delta = cpu_cached_scratch(st, SLOT_DELTA, sizeof(float) * (size_t)B * H * T);
    if (!delta) return NULL;
#pragma omp parallel for if ((size_t)B * T * q_stride >= PAR_MIN)
    for (int bt = 0; bt < B * T; bt++)
        for (int h = 0; h < H; h++) {
            const float *o = out + (size_t)bt * q_stride + (size_t)h * D, *g = dout + (size_t)bt * q_stride + (size_t)h * D;
            float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
            for (int d = 0; d < D; d++) acc += g[d] * o[d];
            delta[((size_t)(bt / T) * H + h) * T + bt % T] = acc;
        }
    return delta;
}

/* Key blocks per (batch, kv head) run: as many runs as bring the tasks to ATT_BWD_TASKS (at most
 * one per key block), the same for every pair of the shape. */
static int attn_bwd_segments(const struct olmo_attn_shape *s) {
    const int kblocks = (s->seq_len + ATT_KB - 1) / ATT_KB, pairs = s->batch * s->n_kv_heads;
    int segs = pairs >= ATT_BWD_TASKS ? 1 : (ATT_BWD_TASKS + pairs - 1) / pairs;
    return segs < kblocks ? segs : kblocks > 0 ? kblocks : 1;
}

/* The tasks, longest first: each (batch, kv head)'s key blocks cut into `segs` runs of about equal
 * cost (queries that see a block x its keys), in key order.  rows[2 * ((b * HK + kh) * segs + g) + 0, 1]
 * = r0, r1: run g of that pair writes the rows of queries r0 .. r1-1 in its dq copy (an earlier run sees
 * them too), and those of the later queries it sees in dq itself (it is the first run they see).  Each
 * query sees itself, so every row of dq is one run's to set; run 0 has no copy (r0 = r1 = 0). */
static struct attn_task *attn_bwd_schedule(const struct olmo_attn_shape *s, const int *lo, int segs, int *n_tasks,
                                           int *rows) {
    const int T = s->seq_len, kblocks = (T + ATT_KB - 1) / ATT_KB;
    *n_tasks = s->batch * s->n_kv_heads * segs;
    struct attn_task *tasks = cpu_scratch(sizeof *tasks * (size_t)(*n_tasks > 0 ? *n_tasks : 1));
    double *cost = tasks ? cpu_scratch(sizeof(double) * (size_t)(kblocks > 0 ? kblocks : 1)) : NULL;
    if (!cost) {
        free(tasks);
        return NULL;
    }
    for (int b = 0, i = 0; b < s->batch; b++) {
        double total = 0.0;
        for (int kb = 0; kb < kblocks; kb++) {
            const int j0 = kb * ATT_KB, j1 = j0 + ATT_KB < T ? j0 + ATT_KB : T;
            int rows = 0; /* queries that see a key of this block */
            for (int t = j0; t < T && lo[(size_t)b * T + t] < j1; t++) rows++;
            cost[kb] = (double)rows * (j1 - j0) + 1.0;
            total += cost[kb];
        }
        /* run g ends at the first block where the cost so far reaches (g + 1) / segs of the total */
        for (int kh = 0; kh < s->n_kv_heads; kh++) {
            double sum = 0.0;
            int seen = 0; /* the end of the queries that the runs so far see (lo non-decreasing: a prefix) */
            for (int g = 0, kb = 0; g < segs; g++, i++) {
                const int kb0 = kb;
                double c = 0.0;
                while (kb < kblocks && (g == segs - 1 || sum + cost[kb] / 2 <= total * (g + 1) / segs))
                    sum += cost[kb], c += cost[kb], kb++;
                /* queries kb0 * ATT_KB .. tend-1 see keys of the run (lo non-decreasing) */
                const int j1 = kb * ATT_KB < T ? kb * ATT_KB : T;
                int tend = kb0 * ATT_KB;
                while (tend < T && lo[(size_t)b * T + tend] < j1) tend++;
                /* the run sees queries r0 .. end-1; those before `seen` an earlier run sees too */
                const int r0 = kb0 * ATT_KB, end = kb > kb0 ? tend : r0, r1 = seen < r0 ? r0 : seen > end ? end : seen;
                rows[2 * i] = r0, rows[2 * i + 1] = r1;
                if (end > seen) seen = end;
                tasks[i] = (struct attn_task){b, kh, kb0, kb, g, c};
            }
        }
    }
    free(cost);
    qsort(tasks, (size_t)*n_tasks, sizeof *tasks, task_cost_desc);
    return tasks;
}

/* dr[col] = pr[col] * (dr[col] - dl) * scale for a <= col <= e, 0 for the other col < n (dS from dP). */
#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
static inline void ds_row(float *dr, const float *pr, int n, int a, int e, float dl, float scale) {
    /* gcc leaves the portable loop scalar here (the conditional); the same operations on 8 lanes */
    const __m256 vdl = _mm256_set1_ps(dl), vscale = _mm256_set1_ps(scale);
    for (int c0 = 0; c0 < n; c0 += 8) {
        const __m256i visible = _mm256_andnot_si256(lane_mask8(a - c0), lane_mask8(e - c0 + 1));
        __m256 v = _mm256_setzero_ps();
        if (!_mm256_testz_si256(visible, visible))
            v = _mm256_and_ps(_mm256_castsi256_ps(visible),
                              _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(pr + c0),
                                                          _mm256_sub_ps(_mm256_loadu_ps(dr + c0), vdl)),
                                            vscale));
        if (c0 + 8 <= n)
            _mm256_storeu_ps(dr + c0, v);
        else
            _mm256_maskstore_ps(dr + c0, lane_mask8(n - c0), v);
    }
}
#else
static inline void ds_row(float *dr, const float *pr, int n, int a, int e, float dl, float scale) {
#pragma omp simd
    for (int col = 0; col < n; col++) dr[col] = col >= a && col <= e ? pr[col] * (dr[col] - dl) * scale : 0.0f;
}
#endif

/* One tile: queries i0 .. i0+nq-1 of head h against keys j0 .. j0+nk-1 of sequence b
 * (kv head kh): dK, dV of the keys, and dQ: the rows of queries before `own` in the task's dq copy dqt,
 * the others in dq.  No buffer is zeroed first: the key block's first tile (kv_first) sets dK and dV
 * (beta 0), the others add to them; dQ rows from `fresh` on have not been written yet and are set,
 * the earlier ones added to. */
static void attn_bwd_tile(const struct attn_bwd *c, const struct attn_bwd_tiles *w, int b, int kh, int h, int j0,
                          int nk, int i0, int nq, bool kv_first, int fresh, int own, float *dkblk, float *dvblk,
                          float *dqt) {
    const int T = c->T, D = c->D, q_stride = c->q_stride, kv_stride = c->kv_stride, wq = c->wq;
    const bool bf16 = c->bf16;
    const int *lob = c->lo + (size_t)b * T;
    const float *lse_bh = c->lse + ((size_t)b * c->H + h) * T, *delta_bh = c->delta + ((size_t)b * c->H + h) * T;
    const size_t kth = ((size_t)b * c->HK + kh) * c->kt_rows * c->ldt + j0; /* of kt and vt */
    const size_t qoff = ((size_t)b * T + i0) * q_stride + (size_t)h * D;
    /* fp32: the queries' Q and dO rows, contiguous (the dK and dV products' B operands) */
    const size_t hoff = ((size_t)(h - kh * c->group) * T + i0 - w->qbase) * D;
    const float *qblk = bf16 ? NULL : w->qr + hoff, *doblk = bf16 ? NULL : w->dor + hoff;
    /* fp32: the task's packed K^T, V^T and K; bf16: the shared arrays */
    const void *ktile = bf16 ? word_at(c->kt, kth) : w->kt, *vtile = bf16 ? word_at(c->vt, kth) : w->vt;
    const int ldkt = bf16 ? c->ldt : ATT_KB;
    float *p = w->p, *ds = w->ds;
    /* the visible keys of each query row, and the visible queries of each key row (both non-decreasing) */
    int vis_a[ATT_QC], vis_e[ATT_QC], seen_a[ATT_KB], seen_e[ATT_KB];
    for (int r = 0; r < nq; r++) row_visible(lob, i0 + r, j0, nk, &vis_a[r], &vis_e[r]);
    for (int col = 0, t = i0; col < nk; col++) {
        while (t < i0 + nq && lob[t] <= j0 + col) t++;
        seen_a[col] = j0 + col - i0 > 0 ? j0 + col - i0 : 0;
        seen_e[col] = t - 1 - i0;
    }
    const struct tile_span cols = {vis_a, vis_e, false}, queries = {seen_a, seen_e, true};
    const float kv_beta = kv_first ? 0.0f : 1.0f;
    ATTN_BEGIN(ATTN_BWD_S);
#ifdef ATT_FUSED_EXP
    if (!bf16)
        tile_gemm_exp(&cols, nq, nk, D, c->s->scale, qblk, D, ktile, ldkt, lse_bh + i0, p, ATT_KB);
    else
#endif
    {
        tile_product(&cols, bf16, false, nq, nk, D, c->s->scale, word_at(c->qa, qoff / wq), q_stride / wq, ktile, ldkt,
                     0.0f, p, ATT_KB);
        for (int r = 0; r < nq; r++) exp_visible(p + (size_t)r * ATT_KB, nk, vis_a[r], vis_e[r], lse_bh[i0 + r]);
    }
    ATTN_END();
    ATTN_BEGIN(ATTN_BWD_DV);
    /* dV += P^T dO (i0 is even: dO's pairs start at i0 / 2) */
    const size_t qpairs = ((size_t)b * c->pairs + i0 / 2) * q_stride + (size_t)h * D;
    if (bf16) {
        pack_bf16_pairs(w->pt, ATT_KB, p, ATT_KB, nq, nk);
        tile_product(&queries, true, true, nk, D, nq, 1.0f, w->pt, ATT_KB, c->dop + qpairs, q_stride, kv_beta, dvblk,
                     kv_stride);
    } else {
        tile_gemm(&queries, true, nk, D, nq, 1.0f, p, ATT_KB, doblk, D, kv_beta, dvblk, kv_stride);
    }
    ATTN_END();
    ATTN_BEGIN(ATTN_BWD_DS);
    /* dP = dO V^T, then dS = P * (dP - delta) * scale */
    const float scale = c->s->scale;
#ifdef ATT_FUSED_EXP
    if (!bf16) {
        tile_gemm_ds(&cols, nq, nk, D, doblk, D, vtile, ldkt, delta_bh + i0, p, scale, ds, ATT_KB);
    } else
#endif
    {
        tile_product(&cols, bf16, false, nq, nk, D, 1.0f, word_at(c->doa, qoff / wq), q_stride / wq, vtile, ldkt, 0.0f,
                     ds, ATT_KB);
        for (int r = 0; r < nq; r++) /* dP is not computed (nor read) outside the visible columns: dS is 0 there */
            ds_row(ds + (size_t)r * ATT_KB, p + (size_t)r * ATT_KB, nk, vis_a[r], vis_e[r], delta_bh[i0 + r], scale);
    }
    ATTN_END();
    ATTN_BEGIN(ATTN_BWD_DK);
    /* dK += dS^T Q;  dQ += dS K (j0 is even: K's pairs start at j0 / 2) */
    if (bf16) {
        pack_bf16_pairs(w->dst, ATT_KB, ds, ATT_KB, nq, nk);
        tile_product(&queries, true, true, nk, D, nq, 1.0f, w->dst, ATT_KB, c->qp + qpairs, q_stride, kv_beta, dkblk,
                     kv_stride);
        pack_bf16_rows(w->dsr, ATT_KB, ds, ATT_KB, nq, nk);
    } else {
        tile_gemm(&queries, true, nk, D, nq, 1.0f, ds, ATT_KB, qblk, D, kv_beta, dkblk, kv_stride);
    }
    ATTN_END(); /* bf16: dS's rows, packed above, count with dK */
    ATTN_BEGIN(ATTN_BWD_DQ);
    /* the dQ product's rows in up to three parts, cut where they go from added to (rows before `fresh`)
     * to set, and from the dq copy to dq (rows before `own` / from it) */
    const int split = fresh - i0 < 0 ? 0 : fresh - i0 > nq ? nq : fresh - i0;
    const int mine = own - i0 < 0 ? 0 : own - i0 > nq ? nq : own - i0;
    const int cut[4] = {0, split < mine ? split : mine, split < mine ? mine : split, nq};
    for (int part = 0; part < 3; part++) {
        const int r0 = cut[part], m = cut[part + 1] - r0;
        if (m == 0) continue;
        const struct tile_span terms = {vis_a + r0, vis_e + r0, true};
        float *dqr = (r0 < mine ? dqt : c->dq) + qoff + (size_t)r0 * q_stride;
        const float beta = r0 < split ? 1.0f : 0.0f;
        if (bf16)
            tile_product(&terms, true, false, m, D, nk, 1.0f, w->dsr + (size_t)r0 * ATT_KB, ATT_KB / 2,
                         c->kp + ((size_t)b * c->pairs + j0 / 2) * kv_stride + (size_t)kh * D, kv_stride, beta, dqr,
                         q_stride);
        else
            tile_gemm(&terms, false, m, D, nk, 1.0f, ds + (size_t)r0 * ATT_KB, ATT_KB, w->kr, D, beta, dqr, q_stride);
    }
    ATTN_END();
}

/* One key block: its dK and dV, over every query chunk of every head of the group that sees it;
 * its dQ contributions into dqt (queries before `own`) and dq, whose rows from `fresh` on are not
 * written yet.  Returns the end of the queries that see the block: the rows written so far, from the
 * run's first block's on. */
static int attn_bwd_block(const struct attn_bwd *c, const struct attn_bwd_tiles *w, int b, int kh, int kb,
                          int fresh, int own, float *dqt) {
    const int T = c->T, D = c->D, kv_stride = c->kv_stride;
    const int j0 = kb * ATT_KB;
    const int nk = j0 + ATT_KB < T ? ATT_KB : T - j0;
    const int *lob = c->lo + (size_t)b * T;
    const size_t koff = ((size_t)b * T + j0) * kv_stride + (size_t)kh * D;
    float *dkblk = c->dk + koff, *dvblk = c->dv + koff;
    /* queries j0 .. tend-1 see some of these keys (lo non-decreasing); tend >= j0 + nk (a query sees itself),
     * so the first chunk (i0 = j0) sees every key of the block: its tile sets every row of dK and dV */
    int tend = j0;
    while (tend < T && lob[tend] < j0 + nk) tend++;
    ATTN_BEGIN(ATTN_BWD_PACK);
    if (!c->bf16) { /* the keys' K^T, V^T and K, contiguous: transposed here, from K and V */
        pack_transposed(w->kt, ATT_KB, c->k + koff, kv_stride, nk, D);
        pack_transposed(w->vt, ATT_KB, c->v + koff, kv_stride, nk, D);
        pack_rows(w->kr, c->k + koff, kv_stride, nk, D);
        /* the Q and dO rows of the queries that no earlier block of the task saw (fresh .. tend-1) */
        for (int g = 0; g < c->group && fresh < tend; g++) {
            const size_t from = ((size_t)b * T + fresh) * c->q_stride + (size_t)(kh * c->group + g) * D;
            const size_t to = ((size_t)g * T + fresh - w->qbase) * D;
            pack_rows(w->qr + to, c->q + from, c->q_stride, tend - fresh, D);
            pack_rows(w->dor + to, c->dout + from, c->q_stride, tend - fresh, D);
        }
    }
    ATTN_END();
    for (int h = kh * c->group; h < (kh + 1) * c->group; h++)
        for (int i0 = j0; i0 < tend; i0 += ATT_QC) {
            const int nq = i0 + ATT_QC < tend ? ATT_QC : tend - i0;
            attn_bwd_tile(c, w, b, kh, h, j0, nk, i0, nq, h == kh * c->group && i0 == j0, fresh, own, dkblk,
                          dvblk, dqt);
        }
    return tend > fresh ? tend : fresh;
}

/* One task: its run of key blocks in order, their dQ contributions into the rows of this (batch, kv
 * head) that it owns (attn_bwd_schedule's rows: r0 .. r1-1 of its dq copy, the later ones of dq): the
 * queries that see the run, from kb0 * ATT_KB, each row set by its first tile and added to by the later
 * ones (the queries that see a block are a contiguous range from its first key, so those of the run's
 * blocks in order are too).  Every query sees itself: nothing is left to zero. */
static void attn_bwd_task(const struct attn_bwd *c, const struct attn_bwd_tiles *w, const struct attn_task *task,
                          float *dqt) {
    const int first = task->kb0 * ATT_KB;
    const int *run = c->dq_rows + 2 * (((size_t)task->b * c->HK + task->kh) * c->segs + task->seg);
    struct attn_bwd_tiles mine = *w;
    mine.qbase = first;
    int written = first; /* also the end of the Q and dO rows packed so far */
    for (int kb = task->kb0; kb < task->kb1; kb++)
        written = attn_bwd_block(c, &mine, task->b, task->kh, kb, written, run[1], dqt);
}

static int attention_bwd(struct cpu_state *st, bool bf16_products, float *dq, float *dk, float *dv,
                         const float *dout, const float *out, const float *lse, const float *q, const float *k,
                         const float *v, const int32_t *doc_ids, const struct olmo_attn_shape *s) {
    const int T = s->seq_len, H = s->n_heads, HK = s->n_kv_heads, D = s->head_dim, B = s->batch;
    const bool bf16 = attn_bf16(bf16_products, s);
    ATTN_CALL_BEGIN();
    struct attn_bwd c = {.s = s, .T = T, .H = H, .HK = HK, .D = D, .group = H / HK, .q_stride = H * D,
                         .kv_stride = HK * D, .wq = bf16 ? 2 : 1, /* floats per element of the operands with k = D */
                         .ldt = transposed_ld(T), .pairs = (T + 1) / 2, .bf16 = bf16, .q = q, .k = k, .v = v, .dout = dout,
                         .lse = lse, .dk = dk, .dv = dv};
    c.kt_rows = D / c.wq;
    const size_t n_q = (size_t)B * T * c.q_stride;
    int *lo = attn_bounds(s, doc_ids);
    c.lo = lo;
    /* bf16: K and V transposed per head as pairs (fp32 transposes each key block as it packs it) */
    c.kt = bf16 ? (const void *)transpose_heads_pairs(st, SLOT_KT, k, B, T, HK, D) : k;
    c.vt = bf16 ? (const void *)transpose_heads_pairs(st, SLOT_VT, v, B, T, HK, D) : v;
    c.qa = bf16 ? (const void *)bf16_rows(st, SLOT_Q16, q, B, T, c.q_stride) : q;
    c.doa = bf16 ? (const void *)bf16_rows(st, SLOT_DO16, dout, B, T, c.q_stride) : dout;
    /* fp32: each thread's Q and dO rows of a sequence, per head of a group (in the slot of the bf16 Q rows,
     * unused then), packed as the tasks come to them, where the products then find them in cache: one
     * thread, T 2048, 6 heads of 64, forced AVX2, against per-head copies made ahead in one pass (two
     * alternating rounds): window 256 61.7 / 64.0 -> 66.6 / 66.1 GFLOP/s, full 71.6 / 70.3 -> 71.7 / 76.2 */
    const size_t qd_floats = (size_t)c.group * T * D;
    float *qd_mine = bf16 ? NULL : cpu_cached_scratch(st, SLOT_Q16, sizeof(float) * 2 * qd_floats * (size_t)omp_get_max_threads());
    c.qp = bf16 ? bf16_position_pairs(st, SLOT_QP, q, B, T, c.q_stride) : NULL;
    c.dop = bf16 ? bf16_position_pairs(st, SLOT_DOP, dout, B, T, c.q_stride) : NULL;
    c.kp = bf16 ? bf16_position_pairs(st, SLOT_KP, k, B, T, c.kv_stride) : NULL;
    c.delta = attn_delta(st, out, dout, s);
    const int segs = c.segs = attn_bwd_segments(s);
    int n_tasks = 0;
    struct attn_task *tasks = NULL;
    float **dq_part = NULL, *parts = NULL, *tiles = NULL;
    int *rows = NULL;
    size_t stride = 0;
    const bool inputs = lo && c.kt && c.vt && c.qa && c.doa && c.delta && (bf16 ? c.qp && c.dop && c.kp : qd_mine != NULL);
    if (inputs && (c.dq_rows = rows = cpu_scratch(sizeof(int) * 2 * (size_t)B * HK * segs)) &&
        (tasks = attn_bwd_schedule(s, lo, segs, &n_tasks, rows)) &&
        (dq_part = cpu_scratch(sizeof(float *) * (size_t)segs)) &&
        (segs == 1 || (parts = cpu_cached_scratch(st, SLOT_DQ_PARTS, sizeof(float) * n_q * (size_t)(segs - 1)))))
        /* per thread: P, dS; bf16 only: P^T and dS^T as query pairs, dS as rows */
        tiles = thread_tiles(2 * (size_t)ATT_QC * ATT_KB + (bf16 ? 2 * (size_t)ATT_QC / 2 * ATT_KB +
                                                                     (size_t)ATT_QC * ATT_KB / 2
                                                                : 3 * (size_t)ATT_KB * D),
                             &stride);
    if (!tiles) {
        free(dq_part);
        free(tasks);
        free(rows);
        free(lo);
        return -1;
    }
    /* dq copies: run s > 0 writes copy s where an earlier run sees the queries too (run 0 has none) */
    c.dq = dq;
    dq_part[0] = dq;
    for (int g = 1; g < segs; g++) dq_part[g] = parts + n_q * (size_t)(g - 1);
    ATTN_SERIAL(ATTN_BWD_PREP, attn_t_call);
#pragma omp parallel if (n_tasks > 1)
    {
        ATTN_THREAD_BEGIN();
        float *mine = tiles + stride * (size_t)omp_get_thread_num();
        const size_t tile = (size_t)ATT_QC * ATT_KB;
        const struct attn_bwd_tiles w = {
            .p = mine,
            .ds = mine + tile,
            .kt = bf16 ? NULL : mine + 2 * tile,
            .vt = bf16 ? NULL : mine + 2 * tile + (size_t)ATT_KB * D,
            .kr = bf16 ? NULL : mine + 2 * tile + 2 * (size_t)ATT_KB * D,
            .pt = bf16 ? (uint32_t *)(mine + 2 * tile) : NULL,
            .dst = bf16 ? (uint32_t *)(mine + 2 * tile + tile / 2) : NULL,
            .dsr = bf16 ? (uint16_t *)(mine + 3 * tile) : NULL,
            .qr = bf16 ? NULL : qd_mine + 2 * qd_floats * (size_t)omp_get_thread_num(),
            .dor = bf16 ? NULL : qd_mine + 2 * qd_floats * (size_t)omp_get_thread_num() + qd_floats,
        };
        /* the longest first; each task owns what it writes, so any thread may take it */
#pragma omp for schedule(dynamic)
        for (int i = 0; i < n_tasks; i++) attn_bwd_task(&c, &w, &tasks[i], dq_part[tasks[i].seg]);
        ATTN_THREAD_END();
    }
    ATTN_MARK(attn_t_sum);
    if (segs > 1) { /* dq += the copies, in run order, on the rows each wrote there */
        const int width = c.group * D, row_blocks = (T + 63) / 64;
#pragma omp parallel for if (n_q >= PAR_MIN)
        for (int job = 0; job < B * HK * row_blocks; job++) {
            const int pair = job / row_blocks, b = pair / HK, kh = pair % HK, t0 = job % row_blocks * 64;
            const int t1 = t0 + 64 < T ? t0 + 64 : T;
            const int *run = rows + 2 * (size_t)pair * segs;
            for (int t = t0; t < t1; t++) {
                const size_t at = ((size_t)b * T + t) * c.q_stride + (size_t)kh * width;
                float *out = dq + at;
                for (int g = 1; g < segs; g++)
                    if (t >= run[2 * g] && t < run[2 * g + 1]) {
                        const float *part = dq_part[g] + at;
#pragma omp simd
                        for (int d = 0; d < width; d++) out[d] += part[d];
                    }
            }
        }
    }
    ATTN_SERIAL(ATTN_BWD_DQSUM, attn_t_sum);
    ATTN_CALL_END(1, lo, s);
    free(tiles);
    free(dq_part);
    free(tasks);
    free(rows);
    free(lo);
    return 0;
}

#endif
