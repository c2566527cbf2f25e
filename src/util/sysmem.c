#include "util/sysmem.h"

#include <stdint.h>
#include <stdio.h>
#include <sys/resource.h>
#include <unistd.h>

size_t olmo_memory_limit(void) {
    size_t limit = SIZE_MAX;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) limit = (size_t)pages * (size_t)page;
    const int resources[] = {RLIMIT_AS, RLIMIT_DATA};
    for (size_t i = 0; i < sizeof resources / sizeof resources[0]; i++) {
        struct rlimit rl;
        if (getrlimit(resources[i], &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < limit)
            limit = (size_t)rl.rlim_cur;
    }
    return limit;
}

const char *olmo_format_gib(char *buf, size_t n, double bytes) {
    snprintf(buf, n, "%.1f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
    return buf;
}
