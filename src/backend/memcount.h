/* A backend instance's memory counters (backend.h: olmo_backend_mem_stats):
 * the bytes of every buffer `alloc` returned and `free` has not yet freed,
 * by pointer, plus the instance's own scratch (grow-only buffers its ops
 * keep between calls), and the most the two have held together.  Used by
 * the CPU and CUDA backends (and so the emulated CUDA one); an instance runs
 * one op at a time, so no locking. */
#ifndef OLMOC_MEMCOUNT_H
#define OLMOC_MEMCOUNT_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct olmo_memcount {
    size_t live, peak, scratch, n_live;
    struct olmo_memcount_slot { void *p; size_t bytes; } *table; /* open addressing; p == NULL: empty */
    size_t cap, used;                                           /* used: slots holding or once holding a pointer */
};

/* p (of `bytes` bytes) was allocated: 0, or -1 with the error set when the table cannot grow (the
 * caller then frees p and fails the allocation). */
int olmo_memcount_add(struct olmo_memcount *c, void *p, size_t bytes);
/* p is about to be freed (a pointer the counter never saw, or NULL: nothing). */
void olmo_memcount_remove(struct olmo_memcount *c, void *p);
/* The instance's scratch went from old_bytes to new_bytes. */
void olmo_memcount_scratch(struct olmo_memcount *c, size_t old_bytes, size_t new_bytes);
/* Frees the table (the counts stay). */
void olmo_memcount_free(struct olmo_memcount *c);

#ifdef __cplusplus
}
#endif

#endif
