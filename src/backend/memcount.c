#include "backend/memcount.h"

#include <stdint.h>
#include <stdlib.h>

#include "util/error.h"

/* A deleted slot keeps this marker, so probes for later pointers carry on past it. */
static char tombstone;
#define TOMB ((void *)&tombstone)

static size_t hash(const void *p, size_t cap) {
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (size_t)x & (cap - 1);
}

static void raise_peak(struct olmo_memcount *c) {
    if (c->live > c->peak) c->peak = c->live;
}

/* Rebuilds the table with room for twice the live pointers (tombstones dropped). */
static int grow(struct olmo_memcount *c) {
    size_t cap = c->cap ? c->cap : 64;
    while (cap < 4 * (c->n_live + 1)) cap *= 2;
    struct olmo_memcount_slot *t = calloc(cap, sizeof *t);
    if (!t) return olmo_error("out of memory for the backend's allocation table (%zu entries)", cap);
    for (size_t i = 0; i < c->cap; i++) {
        void *p = c->table[i].p;
        if (!p || p == TOMB) continue;
        size_t j = hash(p, cap);
        while (t[j].p) j = (j + 1) & (cap - 1);
        t[j] = c->table[i];
    }
    free(c->table);
    c->table = t;
    c->cap = cap;
    c->used = c->n_live;
    return 0;
}

int olmo_memcount_add(struct olmo_memcount *c, void *p, size_t bytes) {
    if (!p) return 0;
    if (2 * (c->used + 1) > c->cap && grow(c)) return -1;
    size_t j = hash(p, c->cap);
    while (c->table[j].p && c->table[j].p != TOMB) j = (j + 1) & (c->cap - 1);
    if (!c->table[j].p) c->used++;
    c->table[j] = (struct olmo_memcount_slot){p, bytes};
    c->n_live++;
    c->live += bytes;
    raise_peak(c);
    return 0;
}

void olmo_memcount_remove(struct olmo_memcount *c, void *p) {
    if (!p || !c->cap) return;
    for (size_t j = hash(p, c->cap); c->table[j].p; j = (j + 1) & (c->cap - 1)) {
        if (c->table[j].p != p) continue;
        c->live -= c->table[j].bytes;
        c->n_live--;
        c->table[j] = (struct olmo_memcount_slot){TOMB, 0};
        return;
    }
}

void olmo_memcount_scratch(struct olmo_memcount *c, size_t old_bytes, size_t new_bytes) {
    c->live = c->live - old_bytes + new_bytes;
    c->scratch = c->scratch - old_bytes + new_bytes;
    raise_peak(c);
}

void olmo_memcount_free(struct olmo_memcount *c) {
    free(c->table);
    c->table = NULL;
    c->cap = c->used = 0;
}
