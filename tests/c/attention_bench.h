/* What the attention benches share (test_attention --bench and test_attention_parts --bench): their
 * shapes, a clock and the sort for medians. */
#ifndef OLMOC_TESTS_ATTENTION_BENCH_H
#define OLMOC_TESTS_ATTENTION_BENCH_H

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* Calls per shape: one head per call, short calls (~10 ms), many of them, so that the best finds the
 * processor to itself. */
enum { ATTN_BENCH_REPS = 31 };

struct attn_bench {
    int B, T, n;       /* batch, sequence length, shapes */
    int shape[4][3];   /* head_dim, heads, window (0: full) */
};

/* The benchmark shapes (one head, T = 2048, head_dim 64 and 128, full and window 256), or the one that
 * OLMOC_BENCH_SHAPE=B,T,H,D,WINDOW names (e.g. a training micro-batch: 4,512,6,64,0); -1, said on
 * stderr, for a malformed one. */
static int attn_bench_shapes(struct attn_bench *b) {
    *b = (struct attn_bench){1, 2048, 4, {{64, 1, 0}, {64, 1, 256}, {128, 1, 0}, {128, 1, 256}}};
    const char *one = getenv("OLMOC_BENCH_SHAPE");
    if (!one || !*one) return 0;
    b->n = 1;
    if (sscanf(one, "%d,%d,%d,%d,%d", &b->B, &b->T, &b->shape[0][1], &b->shape[0][0], &b->shape[0][2]) != 5 ||
        b->B < 1 || b->T < 1 || b->shape[0][1] < 1 || b->shape[0][0] < 1 || b->shape[0][2] < 0) {
        fprintf(stderr, "OLMOC_BENCH_SHAPE: expected B,T,H,D,WINDOW (positive; window 0 = full), got '%s'\n", one);
        return -1;
    }
    return 0;
}

static double attn_bench_now(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int attn_bench_cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#endif
