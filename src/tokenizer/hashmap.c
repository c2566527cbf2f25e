#include "tokenizer/hashmap.h"

#include <stdlib.h>
#include <string.h>

#include "util/error.h"

uint64_t olmo_hash_bytes(const uint8_t *p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (n * 0xff51afd7ed558ccdULL);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xbf58476d1ce4e5b9ULL;
        h ^= h >> 31;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    h = (h ^ w) * 0x94d049bb133111ebULL;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ULL;
    return h ^ (h >> 32);
}

uint64_t olmo_hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}

void olmo_strmap_free(struct olmo_strmap *m) {
    free(m->slots);
    free(m->arena);
    memset(m, 0, sizeof *m);
}

int olmo_strmap_init(struct olmo_strmap *m, size_t expected) {
    memset(m, 0, sizeof *m);
    m->cap = 64;
    while (m->cap < expected * 2) m->cap <<= 1;
    m->slots = olmo_calloc(m->cap, sizeof *m->slots, "token map");
    return m->slots ? 0 : -1;
}

/* 0 marks an empty slot */
static uint64_t strmap_hash(const void *key, size_t len) {
    uint64_t h = olmo_hash_bytes(key, len);
    return h ? h : 1;
}

int32_t olmo_strmap_get(const struct olmo_strmap *m, const void *key, size_t len) {
    uint64_t h = strmap_hash(key, len);
    size_t mask = m->cap - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        const struct olmo_strmap_entry *e = &m->slots[i];
        if (!e->hash) return -1;
        if (e->hash == h && e->len == len && !memcmp(m->arena + e->off, key, len)) return e->val;
    }
}

int olmo_strmap_put(struct olmo_strmap *m, const void *key, size_t len, int32_t val) {
    if ((m->n + 1) * 2 > m->cap) {
        struct olmo_strmap bigger = *m;
        bigger.cap = m->cap * 2;
        bigger.slots = olmo_calloc(bigger.cap, sizeof *bigger.slots, "token map");
        if (!bigger.slots) return -1;
        for (size_t i = 0; i < m->cap; i++) {
            if (!m->slots[i].hash) continue;
            size_t j = m->slots[i].hash & (bigger.cap - 1);
            while (bigger.slots[j].hash) j = (j + 1) & (bigger.cap - 1);
            bigger.slots[j] = m->slots[i];
        }
        free(m->slots);
        m->slots = bigger.slots;
        m->cap = bigger.cap;
    }
    uint64_t h = strmap_hash(key, len);
    size_t mask = m->cap - 1;
    size_t i = h & mask;
    for (;; i = (i + 1) & mask) {
        struct olmo_strmap_entry *e = &m->slots[i];
        if (!e->hash) break;
        if (e->hash == h && e->len == len && !memcmp(m->arena + e->off, key, len)) {
            e->val = val;
            return 0;
        }
    }
    /* the arena exists once anything is stored, so that an empty key ("") never copies to or compares
     * against a null pointer */
    if (!m->arena || m->alen + len > m->acap) {
        size_t nc = m->acap ? m->acap * 2 : 4096;
        while (nc < m->alen + len) nc *= 2;
        uint8_t *na = realloc(m->arena, nc);
        if (!na) return olmo_error("out of memory in token map");
        m->arena = na;
        m->acap = nc;
    }
    memcpy(m->arena + m->alen, key, len);
    m->slots[i] = (struct olmo_strmap_entry){h, m->alen, (uint32_t)len, val};
    m->alen += len;
    m->n++;
    return 0;
}

int olmo_pairmap_init(struct olmo_pairmap *m, size_t n) {
    m->cap = 16;
    while (m->cap < 2 * n + 2) m->cap <<= 1;
    m->keys = olmo_malloc(m->cap * sizeof(uint64_t), "merges");
    m->rank = olmo_malloc(m->cap * sizeof(uint32_t), "merges");
    m->merged = olmo_malloc(m->cap * sizeof(uint32_t), "merges");
    if (!m->keys || !m->rank || !m->merged) return -1;
    for (size_t i = 0; i < m->cap; i++) m->keys[i] = OLMO_PAIR_EMPTY;
    return 0;
}

void olmo_pairmap_free(struct olmo_pairmap *m) {
    free(m->keys);
    free(m->rank);
    free(m->merged);
    memset(m, 0, sizeof *m);
}

void olmo_pairmap_add(struct olmo_pairmap *m, uint32_t a, uint32_t b, uint32_t rank, uint32_t merged) {
    uint64_t k = (uint64_t)a << 32 | b;
    size_t mask = m->cap - 1, j = olmo_hash_u64(k) & mask;
    while (m->keys[j] != OLMO_PAIR_EMPTY && m->keys[j] != k) j = (j + 1) & mask;
    if (m->keys[j] == OLMO_PAIR_EMPTY) {
        m->keys[j] = k;
        m->rank[j] = rank;
        m->merged[j] = merged;
    }
}
