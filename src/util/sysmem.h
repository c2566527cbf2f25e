/* How much memory this process may use: the machine's physical memory, or
 * less where a resource limit (ulimit -v / -d) says so.  Host-memory backends
 * check a model's needs against it before allocating, so a config that cannot
 * fit is refused with a message instead of being killed when the pages are
 * touched (Linux overcommits: a large calloc succeeds and the OOM killer ends
 * the process later). */
#ifndef OLMOC_SYSMEM_H
#define OLMOC_SYSMEM_H

#include <stddef.h>

/* Bytes; SIZE_MAX when unknown. */
size_t olmo_memory_limit(void);
/* "N.N GiB" into buf. */
const char *olmo_format_gib(char *buf, size_t n, double bytes);

#endif
