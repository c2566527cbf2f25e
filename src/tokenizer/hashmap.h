/* Hash maps of the tokenizer: byte string -> int32 (the vocabulary) and
 * (left id, right id) -> (rank, merged id) (the BPE merges). */
#ifndef OLMOC_TOKENIZER_HASHMAP_H
#define OLMOC_TOKENIZER_HASHMAP_H

#include <stddef.h>
#include <stdint.h>

uint64_t olmo_hash_bytes(const uint8_t *p, size_t n);
uint64_t olmo_hash_u64(uint64_t x);

/* Byte string -> int32, open addressing; keys live in an arena. */
struct olmo_strmap {
    struct olmo_strmap_entry {
        uint64_t hash;
        size_t off;
        uint32_t len;
        int32_t val;
    } *slots;
    size_t cap, n;
    uint8_t *arena;
    size_t alen, acap;
};

int olmo_strmap_init(struct olmo_strmap *m, size_t expected);
void olmo_strmap_free(struct olmo_strmap *m);
/* The value of key, -1 when absent. */
int32_t olmo_strmap_get(const struct olmo_strmap *m, const void *key, size_t len);
/* Inserts or overwrites. */
int olmo_strmap_put(struct olmo_strmap *m, const void *key, size_t len, int32_t val);

/* (left id, right id) -> (rank, merged id). */
struct olmo_pairmap {
    uint64_t *keys; /* UINT64_MAX = empty */
    uint32_t *rank, *merged;
    size_t cap;
};

#define OLMO_PAIR_EMPTY UINT64_MAX

static inline int olmo_pairmap_get(const struct olmo_pairmap *m, uint32_t a, uint32_t b, uint32_t *rank, uint32_t *merged) {
    uint64_t k = (uint64_t)a << 32 | b;
    size_t mask = m->cap - 1;
    for (size_t i = olmo_hash_u64(k) & mask;; i = (i + 1) & mask) {
        if (m->keys[i] == k) {
            *rank = m->rank[i];
            *merged = m->merged[i];
            return 1;
        }
        if (m->keys[i] == OLMO_PAIR_EMPTY) return 0;
    }
}


/* Room for n pairs (all empty). */
int olmo_pairmap_init(struct olmo_pairmap *m, size_t n);
void olmo_pairmap_free(struct olmo_pairmap *m);
/* Adds (a, b) unless present: the first occurrence of a pair wins, as in tokenizers. */
void olmo_pairmap_add(struct olmo_pairmap *m, uint32_t a, uint32_t b, uint32_t rank, uint32_t merged);

#endif
