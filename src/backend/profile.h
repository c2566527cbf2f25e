/* A backend that forwards every op to another one and times it (wall clock
 * per op, FLOPs of the GEMMs and of attention), for `OLMOC_PROFILE=1 olmoc
 * train ...` and `bench_train --profile-steps N`.  On a backend that runs ops
 * asynchronously (CUDA) it waits for the device before and after each op, so
 * the times are right but the run is slower than an unprofiled one. */
#ifndef OLMOC_BACKEND_PROFILE_H
#define OLMOC_BACKEND_PROFILE_H

#include <stdbool.h>
#include <stdio.h>

#include "backend/backend.h"

/* A new instance wrapping `inner` (which it does not own: destroy the wrapper
 * with olmo_backend_destroy, then inner); the counters are the wrapper's own.
 * NULL, error set, when out of memory. */
struct olmo_backend *olmo_backend_profiled(const struct olmo_backend *inner);
/* Times ops (the default) or forwards them untimed, without waiting for the device. */
void olmo_profile_enable(const struct olmo_backend *profiled, bool on);
/* Clears the counters (e.g. after warm-up steps). */
void olmo_profile_reset(const struct olmo_backend *profiled);
/* Prints time per op and GEMM throughput since the last reset. */
void olmo_profile_report(const struct olmo_backend *profiled, FILE *out);
/* Query-key pairs that attention of this shape computes without document masking: the sum over
 * positions t of the keys t sees, min(t + 1, window), per sequence.  Attention's model FLOPs are 4
 * (forward) or 8 (backward) x these pairs x heads x head_dim. */
double olmo_attention_visible_pairs(const struct olmo_attn_shape *s);

#endif
