/* Attention's time by part (part of cpu_attention_kernels.h, compiled once per
 * instruction set with it): the ATTN_ macros that the kernels call around
 * their parts, empty unless OLMOC_ATTN_PARTS is defined. */
#ifndef OLMOC_CPU_ATTENTION_PARTS_H
#define OLMOC_CPU_ATTENTION_PARTS_H

#include <omp.h>

#include "backend/cpu/cpu_internal.h"

/* ---- time by part, for studying the kernels ---------------------------------
 * Only where OLMOC_ATTN_PARTS is defined: tests/c/test_attention_parts.c includes
 * cpu_attention_kernels.h so (its --bench prints each part's share); the library's kernels are built
 * without it, and every ATTN_ macro below is then empty.  With it, a call adds to *attn_parts (when set) each thread's seconds in each
 * part (thread-seconds: summed over threads) and the FLOPs its tile products compute (whole kernel
 * vectors, masked column tails included; the column blocks and k ranges the kernels skip are not). */
#ifdef OLMOC_ATTN_PARTS
#include <time.h>
enum attn_part {
    ATTN_FWD_PACK,    /* fp32: K^T blocks and V rows copied for the task's products */
    ATTN_FWD_S,       /* S = scale Q K^T (fp32: with the rows' partial maxima) */
    ATTN_FWD_SOFTMAX, /* the rows' online softmax: maxima, exp, the output rows rescaled */
    ATTN_FWD_PV,      /* O += P V (bf16: P packed first) */
    ATTN_FWD_OUT,     /* the output rows and lse */
    ATTN_BWD_PREP,    /* before the tasks: bounds, delta, schedule (bf16: the operands' copies) */
    ATTN_BWD_PACK,    /* fp32: a key block's K^T, V^T and K, and its new queries' Q and dO rows */
    ATTN_BWD_S,       /* P = exp(scale Q K^T - lse) */
    ATTN_BWD_DV,      /* dV += P^T dO */
    ATTN_BWD_DS,      /* dP = dO V^T, dS = P (dP - delta) scale */
    ATTN_BWD_DK,      /* dK += dS^T Q */
    ATTN_BWD_DQ,      /* dQ += dS K */
    ATTN_BWD_DQSUM,   /* dq += its copies */
    ATTN_PARTS
};
struct attn_parts {
    double seconds[ATTN_PARTS], flops[ATTN_PARTS];
    double total[2]; /* forward, backward: the calls' wall time x omp_get_max_threads() */
    double model[2]; /* their model FLOPs: 4 (forward) or 8 x visible pairs x heads x head_dim */
    long calls[2];
};
static struct attn_parts *attn_parts; /* where calls add their counts; NULL: they do not count */
struct attn_timer {
    double s[ATTN_PARTS], f[ATTN_PARTS], t0;
    int part; /* the part running */
};
static _Thread_local struct attn_timer *attn_tm; /* this thread's, inside a counted call; else NULL */

static inline double attn_clock(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline void attn_begin(int part) {
    if (!attn_tm) return;
    attn_tm->part = part;
    attn_tm->t0 = attn_clock();
}

static inline void attn_end(void) {
    if (attn_tm) attn_tm->s[attn_tm->part] += attn_clock() - attn_tm->t0;
}

/* the thread's counts into *attn_parts */
static inline void attn_thread_end(void) {
    if (!attn_tm) return;
    for (int i = 0; i < ATTN_PARTS; i++) {
#pragma omp atomic
        attn_parts->seconds[i] += attn_tm->s[i];
#pragma omp atomic
        attn_parts->flops[i] += attn_tm->f[i];
    }
    attn_tm = NULL;
}

/* a call of pass 0 (forward) or 1 (backward) that began at t0 */
static void attn_call_end(int pass, double t0, const int *lo, const struct olmo_attn_shape *s) {
    if (!attn_parts) return;
    attn_parts->total[pass] += (attn_clock() - t0) * omp_get_max_threads();
    attn_parts->calls[pass]++;
    double pairs = 0.0;
    for (size_t t = 0; t < (size_t)s->batch * s->seq_len; t++) pairs += (double)(t % s->seq_len) - lo[t] + 1;
    attn_parts->model[pass] += (pass ? 8.0 : 4.0) * pairs * s->n_heads * s->head_dim;
}

/* a part outside the tasks (one thread, the others wait: its wall time x the team's threads) */
static inline void attn_serial(int part, double t0) {
    if (attn_parts) attn_parts->seconds[part] += (attn_clock() - t0) * omp_get_max_threads();
}

#define ATTN_BEGIN(part) attn_begin(part)
#define ATTN_END() attn_end()
#define ATTN_FLOPS(x) ((void)(attn_tm ? attn_tm->f[attn_tm->part] += (x) : 0.0))
#define ATTN_THREAD_BEGIN()                                                                                 \
    struct attn_timer attn_mine = {{0}, {0}, 0.0, 0};                                                       \
    attn_tm = attn_parts ? &attn_mine : NULL
#define ATTN_THREAD_END() attn_thread_end()
#define ATTN_CALL_BEGIN() const double attn_t_call = attn_clock()
#define ATTN_CALL_END(pass, lo, s) attn_call_end(pass, attn_t_call, lo, s)
#define ATTN_MARK(name) const double name = attn_clock()
#define ATTN_SERIAL(part, t0) attn_serial(part, t0)
#else
#define ATTN_BEGIN(part) ((void)0)
#define ATTN_END() ((void)0)
#define ATTN_FLOPS(x) ((void)0)
#define ATTN_THREAD_BEGIN() ((void)0)
#define ATTN_THREAD_END() ((void)0)
#define ATTN_CALL_BEGIN() ((void)0)
#define ATTN_CALL_END(pass, lo, s) ((void)0)
#define ATTN_MARK(name) ((void)0)
#define ATTN_SERIAL(part, t0) ((void)0)
#endif

#endif
