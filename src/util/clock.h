#ifndef OLMOC_CLOCK_H
#define OLMOC_CLOCK_H

/* Monotonic wall-clock time in seconds, for throughput and progress lines. */
double olmo_now_seconds(void);

#include <stddef.h>
/* A duration for progress lines: "4m05s", "1h02m". */
void olmo_format_duration(char *buf, size_t n, double seconds);

#endif
