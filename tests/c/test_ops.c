/* Finite-difference gradient checks for every backward op of the CPU
 * backend, and for the whole model.  Each check builds a scalar loss
 * L = sum(c * op(x)) with a random c, compares dL/dx from the op's backward
 * with central differences (evaluated in double from fp32 outputs).
 * First, every GEMM library of the CPU backend against a double-precision
 * GEMM. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h" /* OLMOC_CPU_BF16: whether this build has oneDNN's bf16 matmul */
#include "backend/cpu/cpu_simd.h"     /* fast_expf: swiglu's scalar form */
#include "model/model.h"
#include "util/error.h"
#include "util/rng.h"

static struct olmo_backend *be;
static struct olmo_rng rng;
static int failures, checks, skips;

/* A variant this build or processor cannot have is skipped, with the reason printed and
 * counted; one that should exist and cannot be created is a failure.
 * Why this build or processor lacks the variant; NULL when it must have it. */
static const char *missing_reason(enum olmo_cpu_gemm_library library) {
#ifndef OLMOC_HAVE_ONEDNN
    if (library == OLMO_CPU_GEMM_ONEDNN) return "this build has no oneDNN";
#endif
#ifndef OLMOC_CPU_BF16
    if (library == OLMO_CPU_GEMM_ONEDNN_BF16) return "this build has no oneDNN 2.x bf16 matmul";
#endif
    if (library == OLMO_CPU_GEMM_ONEDNN_BF16 && !olmo_cpu_has_avx512())
        return "oneDNN's bf16 matmul needs AVX-512, which this processor lacks";
    return NULL;
}

/* The variant, or NULL after printing and counting a skip (absent by design) or a failure (should exist). */
static struct olmo_backend *gemm_variant(enum olmo_cpu_gemm_library library, const char *what) {
    struct olmo_backend *g = olmo_backend_cpu_create(library);
    const char *why = missing_reason(library);
    if (g && !why) return g;
    if (!g && why) {
        skips++;
        printf("SKIP %-40s %s\n", what, why);
        return NULL;
    }
    checks++;
    failures++;
    printf("FAIL %-40s %s\n", what, g ? "available where it should not be" : olmo_last_error());
    olmo_backend_destroy(g);
    return NULL;
}

static float *rand_buf(size_t n, double scale) {
    float *p = be->alloc(be, n * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = (float)(olmo_rng_normal(&rng) * scale);
    return p;
}

static double dotd(const float *a, const float *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

/* Compares an analytic gradient with central differences of loss_fn over
 * up to `samples` coordinates of x. */
typedef double (*loss_fn)(void *ctx);
static void check_grad_tol(const char *what, float *x, const float *grad, size_t n, loss_fn f, void *ctx,
                           double h, int samples, double tol) {
    double worst = 0.0;
    for (int s = 0; s < samples; s++) {
        size_t i = n <= (size_t)samples ? (size_t)s : (size_t)(olmo_rng_next(&rng) % n);
        if (i >= n) break;
        float orig = x[i];
        x[i] = orig + (float)h;
        double lp = f(ctx);
        x[i] = orig - (float)h;
        double lm = f(ctx);
        x[i] = orig;
        double num = (lp - lm) / (2.0 * ((double)(orig + (float)h) - (double)orig));
        double err = fabs(num - grad[i]) / (1e-3 + fabs(num) + fabs(grad[i]));
        if (err > worst) worst = err;
    }
    checks++;
    if (worst > tol) {
        failures++;
        printf("FAIL %-28s worst relative error %.3e\n", what, worst);
    } else {
        printf("ok   %-28s worst relative error %.3e\n", what, worst);
    }
}

/* Single ops are smooth at this scale: 2e-2 separates fp32 rounding from a wrong formula (O(1)). */
static void check_grad(const char *what, float *x, const float *grad, size_t n, loss_fn f, void *ctx, double h,
                       int samples) {
    check_grad_tol(what, x, grad, n, f, ctx, h, samples, 2e-2);
}

/* ---- rmsnorm ---- */
struct rms_ctx { float *x, *w, *y, *rstd, *c; int n, d; };
/* c = alpha op(a) op(b) + beta c in double, row-major (the backend's contract). */
static void gemm_double(bool ta, bool tb, int m, int n, int k, double alpha, const float *a, int lda,
                        const float *b, int ldb, double beta, const float *c, int ldc, double *out) {
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double acc = 0.0;
            for (int p = 0; p < k; p++)
                acc += (double)(ta ? a[(size_t)p * lda + i] : a[(size_t)i * lda + p]) *
                       (tb ? b[(size_t)j * ldb + p] : b[(size_t)p * ldb + j]);
            out[(size_t)i * n + j] = alpha * acc + (beta != 0.0 ? beta * c[(size_t)i * ldc + j] : 0.0);
        }
}

/* Every transpose case with padded leading dimensions, beta 0 (C must not be
 * read: it holds NaNs) and beta != 0, vectors (m or n = 1) and a shape past
 * the libraries' small-matrix paths; the error is relative to sum_k |a||b|:
 * fp32 rounding for tol 1e-6, bf16 operands (relative 2^-9 each) for 1e-2. */
static void test_gemm_library(enum olmo_cpu_gemm_library library, double tol) {
    struct olmo_backend *g = gemm_variant(library, "gemm");
    if (!g) return;
    const int shapes[][3] = {{37, 53, 300}, {1, 70, 33}, {45, 1, 64}, {130, 260, 190}};
    const int pad = 3;
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int acc = 0; acc < 2; acc++) {
                    const int m = shapes[sh][0], n = shapes[sh][1], k = shapes[sh][2];
                    const int lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
                    float *a = rand_buf((size_t)(ta ? k : m) * lda, 1.0), *b = rand_buf((size_t)(tb ? n : k) * ldb, 1.0);
                    float *c = rand_buf((size_t)m * ldc, 1.0);
                    const float alpha = 0.7f, beta = acc ? 1.3f : 0.0f;
                    if (!acc)
                        for (size_t i = 0; i < (size_t)m * ldc; i++) c[i] = NAN;
                    double *want = malloc(sizeof(double) * (size_t)m * n);
                    gemm_double(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, want);
                    g->gemm(g, ta, tb, m, n, k, alpha, a, OLMO_F32, lda, b, OLMO_F32, ldb, beta, c, ldc);
                    double worst = 0.0;
                    for (int i = 0; i < m; i++)
                        for (int j = 0; j < n; j++) {
                            double scale = 0.0; /* |alpha| sum_k |a||b| + |beta c|: the size of the rounding */
                            for (int p = 0; p < k; p++)
                                scale += fabs((double)(ta ? a[(size_t)p * lda + i] : a[(size_t)i * lda + p]) *
                                              (tb ? b[(size_t)j * ldb + p] : b[(size_t)p * ldb + j]));
                            scale = alpha * scale + 1.3 * 4.0 + 1e-30;
                            double err = fabs(c[(size_t)i * ldc + j] - want[(size_t)i * n + j]) / scale;
                            if (!(err <= worst)) worst = isnan(err) ? INFINITY : err;
                        }
                    char what[96];
                    snprintf(what, sizeof what, "%s gemm %s%s %dx%dx%d beta=%.1f",
                             library == OLMO_CPU_GEMM_BF16_CONVERT ? "cpu-bf16(convert)" : g->name, ta ? "T" : "N",
                             tb ? "T" : "N", m, n, k, beta);
                    checks++;
                    const bool ok = worst < tol;
                    if (!ok) failures++;
                    printf("%s %-44s err %.2e\n", ok ? "ok  " : "FAIL", what, worst);
                    free(want);
                    be->free(be, a);
                    be->free(be, b);
                    be->free(be, c);
                }
    olmo_backend_destroy(g);
}

/* cpu-bf16 rounds its operands to bf16 (8 significant bits) to nearest, ties
 * to even: 1 + 2^-8 is a tie between 1 and 1 + 2^-7 (goes to 1), 1 + 3 * 2^-8
 * one between 1 + 2^-7 and 1 + 2^-6 (goes to 1 + 2^-6), 1 + 2^-8 + 2^-20 is
 * above the tie (1 + 2^-7).  Truncation or no rounding at all differ. */
static void test_bf16_rounding(enum olmo_cpu_gemm_library library) {
    struct olmo_backend *g = gemm_variant(library, "bf16 rounding");
    if (!g) return;
    const float one = 1.0f, b[3] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-8f + 0x1p-20f};
    const float want[3] = {1.0f, 1.0f + 0x1p-6f, 1.0f + 0x1p-7f};
    float c[3];
    g->gemm(g, false, false, 1, 3, 1, 1.0f, &one, OLMO_F32, 1, b, OLMO_F32, 3, 0.0f, c, 3);
    const bool ok = c[0] == want[0] && c[1] == want[1] && c[2] == want[2];
    checks++;
    if (!ok) failures++;
    printf("%s %-44s %.9g %.9g %.9g\n", ok ? "ok  " : "FAIL",
           library == OLMO_CPU_GEMM_BF16_CONVERT ? "bf16 (convert) operands round to nearest even"
                                                 : "bf16 (matmul) operands round to nearest even",
           c[0], c[1], c[2]);
    olmo_backend_destroy(g);
}

static double rms_loss(void *p) {
    struct rms_ctx *c = p;
    be->rmsnorm_fwd(be, c->y, c->rstd, c->x, c->w, c->n, c->d, 1e-6f);
    return dotd(c->y, c->c, (size_t)c->n * c->d);
}
static void test_rmsnorm(void) {
    struct rms_ctx c = {.n = 5, .d = 24};
    size_t nd = (size_t)c.n * c.d;
    c.x = rand_buf(nd, 1.0); c.w = rand_buf((size_t)c.d, 1.0); c.c = rand_buf(nd, 1.0);
    c.y = be->alloc(be, nd * 4); c.rstd = be->alloc(be, (size_t)c.n * 4);
    float *dx = be->alloc(be, nd * 4), *dw = be->alloc(be, (size_t)c.d * 4);
    rms_loss(&c);
    be->rmsnorm_bwd(be, dx, dw, c.c, c.x, c.w, c.rstd, c.n, c.d);
    check_grad("rmsnorm dx", c.x, dx, nd, rms_loss, &c, 1e-2, 60);
    check_grad("rmsnorm dw", c.w, dw, (size_t)c.d, rms_loss, &c, 1e-2, 24);
    /* dx may alias dy */
    float *dy = be->alloc(be, nd * 4);
    memcpy(dy, c.c, nd * 4);
    memset(dw, 0, (size_t)c.d * 4);
    be->rmsnorm_bwd(be, dy, dw, dy, c.x, c.w, c.rstd, c.n, c.d);
    checks++;
    if (memcmp(dy, dx, nd * 4)) { failures++; printf("FAIL rmsnorm in-place backward differs\n"); }
    else printf("ok   rmsnorm in-place backward\n");
    be->free(be, c.x); be->free(be, c.w); be->free(be, c.c); be->free(be, c.y); be->free(be, c.rstd); be->free(be, dx); be->free(be, dw); be->free(be, dy);
}

/* ---- rope ---- */
struct rope_ctx { float *x, *y, *cos, *sin, *c; int rows, T, H, D; };
static double rope_loss(void *p) {
    struct rope_ctx *c = p;
    size_t n = (size_t)c->rows * c->H * c->D;
    memcpy(c->y, c->x, n * 4);
    be->rope_fwd(be, c->y, c->cos, c->sin, c->rows, c->T, c->H, c->D);
    return dotd(c->y, c->c, n);
}
static void test_rope(void) {
    struct rope_ctx c = {.rows = 6, .T = 3, .H = 2, .D = 8};
    size_t n = (size_t)c.rows * c.H * c.D, half = (size_t)c.T * c.D / 2;
    c.x = rand_buf(n, 1.0); c.c = rand_buf(n, 1.0); c.y = be->alloc(be, n * 4);
    c.cos = be->alloc(be, half * 4); c.sin = be->alloc(be, half * 4);
    for (size_t i = 0; i < half; i++) {
        double a = olmo_rng_uniform(&rng) * 6.28;
        c.cos[i] = (float)cos(a); c.sin[i] = (float)sin(a);
    }
    float *dx = be->alloc(be, n * 4);
    memcpy(dx, c.c, n * 4);
    be->rope_bwd(be, dx, c.cos, c.sin, c.rows, c.T, c.H, c.D);
    check_grad("rope dx", c.x, dx, n, rope_loss, &c, 1e-2, 96);
    be->free(be, c.x); be->free(be, c.c); be->free(be, c.y); be->free(be, c.cos); be->free(be, c.sin); be->free(be, dx);
}

/* ---- attention ---- */
struct attn_ctx { float *q, *k, *v, *out, *lse, *c; int32_t *docs; struct olmo_attn_shape s; };
static double attn_loss(void *p) {
    struct attn_ctx *c = p;
    be->attention_fwd(be, c->out, c->lse, c->q, c->k, c->v, c->docs, &c->s);
    return dotd(c->out, c->c, (size_t)c->s.batch * c->s.seq_len * c->s.n_heads * c->s.head_dim);
}
static void test_attention(int window, bool docs, int kv_heads, const char *label) {
    struct attn_ctx c = {.s = {.batch = 2, .seq_len = 7, .n_heads = 4, .n_kv_heads = kv_heads, .head_dim = 6,
                               .window = window}};
    c.s.scale = 1.0f / sqrtf(6.0f);
    size_t N = 14, nq = N * 4 * 6, nk = N * (size_t)kv_heads * 6;
    c.q = rand_buf(nq, 1.0); c.k = rand_buf(nk, 1.0); c.v = rand_buf(nk, 1.0); c.c = rand_buf(nq, 1.0);
    c.out = be->alloc(be, nq * 4); c.lse = be->alloc(be, N * 4 * 4);
    int32_t doc_ids[14] = {0, 0, 0, 1, 1, 2, 2, 0, 1, 1, 1, 1, 1, 2};
    c.docs = docs ? doc_ids : NULL;
    float *dq = be->alloc(be, nq * 4), *dk = be->alloc(be, nk * 4), *dv = be->alloc(be, nk * 4);
    attn_loss(&c);
    be->attention_bwd(be, dq, dk, dv, c.c, c.out, c.lse, c.q, c.k, c.v, c.docs, &c.s);
    char name[64];
    snprintf(name, sizeof name, "attention dq %s", label);
    check_grad(name, c.q, dq, nq, attn_loss, &c, 1e-2, 80);
    snprintf(name, sizeof name, "attention dk %s", label);
    check_grad(name, c.k, dk, nk, attn_loss, &c, 1e-2, 80);
    snprintf(name, sizeof name, "attention dv %s", label);
    check_grad(name, c.v, dv, nk, attn_loss, &c, 1e-2, 80);
    be->free(be, c.q); be->free(be, c.k); be->free(be, c.v); be->free(be, c.c); be->free(be, c.out); be->free(be, c.lse);
    be->free(be, dq); be->free(be, dk); be->free(be, dv);
}

/* ---- swiglu ---- */
struct swiglu_ctx { float *g, *u, *s, *c; size_t n; };
static double swiglu_loss(void *p) {
    struct swiglu_ctx *c = p;
    be->swiglu_fwd(be, c->s, c->g, c->u, c->n);
    return dotd(c->s, c->c, c->n);
}
static void test_swiglu(void) {
    struct swiglu_ctx c = {.n = 50};
    c.g = rand_buf(c.n, 2.0); c.u = rand_buf(c.n, 1.0); c.c = rand_buf(c.n, 1.0); c.s = be->alloc(be, c.n * 4);
    float *dg = be->alloc(be, c.n * 4), *du = be->alloc(be, c.n * 4);
    be->swiglu_bwd(be, dg, du, c.c, c.g, c.u, c.n);
    check_grad("swiglu dgate", c.g, dg, c.n, swiglu_loss, &c, 1e-2, 50);
    check_grad("swiglu dup", c.u, du, c.n, swiglu_loss, &c, 1e-2, 50);
    be->free(be, c.g); be->free(be, c.u); be->free(be, c.c); be->free(be, c.s); be->free(be, dg); be->free(be, du);
}

/* swiglu's vector paths (explicit AVX2, or the compiler's) give bitwise the scalar form's results, tail and
 * parallel split included: inputs over fast_expf's whole range, clamps and all. */
static void test_swiglu_bitwise(void) {
    const size_t n = 3 * 16384 + 5; /* above the parallel threshold, not a multiple of 8 or 16 */
    float *g = be->alloc(be, n * 4), *u = be->alloc(be, n * 4), *ds = be->alloc(be, n * 4);
    float *s = be->alloc(be, n * 4), *dg = be->alloc(be, n * 4), *du = be->alloc(be, n * 4);
    struct olmo_rng r;
    olmo_rng_seed(&r, 77);
    for (size_t i = 0; i < n; i++) {
        const double x = olmo_rng_uniform(&r);
        g[i] = (float)(i % 7 == 0 ? 200.0 * (x - 0.5) : 16.0 * (x - 0.5)); /* some beyond +-87 */
        u[i] = (float)(olmo_rng_uniform(&r) - 0.5);
        ds[i] = (float)(olmo_rng_uniform(&r) - 0.5);
    }
    be->swiglu_fwd(be, s, g, u, n);
    be->swiglu_bwd(be, dg, du, ds, g, u, n);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        const float sig = 1.0f / (1.0f + fast_expf(-g[i]));
        const float want_s = g[i] / (1.0f + fast_expf(-g[i])) * u[i];
        const float want_du = ds[i] * (g[i] * sig), want_dg = ds[i] * u[i] * sig * (1.0f + g[i] * (1.0f - sig));
        if (memcmp(&s[i], &want_s, 4) || memcmp(&du[i], &want_du, 4) || memcmp(&dg[i], &want_dg, 4)) {
            if (!bad) printf("  swiglu bitwise: first difference at %zu (g %g): s %a vs %a, du %a vs %a, dg %a vs %a\n",
                             i, g[i], s[i], want_s, du[i], want_du, dg[i], want_dg);
            bad++;
        }
    }
    checks++;
    if (bad) failures++;
    printf("%s swiglu fwd/bwd bitwise = scalar form: %zu of %zu differ\n", bad ? "FAIL" : "ok  ", bad, n);
    be->free(be, g); be->free(be, u); be->free(be, ds); be->free(be, s); be->free(be, dg); be->free(be, du);
}

/* fast_exp8 (every x) and fast_exp8_softmax (x <= 88.37: attention's softmax) give bitwise fast_expf's
 * values: a sweep over [-100, 100] and the edges (both clamps, +-0, +-inf, NaN). */
static void test_exp8_bitwise(void) {
#if defined(__AVX2__) && defined(__FMA__)
    enum { N = 200008 };
    static float x[N];
    const float edges[] = {-87.3365478515625f, nextafterf(-87.3365478515625f, -INFINITY), 88.3762626647949f,
                           nextafterf(88.3762626647949f, INFINITY), 0.0f, -0.0f, -INFINITY, INFINITY, NAN, -1e-30f};
    const int n_edges = (int)(sizeof edges / sizeof edges[0]);
    for (int i = 0; i < N; i++) x[i] = i < n_edges ? edges[i] : -100.0f + 200.0f * (float)i / N;
    size_t bad = 0, checked = 0;
    for (int i = 0; i + 8 <= N; i += 8) {
        float all[8], soft[8];
        _mm256_storeu_ps(all, fast_exp8(_mm256_loadu_ps(x + i)));
        _mm256_storeu_ps(soft, fast_exp8_softmax(_mm256_loadu_ps(x + i)));
        for (int l = 0; l < 8; l++) {
            const float want = fast_expf(x[i + l]);
            const bool soft_applies = !(x[i + l] > 88.3762626647949f); /* NaN included */
            if (memcmp(&all[l], &want, 4) || (soft_applies && memcmp(&soft[l], &want, 4))) {
                if (!bad) printf("  exp8 bitwise: x %a: fast_expf %a, fast_exp8 %a, fast_exp8_softmax %a\n", x[i + l], want,
                                 all[l], soft[l]);
                bad++;
            }
            checked++;
        }
    }
    checks++;
    if (bad) failures++;
    printf("%s fast_exp8 / fast_exp8_softmax bitwise = fast_expf: %zu of %zu differ\n", bad ? "FAIL" : "ok  ", bad, checked);
#else
    printf("SKIP fast_exp8 bitwise: this build has no AVX2+FMA code (x86-64 builds with AVX2 run it)\n");
    skips++;
#endif
}

/* attn_exp8 (the AVX2 attention kernels' exp): within 2.5 ulp of exp over [-87.33, 88.37] (a sweep of 1.6M points;
 * measured 2.01), exactly 1 at +-0, NaN for NaN, a positive value of at most 2^-125 below -87.34 (-inf included). */
static void test_attn_exp8(void) {
#if defined(__AVX2__) && defined(__FMA__)
    double worst = 0.0;
    float worst_x = 0.0f;
    size_t checked = 0, bad = 0;
    for (int i = 0; i < 200000; i++) {
        float x[8], y[8];
        for (int l = 0; l < 8; l++) x[l] = -87.3365f + (88.37f + 87.3365f) * (float)(8 * i + l) / 1600000.0f;
        _mm256_storeu_ps(y, attn_exp8(_mm256_loadu_ps(x)));
        for (int l = 0; l < 8; l++) {
            const double want = exp((double)x[l]), ulp = ldexp(1.0, ilogb(want) - 23);
            const double err = fabs((double)y[l] - want) / ulp;
            if (err > worst) worst = err, worst_x = x[l];
            checked++;
        }
    }
    if (worst > 2.5) bad++;
    const float edges[8] = {0.0f, -0.0f, NAN, -87.34f, -100.0f, -INFINITY, -1e-30f, 88.37f};
    float y[8];
    _mm256_storeu_ps(y, attn_exp8(_mm256_loadu_ps(edges)));
    const bool edges_ok = y[0] == 1.0f && y[1] == 1.0f && isnan(y[2]) && y[3] > 0.0f && y[3] <= 0x1p-125f &&
                          y[4] > 0.0f && y[4] <= 0x1p-125f && y[5] > 0.0f && y[5] <= 0x1p-125f && y[6] == 1.0f &&
                          isfinite(y[7]) && y[7] > 0x1p127f;
    if (!edges_ok) {
        bad++;
        printf("  attn_exp8 edges: exp(0) %a, exp(-0) %a, exp(NaN) %a, exp(-87.34) %a, exp(-100) %a, exp(-inf) %a, "
               "exp(-1e-30) %a, exp(88.37) %a\n", y[0], y[1], y[2], y[3], y[4], y[5], y[6], y[7]);
    }
    checks++;
    if (bad) failures++;
    printf("%s attn_exp8: largest error %.2f ulp (bound 2.5) at x = %g over %zu points; edges %s\n", bad ? "FAIL" : "ok  ",
           worst, worst_x, checked, edges_ok ? "ok" : "wrong");
#else
    printf("SKIP attn_exp8: this build has no AVX2+FMA code (x86-64 builds with AVX2 run it)\n");
    skips++;
#endif
}

/* cross-entropy's vectorised exponentials give bitwise the scalar form's loss sums and gradients (a vocabulary
 * that is not a multiple of 8 or 16, rows above the parallel threshold, an ignored row). */
static void test_cross_entropy_bitwise(void) {
    const int n = 37, V = 1003;
    const float scale = 1.0f / 36, z = 1e-4f;
    float *lg = be->alloc(be, (size_t)n * V * 4), *want = malloc((size_t)n * V * 4);
    int32_t tg[37];
    struct olmo_rng r;
    olmo_rng_seed(&r, 78);
    for (size_t i = 0; i < (size_t)n * V; i++) want[i] = lg[i] = (float)(30.0 * (olmo_rng_uniform(&r) - 0.5));
    for (int i = 0; i < n; i++) tg[i] = i == 5 ? -100 : (int32_t)(olmo_rng_next(&r) % V);
    double ce_want = 0.0, z_want = 0.0;
    for (int i = 0; i < n; i++) {
        float *row = want + (size_t)i * V;
        if (tg[i] < 0) {
            memset(row, 0, (size_t)V * 4);
            continue;
        }
        float mx = row[0];
        for (int j = 1; j < V; j++) mx = row[j] > mx ? row[j] : mx;
        const float t = row[tg[i]];
        double sum = 0.0;
        for (int j = 0; j < V; j++) sum += row[j] = fast_expf(row[j] - mx);
        const double lse = mx + log(sum);
        ce_want += lse - t;
        z_want += lse * lse;
        const float mult = (float)(scale * (1.0 + 2.0 * z * lse) / sum);
        for (int j = 0; j < V; j++) row[j] *= mult;
        row[tg[i]] -= scale;
    }
    double ce, zz;
    be->cross_entropy(be, lg, tg, n, V, scale, z, &ce, &zz);
    const bool same = !memcmp(lg, want, (size_t)n * V * 4) && ce == ce_want && zz == z_want;
    checks++;
    if (!same) failures++;
    printf("%s cross-entropy bitwise = scalar form (ce %.17g vs %.17g, z %.17g vs %.17g)\n", same ? "ok  " : "FAIL",
           ce, ce_want, zz, z_want);
    be->free(be, lg);
    free(want);
}

/* ---- cross entropy with z-loss ---- */
struct ce_ctx { float *logits, *work; int32_t *targets; int n, V; float z; };
static double ce_loss(void *p) {
    struct ce_ctx *c = p;
    memcpy(c->work, c->logits, (size_t)c->n * c->V * 4);
    double ce, zz;
    be->cross_entropy(be, c->work, c->targets, c->n, c->V, 1.0f, c->z, &ce, &zz);
    return ce + c->z * zz;
}
static void test_cross_entropy(void) {
    int32_t targets[4] = {3, -100, 0, 9};
    struct ce_ctx c = {.n = 4, .V = 10, .z = 0.1f, .targets = targets};
    size_t nv = 40;
    c.logits = rand_buf(nv, 2.0); c.work = be->alloc(be, nv * 4);
    float *grad = be->alloc(be, nv * 4);
    memcpy(grad, c.logits, nv * 4);
    double ce, zz;
    be->cross_entropy(be, grad, targets, c.n, c.V, 1.0f, c.z, &ce, &zz);
    check_grad("cross-entropy + z-loss", c.logits, grad, nv, ce_loss, &c, 1e-2, 40);
    be->free(be, c.logits); be->free(be, c.work); be->free(be, grad);
}

/* ---- embedding ---- */
static void test_embedding(void) {
    int32_t tokens[5] = {2, 0, 2, 3, 2};
    float *dout = rand_buf(5 * 4, 1.0), *dtable = be->alloc(be, 4 * 4 * 4);
    be->embedding_bwd(be, dtable, dout, tokens, 5, 4);
    double err = 0;
    for (int j = 0; j < 4; j++) err += fabs(dtable[2 * 4 + j] - (dout[0 * 4 + j] + dout[2 * 4 + j] + dout[4 * 4 + j]));
    for (int j = 0; j < 4; j++) err += fabs(dtable[1 * 4 + j]);
    checks++;
    if (err > 1e-6) { failures++; printf("FAIL embedding backward (error %.3e)\n", err); }
    else printf("ok   embedding backward sums repeated ids\n");
    be->free(be, dout); be->free(be, dtable);
}

/* ---- whole model ---- */
struct model_ctx { struct olmo_model *m; int32_t *tokens, *targets; };
static double model_loss(void *p) {
    struct model_ctx *c = p;
    olmo_model_forward(c->m, c->tokens, true);
    double ce, zz;
    olmo_model_loss(c->m, c->targets, 1.0f, 1e-2f, &ce, &zz);
    return ce + 1e-2 * zz;
}
static void test_model(void) {
    struct olmo_model_config cfg = {.vocab_size = 11, .d_model = 16, .n_layers = 4, .n_heads = 4, .n_kv_heads = 2,
                                    .mlp_hidden = 24, .rope_theta = 10000, .sliding_window = 3,
                                    .full_attention_every = 4, .full_attention_last = true, .rms_norm_eps = 1e-6,
                                    .init_std = 0.3, .eos_token_id = 1};
    struct olmo_model m;
    if (olmo_model_create(&m, &cfg, be) || olmo_model_reserve(&m, 2, 6)) {
        failures++;
        printf("FAIL model create\n");
        return;
    }
    olmo_model_init_weights(&m, 7);
    /* perturb norm weights away from 1 so their gradients are exercised */
    for (int i = 0; i < m.n_tensors; i++)
        if (m.params[i].cols == 1)
            for (size_t j = 0; j < m.params[i].numel; j++) m.weights[m.params[i].offset + j] += (float)(0.3 * olmo_rng_normal(&rng));
    int32_t tokens[12] = {4, 1, 7, 7, 2, 9, 3, 5, 1, 10, 1, 6};
    int32_t targets[12] = {1, 7, 7, 2, 9, -100, 5, 1, 10, 1, 6, -100};
    struct model_ctx c = {&m, tokens, targets};
    model_loss(&c);
    /* a second loss without a forward pass would read the gradient as logits: refused */
    double ce2, z2;
    checks++;
    if (olmo_model_loss(&m, targets, 1.0f, 1e-2f, &ce2, &z2) == 0) {
        failures++;
        printf("FAIL a second loss without a forward pass was accepted\n");
    } else {
        printf("ok   a second loss without a forward pass refused: %s\n", olmo_last_error());
    }
    olmo_model_backward(&m);
    for (int i = 0; i < m.n_tensors; i++) {
        const struct olmo_param *p = &m.params[i];
        char name[64];
        snprintf(name, sizeof name, "model %.50s", p->name + (strncmp(p->name, "model.", 6) ? 0 : 6));
        /* fp32 differences through 4 layers are noisier than single ops */
        check_grad_tol(name, m.weights + p->offset, m.grads + p->offset, p->numel, model_loss, &c, 1e-2, 12, 5e-2);
    }
    olmo_model_destroy(&m);
}

/* overwrite_grads: the first micro-batch's backward sets the gradients, with the bits that zeroing them and
 * adding gives, over gradients full of NaN (any element it did not write would show); the second adds. */
static void test_model_overwrite_grads(void) {
    struct olmo_model_config cfg = {.vocab_size = 300, .d_model = 128, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
                                    .mlp_hidden = 256, .rope_theta = 10000, .sliding_window = 32,
                                    .full_attention_every = 2, .full_attention_last = true, .rms_norm_eps = 1e-6,
                                    .init_std = 0.05, .eos_token_id = 1};
    enum { B = 2, T = 128, N = B * T };
    struct olmo_model m;
    if (olmo_model_create(&m, &cfg, be) || olmo_model_reserve(&m, B, T)) {
        failures++;
        printf("FAIL model create (overwrite_grads)\n");
        return;
    }
    olmo_model_init_weights(&m, 11);
    int32_t tokens[2][N], targets[2][N];
    for (int mb = 0; mb < 2; mb++)
        for (int i = 0; i < N; i++) {
            tokens[mb][i] = (int32_t)((i * 37 + mb * 101 + 5) % cfg.vocab_size);
            targets[mb][i] = i % T == T - 1 ? -100 : (int32_t)((i * 53 + mb * 7 + 3) % cfg.vocab_size);
        }
    const size_t bytes = m.n_floats * sizeof(float);
    float *added = malloc(bytes), *first = malloc(bytes);
    bool ok = added && first, flag_cleared = true;
    for (int mode = 0; ok && mode < 2; mode++) {
        if (mode == 0) memset(m.grads, 0, bytes);
        else
            for (size_t i = 0; i < m.n_floats; i++) m.grads[i] = NAN;
        m.overwrite_grads = mode == 1;
        for (int mb = 0; ok && mb < 2; mb++) {
            struct model_ctx c = {&m, tokens[mb], targets[mb]};
            model_loss(&c);
            ok = olmo_model_backward(&m) == 0;
            if (mode == 1 && mb == 0) {
                memcpy(first, m.grads, bytes);
                flag_cleared = !m.overwrite_grads;
            }
        }
        if (mode == 0) memcpy(added, m.grads, bytes);
    }
    size_t nan_first = 0, differ = 0;
    for (size_t i = 0; ok && i < m.n_floats; i++) {
        nan_first += isnan(first[i]) != 0;
        differ += memcmp(&added[i], &m.grads[i], sizeof(float)) != 0;
    }
    checks++;
    if (!ok || nan_first || differ || !flag_cleared) {
        failures++;
        printf("FAIL overwrite_grads: %zu of %zu gradients unwritten by the first backward, %zu differ from zeroed + "
               "added after two micro-batches%s%s\n",
               nan_first, m.n_floats, differ, flag_cleared ? "" : ", flag not cleared", ok ? "" : ", a pass failed");
    } else {
        printf("ok   overwrite_grads: the first backward writes all %zu gradients; after two micro-batches bitwise "
               "those of zeroed + added\n",
               m.n_floats);
    }
    free(added);
    free(first);
    olmo_model_destroy(&m);
}

/* copy, zero and convert between equal types: the bytes memcpy and memset give, none past the end, below
 * and above the size from which the threads split them (1 MiB), at sizes not a multiple of their 4 KiB parts */
static void test_copy_zero(void) {
    const size_t sizes[] = {0, 5, 4096, (1u << 20) - 3, 1u << 20, (3u << 20) + 7, (9u << 20) + 4093};
    enum { GUARD = 64 };
    for (size_t t = 0; t < sizeof sizes / sizeof sizes[0]; t++) {
        const size_t n = sizes[t];
        unsigned char *src = malloc(n + GUARD), *dst = malloc(n + GUARD), *cvt = malloc(n + GUARD);
        if (!src || !dst || !cvt) {
            checks++, failures++;
            printf("FAIL copy/zero: out of memory at %zu bytes\n", n);
            free(src), free(dst), free(cvt);
            return;
        }
        for (size_t i = 0; i < n + GUARD; i++) src[i] = (unsigned char)(i * 131 + 7);
        memset(dst, 0xAB, n + GUARD);
        memset(cvt, 0xAB, n + GUARD);
        const int rc_copy = be->copy(be, dst, src, n);
        const int rc_cvt = be->convert(be, cvt, OLMO_F32, src, OLMO_F32, n / 4);
        bool copied = rc_copy == 0 && !memcmp(dst, src, n), converted = rc_cvt == 0 && !memcmp(cvt, src, n / 4 * 4);
        for (size_t i = n; i < n + GUARD; i++) copied = copied && dst[i] == 0xAB;
        for (size_t i = n / 4 * 4; i < n + GUARD; i++) converted = converted && cvt[i] == 0xAB;
        bool zeroed = be->zero(be, dst, n) == 0;
        for (size_t i = 0; i < n + GUARD; i++) zeroed = zeroed && dst[i] == (i < n ? 0 : 0xAB);
        checks++;
        if (copied && converted && zeroed) {
            printf("ok   copy/zero/convert f32->f32 of %zu bytes\n", n);
        } else {
            failures++;
            printf("FAIL copy/zero/convert f32->f32 of %zu bytes: copy %s, convert %s, zero %s\n", n,
                   copied ? "ok" : "wrong", converted ? "ok" : "wrong", zeroed ? "ok" : "wrong");
        }
        free(src), free(dst), free(cvt);
    }
}

int main(void) {
    be = olmo_backend_create("cpu");
    if (!be) {
        fprintf(stderr, "test_ops: %s\n", olmo_last_error());
        return 1;
    }
    olmo_rng_seed(&rng, 1234);
    test_gemm_library(OLMO_CPU_GEMM_OPENBLAS, 1e-6);
    test_gemm_library(OLMO_CPU_GEMM_ONEDNN, 1e-6);
    test_gemm_library(OLMO_CPU_GEMM_ONEDNN_BF16, 1e-2);
    test_bf16_rounding(OLMO_CPU_GEMM_ONEDNN_BF16);
    test_rmsnorm();
    test_rope();
    test_attention(0, false, 4, "(full, MHA)");
    test_attention(3, false, 2, "(window 3, GQA)");
    test_attention(4, true, 1, "(window 4, docs, MQA)");
    test_swiglu();
    test_swiglu_bitwise();
    test_exp8_bitwise();
    test_attn_exp8();
    test_cross_entropy();
    test_cross_entropy_bitwise();
    test_embedding();
    test_model();
    test_model_overwrite_grads();
    test_copy_zero();
    /* last, so the random inputs of the tests above stay those they were tuned on */
    test_gemm_library(OLMO_CPU_GEMM_BF16_CONVERT, 1e-2);
    test_bf16_rounding(OLMO_CPU_GEMM_BF16_CONVERT);
    printf("%d passed, %d failed, %d skipped (reasons above)\n", checks - failures, failures, skips);
    olmo_backend_destroy(be);
    return failures ? 1 : 0;
}
