/* BPE merging of one pre-token, as tokenizers' Word::merge_all, with a
 * per-encoder cache of recent words. */
#include <string.h>

#include "tokenizer/internal.h"

void olmo_tok_cache_clear(struct olmo_encoder *e) {
    memset(e->cache, 0, CACHE_SLOTS * sizeof *e->cache);
    e->cache_n = 0;
    e->cache_keys.n = 0;
    e->cache_vals.n = 0;
}

static void heap_push(struct heap_entry *h, size_t *n, struct heap_entry x) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p].rank < x.rank || (h[p].rank == x.rank && h[p].pos < x.pos)) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = x;
}

static struct heap_entry heap_pop(struct heap_entry *h, size_t *n) {
    struct heap_entry top = h[0], x = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && (h[c + 1].rank < h[c].rank || (h[c + 1].rank == h[c].rank && h[c + 1].pos < h[c].pos)))
            c++;
        if (x.rank < h[c].rank || (x.rank == h[c].rank && x.pos < h[c].pos)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = x;
    return top;
}

/* BPE of one pre-token (raw bytes), exactly as tokenizers' Word::merge_all:
 * repeatedly apply the lowest-ranked merge, leftmost first. */
static int bpe_one(struct olmo_encoder *e, const uint8_t *p, size_t n, struct olmo_ids *out) {
    const struct olmo_tokenizer *t = e->t;
    if (n == 1 && t->byte_id[p[0]] >= 0) return olmo_ids_push(out, (uint32_t)t->byte_id[p[0]]);
    if (t->ignore_merges) {
        int32_t id = olmo_strmap_get(&t->by_bytes, p, n);
        if (id >= 0) return olmo_ids_push(out, (uint32_t)id);
    }
    uint64_t h = 0;
    size_t slot = 0;
    if (n <= CACHE_MAX_KEY) {
        h = olmo_hash_bytes(p, n) | 1;
        for (slot = h & (CACHE_SLOTS - 1);; slot = (slot + 1) & (CACHE_SLOTS - 1)) {
            const struct cache_slot *c = &e->cache[slot];
            if (!c->hash) break;
            if (c->hash == h && c->key_len == n && !memcmp((uint8_t *)e->cache_keys.p + c->key_off, p, n)) {
                const uint32_t *ids = (const uint32_t *)e->cache_vals.p + c->val_off;
                for (uint16_t i = 0; i < c->n_ids; i++)
                    if (olmo_ids_push(out, ids[i])) return -1;
                return 0;
            }
        }
    }
    if (olmo_tok_vec_reserve(&e->sym, n, sizeof(uint32_t)) || olmo_tok_vec_reserve(&e->prev, n, sizeof(int32_t)) ||
        olmo_tok_vec_reserve(&e->next, n, sizeof(int32_t)) || olmo_tok_vec_reserve(&e->heap, 2 * n + 2, sizeof(struct heap_entry)))
        return -1;
    uint32_t *sym = e->sym.p;
    int32_t *prev = e->prev.p, *next = e->next.p;
    struct heap_entry *heap = e->heap.p;
    /* initial symbols: one per byte; missing bytes become unk (fused when
     * fuse_unk) or are dropped when the model has no unk token */
    size_t m = 0;
    bool last_unk = false;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[p[i]];
        if (id >= 0) {
            sym[m++] = (uint32_t)id;
            last_unk = false;
        } else if (t->unk_id >= 0) {
            if (!(t->fuse_unk && last_unk)) sym[m++] = (uint32_t)t->unk_id;
            last_unk = true;
        }
    }
    for (size_t i = 0; i < m; i++) {
        prev[i] = (int32_t)i - 1;
        next[i] = i + 1 < m ? (int32_t)i + 1 : -1;
    }
    size_t hn = 0;
    for (size_t i = 0; i + 1 < m; i++) {
        uint32_t r, mg;
        if (olmo_pairmap_get(&t->merges, sym[i], sym[i + 1], &r, &mg))
            heap_push(heap, &hn, (struct heap_entry){r, (uint32_t)i, mg});
    }
    const uint32_t REMOVED = UINT32_MAX;
    while (hn) {
        struct heap_entry top = heap_pop(heap, &hn);
        uint32_t pos = top.pos;
        if (sym[pos] == REMOVED || next[pos] < 0) continue;
        uint32_t nx = (uint32_t)next[pos];
        uint32_t r, mg;
        if (!olmo_pairmap_get(&t->merges, sym[pos], sym[nx], &r, &mg) || mg != top.merged) continue;
        sym[pos] = top.merged;
        sym[nx] = REMOVED;
        next[pos] = next[nx];
        if (next[nx] >= 0) prev[next[nx]] = (int32_t)pos;
        if (hn + 2 > e->heap.cap) {
            if (olmo_tok_vec_reserve(&e->heap, hn + 2, sizeof(struct heap_entry))) return -1;
            heap = e->heap.p;
        }
        if (prev[pos] >= 0 && olmo_pairmap_get(&t->merges, sym[prev[pos]], sym[pos], &r, &mg))
            heap_push(heap, &hn, (struct heap_entry){r, (uint32_t)prev[pos], mg});
        if (next[pos] >= 0 && olmo_pairmap_get(&t->merges, sym[pos], sym[next[pos]], &r, &mg))
            heap_push(heap, &hn, (struct heap_entry){r, pos, mg});
    }
    size_t first = out->n;
    for (size_t i = 0; i < m; i++)
        if (sym[i] != REMOVED && olmo_ids_push(out, sym[i])) return -1;
    size_t n_ids = out->n - first;
    if (n <= CACHE_MAX_KEY && n_ids <= UINT16_MAX) {
        if (e->cache_n * 2 >= CACHE_SLOTS || e->cache_keys.n + n > (1u << 24) ||
            e->cache_vals.n + n_ids > (1u << 22)) {
            olmo_tok_cache_clear(e);
            for (slot = h & (CACHE_SLOTS - 1); e->cache[slot].hash; slot = (slot + 1) & (CACHE_SLOTS - 1)) {
            }
        }
        if (olmo_tok_vec_reserve(&e->cache_keys, e->cache_keys.n + n, 1) ||
            olmo_tok_vec_reserve(&e->cache_vals, e->cache_vals.n + n_ids, sizeof(uint32_t)))
            return -1;
        memcpy((uint8_t *)e->cache_keys.p + e->cache_keys.n, p, n);
        /* a word may leave no ids (every byte unknown, no unk_token): then out->ids and the
         * value store may still be NULL, and NULL + 0 is undefined */
        if (n_ids)
            memcpy((uint32_t *)e->cache_vals.p + e->cache_vals.n, out->ids + first, n_ids * sizeof(uint32_t));
        e->cache[slot] = (struct cache_slot){h, (uint32_t)e->cache_keys.n, (uint32_t)e->cache_vals.n, (uint16_t)n,
                                             (uint16_t)n_ids};
        e->cache_keys.n += n;
        e->cache_vals.n += n_ids;
        e->cache_n++;
    }
    return 0;
}

/* BPE of one pre-token.  Its scratch space is ~36 bytes per byte, so a
 * pre-token longer than OLMO_MAX_PRETOKEN_BYTES (one 100 MB "word" took
 * 2.8 GB) is cut into pieces of at most that many bytes, at character
 * starts, each merged on its own.  `tokenizers` merges it whole; the ids
 * differ only for such pre-tokens, which text does not have. */
int olmo_tok_bpe_word(struct olmo_encoder *e, const uint8_t *p, size_t n, struct olmo_ids *out) {
    while (n > OLMO_MAX_PRETOKEN_BYTES) {
        size_t cut = olmo_utf8_char_start(p, OLMO_MAX_PRETOKEN_BYTES, 0);
        if (bpe_one(e, p, cut, out)) return -1;
        p += cut;
        n -= cut;
    }
    return bpe_one(e, p, n, out);
}

