/* Scalar, AVX-512 and AVX2 helpers of the CPU backend's kernels: a
 * vectorisable exp, fp32 -> bf16 rounding, a vectorisable max, and their
 * 16-lane (AVX-512) and 8-lane (AVX2+FMA) forms.  Each is compiled in when
 * the file including this targets that instruction set (-march, or
 * cpu_attention_avx2.c's flags); the kernels that use them keep a portable
 * version under #else. */
#ifndef OLMOC_CPU_SIMD_H
#define OLMOC_CPU_SIMD_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

/* Attention's products on bf16 pairs with vdpbf16ps (cpu-bf16). */
#if defined(__AVX512F__) && defined(__AVX512BF16__)
#define OLMOC_ATTN_BF16 1
#endif

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
    /* NaN x: n is NaN, whose conversion to int is undefined; p is NaN already, so any
     * exponent gives the NaN that fast_exp16 gives */
    int32_t bits = ((int32_t)(n == n ? n : 0.0f) + 127) * (1 << 23);
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


/* bf16 -> fp32, exact. */
static inline float from_bf16(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* max of x[0..n), n >= 1; 16 running maxima so that gcc and clang both vectorise it. */
static inline float max_of(const float *x, int n) {
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

#if defined(__AVX512F__)
/* Lanes 0 .. left-1 of 16. */
static inline __mmask16 col_mask(int left) {
    return left >= 16 ? (__mmask16)0xFFFF : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1u);
}

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
#endif /* __AVX512F__ */

#if defined(__AVX2__) && defined(__FMA__)
/* Lanes 0 .. left-1 of 8 all ones (maskload/maskstore/and masks). */
static inline __m256i lane_mask8(int left) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(left), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* fast_expf on 8 lanes for x <= 88.37: the same operations in the same order as fast_expf, bitwise equal
 * results there and for NaN, without the overflow clamp and its select; a larger x gives garbage (fast_exp8
 * adds the clamp; the AVX2 attention kernels use the cheaper attn_exp8 below). */
static inline __m256 fast_exp8_softmax(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.3365478515625f);
    const __m256 xc = _mm256_max_ps(lo, x); /* max returns its second operand when one is NaN: NaN stays */
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-0.693145751953125f), xc);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-1.428606765330187045e-06f), r);
    __m256 p = _mm256_set1_ps(1.98412698e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.38888889e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.33333333e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.16666667e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.66666667e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(bits)), _mm256_cmp_ps(x, lo, _CMP_NLT_UQ));
}

/* exp(x) on 8 lanes for attention's softmax (x = s - max or s - lse, so x <= 0; any x <= 88.37 works), within
 * 2.1 ulp of exp (test_ops sweeps it), exp(0) = 1 exactly, NaN stays NaN; x below -87.34 gives about 2^-126, not
 * 0.  Cheaper than fast_exp8_softmax (12 operations against 19: n = round(x log2 e) by adding 1.5 2^23 + 127,
 * whose low bits are then the exponent of 2^n as they stand; a degree-5 polynomial for e^r with r = x - n ln 2
 * in Cody and Waite's two steps, its coefficients a minimax fit for relative error with the constant term 1),
 * so not fast_expf's bits: the AVX2 attention kernels use it for their forward softmax and the backward's P.
 * scripts/fit_exp_poly.py makes the coefficients. */
static inline __m256 attn_exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.3365478515625f), magic = _mm256_set1_ps(12582912.0f + 127.0f);
    const __m256 xc = _mm256_max_ps(lo, x);
    const __m256 t = _mm256_fmadd_ps(xc, _mm256_set1_ps(1.44269504088896341f), magic);
    const __m256 n = _mm256_sub_ps(t, magic);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-0.693145751953125f), xc);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-1.428606765330187045e-06f), r);
    __m256 p = _mm256_set1_ps(0.008290315046906471f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.04189793020486832f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.1666763573884964f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.4999915063381195f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.9999997019767761f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    return _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(t), 23)));
}

/* fast_expf on 8 lanes, bitwise equal results: x clamped to 88.37 (min returns its second operand, a NaN
 * x), then inf where x was above it. */
static inline __m256 fast_exp8(__m256 x) {
    const __m256 hi = _mm256_set1_ps(88.3762626647949f);
    return _mm256_blendv_ps(fast_exp8_softmax(_mm256_min_ps(hi, x)), _mm256_set1_ps(INFINITY),
                            _mm256_cmp_ps(x, hi, _CMP_GT_OQ));
}

/* The sum of the 8 lanes: halves, then pairs (a fixed order). */
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif /* __AVX2__ && __FMA__ */

/* x[j] = fast_expf(x[j] - shift) for j < n: bitwise the scalar loop's values, on 16 or 8 lanes where the
 * processor has them (gcc leaves the scalar loop unvectorised: fast_expf's selects). */
static inline void exp_shifted(float *x, int n, float shift) {
    int j = 0;
#if defined(__AVX512F__)
    const __m512 s16 = _mm512_set1_ps(shift);
    for (; j + 16 <= n; j += 16) _mm512_storeu_ps(x + j, fast_exp16(_mm512_sub_ps(_mm512_loadu_ps(x + j), s16)));
#elif defined(__AVX2__) && defined(__FMA__)
    const __m256 s8 = _mm256_set1_ps(shift);
    for (; j + 8 <= n; j += 8) _mm256_storeu_ps(x + j, fast_exp8(_mm256_sub_ps(_mm256_loadu_ps(x + j), s8)));
#endif
    for (; j < n; j++) x[j] = fast_expf(x[j] - shift);
}

#endif
