/* Backend parity: runs every op of backend.h on the CPU backend (the
 * reference) and on another backend, named on the command line, with the same
 * random inputs, and compares the results; then trains two tiny models for a
 * few steps on both and compares losses, gradients and parameters.
 *
 *   test_backend_parity BACKEND [--quick]   (cpu | cpu-openblas | cpu-onednn | cpu-bf16 | cuda | cuda-tf32 |
 *                                            cuda-bf16 | cuda-bf16-cublas)
 *
 * --quick trains the tiny models for fewer steps (sanitizer builds).
 *
 * Error of a tensor = max |other - cpu| / max |cpu| (as in the fidelity
 * tests).  Tolerances depend on the other backend's GEMM precision (see
 * `tol` below); every non-GEMM op is fp32 in all CUDA variants, so those keep
 * the fp32 tolerances.  For a non-CPU backend the ops whose reductions must
 * be deterministic are also run twice and must agree bit for bit, and so must
 * two identical training runs.
 *
 * The CPU backend with oneDNN GEMMs (when the build has it) is the
 * reference, so cpu-openblas compares the two CPU GEMM libraries.
 *
 * Exit status: 0 all passed, 1 a check failed or the backend could not be
 * created, 77 skipped (a CUDA backend was asked for and no CUDA device is
 * present, or the build has no CUDA: the reason is printed). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "model/model.h"
#include "train/trainer.h"
#include "util/error.h"
#include "util/rng.h"

#include "backend_parity.h"

#if defined(OLMOC_HAVE_CUDA) && !defined(OLMOC_CUDA_EMULATION)
#include <cuda_runtime_api.h>
#endif

struct olmo_backend *ref, *dut;
bool check_determinism;
struct olmo_rng rng;
int checks, failures;

struct parity_tolerances tol;
/* The whole-model tolerances of a bf16 device backend against cpu-bf16 (test_model_vs_cpu_bf16). */
struct parity_tolerances16 tol16 = {5e-3, 3e-2, 1e-1, 3e-2};

static void set_tolerances(const char *name) {
    /* fp32 everywhere: rounding-level differences only (docs/fidelity.md: fp32 vs fp64 reference is ~1e-6..6e-5). */
    tol.exact = 1e-6;
    tol.reduce = 1e-5;
    tol.gemm = 1e-5;
    tol.attn = 2e-5;
    tol.attn_bf16 = 2e-5;
    tol.sum = 1e-6;
    tol.model_loss = 1e-5;
    tol.model_grad = 1e-4;
    tol.model_param = 1e-4;
    if (strstr(name, "tf32")) { /* 10-bit mantissa operands, fp32 accumulation */
        tol.gemm = 5e-3;
        tol.model_loss = 2e-3;
        tol.model_grad = 5e-2;
        tol.model_param = 2e-2;
    } else if (strstr(name, "bf16")) { /* 8-bit mantissa operands, fp32 accumulation */
        tol.gemm = 2e-2;
        /* Q, K, V, dO, P and dS rounded to bf16 (relative 2^-9): up to 6e-3 seen under emulation,
         * 1.6e-2 for window 1, where dq = dk = 0 analytically and what remains is the cancellation
         * of dP (bf16 operands) against delta (fp32); a masking error is 1e-1 or more */
        tol.attn_bf16 = 3e-2;
        tol.model_loss = 1e-2;
        tol.model_grad = 2e-1;
        tol.model_param = 1e-1;
    }
}

/* ---- tensors present on both backends ---- */


void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "test_backend_parity: out of host memory\n");
        exit(1);
    }
    return p;
}

void *be_alloc(const struct olmo_backend *be, size_t bytes) {
    void *p = be->alloc(be, bytes);
    if (!p) {
        fprintf(stderr, "test_backend_parity: %s: %s\n", be->name, olmo_last_error());
        exit(1);
    }
    return p;
}

static float *host_rand(size_t n, double scale) {
    float *h = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = (float)(olmo_rng_normal(&rng) * scale);
    return h;
}

static struct dual dual_from_host(const float *h, size_t n) {
    struct dual x = {be_alloc(ref, n * sizeof(float)), be_alloc(dut, n * sizeof(float)), n};
    ref->to_device(ref, x.r, h, n * sizeof(float));
    dut->to_device(dut, x.d, h, n * sizeof(float));
    return x;
}

struct dual dual_rand(size_t n, double scale) {
    float *h = host_rand(n, scale);
    struct dual x = dual_from_host(h, n);
    free(h);
    return x;
}

struct dual dual_zero(size_t n) {
    struct dual x = {be_alloc(ref, n * sizeof(float)), be_alloc(dut, n * sizeof(float)), n};
    return x;
}

struct dual dual_clone(struct dual src) {
    struct dual x = dual_zero(src.n);
    ref->copy(ref, x.r, src.r, src.n * sizeof(float));
    dut->copy(dut, x.d, src.d, src.n * sizeof(float));
    return x;
}

void dual_free(struct dual *x) {
    ref->free(ref, x->r);
    dut->free(dut, x->d);
    x->r = x->d = NULL;
}


struct dual_i32 ints_from_host(const int32_t *h, size_t n) {
    struct dual_i32 x = {be_alloc(ref, n * sizeof(int32_t)), be_alloc(dut, n * sizeof(int32_t))};
    ref->to_device(ref, x.r, h, n * sizeof(int32_t));
    dut->to_device(dut, x.d, h, n * sizeof(int32_t));
    return x;
}

void ints_free(struct dual_i32 *x) {
    ref->free(ref, x->r);
    dut->free(dut, x->d);
    x->r = x->d = NULL;
}

/* ---- comparisons ---- */

/* max |d - r| / max(max |r|, floor): relative to the tensor's scale, absolute below `floor`. */
static double err_floor_host(const float *r, const float *d, size_t n, double floor) {
    double max_ref = 0.0, max_diff = 0.0;
    for (size_t i = 0; i < n; i++) {
        double a = fabs((double)r[i]), diff = fabs((double)d[i] - (double)r[i]);
        if (a > max_ref) max_ref = a;
        if (!(diff <= max_diff)) max_diff = diff; /* NaN propagates */
    }
    if (max_ref < floor) max_ref = floor;
    return max_diff / (max_ref > 0.0 ? max_ref : 1e-30);
}

double rel_err_host(const float *r, const float *d, size_t n) { return err_floor_host(r, d, n, 0.0); }

void report(const char *what, double err, double limit) {
    checks++;
    bool ok = err <= limit; /* false for NaN */
    if (!ok) failures++;
    printf("%s %-44s error %.3e (tolerance %.0e)\n", ok ? "ok  " : "FAIL", what, err, limit);
}

static double dual_err(struct dual x, double floor) {
    float *hr = xmalloc(x.n * sizeof(float)), *hd = xmalloc(x.n * sizeof(float));
    ref->to_host(ref, hr, x.r, x.n * sizeof(float));
    dut->to_host(dut, hd, x.d, x.n * sizeof(float));
    double err = err_floor_host(hr, hd, x.n, floor);
    free(hr);
    free(hd);
    return err;
}

void expect(const char *what, struct dual x, double limit) { report(what, dual_err(x, 0.0), limit); }

static void expect_scalar(const char *what, double r, double d, double limit) {
    report(what, fabs(d - r) / (fabs(r) > 0 ? fabs(r) : 1e-30), limit);
}

/* Bitwise agreement of two buffers of the backend under test (determinism). */
void expect_same_bits(const char *what, const float *a, const float *b, size_t n) {
    if (!check_determinism) return;
    float *ha = xmalloc(n * sizeof(float)), *hb = xmalloc(n * sizeof(float));
    dut->to_host(dut, ha, a, n * sizeof(float));
    dut->to_host(dut, hb, b, n * sizeof(float));
    checks++;
    bool same = memcmp(ha, hb, n * sizeof(float)) == 0;
    if (!same) failures++;
    printf("%s %-44s %s\n", same ? "ok  " : "FAIL", what, same ? "bitwise reproducible" : "differs between runs");
    free(ha);
    free(hb);
}

/* ---- ops ---- */

static void test_gemm(void) {
    const int m = 37, n = 53, k = 300, pad = 3;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int acc = 0; acc < 2; acc++) {
                const int a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k, b_cols = tb ? k : n;
                const int lda = a_cols + pad, ldb = b_cols + pad, ldc = n + pad;
                struct dual a = dual_rand((size_t)a_rows * lda, 1.0), b = dual_rand((size_t)b_rows * ldb, 1.0);
                struct dual c = dual_rand((size_t)m * ldc, 1.0);
                const float alpha = 0.7f, beta = acc ? 1.3f : 0.0f;
                ref->gemm(ref, ta, tb, m, n, k, alpha, a.r, OLMO_F32, lda, b.r, OLMO_F32, ldb, beta, c.r, ldc);
                dut->gemm(dut, ta, tb, m, n, k, alpha, a.d, OLMO_F32, lda, b.d, OLMO_F32, ldb, beta, c.d, ldc);
                char name[64];
                snprintf(name, sizeof name, "gemm %s%s beta=%.1f", ta ? "T" : "N", tb ? "T" : "N", beta);
                expect(name, c, tol.gemm);
                dual_free(&a);
                dual_free(&b);
                dual_free(&c);
            }
    /* a square one, the model's most common case (x @ W^T) */
    const int s = 256;
    struct dual a = dual_rand((size_t)s * s, 1.0), b = dual_rand((size_t)s * s, 1.0), c = dual_zero((size_t)s * s);
    ref->gemm(ref, false, true, s, s, s, 1.0f, a.r, OLMO_F32, s, b.r, OLMO_F32, s, 0.0f, c.r, s);
    dut->gemm(dut, false, true, s, s, s, 1.0f, a.d, OLMO_F32, s, b.d, OLMO_F32, s, 0.0f, c.d, s);
    expect("gemm NT 256^3", c, tol.gemm);
    dual_free(&a);
    dual_free(&b);
    dual_free(&c);
}

static void test_embedding(void) {
    const int V = 50, dim = 70, n = 200;
    int32_t tokens[200];
    for (int i = 0; i < n; i++) tokens[i] = (int32_t)(olmo_rng_next(&rng) % (i % 3 ? V : 5)); /* many repeats */
    struct dual_i32 tok = ints_from_host(tokens, (size_t)n);
    struct dual table = dual_rand((size_t)V * dim, 1.0), out = dual_zero((size_t)n * dim);
    ref->embedding_fwd(ref, out.r, table.r, tok.r, n, dim);
    dut->embedding_fwd(dut, out.d, table.d, tok.d, n, dim);
    expect("embedding fwd", out, 0.0);
    struct dual dout = dual_rand((size_t)n * dim, 1.0), dtable = dual_rand((size_t)V * dim, 1.0);
    struct dual dtable2 = dual_clone(dtable);
    ref->embedding_bwd(ref, dtable.r, dout.r, tok.r, n, dim);
    dut->embedding_bwd(dut, dtable.d, dout.d, tok.d, n, dim);
    expect("embedding bwd (accumulates, repeated ids)", dtable, tol.exact);
    dut->embedding_bwd(dut, dtable2.d, dout.d, tok.d, n, dim);
    expect_same_bits("embedding bwd determinism", dtable.d, dtable2.d, dtable.n);
    dual_free(&table);
    dual_free(&out);
    dual_free(&dout);
    dual_free(&dtable);
    dual_free(&dtable2);
    ints_free(&tok);
}

static void test_rmsnorm(int n, int dim) {
    char name[80];
    struct dual x = dual_rand((size_t)n * dim, 2.0), w = dual_rand((size_t)dim, 1.0);
    struct dual y = dual_zero((size_t)n * dim), rstd = dual_zero((size_t)n);
    ref->rmsnorm_fwd(ref, y.r, rstd.r, x.r, w.r, n, dim, 1e-6f);
    dut->rmsnorm_fwd(dut, y.d, rstd.d, x.d, w.d, n, dim, 1e-6f);
    snprintf(name, sizeof name, "rmsnorm fwd y [%d x %d]", n, dim);
    expect(name, y, tol.reduce);
    snprintf(name, sizeof name, "rmsnorm fwd rstd [%d x %d]", n, dim);
    expect(name, rstd, tol.reduce);
    struct dual dy = dual_rand((size_t)n * dim, 1.0), dx = dual_zero((size_t)n * dim);
    struct dual dw = dual_rand((size_t)dim, 1.0), dw2 = dual_clone(dw);
    ref->rmsnorm_bwd(ref, dx.r, dw.r, dy.r, x.r, w.r, rstd.r, n, dim);
    dut->rmsnorm_bwd(dut, dx.d, dw.d, dy.d, x.d, w.d, rstd.d, n, dim);
    snprintf(name, sizeof name, "rmsnorm bwd dx [%d x %d]", n, dim);
    expect(name, dx, tol.reduce);
    snprintf(name, sizeof name, "rmsnorm bwd dw (accumulates) [%d x %d]", n, dim);
    expect(name, dw, tol.reduce);
    /* dx aliasing dy must give the same dx, and dw must not see the overwritten dy */
    dut->rmsnorm_bwd(dut, dy.d, dw2.d, dy.d, x.d, w.d, rstd.d, n, dim);
    ref->rmsnorm_bwd(ref, dy.r, dw2.r, dy.r, x.r, w.r, rstd.r, n, dim);
    snprintf(name, sizeof name, "rmsnorm bwd in place dx [%d x %d]", n, dim);
    expect(name, dy, tol.reduce);
    expect_same_bits("rmsnorm bwd in place == out of place (dx)", dy.d, dx.d, dx.n);
    expect_same_bits("rmsnorm bwd dw determinism", dw.d, dw2.d, dw.n);
    dual_free(&x);
    dual_free(&w);
    dual_free(&y);
    dual_free(&rstd);
    dual_free(&dy);
    dual_free(&dx);
    dual_free(&dw);
    dual_free(&dw2);
}

static void test_rope(void) {
    const int B = 2, T = 37, H = 3, D = 16, half = D / 2;
    const size_t n = (size_t)B * T * H * D, nt = (size_t)T * half;
    float *c = xmalloc(nt * sizeof(float)), *s = xmalloc(nt * sizeof(float));
    for (size_t i = 0; i < nt; i++) {
        double a = olmo_rng_uniform(&rng) * 6.283185307179586;
        c[i] = (float)cos(a);
        s[i] = (float)sin(a);
    }
    struct dual cs = dual_from_host(c, nt), sn = dual_from_host(s, nt);
    free(c);
    free(s);
    struct dual x = dual_rand(n, 1.0), dx = dual_rand(n, 1.0);
    ref->rope_fwd(ref, x.r, cs.r, sn.r, B * T, T, H, D);
    dut->rope_fwd(dut, x.d, cs.d, sn.d, B * T, T, H, D);
    expect("rope fwd", x, tol.exact);
    ref->rope_bwd(ref, dx.r, cs.r, sn.r, B * T, T, H, D);
    dut->rope_bwd(dut, dx.d, cs.d, sn.d, B * T, T, H, D);
    expect("rope bwd", dx, tol.exact);
    dual_free(&cs);
    dual_free(&sn);
    dual_free(&x);
    dual_free(&dx);
}

/* Whether the bf16 variants run attention's products on bf16 operands at this head_dim: cuda-bf16 on
 * tensor cores for multiples of 16 up to 128, cpu-bf16 for even sizes (when built with AVX512-BF16;
 * otherwise its fp32 attention is held to the looser bf16 tolerance). */
static bool bf16_attention(int head_dim) {
    if (!strcmp(dut->name, "cpu-bf16")) return head_dim % 2 == 0;
    return head_dim % 16 == 0 && head_dim <= 128;
}

static void test_attention(int B, int T, int H, int HK, int D, int window, bool docs) {
    struct olmo_attn_shape s = {.batch = B, .seq_len = T, .n_heads = H, .n_kv_heads = HK, .head_dim = D,
                                .window = window, .scale = 1.0f / sqrtf((float)D)};
    const size_t N = (size_t)B * T, nq = N * H * D, nk = N * HK * D;
    struct dual q = dual_rand(nq, 1.0), k = dual_rand(nk, 1.0), v = dual_rand(nk, 1.0);
    struct dual out = dual_zero(nq), lse = dual_zero(N * H), dout = dual_rand(nq, 1.0);
    struct dual dq = dual_zero(nq), dk = dual_zero(nk), dv = dual_zero(nk);
    struct dual dq2 = dual_zero(nq), dk2 = dual_zero(nk), dv2 = dual_zero(nk);
    struct dual_i32 doc = {NULL, NULL};
    if (docs) { /* documents as the model builds them: contiguous, an EOS closes one */
        int32_t *ids = xmalloc(N * sizeof(int32_t));
        for (int b = 0; b < B; b++) {
            int32_t d = 0;
            for (int t = 0; t < T; t++) {
                ids[(size_t)b * T + t] = d;
                if (olmo_rng_uniform(&rng) < 0.08) d++;
            }
        }
        doc = ints_from_host(ids, N);
        free(ids);
    }
    ref->attention_fwd(ref, out.r, lse.r, q.r, k.r, v.r, doc.r, &s);
    dut->attention_fwd(dut, out.d, lse.d, q.d, k.d, v.d, doc.d, &s);
    ref->attention_bwd(ref, dq.r, dk.r, dv.r, dout.r, out.r, lse.r, q.r, k.r, v.r, doc.r, &s);
    dut->attention_bwd(dut, dq.d, dk.d, dv.d, dout.d, out.d, lse.d, q.d, k.d, v.d, doc.d, &s);
    char label[96], name[128];
    snprintf(label, sizeof label, "B%d T%d H%d/%d D%d w%d%s", B, T, H, HK, D, window, docs ? " docs" : "");
    struct {
        const char *what;
        struct dual x;
    } res[] = {{"out", out}, {"lse", lse}, {"dq", dq}, {"dk", dk}, {"dv", dv}};
    for (size_t i = 0; i < sizeof res / sizeof res[0]; i++) {
        snprintf(name, sizeof name, "attention %s %s", res[i].what, label);
        /* q, k, v, dout are N(0, 1), so results are O(1): errors are relative to max(max|ref|, 1).
         * The floor matters only for analytically-zero results (window 1: each query sees only
         * itself, so dq = dk = 0 up to the cancellation noise of dO.v - dO.O). */
        report(name, dual_err(res[i].x, 1.0), bf16_attention(D) ? tol.attn_bf16 : tol.attn);
    }
    dut->attention_bwd(dut, dq2.d, dk2.d, dv2.d, dout.d, out.d, lse.d, q.d, k.d, v.d, doc.d, &s);
    snprintf(name, sizeof name, "attention bwd determinism %s", label);
    expect_same_bits(name, dq.d, dq2.d, nq);
    expect_same_bits(name, dk.d, dk2.d, nk);
    expect_same_bits(name, dv.d, dv2.d, nk);
    struct dual *all[] = {&q, &k, &v, &out, &lse, &dout, &dq, &dk, &dv, &dq2, &dk2, &dv2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dual_free(all[i]);
    if (docs) ints_free(&doc);
}

/* Inference attention over a ring-buffer KV cache: n new rows at pos0, cache of cap rows. */
static void test_attention_cached(int n, int pos0, int cap, int H, int HK, int D, int window) {
    struct olmo_attn_shape s = {.n_heads = H, .n_kv_heads = HK, .head_dim = D, .window = window,
                                .scale = 1.0f / sqrtf((float)D)};
    if (!dut->attention_cached) {
        report("attention_cached present", 1.0, 0.0);
        return;
    }
    struct dual q = dual_rand((size_t)n * H * D, 1.0), out = dual_zero((size_t)n * H * D);
    struct dual kc = dual_rand((size_t)cap * HK * D, 1.0), vc = dual_rand((size_t)cap * HK * D, 1.0);
    ref->attention_cached(ref, out.r, q.r, kc.r, vc.r, n, pos0, cap, &s);
    dut->attention_cached(dut, out.d, q.d, kc.d, vc.d, n, pos0, cap, &s);
    char name[128];
    snprintf(name, sizeof name, "attention_cached n%d pos0 %d cap %d H%d/%d D%d w%d", n, pos0, cap, H, HK, D, window);
    report(name, dual_err(out, 1.0), tol.attn);
    struct dual *all[] = {&q, &out, &kc, &vc};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dual_free(all[i]);
}

static void test_elementwise(void) {
    const size_t n = 10007;
    struct dual g = dual_rand(n, 3.0), u = dual_rand(n, 1.0), s = dual_zero(n);
    ref->swiglu_fwd(ref, s.r, g.r, u.r, n);
    dut->swiglu_fwd(dut, s.d, g.d, u.d, n);
    expect("swiglu fwd", s, tol.exact);
    struct dual ds = dual_rand(n, 1.0), dg = dual_zero(n), du = dual_zero(n);
    ref->swiglu_bwd(ref, dg.r, du.r, ds.r, g.r, u.r, n);
    dut->swiglu_bwd(dut, dg.d, du.d, ds.d, g.d, u.d, n);
    expect("swiglu bwd dgate", dg, tol.exact);
    expect("swiglu bwd dup", du, tol.exact);
    struct dual y = dual_zero(n);
    ref->add(ref, y.r, g.r, u.r, n);
    dut->add(dut, y.d, g.d, u.d, n);
    expect("add", y, 0.0);
    ref->add(ref, g.r, g.r, u.r, n); /* y aliasing a */
    dut->add(dut, g.d, g.d, u.d, n);
    expect("add in place", g, 0.0);
    ref->scale(ref, u.r, n, 0.37f);
    dut->scale(dut, u.d, n, 0.37f);
    expect("scale", u, 0.0);
    struct dual *all[] = {&g, &u, &s, &ds, &dg, &du, &y};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dual_free(all[i]);
}

/* ---- fused ops (backend.h: cross_entropy_bf16, swiglu_fwd_bf16, rmsnorm_add_fwd, swiglu_bwd_bf16,
 * rmsnorm_bwd_bf16) ----
 * Each must give the bits of the unfused ops of the same backend, rounded to bf16 by the backend's own
 * convert where the fused op writes bf16 (what its bf16 GEMMs do to an fp32 operand); the unfused ops are
 * compared with the CPU above.  A backend without one is told, not tested. */

/* The side queue (fully sharded training's prefetch): ops queued there after side_begin see what the
 * main queue did before it, and the main queue sees their results after side_wait; the reference does
 * the same ops in order.  Large enough that a missing event shows on a GPU as a race, and on the
 * emulation (which runs side work only when it is waited for) as the old contents. */
static void test_side_queue(void) {
    if (!dut->side_begin) {
        printf("note: %s has no side queue (ops run in order as called)\n", dut->name);
        return;
    }
    const size_t n = (size_t)1 << 22;
    struct dual x = dual_rand(n, 1.0), w = dual_zero(n), z = dual_rand(n, 1.0), back = dual_zero(n);
    void *c_r = be_alloc(ref, n * 2), *c_d = be_alloc(dut, n * 2);
    for (int slot = 0; slot < 2; slot++) {
        ref->scale(ref, x.r, n, 1.5f); /* main queue, before side_begin */
        dut->scale(dut, x.d, n, 1.5f);
        ref->copy(ref, w.r, x.r, n * sizeof(float));
        ref->convert(ref, c_r, OLMO_BF16, x.r, OLMO_F32, n);
        ref->zero(ref, z.r, n * sizeof(float));
        int rc = dut->side_begin(dut);
        rc |= dut->copy(dut, w.d, x.d, n * sizeof(float));
        rc |= dut->convert(dut, c_d, OLMO_BF16, x.d, OLMO_F32, n);
        rc |= dut->zero(dut, z.d, n * sizeof(float));
        rc |= dut->side_end(dut, slot);
        rc |= dut->side_wait(dut, slot);
        /* main queue, after the wait: reads what the side queue wrote */
        ref->convert(ref, back.r, OLMO_F32, c_r, OLMO_BF16, n);
        rc |= dut->convert(dut, back.d, OLMO_F32, c_d, OLMO_BF16, n);
        report(slot ? "side queue (slot 1) calls" : "side queue (slot 0) calls", rc ? 1.0 : 0.0, 0.0);
        expect("side queue: copy of main-queue data", w, 0.0);
        expect("side queue: convert to bf16 and back", back, 0.0);
        expect("side queue: zero", z, 0.0);
    }
    /* misuse is an error, not a hang or a wrong stream */
    const int bad_end = dut->side_end(dut, 0); /* without side_begin */
    int begun = dut->side_begin(dut) == 0;
    const int bad_wait = dut->side_wait(dut, 0); /* a wait while on the side queue */
    const int bad_slot = dut->side_end(dut, 2);  /* refused, and back on the main queue */
    begun += dut->side_begin(dut) == 0;          /* so this is no second side_begin */
    const bool ended = begun == 2 && dut->side_end(dut, 0) == 0 && dut->side_wait(dut, 0) == 0;
    report("side queue: misuse refused", bad_end && bad_slot && bad_wait && ended ? 0.0 : 1.0, 0.0);
    ref->free(ref, c_r);
    dut->free(dut, c_d);
    struct dual *all[] = {&x, &w, &z, &back};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dual_free(all[i]);
}

static void test_cross_entropy(int n, int V) {
    int32_t *targets = xmalloc((size_t)n * sizeof(int32_t));
    for (int i = 0; i < n; i++) targets[i] = i % 5 == 3 ? -100 : (int32_t)(olmo_rng_next(&rng) % (uint64_t)V);
    struct dual_i32 tg = ints_from_host(targets, (size_t)n);
    free(targets);
    struct dual logits = dual_rand((size_t)n * V, 3.0), logits2 = dual_clone(logits);
    const float grad_scale = 1.0f / 17.0f, z = 1e-2f;
    double ce_r, z_r, ce_d, z_d, ce_d2, z_d2;
    ref->cross_entropy(ref, logits.r, tg.r, n, V, grad_scale, z, &ce_r, &z_r);
    dut->cross_entropy(dut, logits.d, tg.d, n, V, grad_scale, z, &ce_d, &z_d);
    char name[80];
    snprintf(name, sizeof name, "cross-entropy grad [%d x %d]", n, V);
    expect(name, logits, tol.reduce);
    snprintf(name, sizeof name, "cross-entropy ce sum [%d x %d]", n, V);
    expect_scalar(name, ce_r, ce_d, tol.sum);
    snprintf(name, sizeof name, "cross-entropy lse^2 sum [%d x %d]", n, V);
    expect_scalar(name, z_r, z_d, tol.sum);
    dut->cross_entropy(dut, logits2.d, tg.d, n, V, grad_scale, z, &ce_d2, &z_d2);
    expect_same_bits("cross-entropy determinism (grad)", logits.d, logits2.d, logits.n);
    if (check_determinism) {
        checks++;
        bool same = ce_d == ce_d2 && z_d == z_d2;
        if (!same) failures++;
        printf("%s %-44s %s\n", same ? "ok  " : "FAIL", "cross-entropy determinism (sums)",
               same ? "bitwise reproducible" : "differs between runs");
    }
    dual_free(&logits);
    dual_free(&logits2);
    ints_free(&tg);
}

static void test_sum_squares(void) {
    const size_t n = 1000003;
    struct dual x = dual_rand(n, 1.5);
    double r, d;
    ref->sum_squares(ref, x.r, n, &r);
    dut->sum_squares(dut, x.d, n, &d);
    expect_scalar("sum_squares (1e6 elements)", r, d, 1e-10);
    if (check_determinism) {
        double d2;
        dut->sum_squares(dut, x.d, n, &d2);
        checks++;
        if (d2 != d) failures++;
        printf("%s %-44s %s\n", d2 == d ? "ok  " : "FAIL", "sum_squares determinism",
               d2 == d ? "bitwise reproducible" : "differs between runs");
    }
    double r1, d1;
    ref->sum_squares(ref, x.r, 7, &r1);
    dut->sum_squares(dut, x.d, 7, &d1);
    expect_scalar("sum_squares (7 elements)", r1, d1, 1e-10);
    dual_free(&x);
}

static void test_adamw(void) {
    const size_t n = 10007;
    struct dual p = dual_rand(n, 0.5), m = dual_zero(n), v = dual_zero(n);
    for (long step = 1; step <= 3; step++) {
        struct dual g = dual_rand(n, step == 2 ? 1e-3 : 1.0);
        ref->adamw(ref, p.r, g.r, m.r, v.r, n, 1e-2, 0.9f, 0.95f, 1e-8f, 0.1, step);
        dut->adamw(dut, p.d, g.d, m.d, v.d, n, 1e-2, 0.9f, 0.95f, 1e-8f, 0.1, step);
        dual_free(&g);
    }
    expect("adamw params after 3 steps", p, tol.exact);
    expect("adamw exp_avg", m, tol.exact);
    expect("adamw exp_avg_sq", v, tol.exact);
    dual_free(&p);
    dual_free(&m);
    dual_free(&v);
}

/* ---- whole model: a few training steps on both backends ---- */

int main(int argc, char **argv) {
    const bool quick = argc == 3 && !strcmp(argv[2], "--quick");
    if (argc != 2 && !quick) {
        fprintf(stderr, "usage: test_backend_parity BACKEND [--quick]   (cpu, cpu-openblas, cpu-onednn, cpu-bf16, cuda, "
                        "cuda-tf32, cuda-bf16, cuda-bf16-cublas)\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0); /* progress lines appear as they happen under ctest */
    const char *name = argv[1];
    if (!strncmp(name, "cuda", 4)) {
#if defined(OLMOC_CUDA_EMULATION)
        printf("note: the CUDA backend runs on the CPU here (tests/c/cuda_emu emulation)\n");
#elif defined(OLMOC_HAVE_CUDA)
        int count = 0;
        if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
            printf("SKIP: no CUDA device (backend '%s' not tested)\n", name);
            return 77;
        }
#else
        printf("SKIP: built without the CUDA backend\n");
        return 77;
#endif
    }
    /* OLMOC_CPU_ISA (e.g. avx2: attention's AVX2+FMA kernels) is for the backend under test: the
     * reference runs the best kernels this build has for this processor */
    const char *isa_env = getenv("OLMOC_CPU_ISA");
    char isa[32] = "";
    if (isa_env) snprintf(isa, sizeof isa, "%s", isa_env);
    if (isa_env) unsetenv("OLMOC_CPU_ISA");
    ref = olmo_backend_create("cpu");
    if (isa[0]) setenv("OLMOC_CPU_ISA", isa, 1);
    if (!strcmp(isa, "avx2") && !olmo_cpu_has_avx2_fma()) {
        printf("SKIP: OLMOC_CPU_ISA=avx2 asks for AVX2+FMA kernels, and this processor has no AVX2 and FMA\n");
        return 77;
    }
    dut = olmo_backend_create(name);
    if (!dut) {
        fprintf(stderr, "test_backend_parity: %s\n", olmo_last_error());
        return 1;
    }
    set_tolerances(dut->name);
    check_determinism = !dut->host_memory;
    printf("backend parity: cpu (reference) vs %s (%s)\n", dut->name, dut->describe ? dut->describe(dut) : "");
    if (!strcmp(isa, "avx2") && (!dut->describe || !strstr(dut->describe(dut), "attention: AVX2+FMA kernels"))) {
        fprintf(stderr, "test_backend_parity: OLMOC_CPU_ISA=avx2, but %s runs other attention kernels\n", dut->name);
        return 1;
    }
    if (isa[0]) printf("reference: %s\n", ref->describe ? ref->describe(ref) : "");
    olmo_rng_seed(&rng, 20260101);

    test_gemm();
    test_embedding();
    test_rmsnorm(33, 300);
    test_rmsnorm(600, 2048);
    test_rmsnorm(1100, 4096); /* the CPU backend's dw run sums in two panels (128 runs of 8 rows, then 10) */
    test_rope();
    test_attention(2, 7, 4, 4, 6, 0, false);
    test_attention(2, 7, 4, 2, 6, 3, false);
    test_attention(2, 7, 4, 1, 6, 4, true);
    test_attention(2, 150, 4, 2, 64, 37, true);
    test_attention(1, 200, 2, 2, 128, 0, false);
    test_attention(1, 130, 6, 2, 96, 70, true);
    test_attention(1, 64, 2, 1, 33, 0, true);
    /* windows at the 64-key tile boundaries of the CUDA kernels (1: self only) */
    const int windows[] = {1, 2, 64, 65, 66, 129};
    for (size_t i = 0; i < sizeof windows / sizeof windows[0]; i++) {
        test_attention(1, 200, 2, 1, 8, windows[i], i % 2);
        test_attention(1, 200, 2, 1, 16, windows[i], (i + 1) % 2); /* tensor-core kernels in cuda-bf16 */
    }
    test_attention_cached(1, 0, 16, 4, 2, 8, 0);       /* first token */
    test_attention_cached(5, 11, 40, 4, 4, 16, 0);     /* prefill chunk, full attention */
    test_attention_cached(1, 300, 320, 2, 1, 128, 0);  /* decode, long context, MQA */
    test_attention_cached(7, 90, 24, 6, 2, 96, 17);    /* sliding window, ring buffer wrapped */
    test_attention_cached(1, 100, 4, 4, 2, 33, 4);     /* window = cache */
    test_elementwise();
    test_side_queue();
    test_cross_entropy(19, 1000);
    test_cross_entropy(5, 50000);
    test_elementwise_unaligned();
    test_rmsnorm_add(33, 300);
    test_rmsnorm_add(70, 2048);
    test_swiglu_bf16(10007);
    test_swiglu_bwd_bf16(10007);
    test_rmsnorm_bwd_bf16(33, 300);
    test_rmsnorm_bwd_bf16(70, 2048);
    test_cross_entropy_bf16(19, 1000);
    test_cross_entropy_bf16(4, 50001);
    test_sum_squares();
    test_adamw();
    test_adamw_flat();

    struct olmo_config a;
    base_config(&a);
    a.model.vocab_size = 97;
    a.model.d_model = 64;
    a.model.n_layers = 4;
    a.model.n_heads = 4;
    a.model.n_kv_heads = 2;
    a.model.mlp_hidden = 96;
    a.model.sliding_window = 24;
    a.train.seq_len = 80;
    a.train.micro_batch = 2;
    a.train.grad_accum = 2;
    a.train.steps = 4;
    a.train.intra_doc_masking = true;
    test_model("A (GQA, window 24, docs, head_dim 16)", &a, quick ? 2 : 4);
    test_model_vs_cpu_bf16("A (GQA, window 24, docs, head_dim 16)", &a, quick ? 2 : 4);
    test_model_logits_chunks("A", &a, 2, 48); /* 160 rows: chunks of 48, 48, 48, 16 */

    struct olmo_config b;
    base_config(&b);
    b.model.vocab_size = 300;
    b.model.d_model = 256;
    b.model.n_layers = 2;
    b.model.n_heads = 2;
    b.model.n_kv_heads = 1;
    b.model.mlp_hidden = 512;
    b.model.sliding_window = 32;
    b.model.full_attention_every = 2;
    b.train.seq_len = 70;
    b.train.micro_batch = 1;
    b.train.grad_accum = 2;
    b.train.steps = 3;
    test_model("B (MQA, window 32, head_dim 128)", &b, quick ? 1 : 3);
    test_model_vs_cpu_bf16("B (MQA, window 32, head_dim 128)", &b, quick ? 1 : 3);

    printf("%d passed, %d failed (cpu vs %s)\n", checks - failures, failures, dut->name);
    olmo_backend_destroy(dut);
    olmo_backend_destroy(ref);
    return failures ? 1 : 0;
}
