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

/* Wraps `inner`; one profiled backend per process (its counters are global). */
const struct olmo_backend *olmo_backend_profiled(const struct olmo_backend *inner);
/* Times ops (the default) or forwards them untimed, without waiting for the device. */
void olmo_profile_enable(bool on);
/* Clears the counters (e.g. after warm-up steps). */
void olmo_profile_reset(void);
/* Prints time per op and GEMM throughput since the last reset. */
void olmo_profile_report(FILE *out);

#endif
