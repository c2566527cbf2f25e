/* Unit tests of the training-system pieces that need no files: thread-count
 * independent (deterministic) reductions, KV-cache generation against the
 * full forward pass, and the token sampler's distribution. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h" /* PAR_MIN: the determinism test must run above it */
#include "backend/profile.h"
#include "util/error.h"
#include "model/generate.h"
#include "model/sample.h"
#include "model/model.h"
#include "train/checkpoint.h"
#include "train/trainer.h"
#include "util/rng.h"

static struct olmo_backend *be;
static struct olmo_rng rng;
static int failures, checks;

static void check(int ok, const char *what, double value) {
    checks++;
    if (!ok) failures++;
    printf("%s %-52s %.3e\n", ok ? "ok  " : "FAIL", what, value);
}

static float *rand_buf(size_t n, double scale) {
    float *p = be->alloc(be, n * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = (float)(olmo_rng_normal(&rng) * scale);
    return p;
}

/* The same reductions with 1 and with 3 threads must agree bit for bit.  The
 * sizes put every op above the CPU backend's parallel threshold (PAR_MIN
 * elements; below it a loop runs on the calling thread and the comparison
 * proves nothing); rmsnorm's rows span many of the 8-row runs its backward
 * divides among threads and its dim several of the 64-column blocks its dw's
 * sums are divided into, so each reduction really is divided among threads. */
enum { DET_ROWS = 301, DET_DIM = 200, DET_VOCAB = 97, DET_BIG = 300000 };
_Static_assert(DET_ROWS * DET_DIM >= 3 * PAR_MIN, "rmsnorm determinism test below the parallel threshold");
_Static_assert(DET_DIM > 3 * 64, "rmsnorm dw in fewer column blocks than threads");
_Static_assert(DET_ROWS * DET_VOCAB >= PAR_MIN, "cross-entropy determinism test below the parallel threshold");

static void test_determinism(void) {
    const int n = DET_ROWS, dim = DET_DIM, vocab = DET_VOCAB;
    float *x = rand_buf((size_t)n * dim, 1.0), *w = rand_buf((size_t)dim, 1.0), *dy = rand_buf((size_t)n * dim, 1.0);
    float *y = be->alloc(be, (size_t)n * dim * 4), *rstd = be->alloc(be, (size_t)n * 4);
    be->rmsnorm_fwd(be, y, rstd, x, w, n, dim, 1e-6f);
    float *logits0 = rand_buf((size_t)n * vocab, 3.0);
    int32_t *targets = be->alloc(be, (size_t)n * 4);
    for (int i = 0; i < n; i++) targets[i] = i % 7 == 0 ? -100 : (int32_t)(olmo_rng_next(&rng) % vocab);
    float *big = rand_buf(DET_BIG, 1.0);
    float *dw[2], *dx[2], *yk[2];
    double ce[2], zz[2], ss[2];
    float *logits = be->alloc(be, (size_t)n * vocab * 4);
    const int threads[2] = {1, 3};
    for (int k = 0; k < 2; k++) {
        dw[k] = be->alloc(be, (size_t)dim * 4);
        dx[k] = be->alloc(be, (size_t)n * dim * 4);
        yk[k] = be->alloc(be, (size_t)n * dim * 4);
        float *rstd_k = be->alloc(be, (size_t)n * 4);
        omp_set_num_threads(threads[k]);
        be->rmsnorm_fwd(be, yk[k], rstd_k, x, w, n, dim, 1e-6f);
        be->rmsnorm_bwd(be, dx[k], dw[k], dy, x, w, rstd, n, dim);
        memcpy(logits, logits0, (size_t)n * vocab * 4);
        be->cross_entropy(be, logits, targets, n, vocab, 0.01f, 1e-4f, &ce[k], &zz[k]);
        be->sum_squares(be, big, DET_BIG, &ss[k]);
        be->free(be, rstd_k);
    }
    omp_set_num_threads(omp_get_num_procs());
    check(!memcmp(yk[0], yk[1], (size_t)n * dim * 4), "rmsnorm forward: 1 vs 3 threads bit-identical", 0.0);
    check(!memcmp(dw[0], dw[1], (size_t)dim * 4) && !memcmp(dx[0], dx[1], (size_t)n * dim * 4),
          "rmsnorm backward: 1 vs 3 threads bit-identical", 0.0);
    check(ce[0] == ce[1] && zz[0] == zz[1], "cross-entropy sums: 1 vs 3 threads bit-identical", fabs(ce[0] - ce[1]));
    check(ss[0] == ss[1], "sum of squares: 1 vs 3 threads bit-identical", fabs(ss[0] - ss[1]));
    /* empty rows (dim 0) and no rows: nothing to do, no error, nothing written (the backward's run sums once
     * divided 2 MiB by a 0-wide row) */
    const float before = dw[0][0];
    check(be->rmsnorm_bwd(be, dx[0], dw[0], dy, x, w, rstd, n, 0) == 0 &&
              be->rmsnorm_bwd(be, dx[0], dw[0], dy, x, w, rstd, 0, dim) == 0 && dw[0][0] == before &&
              !memcmp(dx[0], dx[1], (size_t)n * dim * 4),
          "rmsnorm backward: dim 0 and 0 rows are no-ops", 0.0);
    float *bufs[] = {x, w, dy, y, rstd, logits0, big, logits, dw[0], dw[1], dx[0], dx[1], yk[0], yk[1]};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->free(be, bufs[i]);
    be->free(be, targets);
}

static int argmax(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

/* Greedy decoding with the KV cache vs the full (uncached) forward pass over
 * the whole sequence at every step: same argmax, logits within fp32 rounding. */
static void test_generate_matches_forward(int chunk) {
    struct olmo_model_config c = {.vocab_size = 61, .d_model = 32, .n_layers = 5, .n_heads = 4, .n_kv_heads = 2,
                                  .mlp_hidden = 48, .rope_theta = 10000.0, .sliding_window = 4,
                                  .full_attention_every = 4, .full_attention_last = false, .rms_norm_eps = 1e-6,
                                  .init_std = 0.3, .eos_token_id = 0, .pad_token_id = 1};
    struct olmo_model m;
    if (olmo_model_create(&m, &c, be)) {
        check(0, "model create", 0);
        return;
    }
    olmo_model_init_weights(&m, 42);
    const int prompt = 7, n_new = 18, total = prompt + n_new;
    int32_t seq[64];
    for (int i = 0; i < prompt; i++) seq[i] = (int32_t)(olmo_rng_next(&rng) % c.vocab_size);
    struct olmo_gen g;
    float *logits = malloc(sizeof(float) * c.vocab_size), *full = malloc(sizeof(float) * c.vocab_size);
    if (olmo_gen_create(&g, &m, total, chunk)) {
        check(0, "generator create", 0);
        return;
    }
    for (int p = 0; p < prompt; p += chunk)
        olmo_gen_feed(&g, seq + p, prompt - p < chunk ? prompt - p : chunk, logits);
    double worst = 0.0;
    int mismatches = 0;
    for (int len = prompt; len < total; len++) {
        /* reference: the training forward over seq[0..len) */
        olmo_model_reserve(&m, 1, len);
        olmo_model_forward(&m, seq, false);
        olmo_model_logits_rows(&m, len - 1, 1, full);
        double mx = 0, diff = 0;
        for (int v = 0; v < c.vocab_size; v++) {
            if (fabs(full[v]) > mx) mx = fabs(full[v]);
            if (fabs(full[v] - logits[v]) > diff) diff = fabs(full[v] - logits[v]);
        }
        if (diff / mx > worst) worst = diff / mx;
        int next = argmax(logits, c.vocab_size);
        if (next != argmax(full, c.vocab_size)) mismatches++;
        seq[len] = next;
        if (len + 1 < total) olmo_gen_feed(&g, &seq[len], 1, logits);
    }
    char what[96];
    snprintf(what, sizeof what, "KV-cache greedy == full forward argmax (chunk %d)", chunk);
    check(mismatches == 0, what, (double)mismatches);
    snprintf(what, sizeof what, "KV-cache logits vs full forward, rel (chunk %d)", chunk);
    check(worst < 1e-5, what, worst);
    olmo_gen_destroy(&g);
    olmo_model_destroy(&m);
    free(logits);
    free(full);
}

static void test_sampler(void) {
    const int V = 6;
    const float logits[6] = {1.0f, 2.0f, 0.5f, -1.0f, 1.5f, 0.0f};
    const double T = 0.7;
    double p[6], total = 0;
    for (int i = 0; i < V; i++) total += p[i] = exp(logits[i] / T);
    for (int i = 0; i < V; i++) p[i] /= total;
    struct olmo_rng r;
    olmo_rng_seed(&r, 5);
    const int draws = 60000;
    int counts[6] = {0};
    for (int k = 0; k < draws; k++) counts[olmo_sample_token(logits, V, T, 1.0, &r)]++;
    double worst = 0;
    for (int i = 0; i < V; i++) {
        double se = sqrt(p[i] * (1 - p[i]) / draws), z = fabs(counts[i] / (double)draws - p[i]) / se;
        if (z > worst) worst = z;
    }
    check(worst < 5.0, "temperature sampling frequencies (max z-score)", worst);
    /* top-p 0.6: sorted probabilities are p1 > p4 > p0 > ...; the nucleus is the
     * smallest prefix reaching 0.6 of the mass. */
    int order[6] = {1, 4, 0, 2, 5, 3}, keep = 0;
    double cum = 0;
    while (cum < 0.6) cum += p[order[keep++]];
    memset(counts, 0, sizeof counts);
    for (int k = 0; k < draws; k++) counts[olmo_sample_token(logits, V, T, 0.6, &r)]++;
    int outside = 0;
    for (int k = keep; k < V; k++) outside += counts[order[k]];
    worst = 0;
    for (int k = 0; k < keep; k++) {
        double q = p[order[k]] / cum, se = sqrt(q * (1 - q) / draws);
        double z = fabs(counts[order[k]] / (double)draws - q) / se;
        if (z > worst) worst = z;
    }
    check(outside == 0 && worst < 5.0, "top-p: nothing outside the nucleus, renormalised inside", worst);
    check(olmo_sample_token(logits, V, 0.0, 1.0, &r) == 1, "temperature 0 is argmax", 0);
    struct olmo_rng a, b;
    olmo_rng_seed(&a, 9);
    olmo_rng_seed(&b, 9);
    int same = 1;
    for (int k = 0; k < 100; k++) same &= olmo_sample_token(logits, V, 1.0, 0.9, &a) == olmo_sample_token(logits, V, 1.0, 0.9, &b);
    check(same, "same seed, same samples", 0);
}

static void test_hash(void) {
    char buf[100];
    for (int i = 0; i < 100; i++) buf[i] = (char)i;
    uint64_t h = olmo_hash64(buf, 100);
    int distinct = 1;
    for (int i = 0; i < 100; i++) {
        buf[i] ^= 1;
        distinct &= olmo_hash64(buf, 100) != h;
        buf[i] ^= 1;
    }
    distinct &= olmo_hash64(buf, 99) != h;
    check(distinct && olmo_hash64(buf, 100) == h, "hash64 changes with any flipped bit or length", 0);
    /* XXH3-64, seed 0: xxHash's published value for no bytes, and Python's xxhash.xxh3_64 of bytes 0..99 */
    check(olmo_hash64("", 0) == 0x2d06800538d394c2ULL && h == 0x004e4f921a64bd1cULL,
          "hash64 is XXH3-64 (state.json's \"hash\": \"xxh3_64\")", 0);
}

/* Backend instances share no state: two cpu-bf16 instances (each with its own
 * scratch buffers and oneDNN primitives) give the same products, one keeps
 * working after the other is destroyed, and two profiled wrappers count
 * their own calls. */
static int gemm_calls_reported(const struct olmo_backend *profiled) {
    char text[8192] = {0};
    FILE *f = fmemopen(text, sizeof text - 1, "w");
    if (!f) return -1;
    olmo_profile_report(profiled, f);
    fclose(f);
    const char *line = strstr(text, "profile: gemm ");
    long calls = -1;
    if (line) sscanf(line + strlen("profile: gemm "), "%ld", &calls);
    return (int)calls;
}

static void test_instances(void) {
    enum { M = 70, N = 300, K = 130 };
    struct olmo_backend *one = olmo_backend_create("cpu-bf16"), *two = olmo_backend_create("cpu-bf16");
    if (!one || !two) {
        check(0, "two cpu-bf16 instances", 0);
        olmo_backend_destroy(one);
        olmo_backend_destroy(two);
        return;
    }
    float *a = rand_buf((size_t)M * K, 1.0), *b = rand_buf((size_t)N * K, 1.0);
    float *c1 = be->alloc(be, sizeof(float) * M * N), *c2 = be->alloc(be, sizeof(float) * M * N),
          *c3 = be->alloc(be, sizeof(float) * M * N);
    int rc = one->gemm(one, false, true, M, N, K, 1.0f, a, OLMO_F32, K, b, OLMO_F32, K, 0.0f, c1, N);
    rc |= two->gemm(two, false, true, M, N, K, 1.0f, a, OLMO_F32, K, b, OLMO_F32, K, 0.0f, c2, N);
    olmo_backend_destroy(one);
    rc |= two->gemm(two, false, true, M, N, K, 1.0f, a, OLMO_F32, K, b, OLMO_F32, K, 0.0f, c3, N);
    check(!rc && !memcmp(c1, c2, sizeof(float) * M * N) && !memcmp(c1, c3, sizeof(float) * M * N),
          "two instances: same products, independent lifetimes", 0);
    struct olmo_backend *p1 = olmo_backend_profiled(two), *p2 = olmo_backend_profiled(two);
    if (p1 && p2) {
        p1->gemm(p1, false, true, M, N, K, 1.0f, a, OLMO_F32, K, b, OLMO_F32, K, 0.0f, c1, N);
        p1->gemm(p1, false, true, M, N, K, 1.0f, a, OLMO_F32, K, b, OLMO_F32, K, 0.0f, c1, N);
        p2->gemm(p2, false, true, M, N, K, 1.0f, a, OLMO_F32, K, b, OLMO_F32, K, 0.0f, c2, N);
    }
    const int n1 = p1 ? gemm_calls_reported(p1) : -1, n2 = p2 ? gemm_calls_reported(p2) : -1;
    check(n1 == 2 && n2 == 1, "profiled wrappers count their own calls (2 and 1)", n1 * 10 + n2);
    olmo_backend_destroy(p1);
    olmo_backend_destroy(p2);
    olmo_backend_destroy(two);
    float *bufs[] = {a, b, c1, c2, c3};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->free(be, bufs[i]);
}

/* cpu-bf16 multiplies by a bf16 compute copy of the weights: after
 * initialisation and after every optimizer step it must be exactly the
 * master weights rounded to nearest even (a missed refresh would leave the
 * GEMMs on stale weights). */
static void test_compute_copy(void) {
    struct olmo_backend *bf = olmo_backend_create("cpu-bf16");
    struct olmo_config cfg;
    olmo_config_defaults(&cfg);
    cfg.model = (struct olmo_model_config){.vocab_size = 61, .d_model = 32, .n_layers = 2, .n_heads = 4,
                                           .n_kv_heads = 2, .mlp_hidden = 48, .rope_theta = 10000.0,
                                           .sliding_window = 4, .full_attention_every = 2, .rms_norm_eps = 1e-6,
                                           .init_std = 0.3, .eos_token_id = 0, .pad_token_id = 1};
    cfg.train.seq_len = 16;
    cfg.train.micro_batch = 2;
    cfg.train.grad_accum = 1;
    cfg.train.lr = 1e-2;
    struct olmo_trainer tr;
    if (!bf || olmo_trainer_init(&tr, &cfg, bf)) {
        check(0, "cpu-bf16 trainer", 0);
        olmo_backend_destroy(bf);
        return;
    }
    struct olmo_model *m = &tr.model;
    bool ok = m->compute.numel == m->n_floats && m->compute.dtype == OLMO_BF16 &&
              m->compute.role == OLMO_BUF_COMPUTE_COPY && !olmo_model_init_weights(m, 5);
    const size_t n = olmo_trainer_batch_rows(&tr) * (size_t)cfg.train.seq_len;
    int32_t *batch = malloc(sizeof(int32_t) * n);
    uint16_t *want = malloc(sizeof(uint16_t) * m->n_floats);
    for (int step = 0; step <= 2 && ok && batch && want; step++) {
        struct olmo_step_result res;
        for (size_t i = 0; i < n; i++) batch[i] = (int32_t)(olmo_rng_next(&rng) % 61);
        if (step > 0) ok = !olmo_trainer_step(&tr, batch, &res);
        bf->convert(bf, want, OLMO_BF16, m->weights, OLMO_F32, m->n_floats);
        ok = ok && !memcmp(want, m->compute.data, sizeof(uint16_t) * m->n_floats);
    }
    check(ok && batch && want, "cpu-bf16 compute copy == bf16(weights) after init and steps", 0);
    free(batch);
    free(want);
    olmo_trainer_destroy(&tr);
    olmo_backend_destroy(bf);
}

int main(void) {
    be = olmo_backend_create("cpu");
    if (!be) {
        fprintf(stderr, "test_train_system: %s\n", olmo_last_error());
        return 1;
    }
    olmo_rng_seed(&rng, 1234);
    test_determinism();
    test_generate_matches_forward(64);
    test_generate_matches_forward(3);
    test_generate_matches_forward(1);
    test_sampler();
    test_hash();
    test_instances();
    test_compute_copy();
    printf("%d/%d checks passed\n", checks - failures, checks);
    olmo_backend_destroy(be);
    return failures ? 1 : 0;
}
