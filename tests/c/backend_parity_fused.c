/* Backend parity, the fused and flat ops of backend.h (cross_entropy_bf16, swiglu_fwd_bf16,
 * rmsnorm_add_fwd, swiglu_bwd_bf16, rmsnorm_bwd_bf16, adamw_flat) and the vectorised elementwise kernels
 * on unaligned pointers: each against the unfused ops of the same backend, bit for bit
 * (test_backend_parity.c runs the rest). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_parity.h"
#include "util/error.h"

static void report_same(const char *what, bool same) {
    checks++;
    if (!same) failures++;
    printf("%s %-44s %s\n", same ? "ok  " : "FAIL", what, same ? "bit-identical to the unfused ops" : "DIFFERS");
}

static void *dut_to_host(const void *p, size_t bytes) {
    void *h = xmalloc(bytes);
    dut->to_host(dut, h, p, bytes);
    return h;
}

static bool dut_same(const void *a, const void *b, size_t bytes) {
    void *ha = dut_to_host(a, bytes), *hb = dut_to_host(b, bytes);
    const bool same = memcmp(ha, hb, bytes) == 0;
    free(ha);
    free(hb);
    return same;
}

/* The elementwise ops with every pointer one float past a 16-byte boundary (the one-at-a-time path of
 * a vectorising backend) and an odd length. */
void test_elementwise_unaligned(void) {
    const size_t n = 4099;
    struct dual g = dual_rand(n + 1, 3.0), u = dual_rand(n + 1, 1.0), s = dual_zero(n + 1);
    struct dual ds = dual_rand(n + 1, 1.0), dg = dual_zero(n + 1), du = dual_zero(n + 1);
    ref->swiglu_fwd(ref, s.r + 1, g.r + 1, u.r + 1, n);
    dut->swiglu_fwd(dut, s.d + 1, g.d + 1, u.d + 1, n);
    expect("swiglu fwd (unaligned)", s, tol.exact);
    ref->swiglu_bwd(ref, dg.r + 1, du.r + 1, ds.r + 1, g.r + 1, u.r + 1, n);
    dut->swiglu_bwd(dut, dg.d + 1, du.d + 1, ds.d + 1, g.d + 1, u.d + 1, n);
    expect("swiglu bwd dgate (unaligned)", dg, tol.exact);
    expect("swiglu bwd dup (unaligned)", du, tol.exact);
    ref->add(ref, g.r + 1, g.r + 1, u.r + 1, n);
    dut->add(dut, g.d + 1, g.d + 1, u.d + 1, n);
    expect("add in place (unaligned)", g, 0.0);
    ref->scale(ref, u.r + 1, n, -1.7f);
    dut->scale(dut, u.d + 1, n, -1.7f);
    expect("scale (unaligned)", u, 0.0);
    struct dual *all[] = {&g, &u, &s, &ds, &dg, &du};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dual_free(all[i]);
}

void test_rmsnorm_add(int n, int dim) {
    char name[96];
    if (!dut->rmsnorm_add_fwd) {
        printf("note: %s has no rmsnorm_add_fwd (the model runs rmsnorm_fwd, then add)\n", dut->name);
        return;
    }
    const size_t nd = (size_t)n * dim;
    struct dual x = dual_rand(nd, 2.0), w = dual_rand((size_t)dim, 1.0), resid = dual_rand(nd, 1.0);
    struct dual tmp = dual_zero(nd), y = dual_zero(nd), rstd = dual_zero((size_t)n);
    struct dual y2 = dual_zero(nd), rstd2 = dual_zero((size_t)n), y3 = dual_clone(resid);
    const float eps = 1e-6f;
    for (int side = 0; side < 2; side++) { /* the unfused ops on both */
        const struct olmo_backend *be = side ? dut : ref;
        be->rmsnorm_fwd(be, side ? tmp.d : tmp.r, side ? rstd.d : rstd.r, side ? x.d : x.r, side ? w.d : w.r, n,
                        dim, eps);
        be->add(be, side ? y.d : y.r, side ? resid.d : resid.r, side ? tmp.d : tmp.r, nd);
    }
    if (dut->rmsnorm_add_fwd(dut, y2.d, rstd2.d, resid.d, x.d, w.d, n, dim, eps) ||
        dut->rmsnorm_add_fwd(dut, y3.d, rstd2.d, y3.d, x.d, w.d, n, dim, eps)) { /* y aliasing resid */
        fprintf(stderr, "test_backend_parity: rmsnorm_add_fwd: %s\n", olmo_last_error());
        exit(1);
    }
    ref->copy(ref, y2.r, y.r, nd * sizeof(float));
    snprintf(name, sizeof name, "rmsnorm+add fwd [%d x %d] vs cpu", n, dim);
    expect(name, y2, tol.reduce);
    snprintf(name, sizeof name, "rmsnorm+add fwd [%d x %d]", n, dim);
    report_same(name, dut_same(y.d, y2.d, nd * sizeof(float)) && dut_same(rstd.d, rstd2.d, (size_t)n * sizeof(float)));
    snprintf(name, sizeof name, "rmsnorm+add fwd in place [%d x %d]", n, dim);
    report_same(name, dut_same(y.d, y3.d, nd * sizeof(float)));
    struct dual *all[] = {&x, &w, &resid, &tmp, &y, &rstd, &y2, &rstd2, &y3};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dual_free(all[i]);
}

void test_swiglu_bf16(size_t n) {
    char name[96];
    if (!dut->swiglu_fwd_bf16) {
        printf("note: %s has no swiglu_fwd_bf16 (the model runs swiglu_fwd; a bf16 GEMM rounds s)\n", dut->name);
        return;
    }
    struct dual g = dual_rand(n + 1, 3.0), u = dual_rand(n + 1, 1.0), s = dual_zero(n + 1);
    uint16_t *want = be_alloc(dut, (n + 1) * 2), *got = be_alloc(dut, (n + 1) * 2);
    for (int off = 0; off < 2; off++) { /* aligned, then one element off (the one-at-a-time path) */
        dut->swiglu_fwd(dut, s.d + off, g.d + off, u.d + off, n);
        dut->convert(dut, want, OLMO_BF16, s.d + off, OLMO_F32, n);
        if (dut->swiglu_fwd_bf16(dut, got + off, g.d + off, u.d + off, n)) {
            fprintf(stderr, "test_backend_parity: swiglu_fwd_bf16: %s\n", olmo_last_error());
            exit(1);
        }
        snprintf(name, sizeof name, "swiglu fwd to bf16 [%zu]%s", n, off ? " (unaligned)" : "");
        report_same(name, dut_same(want, got + off, n * 2));
    }
    dut->free(dut, want);
    dut->free(dut, got);
    struct dual *all[] = {&g, &u, &s};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dual_free(all[i]);
}

/* swiglu_bwd_bf16 against swiglu_bwd then convert of dg and du, aligned and one element off. */
void test_swiglu_bwd_bf16(size_t n) {
    char name[96];
    if (!dut->swiglu_bwd_bf16) {
        printf("note: %s has no swiglu_bwd_bf16 (the model runs swiglu_bwd; a bf16 GEMM rounds dg, du)\n",
               dut->name);
        return;
    }
    struct dual g = dual_rand(n + 1, 3.0), u = dual_rand(n + 1, 1.0), ds = dual_rand(n + 1, 1.0);
    struct dual dg = dual_zero(n + 1), du = dual_zero(n + 1);
    uint16_t *want_g = be_alloc(dut, (n + 1) * 2), *want_u = be_alloc(dut, (n + 1) * 2);
    uint16_t *got_g = be_alloc(dut, (n + 1) * 2), *got_u = be_alloc(dut, (n + 1) * 2);
    for (int off = 0; off < 2; off++) {
        int rc = dut->swiglu_bwd(dut, dg.d + off, du.d + off, ds.d + off, g.d + off, u.d + off, n);
        rc = rc || dut->convert(dut, want_g, OLMO_BF16, dg.d + off, OLMO_F32, n);
        rc = rc || dut->convert(dut, want_u, OLMO_BF16, du.d + off, OLMO_F32, n);
        if (rc || dut->swiglu_bwd_bf16(dut, got_g + off, got_u + off, ds.d + off, g.d + off, u.d + off, n)) {
            fprintf(stderr, "test_backend_parity: swiglu_bwd_bf16: %s\n", olmo_last_error());
            exit(1);
        }
        snprintf(name, sizeof name, "swiglu bwd to bf16 [%zu]%s", n, off ? " (unaligned)" : "");
        report_same(name, dut_same(want_g, got_g + off, n * 2) && dut_same(want_u, got_u + off, n * 2));
    }
    uint16_t *bufs[] = {want_g, want_u, got_g, got_u};
    for (int i = 0; i < 4; i++) dut->free(dut, bufs[i]);
    struct dual *all[] = {&g, &u, &ds, &dg, &du};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dual_free(all[i]);
}

/* rmsnorm_bwd_bf16 against rmsnorm_bwd then convert of dx; dw must accumulate the same bits; a dx
 * overlapping dy is refused. */
void test_rmsnorm_bwd_bf16(int n, int dim) {
    char name[96];
    if (!dut->rmsnorm_bwd_bf16) {
        printf("note: %s has no rmsnorm_bwd_bf16 (the model runs rmsnorm_bwd; a bf16 GEMM rounds dx)\n", dut->name);
        return;
    }
    const size_t nd = (size_t)n * dim;
    struct dual x = dual_rand(nd, 2.0), w = dual_rand((size_t)dim, 1.0), dy = dual_rand(nd, 1.0);
    struct dual y = dual_zero(nd), rstd = dual_zero((size_t)n), dx = dual_zero(nd);
    struct dual dw = dual_rand((size_t)dim, 1.0), dw2 = dual_clone(dw);
    uint16_t *want = be_alloc(dut, nd * 2), *got = be_alloc(dut, nd * 2);
    int rc = dut->rmsnorm_fwd(dut, y.d, rstd.d, x.d, w.d, n, dim, 1e-6f);
    rc = rc || dut->rmsnorm_bwd(dut, dx.d, dw.d, dy.d, x.d, w.d, rstd.d, n, dim);
    rc = rc || dut->convert(dut, want, OLMO_BF16, dx.d, OLMO_F32, nd);
    if (rc || dut->rmsnorm_bwd_bf16(dut, got, dw2.d, dy.d, x.d, w.d, rstd.d, n, dim)) {
        fprintf(stderr, "test_backend_parity: rmsnorm_bwd_bf16: %s\n", olmo_last_error());
        exit(1);
    }
    snprintf(name, sizeof name, "rmsnorm bwd to bf16 [%d x %d]", n, dim);
    report_same(name, dut_same(want, got, nd * 2) && dut_same(dw.d, dw2.d, (size_t)dim * sizeof(float)));
    const bool refused = dut->rmsnorm_bwd_bf16(dut, dy.d, dw2.d, dy.d, x.d, w.d, rstd.d, n, dim) != 0;
    report("rmsnorm bwd to bf16: dx overlapping dy refused", refused ? 0.0 : 1.0, 0.0);
    dut->free(dut, want);
    dut->free(dut, got);
    struct dual *all[] = {&x, &w, &dy, &y, &rstd, &dx, &dw, &dw2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dual_free(all[i]);
}

/* cross_entropy_bf16 against cross_entropy then convert: in place (ld 2 V) and into a separate buffer
 * with a leading dimension above V; the sums must be the same numbers. */
void test_cross_entropy_bf16(int n, int V) {
    char name[96];
    if (!dut->cross_entropy_bf16) {
        printf("note: %s has no cross_entropy_bf16 (the model runs cross_entropy; a bf16 GEMM rounds the "
               "gradient)\n", dut->name);
        return;
    }
    int32_t *targets = xmalloc((size_t)n * sizeof(int32_t));
    for (int i = 0; i < n; i++) targets[i] = i % 4 == 1 ? -100 : (int32_t)(olmo_rng_next(&rng) % (uint64_t)V);
    targets[0] = V - 1;
    struct dual_i32 tg = ints_from_host(targets, (size_t)n);
    free(targets);
    const size_t nv = (size_t)n * V, ld = (size_t)V + 3;
    struct dual logits = dual_rand(nv, 4.0), a = dual_clone(logits), b = dual_clone(logits);
    uint16_t *want = be_alloc(dut, nv * 2), *sep = be_alloc(dut, (size_t)n * ld * 2);
    const float grad_scale = 1.0f / 23.0f, z = 1e-2f;
    double ce[3], zs[3];
    int rc = dut->cross_entropy(dut, a.d, tg.d, n, V, grad_scale, z, &ce[0], &zs[0]);
    rc = rc || dut->convert(dut, want, OLMO_BF16, a.d, OLMO_F32, nv);
    rc = rc || dut->cross_entropy_bf16(dut, b.d, b.d, 2 * (size_t)V, tg.d, n, V, grad_scale, z, 0, n, &ce[1], &zs[1]);
    rc = rc || dut->cross_entropy_bf16(dut, logits.d, sep, ld, tg.d, n, V, grad_scale, z, 0, n, &ce[2], &zs[2]);
    if (rc) {
        fprintf(stderr, "test_backend_parity: cross_entropy_bf16: %s\n", olmo_last_error());
        exit(1);
    }
    uint16_t *hw = dut_to_host(want, nv * 2), *hb = dut_to_host(b.d, nv * 4);
    uint16_t *hs = dut_to_host(sep, (size_t)n * ld * 2);
    bool in_place = true, separate = true;
    for (int i = 0; i < n; i++) {
        in_place = in_place && !memcmp(hw + (size_t)i * V, hb + (size_t)i * 2 * V, (size_t)V * 2);
        separate = separate && !memcmp(hw + (size_t)i * V, hs + (size_t)i * ld, (size_t)V * 2);
    }
    snprintf(name, sizeof name, "cross-entropy bf16 grad in place [%d x %d]", n, V);
    report_same(name, in_place && ce[1] == ce[0] && zs[1] == zs[0]);
    snprintf(name, sizeof name, "cross-entropy bf16 grad, ld %zu [%d x %d]", ld, n, V);
    report_same(name, separate && ce[2] == ce[0] && zs[2] == zs[0]);
    /* a gradient inside the logits anywhere but over its own rows is refused */
    double c, zz;
    const bool refused = dut->cross_entropy_bf16(dut, b.d, b.d, (size_t)V, tg.d, n, V, 1.0f, 0.0f, 0, n, &c, &zz) != 0 &&
                         dut->cross_entropy_bf16(dut, b.d, sep, (size_t)V - 1, tg.d, n, V, 1.0f, 0.0f, 0, n, &c, &zz) != 0;
    report("cross-entropy bf16: overlapping or short ld refused", refused ? 0.0 : 1.0, 0.0);
    /* in runs of rows (the chunked loss): runs of 3 rows, the last shorter, into a buffer of ld V; the sums
     * (returned, then deferred) must be those of one call, bit for bit */
    struct dual c2 = dual_clone(logits), c3 = dual_clone(logits), c4 = dual_clone(logits);
    uint16_t *runs = be_alloc(dut, nv * 2);
    double rce = -1, rz = -1, dce[2] = {-1, -1}, dz[2] = {-1, -1};
    rc = 0;
    for (int r0 = 0; r0 < n && !rc; r0 += 3) {
        const int k = n - r0 < 3 ? n - r0 : 3;
        rc = dut->cross_entropy_bf16(dut, c2.d + (size_t)r0 * V, runs + (size_t)r0 * V, (size_t)V, tg.d + r0, k, V,
                                     grad_scale, z, r0, n, &rce, &rz);
    }
    if (dut->loss_sums) { /* deferred: one call, then the same in runs */
        rc = rc || dut->loss_sums(dut, NULL, NULL);
        rc = rc || dut->cross_entropy_bf16(dut, c4.d, sep, ld, tg.d, n, V, grad_scale, z, 0, n, NULL, NULL);
        rc = rc || dut->loss_sums(dut, &dce[0], &dz[0]);
        for (int r0 = 0; r0 < n && !rc; r0 += 3) {
            const int k = n - r0 < 3 ? n - r0 : 3;
            rc = dut->cross_entropy_bf16(dut, c3.d + (size_t)r0 * V, sep + (size_t)r0 * ld, ld, tg.d + r0, k, V,
                                         grad_scale, z, r0, n, NULL, NULL);
        }
        rc = rc || dut->loss_sums(dut, &dce[1], &dz[1]);
    }
    if (rc) {
        fprintf(stderr, "test_backend_parity: cross_entropy_bf16 in runs: %s\n", olmo_last_error());
        exit(1);
    }
    uint16_t *hr = dut_to_host(runs, nv * 2);
    snprintf(name, sizeof name, "cross-entropy bf16 in runs of 3 rows [%d x %d]", n, V);
    report_same(name, !memcmp(hw, hr, nv * 2) && rce == ce[0] && rz == zs[0] &&
                          (!dut->loss_sums || (dce[0] == dce[1] && dz[0] == dz[1])));
    /* runs out of order (a gap) are refused */
    const bool gap = n > 3 && dut->cross_entropy_bf16(dut, c2.d, runs, (size_t)V, tg.d, 1, V, 1.0f, 0.0f, 0, n, &c,
                                                      &zz) == 0 &&
                     dut->cross_entropy_bf16(dut, c2.d, runs, (size_t)V, tg.d, 1, V, 1.0f, 0.0f, 2, n, &c, &zz) != 0;
    report("cross-entropy bf16: runs out of row order refused", gap || n <= 3 ? 0.0 : 1.0, 0.0);
    /* an empty run (which would end a sequence without its sums) is refused */
    const bool empty = dut->cross_entropy_bf16(dut, c2.d, runs, (size_t)V, tg.d, 0, V, 1.0f, 0.0f, 0, n, &c, &zz) != 0 &&
                       dut->cross_entropy_bf16(dut, c2.d, runs, (size_t)V, tg.d, 0, V, 1.0f, 0.0f, n, n, &c, &zz) != 0;
    report("cross-entropy bf16: an empty run of rows refused", empty || n == 0 ? 0.0 : 1.0, 0.0);
    free(hr);
    dut->free(dut, runs);
    dual_free(&c2);
    dual_free(&c3);
    dual_free(&c4);
    free(hw);
    free(hb);
    free(hs);
    dut->free(dut, want);
    dut->free(dut, sep);
    dual_free(&logits);
    dual_free(&a);
    dual_free(&b);
    ints_free(&tg);
}

/* true when the dut's n bytes at a and b are the same */
static bool dut_same_bytes(const void *a, const void *b, size_t bytes) {
    char *ha = xmalloc(bytes), *hb = xmalloc(bytes);
    dut->to_host(dut, ha, a, bytes);
    dut->to_host(dut, hb, b, bytes);
    const bool same = memcmp(ha, hb, bytes) == 0;
    free(ha);
    free(hb);
    return same;
}

/* The multi-tensor step (adamw_flat) against what it replaces on the same backend: scale (the clipping
 * coefficient), one adamw per tensor with its weight decay, convert to the bf16 compute copy -- bitwise. */
void test_adamw_flat(void) {
    if (!dut->adamw_flat) {
        printf("skip adamw_flat: backend '%s' has none (the optimizer calls adamw per tensor)\n", dut->name);
        return;
    }
    const size_t n = 10007, emb = 3001; /* an "embedding" of 3001 elements, then the other tensors */
    struct dual pa = dual_rand(n, 0.5), ma = dual_zero(n), va = dual_zero(n);
    float *pb = be_alloc(dut, n * sizeof(float)), *mb = be_alloc(dut, n * sizeof(float)),
          *vb = be_alloc(dut, n * sizeof(float)), *ga = be_alloc(dut, n * sizeof(float));
    void *ca = be_alloc(dut, n * 2), *cb = be_alloc(dut, n * 2);
    dut->copy(dut, pb, pa.d, n * sizeof(float));
    dut->zero(dut, ma.d, n * sizeof(float));
    dut->zero(dut, va.d, n * sizeof(float));
    dut->zero(dut, mb, n * sizeof(float));
    dut->zero(dut, vb, n * sizeof(float));
    int rc = 0;
    for (long step = 1; step <= 3; step++) {
        struct dual g = dual_rand(n, step == 2 ? 1e-3 : 1.0);
        const float coef = step == 3 ? 1.0f : 0.37f; /* step 3: no clipping */
        dut->copy(dut, ga, g.d, n * sizeof(float));
        rc |= dut->scale(dut, ga, n, coef);
        rc |= dut->adamw(dut, pa.d, ga, ma.d, va.d, emb, 1e-2, 0.9f, 0.95f, 1e-8f, 0.0, step);
        rc |= dut->adamw(dut, pa.d + emb, ga + emb, ma.d + emb, va.d + emb, n - emb, 1e-2, 0.9f, 0.95f, 1e-8f, 0.1,
                         step);
        const bool bf16 = dut->compute_dtype == OLMO_BF16; /* the compute copy: bf16 variants only */
        if (bf16) rc |= dut->convert(dut, ca, OLMO_BF16, pa.d, OLMO_F32, n);
        else rc |= dut->zero(dut, ca, n * 2) | dut->zero(dut, cb, n * 2);
        const struct olmo_adamw_flat f = {.weight_decay = 0.1, .weight_decay2 = 0.0, .wd2_lo = 0, .wd2_hi = emb,
                                          .grad_scale = coef, .compute = bf16 ? cb : NULL};
        rc |= dut->adamw_flat(dut, pb, g.d, mb, vb, n, 1e-2, 0.9f, 0.95f, 1e-8f, &f, step);
        dual_free(&g);
    }
    const bool same = !rc && dut_same_bytes(pa.d, pb, n * sizeof(float)) &&
                      dut_same_bytes(ma.d, mb, n * sizeof(float)) && dut_same_bytes(va.d, vb, n * sizeof(float)) &&
                      dut_same_bytes(ca, cb, n * 2);
    checks++;
    if (!same) failures++;
    printf("%s %-44s %s\n", same ? "ok  " : "FAIL", "adamw_flat vs scale + adamw + convert",
           same ? "bitwise equal (params, moments, bf16 copy)" : "differs");
    dual_free(&pa);
    dual_free(&ma);
    dual_free(&va);
    void *bufs[] = {pb, mb, vb, ga, ca, cb};
    for (int i = 0; i < 6; i++) dut->free(dut, bufs[i]);
}
