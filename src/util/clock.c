#include "util/clock.h"

#include <stdio.h>
#include <time.h>

double olmo_now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void olmo_format_duration(char *buf, size_t n, double seconds) {
    const long t = seconds > 0 ? (long)(seconds + 0.5) : 0;
    if (t >= 3600) snprintf(buf, n, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
}
