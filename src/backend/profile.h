/* A backend that forwards every op to another one and times it (wall clock
 * per op, FLOPs of the GEMMs), for `OLMOC_PROFILE=1 olmoc train ...`.
 * Only meaningful for synchronous backends (the CPU one). */
#ifndef OLMOC_BACKEND_PROFILE_H
#define OLMOC_BACKEND_PROFILE_H

#include <stdio.h>

#include "backend/backend.h"

/* Wraps `inner`; one profiled backend per process (its counters are global). */
const struct olmo_backend *olmo_backend_profiled(const struct olmo_backend *inner);
/* Clears the counters (e.g. after warm-up steps). */
void olmo_profile_reset(void);
/* Prints time per op and GEMM throughput since the last reset. */
void olmo_profile_report(FILE *out);

#endif
