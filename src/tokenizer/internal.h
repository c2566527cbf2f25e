/* What the tokenizer's files share: the loaded tokenizer, the encoder's
 * scratch space, and the functions one file gives the others.  Not part of
 * the public interface (tokenizer/tokenizer.h). */
#ifndef OLMOC_TOKENIZER_INTERNAL_H
#define OLMOC_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <cjson/cJSON.h>
#include <pcre2.h>
#include <stdbool.h>

#include "tokenizer/hashmap.h"
#include "tokenizer/tokenizer.h"

#define MAX_STEPS 8

enum split_behavior { B_REMOVED, B_ISOLATED, B_MERGED_PREV, B_MERGED_NEXT, B_CONTIGUOUS };

struct pt_step {
    bool byte_level, add_prefix_space;
    pcre2_code *re; /* NULL: no splitting at this step */
    bool jit;
    enum split_behavior behavior;
    bool invert;
};

struct added_token {
    uint8_t *content;
    size_t len;
    uint32_t id;
    bool special, lstrip, rstrip, single_word;
};

struct olmo_tokenizer {
    char path[512];
    uint32_t vocab_size;
    char **id_token;      /* content per id (NULL: no token) */
    uint32_t *dec_off;    /* decode bytes per id, in dec_arena */
    uint32_t *dec_len;
    uint8_t *dec_arena;
    bool *is_special;
    struct olmo_strmap by_content; /* model vocabulary: spelling -> id */
    struct olmo_strmap by_bytes;   /* model vocabulary: raw bytes -> id (byte-level tokens only) */
    int32_t byte_id[256];
    struct olmo_pairmap merges;
    int32_t unk_id;
    bool fuse_unk, ignore_merges;
    struct added_token *added; /* sorted by first byte, then longest first */
    size_t n_added, max_added_len;
    size_t added_first[256], added_count[256]; /* index range per first byte */
    bool any_lstrip, any_single_word;
    pcre2_code *word_re; /* [\p{Alphabetic}\p{N}_], for single_word tokens */
    struct pt_step steps[MAX_STEPS];
    int n_steps;
    bool has_decoder;
};

struct elem {
    size_t s, e;
    bool m;
};

struct vec {
    void *p;
    size_t n, cap;
};

struct cache_slot {
    uint64_t hash; /* 0 = empty */
    uint32_t key_off, val_off;
    uint16_t key_len, n_ids;
};

#define CACHE_SLOTS (1u << 16)
#define CACHE_MAX_KEY 255

struct heap_entry {
    uint32_t rank, pos, merged;
};

struct olmo_encoder {
    const struct olmo_tokenizer *t;
    pcre2_match_data *md[MAX_STEPS], *word_md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit_stack;
    struct vec elems[MAX_STEPS], pieces[MAX_STEPS], prefixed[MAX_STEPS];
    struct vec fixed;
    /* BPE scratch */
    struct vec sym, prev, next, heap;
    /* word cache */
    struct cache_slot *cache;
    size_t cache_n;
    struct vec cache_keys, cache_vals;
};

/* load.c */
bool olmo_tok_json_bool(const cJSON *obj, const char *key, bool def);

/* pretokenizer.c: one pre_tokenizer object (Sequence, Split, ByteLevel) ->
 * t->steps; splitting a piece of text with step d. */
int olmo_tok_add_step(struct olmo_tokenizer *t, const cJSON *pt);
int olmo_tok_split_step(struct olmo_encoder *e, int d, const uint8_t *p, size_t len, bool partial,
                        struct olmo_ids *out, size_t *consumed);

/* encode.c */
int olmo_tok_vec_reserve(struct vec *v, size_t n, size_t elem);
/* Pre-tokenizer step d (and the following ones) on one piece, then BPE. */
int olmo_tok_process(struct olmo_encoder *e, int d, const uint8_t *p, size_t len, bool partial, bool skip_prefix,
                     struct olmo_ids *out, size_t *consumed);

/* bpe.c */
int olmo_tok_bpe_word(struct olmo_encoder *e, const uint8_t *p, size_t n, struct olmo_ids *out);
void olmo_tok_cache_clear(struct olmo_encoder *e);

#endif
