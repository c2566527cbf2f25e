#ifndef OLMOC_CLOCK_H
#define OLMOC_CLOCK_H

/* Monotonic wall-clock time in seconds, for throughput and progress lines. */
double olmo_now_seconds(void);

#endif
