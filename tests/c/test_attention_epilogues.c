/* The fused epilogues of attention's tile kernels (src/backend/cpu/cpu_attention_kernels.h) against
 * the passes they replace, bit for bit:
 *   tile_gemm_max: S = alpha A B and each row's maximum over its visible columns, against tile_gemm
 *                  (alpha A B, no epilogue) and a scalar maximum;
 *   tile_gemm_exp: P = exp(alpha A B - shift) on the visible columns and 0 elsewhere, against tile_gemm
 *                  and exp_visible (the forward's pass, and the unfused backward's);
 *   tile_gemm_ds:  dS = P (A B - delta) scale on the visible columns and 0 elsewhere, against tile_gemm
 *                  and ds_row.
 * The kernels claim the same operations in the same order as the unfused passes, so the same bits; the
 * rows' visible columns come from masks as attention builds them (causal, sliding windows, documents,
 * rows that see nothing of the chunk), on tiles whose width is not a multiple of 16 and whose height
 * is not a multiple of the kernel's row group.  The shift is the visible columns' maximum, so hidden
 * columns may exceed it (exp overflows there) and must still come out 0.
 *
 * Built twice (tests/CMakeLists.txt): with the build's flags (the AVX-512 kernels where the build
 * targets AVX-512, the AVX2 ones where it targets AVX2; exit 77, skipped, in a build with neither) and
 * with -mavx2 -mfma -mno-avx512f (the AVX2 kernels; exit 77 on a processor without AVX2 and FMA). */
#pragma GCC diagnostic ignored "-Wunused-function" /* the header's forward and backward are not called here */
#include "backend/cpu/cpu_attention_kernels.h"

#include <stdio.h>

#include "util/rng.h"

#if defined(ATT_FUSED_MAX) && defined(ATT_FUSED_EXP)

enum { MAXM = 70, MAXN = 330, MAXK = 128 };

static int failures, checks;
static struct olmo_rng rng;

static unsigned bits(float x) {
    unsigned u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static void fail(const char *what, const char *name, int r, int col, float got, float want) {
    if (failures < 20)
        printf("FAIL %s (%s): row %d column %d: %.9g (0x%08x) != %.9g (0x%08x)\n", what, name, r, col, got,
               bits(got), want, bits(want));
    failures++;
}

static bool same(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

/* One tile: rows i0 .. i0+m-1 of a sequence against keys j0 .. j0+n-1, each row's visible columns from
 * lo (lo[t]: the first key query t sees), as the forward and backward build them with row_visible. */
static void check_tile(const char *name, const int *lo, int i0, int m, int j0, int n, int k, float alpha) {
    static float a[MAXM * MAXK], b[MAXK * MAXN], ref[MAXM * MAXN], got[MAXM * MAXN], p[MAXM * MAXN];
    static float shift[MAXM], delta[MAXM], maxp[MAXM * ATT_MAXP];
    int va[MAXM], ve[MAXM];
    for (int i = 0; i < m * k; i++) a[i] = (float)olmo_rng_normal(&rng);
    for (int i = 0; i < k * n; i++) b[i] = (float)olmo_rng_normal(&rng);
    for (int r = 0; r < m; r++) row_visible(lo, i0 + r, j0, n, &va[r], &ve[r]);
    const struct tile_span cols = {va, ve, false};
    /* the reference product, every column */
    tile_gemm(NULL, false, m, n, k, alpha, a, k, b, n, 0.0f, ref, n);

    /* S and the rows' maxima */
    for (int i = 0; i < m * ATT_MAXP; i++) maxp[i] = -INFINITY;
    for (int i = 0; i < m * n; i++) got[i] = NAN;
    tile_gemm_max(&cols, m, n, k, alpha, a, k, b, n, maxp, got, n);
    for (int r = 0; r < m; r++) {
        shift[r] = delta[r] = 0.0f;
        if (ve[r] < va[r]) continue; /* nothing visible: the forward skips the row */
        float mx = -INFINITY;
        for (int c = va[r]; c <= ve[r]; c++) {
            checks++;
            if (!same(got[r * n + c], ref[r * n + c])) fail("S", name, r, c, got[r * n + c], ref[r * n + c]);
            mx = ref[r * n + c] > mx ? ref[r * n + c] : mx;
        }
        const float fused = max_of(maxp + (size_t)r * ATT_MAXP, ATT_MAXP);
        checks++;
        if (!same(fused, mx)) fail("row maximum", name, r, -1, fused, mx);
        shift[r] = mx;
        delta[r] = 0.25f * (float)olmo_rng_normal(&rng);
    }

    /* P = exp(S - shift) */
    for (int i = 0; i < m * n; i++) got[i] = NAN, p[i] = ref[i];
    tile_gemm_exp(&cols, m, n, k, alpha, a, k, b, n, shift, got, n);
    for (int r = 0; r < m; r++) exp_visible(p + (size_t)r * n, n, va[r], ve[r], shift[r]);
    for (int i = 0; i < m * n; i++) {
        checks++;
        if (!same(got[i], p[i])) fail("P", name, i / n, i % n, got[i], p[i]);
    }

    /* dS = P (A B - delta) scale, with P from above and the product without alpha */
    const float scale = 0.125f;
    static float dref[MAXM * MAXN];
    tile_gemm(NULL, false, m, n, k, 1.0f, a, k, b, n, 0.0f, dref, n);
    for (int r = 0; r < m; r++) ds_row(dref + (size_t)r * n, p + (size_t)r * n, n, va[r], ve[r], delta[r], scale);
    for (int i = 0; i < m * n; i++) got[i] = NAN;
    tile_gemm_ds(&cols, m, n, k, a, k, b, n, delta, p, scale, got, n);
    for (int i = 0; i < m * n; i++) {
        checks++;
        if (!same(got[i], dref[i])) fail("dS", name, i / n, i % n, got[i], dref[i]);
    }
}

int main(void) {
#if !defined(__AVX512F__)
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
        printf("SKIP: the processor has no AVX2 and FMA\n");
        return 77;
    }
#endif
    olmo_rng_seed(&rng, 2026);
    static int32_t docs[4096];
    /* name, T, window, document length, query block i0 / rows, key chunk j0 / columns, k */
    const struct {
        const char *name;
        int T, w, doc, i0, m, j0, n, k;
        float alpha;
    } cases[] = {
        {"full, every column visible", 512, 0, 0, 256, 64, 0, 64, 64, 0.125f},
        {"causal diagonal 64 x 64", 512, 0, 0, 128, 64, 128, 64, 64, 0.125f},
        {"window 256, a forward chunk of 320", 2048, 256, 0, 640, 64, 386, 320, 64, 0.125f},
        {"window 256, head_dim 128", 2048, 256, 0, 640, 64, 386, 320, 128, 0.08838835f},
        {"window 37, odd sizes", 700, 37, 0, 300, 61, 262, 45, 16, 0.25f},
        {"documents of 50, window 40", 400, 40, 50, 96, 13, 64, 64, 64, 0.125f},
        {"rows before the chunk (empty)", 512, 0, 0, 64, 64, 100, 80, 64, 0.125f},
        {"rows past the window (empty)", 1024, 100, 0, 300, 70, 180, 64, 32, 0.125f},
        {"one row", 300, 0, 0, 200, 1, 192, 17, 64, 0.125f},
        {"window 1024, chunk 4 of 4", 2048, 1024, 0, 1984, 64, 1920, 128, 64, 0.125f},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        /* the bounds as attention builds them: causal, the window, documents of doc tokens (0: one) */
        const struct olmo_attn_shape shape = {.batch = 1, .seq_len = cases[i].T, .window = cases[i].w};
        for (int t = 0; t < cases[i].T; t++) docs[t] = cases[i].doc > 0 ? t / cases[i].doc : 0;
        int *lo = attn_bounds(&shape, docs);
        if (!lo) {
            printf("FAIL: out of memory\n");
            return 1;
        }
        const int before = failures;
        check_tile(cases[i].name, lo, cases[i].i0, cases[i].m, cases[i].j0, cases[i].n, cases[i].k, cases[i].alpha);
        free(lo);
        printf("%s  %s\n", failures == before ? "ok  " : "FAIL", cases[i].name);
    }
    printf("%s kernels: %d checks, %d failed\n",
#if defined(__AVX512F__)
           "AVX-512",
#else
           "AVX2",
#endif
           checks, failures);
    return failures ? 1 : 0;
}

#else
int main(void) {
    printf("SKIP: this build has no fused attention epilogues (neither AVX-512 nor AVX2 kernels)\n");
    return 77;
}
#endif
