/* Attention's time by part, for studying the CPU kernels.  This file includes
 * src/backend/cpu/cpu_attention_kernels.h with OLMOC_ATTN_PARTS defined: a clock read around each
 * part of the forward and backward and the FLOPs each tile product computes (the library's kernels
 * are built without it, the same machine code as before it existed).  Built twice
 * (tests/CMakeLists.txt), like test_attention_epilogues: with the build's flags (the kernels of
 * cpu_attention.c) and with -mavx2 -mfma -mno-avx512f (those of cpu_attention_avx2.c).
 *
 * test_attention_parts: on a few shapes (GQA, windows, documents, partial tiles; fp32 and bf16
 *   products), this counting copy gives the same bits as the library's kernels (backends cpu and
 *   cpu-bf16, with OLMOC_CPU_ISA=avx2 for the AVX2 build), counts one call of each pass, time and
 *   FLOPs in every product part, at least the FLOPs the products must compute (forward: S and PV,
 *   2 x visible pairs x head_dim each, together its model FLOPs; backward: five such products, 1.25x
 *   its model FLOPs) and, on a full causal shape, not much more, and parts within the calls' time.
 *   Exit 77 (skipped) where the AVX2 build meets a processor without AVX2 and FMA.
 * test_attention_parts --bench [PEAK_GFLOPS]: test_attention --bench's shapes (one head, T = 2048,
 *   head_dim 64 and 128, full and window 256; OLMOC_BENCH_SHAPE=B,T,H,D,WINDOW for one other), each
 *   pass's model GFLOP/s (and share of PEAK_GFLOPS) and each part's share of its time, with the
 *   products' computed GFLOP/s: where the time goes, on the processor it runs on; then the tile kernel
 *   alone at the backward's product shapes on operands that stay in cache, for each head_dim (to 128).
 *   The clock reads cost a few hundred nanoseconds a tile: test_attention --bench gives the kernels'
 *   speed. */
#define OLMOC_ATTN_PARTS 1
#pragma GCC diagnostic ignored "-Wunused-function" /* the header's helpers not called here */
#include "backend/cpu/cpu_attention_kernels.h"

#include <stdio.h>

#include "attention_bench.h"
#include "backend/profile.h"
#include "util/error.h"
#include "util/rng.h"

static int failures, checks;
static struct olmo_rng rng;

/* the kernels' scratch (cpu_cached_scratch), as a backend instance holds it */
static struct cpu_state *st;

struct problem {
    struct olmo_attn_shape s;
    int32_t *docs;
    float *q, *k, *v, *dout, *out, *lse, *dq, *dk, *dv;
    size_t nq, nk, nl;
};

static float *normal(size_t n) {
    float *p = malloc(n * sizeof(float));
    for (size_t i = 0; p && i < n; i++) p[i] = (float)olmo_rng_normal(&rng);
    return p;
}

static void problem_init(struct problem *p, int B, int T, int H, int HK, int D, int window, int doc_len) {
    *p = (struct problem){.s = {B, T, H, HK, D, window, 1.0f / sqrtf((float)D)}};
    p->nq = (size_t)B * T * H * D, p->nk = (size_t)B * T * HK * D, p->nl = (size_t)B * H * T;
    p->q = normal(p->nq), p->k = normal(p->nk), p->v = normal(p->nk), p->dout = normal(p->nq);
    p->out = malloc(p->nq * 4), p->lse = malloc(p->nl * 4), p->dq = malloc(p->nq * 4);
    p->dk = malloc(p->nk * 4), p->dv = malloc(p->nk * 4);
    if (doc_len > 0) { /* documents of doc_len positions, ids non-decreasing as the model builds them */
        p->docs = malloc((size_t)B * T * sizeof(int32_t));
        for (int i = 0; i < B * T; i++) p->docs[i] = i % T / doc_len;
    }
}

static void problem_free(struct problem *p) {
    float *bufs[] = {p->q, p->k, p->v, p->dout, p->out, p->lse, p->dq, p->dk, p->dv};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(p->docs);
}

/* forward and backward with this file's counting kernels (bf16: cpu-bf16's products where they exist) */
static int run_counting(struct problem *p, bool bf16) {
    if (attention_fwd(st, bf16, p->out, p->lse, p->q, p->k, p->v, p->docs, &p->s) != 0) return -1;
    return attention_bwd(st, bf16, p->dq, p->dk, p->dv, p->dout, p->out, p->lse, p->q, p->k, p->v, p->docs, &p->s);
}

static void parts_print(const struct attn_parts *p, FILE *out) {
    static const char *const names[ATTN_PARTS] = {"pack", "S", "softmax", "PV", "out", "prep", "pack", "S,P",
                                                  "dV", "dP,dS", "dK", "dQ", "dq sum"};
    static const char *const pass_name[2] = {"forward", "backward"};
    const int first[2] = {ATTN_FWD_PACK, ATTN_BWD_PREP}, end[2] = {ATTN_BWD_PREP, ATTN_PARTS};
    for (int pass = 0; pass < 2; pass++) {
        if (!p->calls[pass] || p->total[pass] <= 0.0) continue;
        double in_parts = 0.0, flops = 0.0;
        for (int i = first[pass]; i < end[pass]; i++) in_parts += p->seconds[i], flops += p->flops[i];
        fprintf(out, "  %s: %ld calls, %.3f thread-s, %.1f model GFLOP/s a thread; products compute %.3fx the model FLOPs\n   ",
                pass_name[pass], p->calls[pass], p->total[pass], p->model[pass] / p->total[pass] * 1e-9,
                flops / p->model[pass]);
        for (int i = first[pass]; i < end[pass]; i++) {
            fprintf(out, " %s %.1f%%", names[i], 100.0 * p->seconds[i] / p->total[pass]);
            if (p->flops[i] > 0.0 && p->seconds[i] > 0.0) fprintf(out, " (%.1f)", p->flops[i] / p->seconds[i] * 1e-9);
        }
        fprintf(out, ", other %.1f%%\n", 100.0 * (p->total[pass] - in_parts) / p->total[pass]);
    }
}

/* One shape: the library's kernels, then this copy counting; bounded: check the products' FLOPs from above */
static void check(const char *what, bool bf16, bool bounded, int B, int T, int H, int HK, int D, int window,
                  int doc_len) {
    struct olmo_backend *be = olmo_backend_create(bf16 ? "cpu-bf16" : "cpu");
    checks++;
    if (!be) {
        failures++;
        printf("FAIL %s: backend %s: %s\n", what, bf16 ? "cpu-bf16" : "cpu", olmo_last_error());
        return;
    }
    struct problem p;
    problem_init(&p, B, T, H, HK, D, window, doc_len);
    float *ref = malloc(4 * (2 * p.nq + p.nl + 2 * p.nk));
    const float *outs[5] = {p.out, p.lse, p.dq, p.dk, p.dv};
    const size_t sizes[5] = {p.nq, p.nl, p.nq, p.nk, p.nk};
    int rc = be->attention_fwd(be, p.out, p.lse, p.q, p.k, p.v, p.docs, &p.s);
    if (rc == 0) rc = be->attention_bwd(be, p.dq, p.dk, p.dv, p.dout, p.out, p.lse, p.q, p.k, p.v, p.docs, &p.s);
    for (size_t i = 0, at = 0; i < 5; at += sizes[i], i++) memcpy(ref + at, outs[i], sizes[i] * 4);
    struct attn_parts parts = {0};
    attn_parts = &parts;
    rc = rc ? rc : run_counting(&p, bf16);
    attn_parts = NULL;
    bool same = rc == 0;
    for (size_t i = 0, at = 0; i < 5; at += sizes[i], i++) same = same && !memcmp(ref + at, outs[i], sizes[i] * 4);
    static const int products[] = {ATTN_FWD_S, ATTN_FWD_PV, ATTN_BWD_S, ATTN_BWD_DV, ATTN_BWD_DS, ATTN_BWD_DK,
                                   ATTN_BWD_DQ};
    int empty = 0;
    for (size_t i = 0; i < sizeof products / sizeof products[0]; i++)
        if (!(parts.flops[products[i]] > 0.0 && parts.seconds[products[i]] > 0.0)) empty++;
    double fwd = 0.0, bwd = 0.0, in_fwd = 0.0, in_bwd = 0.0;
    for (int i = 0; i < ATTN_PARTS; i++) {
        if (i < ATTN_BWD_PREP)
            fwd += parts.flops[i], in_fwd += parts.seconds[i];
        else
            bwd += parts.flops[i], in_bwd += parts.seconds[i];
    }
    const double rf = fwd / parts.model[0], rb = bwd / parts.model[1];
    /* upper bounds on the full causal shape: whole vectors and tiles about the diagonal give 1.05-1.25x
     * (forward) and 1.30-1.56x (backward) by kernel; a part counted twice would give 2x and more */
    const bool ok = same && parts.calls[0] == 1 && parts.calls[1] == 1 && empty == 0 && rf >= 1.0 && rb >= 1.25 &&
                    (!bounded || (rf <= 1.6 && rb <= 2.0)) && in_fwd <= parts.total[0] * 1.001 &&
                    in_bwd <= parts.total[1] * 1.001;
    if (!ok) failures++;
    printf("%s %-44s %s bits as the library's; products %.3fx / %.3fx the model FLOPs (forward / backward); "
           "%d product parts without time or FLOPs; parts %.0f%% / %.0f%% of the calls' time\n",
           ok ? "ok  " : "FAIL", what, same ? "same" : "OTHER", rf, rb, empty, 100.0 * in_fwd / parts.total[0],
           100.0 * in_bwd / parts.total[1]);
    free(ref);
    problem_free(&p);
    olmo_backend_destroy(be);
}

/* The tile kernel alone, at the backward's product shapes (64 queries x 64 keys: S and dP as A B with
 * k = head_dim; dV and dK as A^T B, dQ as A B, with k = 64 and C added to), called over and over on the
 * same arrays, which stay in cache (in a 48 KiB L1 at head_dim 64; L1 and L2 at 128): what the products
 * would run at with nothing else in the cache, beside what they do in the passes.  The arrays start at
 * different offsets in a 4 KiB page (three 16 KiB arrays at one offset, which fill the L1's sets together,
 * ran 10-20% slower). */
static void bench_hot_tiles(const int *dims, int n_dims, double peak) {
    enum { OPERAND = 64 * 128, SKEW = 272 }; /* floats: the largest operand; 1088 bytes, not a multiple of 4 KiB */
    float *buf = malloc(sizeof(float) * 3 * (OPERAND + SKEW));
    if (!buf) return;
    float *a = buf, *b = a + OPERAND + SKEW, *c = b + OPERAND + SKEW;
    for (int i = 0; i < OPERAND; i++) a[i] = 0.01f * (float)(i % 7), b[i] = 0.01f * (float)(i % 5), c[i] = 0.0f;
    for (int i = 0; i < n_dims; i++) {
        const int D = dims[i];
        /* m, n, k, A transposed, beta */
        const int prods[3][5] = {{64, 64, D, 0, 0}, {64, D, 64, 1, 1}, {64, D, 64, 0, 1}};
        static const char *names[3] = {"S, dP (A B, k = head_dim)", "dV, dK (A^T B + C)", "dQ (A B + C)"};
        printf("tile kernel, operands in cache, head_dim %d:", D);
        for (int j = 0; j < 3; j++) {
            const int m = prods[j][0], n = prods[j][1], k = prods[j][2];
            const bool ta = prods[j][3];
            double best = 0.0;
            for (int rep = 0; rep < 5; rep++) {
                const int calls = 2000;
                const double t0 = attn_bench_now(CLOCK_THREAD_CPUTIME_ID);
                for (int r = 0; r < calls; r++)
                    tile_gemm(NULL, ta, m, n, k, 1.0f, a, ta ? m : k, b, n, (float)prods[j][4], c, n);
                const double g = 2.0 * m * n * k * calls / (attn_bench_now(CLOCK_THREAD_CPUTIME_ID) - t0) * 1e-9;
                best = g > best ? g : best;
            }
            printf("%s %s %.1f GFLOP/s", j ? "," : "", names[j], best);
            if (peak > 0) printf(" = %.0f%%", 100.0 * best / peak);
        }
        printf(" (best of 5)\n");
    }
    free(buf);
}

/* --bench: test_attention --bench's shapes through this copy (its figures: model FLOPs over CPU seconds /
 * threads), then where the time went */
static int bench(double peak) {
    enum { REPS = ATTN_BENCH_REPS };
    struct attn_bench shapes;
    if (attn_bench_shapes(&shapes) != 0) return 2;
    const int T = shapes.T, B = shapes.B, threads = omp_get_max_threads();
    printf("bench (time by part): %d thread(s), T=%d, batch %d, fp32 products; model FLOPs over CPU seconds / "
           "threads, median of %d runs%s; after each shape its parts' share of the pass and (in brackets) the "
           "products' computed GFLOP/s a thread\n",
           threads, T, B, REPS, peak > 0 ? ", % of the given peak" : "");
    for (int i = 0; i < shapes.n; i++) {
        const int D = shapes.shape[i][0], H = shapes.shape[i][1], w = shapes.shape[i][2];
        struct problem p;
        problem_init(&p, B, T, H, H, D, w, 0);
        const double pairs = olmo_attention_visible_pairs(&p.s); /* as OLMOC_PROFILE counts them */
        if (run_counting(&p, false) != 0) { /* warm-up: scratch and the thread team exist */
            fprintf(stderr, "bench: %s\n", olmo_last_error());
            return 1;
        }
        struct attn_parts parts = {0};
        attn_parts = &parts;
        double tf[REPS], tb[REPS];
        for (int r = 0; r < REPS; r++) {
            const double t0 = attn_bench_now(CLOCK_PROCESS_CPUTIME_ID);
            attention_fwd(st, false, p.out, p.lse, p.q, p.k, p.v, NULL, &p.s);
            const double t1 = attn_bench_now(CLOCK_PROCESS_CPUTIME_ID);
            attention_bwd(st, false, p.dq, p.dk, p.dv, p.dout, p.out, p.lse, p.q, p.k, p.v, NULL, &p.s);
            tf[r] = (t1 - t0) / threads, tb[r] = (attn_bench_now(CLOCK_PROCESS_CPUTIME_ID) - t1) / threads;
        }
        attn_parts = NULL;
        qsort(tf, REPS, sizeof tf[0], attn_bench_cmp);
        qsort(tb, REPS, sizeof tb[0], attn_bench_cmp);
        const double ff = 4.0 * pairs * H * D * 1e-9, fb = 2.0 * ff;
        printf("bench D=%3d H=%d window %4d: fwd %6.1f GFLOP/s", D, H, w, ff / tf[REPS / 2]);
        if (peak > 0) printf(" = %3.0f%%", 100 * ff / tf[REPS / 2] / peak);
        printf("  bwd %6.1f GFLOP/s", fb / tb[REPS / 2]);
        if (peak > 0) printf(" = %3.0f%%", 100 * fb / tb[REPS / 2] / peak);
        printf("\n");
        parts_print(&parts, stdout);
        problem_free(&p);
    }
    int dims[8], n_dims = 0; /* the shapes' head_dims, each once */
    for (int i = 0; i < shapes.n; i++) {
        bool seen = false;
        for (int j = 0; j < n_dims; j++) seen = seen || dims[j] == shapes.shape[i][0];
        if (!seen && n_dims < 8 && shapes.shape[i][0] <= 128) dims[n_dims++] = shapes.shape[i][0];
    }
    bench_hot_tiles(dims, n_dims, peak);
    return 0;
}

int main(int argc, char **argv) {
    const bool bench_mode = argc > 1 && !strcmp(argv[1], "--bench");
    if (argc > (bench_mode ? 3 : 1)) {
        fprintf(stderr, "usage: test_attention_parts [--bench [PEAK_GFLOPS]]\n");
        return 2;
    }
#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__) && defined(OLMOC_PARTS_AVX2_BUILD)
    if (!olmo_cpu_has_avx2_fma()) {
        printf("SKIP: the AVX2+FMA build of this test, and this processor has no AVX2 and FMA\n");
        return 77;
    }
    setenv("OLMOC_CPU_ISA", "avx2", 1); /* the library's AVX2 kernels, the ones this copy is built as */
    const char *copy = "AVX2+FMA (-mavx2 -mfma -mno-avx512f)";
#else
    unsetenv("OLMOC_CPU_ISA"); /* the library's kernels built with the build's flags, as this copy is */
    const char *copy = "the build's (-march)";
#endif
#if !defined(__AVX512F__) && !(defined(__AVX2__) && defined(__FMA__))
    /* a build whose flags have no attention kernels (e.g. the ASan build, without -march): its library runs
     * the AVX2 ones on a processor that has them, which this copy is not; the AVX2 build of this test is */
    struct olmo_backend *probe = olmo_backend_create("cpu");
    const bool other = probe && strstr(probe->describe(probe), "attention: AVX2+FMA kernels") != NULL;
    if (probe) olmo_backend_destroy(probe);
    if (other) {
        printf("SKIP: this build's flags give attention no SIMD kernels, and its library runs its AVX2+FMA ones "
               "here (test_attention_parts_avx2 checks those)\n");
        return 77;
    }
#endif
    st = calloc(1, sizeof *st);
    olmo_rng_seed(&rng, 7);
    printf("attention kernels with time by part: %s\n", copy);
    int rc = 0;
    if (bench_mode) {
        rc = bench(argc > 2 ? atof(argv[2]) : 0.0);
    } else {
        for (int bf16 = 0; bf16 < 2; bf16++) {
            const char *v = bf16 ? "bf16 products:" : "fp32 products:";
            char what[96];
            snprintf(what, sizeof what, "%s T=256 full, GQA 4/2, D=64", v);
            check(what, bf16, true, 2, 256, 4, 2, 64, 0, 0);
            snprintf(what, sizeof what, "%s T=301 window 77, GQA 4/2, D=128", v);
            check(what, bf16, false, 1, 301, 4, 2, 128, 77, 0);
            snprintf(what, sizeof what, "%s T=257 window 100 + docs, MQA 3/1, D=8", v);
            check(what, bf16, false, 2, 257, 3, 1, 8, 100, 40);
        }
        printf("%d passed, %d failed\n", checks - failures, failures);
        rc = failures ? 1 : 0;
    }
    for (int i = 0; i < N_SLOTS; i++) free(st->slots[i].p);
    free(st);
    return rc;
}
