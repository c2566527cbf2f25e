/* Attention's tile products (part of cpu_attention_kernels.h, compiled once
 * per instruction set with it): the register-blocked AVX-512 and AVX2+FMA
 * kernels, OpenBLAS otherwise, and their fused epilogues. */
#ifndef OLMOC_CPU_ATTENTION_TILE_H
#define OLMOC_CPU_ATTENTION_TILE_H

#include <cblas.h>

#include "backend/cpu/cpu_attention_parts.h"
#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_simd.h"

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

#endif
