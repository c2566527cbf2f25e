/* Attention's operands and softmax rows (part of cpu_attention_kernels.h,
 * compiled once per instruction set with it): the choice of bf16 products,
 * the bf16 and transposed copies of the operands, the rows' exponentials,
 * and the per-thread tiles. */
#ifndef OLMOC_CPU_ATTENTION_PACK_H
#define OLMOC_CPU_ATTENTION_PACK_H

#include <omp.h>
#include <string.h>

#include "backend/cpu/cpu_attention_tile.h"

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

#endif
