/* Byte-level BPE (tokenizer.json) — see tokenizer.h for what is supported.
 *
 * Internally everything works on raw bytes: the GPT-2 byte-to-unicode
 * alphabet is undone when the vocabulary is loaded, so a pre-token's bytes
 * go straight into BPE (one initial symbol per byte) without re-encoding. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/tokenizer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <pcre2.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "util/error.h"

#define MAX_STEPS 8

/* ---------------------------------------------------------------- hashing */

static uint64_t hash_bytes(const uint8_t *p, size_t n) {
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

static uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}

/* Byte string -> int32, open addressing; keys live in an arena. */
struct strmap {
    struct strmap_entry {
        uint64_t hash;
        size_t off;
        uint32_t len;
        int32_t val;
    } *slots;
    size_t cap, n;
    uint8_t *arena;
    size_t alen, acap;
};

static void strmap_free(struct strmap *m) {
    free(m->slots);
    free(m->arena);
    memset(m, 0, sizeof *m);
}

static int strmap_init(struct strmap *m, size_t expected) {
    memset(m, 0, sizeof *m);
    m->cap = 64;
    while (m->cap < expected * 2) m->cap <<= 1;
    m->slots = olmo_calloc(m->cap, sizeof *m->slots, "token map");
    return m->slots ? 0 : -1;
}

/* 0 marks an empty slot */
static uint64_t strmap_hash(const void *key, size_t len) {
    uint64_t h = hash_bytes(key, len);
    return h ? h : 1;
}

static int32_t strmap_get(const struct strmap *m, const void *key, size_t len) {
    uint64_t h = strmap_hash(key, len);
    size_t mask = m->cap - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        const struct strmap_entry *e = &m->slots[i];
        if (!e->hash) return -1;
        if (e->hash == h && e->len == len && !memcmp(m->arena + e->off, key, len)) return e->val;
    }
}

/* Inserts or overwrites. */
static int strmap_put(struct strmap *m, const void *key, size_t len, int32_t val) {
    if ((m->n + 1) * 2 > m->cap) {
        struct strmap bigger = *m;
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
        struct strmap_entry *e = &m->slots[i];
        if (!e->hash) break;
        if (e->hash == h && e->len == len && !memcmp(m->arena + e->off, key, len)) {
            e->val = val;
            return 0;
        }
    }
    if (m->alen + len > m->acap) {
        size_t nc = m->acap ? m->acap * 2 : 4096;
        while (nc < m->alen + len) nc *= 2;
        uint8_t *na = realloc(m->arena, nc);
        if (!na) return olmo_error("out of memory in token map");
        m->arena = na;
        m->acap = nc;
    }
    memcpy(m->arena + m->alen, key, len);
    m->slots[i] = (struct strmap_entry){h, m->alen, (uint32_t)len, val};
    m->alen += len;
    m->n++;
    return 0;
}

/* (left id, right id) -> (rank, merged id). */
struct pairmap {
    uint64_t *keys; /* UINT64_MAX = empty */
    uint32_t *rank, *merged;
    size_t cap;
};

static const uint64_t PAIR_EMPTY = UINT64_MAX;

static inline int pairmap_get(const struct pairmap *m, uint32_t a, uint32_t b, uint32_t *rank, uint32_t *merged) {
    uint64_t k = (uint64_t)a << 32 | b;
    size_t mask = m->cap - 1;
    for (size_t i = hash_u64(k) & mask;; i = (i + 1) & mask) {
        if (m->keys[i] == k) {
            *rank = m->rank[i];
            *merged = m->merged[i];
            return 1;
        }
        if (m->keys[i] == PAIR_EMPTY) return 0;
    }
}

/* ------------------------------------------------------------- tokenizer */

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
    struct strmap by_content; /* model vocabulary: spelling -> id */
    struct strmap by_bytes;   /* model vocabulary: raw bytes -> id (byte-level tokens only) */
    int32_t byte_id[256];
    struct pairmap merges;
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

/* GPT-2 byte <-> unicode alphabet. */
static uint32_t byte_to_cp[256];
static int16_t cp_to_byte[324];

static void build_byte_alphabet(void) {
    int n = 0;
    for (int b = 0; b < 256; b++) {
        bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        byte_to_cp[b] = keep ? (uint32_t)b : (uint32_t)(256 + n++);
    }
    for (int i = 0; i < 324; i++) cp_to_byte[i] = -1;
    for (int b = 0; b < 256; b++) cp_to_byte[byte_to_cp[b]] = (int16_t)b;
}

static void init_byte_alphabet(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, build_byte_alphabet);
}

/* Decodes one code point of valid UTF-8; returns its length. */
static size_t utf8_decode(const uint8_t *s, size_t n, uint32_t *cp) {
    uint8_t b = s[0];
    if (b < 0x80 || n < 2) {
        *cp = b;
        return 1;
    }
    if (b < 0xE0) {
        *cp = (uint32_t)(b & 0x1F) << 6 | (s[1] & 0x3F);
        return 2;
    }
    if (b < 0xF0 && n >= 3) {
        *cp = (uint32_t)(b & 0x0F) << 12 | (uint32_t)(s[1] & 0x3F) << 6 | (s[2] & 0x3F);
        return 3;
    }
    if (n >= 4) {
        *cp = (uint32_t)(b & 0x07) << 18 | (uint32_t)(s[1] & 0x3F) << 12 | (uint32_t)(s[2] & 0x3F) << 6 |
              (s[3] & 0x3F);
        return 4;
    }
    *cp = b;
    return 1;
}

static size_t utf8_char_len(uint8_t b) { return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4; }

/* Byte-level spelling -> raw bytes; returns -1 when a character is outside the alphabet. */
static long spelling_to_bytes(const char *s, size_t n, uint8_t *out) {
    size_t i = 0, o = 0;
    while (i < n) {
        uint32_t cp;
        i += utf8_decode((const uint8_t *)s + i, n - i, &cp);
        if (cp >= 324 || cp_to_byte[cp] < 0) return -1;
        out[o++] = (uint8_t)cp_to_byte[cp];
    }
    return (long)o;
}

/* Unicode White_Space (Rust char::is_whitespace). */
static bool is_ws_cp(uint32_t c) {
    return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Rewrites Oniguruma shorthand classes to the Unicode properties they mean
 * there, so PCRE2 agrees with `tokenizers`: PCRE2's \s also matches U+180E
 * (an old Unicode space), Oniguruma's \s is exactly White_Space; \w and \d
 * follow Oniguruma's definitions.  Returns a malloc'ed pattern. */
static char *onig_to_pcre2(const char *pat, size_t len, size_t *out_len) {
    char *out = malloc(len * 24 + 1);
    if (!out) return NULL;
    size_t o = 0;
    bool in_class = false;
    for (size_t i = 0; i < len; i++) {
        char c = pat[i];
        if (c == '\\' && i + 1 < len) {
            char e = pat[i + 1];
            const char *rep = NULL;
            switch (e) {
            case 's': rep = "\\p{White_Space}"; break;
            case 'S': rep = "\\P{White_Space}"; break;
            case 'd': rep = "\\p{Nd}"; break;
            case 'D': rep = "\\P{Nd}"; break;
            case 'w': rep = in_class ? "\\p{L}\\p{M}\\p{N}\\p{Pc}" : "[\\p{L}\\p{M}\\p{N}\\p{Pc}]"; break;
            case 'W': rep = in_class ? NULL : "[^\\p{L}\\p{M}\\p{N}\\p{Pc}]"; break;
            default: break;
            }
            if (rep) {
                size_t n = strlen(rep);
                memcpy(out + o, rep, n);
                o += n;
            } else {
                out[o++] = c;
                out[o++] = e;
            }
            i++;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            out[o++] = c;
            /* a ']' right after '[' or '[^' is a literal */
            if (i + 1 < len && pat[i + 1] == '^') out[o++] = pat[++i];
            if (i + 1 < len && pat[i + 1] == ']') out[o++] = pat[++i];
            continue;
        }
        if (in_class && c == '[' && i + 1 < len && pat[i + 1] == ':') { /* POSIX [:name:] */
            const char *end = strstr(pat + i + 2, ":]");
            if (end && (size_t)(end - pat) < len) {
                size_t n = (size_t)(end - pat) + 2 - i;
                memcpy(out + o, pat + i, n);
                o += n;
                i += n - 1;
                continue;
            }
        }
        if (in_class && c == ']') in_class = false;
        out[o++] = c;
    }
    out[o] = 0;
    *out_len = o;
    return out;
}

static int compile_regex(struct olmo_tokenizer *t, struct pt_step *st, const char *pattern, size_t len,
                         bool literal) {
    int err;
    PCRE2_SIZE erroff;
    char *translated = NULL;
    if (!literal) {
        translated = onig_to_pcre2(pattern, len, &len);
        if (!translated) return olmo_error("out of memory");
        pattern = translated;
    }
    uint32_t opts = literal ? PCRE2_UTF | PCRE2_LITERAL : PCRE2_UTF | PCRE2_UCP;
    st->re = pcre2_compile((PCRE2_SPTR)pattern, len, opts, &err, &erroff, NULL);
    if (!st->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        olmo_error("'%s': pre-tokenizer regex does not compile at offset %zu: %s (pattern %.200s)", t->path,
                   (size_t)erroff, (const char *)msg, pattern);
        free(translated);
        return -1;
    }
    free(translated);
    st->jit = pcre2_jit_compile(st->re, PCRE2_JIT_COMPLETE | PCRE2_JIT_PARTIAL_HARD) == 0;
    return 0;
}

static const char GPT2_PATTERN[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static bool json_bool(const cJSON *obj, const char *key, bool def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (cJSON_IsBool(v)) return cJSON_IsTrue(v);
    return def;
}

static int add_step(struct olmo_tokenizer *t, const cJSON *pt) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(pt, "type");
    if (!cJSON_IsString(type)) return olmo_error("'%s': pre_tokenizer without a \"type\"", t->path);
    if (!strcmp(type->valuestring, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(pt, "pretokenizers");
        if (!cJSON_IsArray(list)) return olmo_error("'%s': Sequence pre_tokenizer without \"pretokenizers\"", t->path);
        const cJSON *it;
        cJSON_ArrayForEach(it, list) if (add_step(t, it)) return -1;
        return 0;
    }
    if (t->n_steps == MAX_STEPS) return olmo_error("'%s': more than %d pre-tokenizers", t->path, MAX_STEPS);
    struct pt_step *st = &t->steps[t->n_steps];
    memset(st, 0, sizeof *st);
    if (!strcmp(type->valuestring, "ByteLevel")) {
        st->byte_level = true;
        st->add_prefix_space = json_bool(pt, "add_prefix_space", true);
        st->behavior = B_ISOLATED;
        if (json_bool(pt, "use_regex", true) && compile_regex(t, st, GPT2_PATTERN, strlen(GPT2_PATTERN), false))
            return -1;
    } else if (!strcmp(type->valuestring, "Split")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(pt, "pattern");
        const cJSON *rx = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
        const cJSON *str = cJSON_GetObjectItemCaseSensitive(pat, "String");
        if (cJSON_IsString(rx)) {
            if (compile_regex(t, st, rx->valuestring, strlen(rx->valuestring), false)) return -1;
        } else if (cJSON_IsString(str)) {
            if (!str->valuestring[0]) return olmo_error("'%s': Split with an empty String pattern", t->path);
            if (compile_regex(t, st, str->valuestring, strlen(str->valuestring), true)) return -1;
        } else {
            return olmo_error("'%s': Split pre_tokenizer needs a \"pattern\" with \"Regex\" or \"String\"", t->path);
        }
        const cJSON *beh = cJSON_GetObjectItemCaseSensitive(pt, "behavior");
        const char *b = cJSON_IsString(beh) ? beh->valuestring : "";
        if (!strcmp(b, "Isolated")) st->behavior = B_ISOLATED;
        else if (!strcmp(b, "Removed")) st->behavior = B_REMOVED;
        else if (!strcmp(b, "MergedWithPrevious")) st->behavior = B_MERGED_PREV;
        else if (!strcmp(b, "MergedWithNext")) st->behavior = B_MERGED_NEXT;
        else if (!strcmp(b, "Contiguous")) st->behavior = B_CONTIGUOUS;
        else return olmo_error("'%s': unknown Split behavior '%s'", t->path, b);
        st->invert = json_bool(pt, "invert", false);
    } else {
        return olmo_error("'%s': pre_tokenizer type '%s' is not supported (only Sequence, Split, ByteLevel)",
                          t->path, type->valuestring);
    }
    t->n_steps++;
    return 0;
}

static char *read_whole_file(const char *path, size_t *len) {
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        olmo_error("cannot open tokenizer '%s': %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fileno(fp), &st)) {
        fclose(fp);
        olmo_error("cannot stat '%s': %s", path, strerror(errno));
        return NULL;
    }
    char *buf = olmo_malloc((size_t)st.st_size + 1, "tokenizer.json");
    if (!buf) {
        fclose(fp);
        return NULL;
    }
    size_t n = fread(buf, 1, (size_t)st.st_size, fp);
    fclose(fp);
    if (n != (size_t)st.st_size) {
        free(buf);
        olmo_error("short read on '%s'", path);
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

/* A token id: a whole number in [0, OLMO_TOKENIZER_MAX_IDS).  Per-id tables
 * are sized by the largest id, so an absurd one (say 2^31 - 2) would cost
 * seconds and gigabytes before anything else is checked: refused here.
 * Returns 0, -1 when v is not an id at all, -2 when it is too large. */
static int json_id(const cJSON *v, uint32_t *id) {
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != (double)(long long)v->valuedouble) return -1;
    if (v->valuedouble >= (double)OLMO_TOKENIZER_MAX_IDS) return -2;
    *id = (uint32_t)v->valuedouble;
    return 0;
}

static int bad_id(const struct olmo_tokenizer *t, const char *what, const cJSON *v, int why) {
    if (why == -2)
        return olmo_error("'%s': %s has id %.0f; token ids must be below %u (olmoc's limit on the vocabulary size)",
                          t->path, what, v->valuedouble, (unsigned)OLMO_TOKENIZER_MAX_IDS);
    return olmo_error("'%s': %s has a bad id (not a whole number >= 0)", t->path, what);
}

static int cmp_added(const void *a, const void *b) {
    const struct added_token *x = a, *y = b;
    if (x->content[0] != y->content[0]) return x->content[0] < y->content[0] ? -1 : 1;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int set_token(struct olmo_tokenizer *t, uint32_t id, const char *content) {
    free(t->id_token[id]);
    t->id_token[id] = strdup(content);
    if (!t->id_token[id]) return olmo_error("out of memory");
    return 0;
}

static int load_model(struct olmo_tokenizer *t, const cJSON *root) {
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *mtype = cJSON_GetObjectItemCaseSensitive(model, "type");
    if (!cJSON_IsObject(model)) return olmo_error("'%s': no \"model\" object", t->path);
    if (mtype && (!cJSON_IsString(mtype) || strcmp(mtype->valuestring, "BPE")))
        return olmo_error("'%s': model type '%s' is not supported (only BPE)", t->path,
                          cJSON_IsString(mtype) ? mtype->valuestring : "?");
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (dropout && !cJSON_IsNull(dropout) && !(cJSON_IsNumber(dropout) && dropout->valuedouble == 0.0))
        return olmo_error("'%s': BPE dropout is not supported", t->path);
    const char *affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(model, affixes[i]);
        if (a && !cJSON_IsNull(a) && !(cJSON_IsString(a) && !a->valuestring[0]))
            return olmo_error("'%s': BPE %s is not supported", t->path, affixes[i]);
    }
    if (json_bool(model, "byte_fallback", false))
        return olmo_error("'%s': BPE byte_fallback is not supported (byte-level BPE does not need it)", t->path);
    t->fuse_unk = json_bool(model, "fuse_unk", false);
    t->ignore_merges = json_bool(model, "ignore_merges", false);

    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    if (!cJSON_IsObject(vocab)) return olmo_error("'%s': model has no \"vocab\" object", t->path);
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    /* vocabulary size: 1 + largest id */
    uint32_t max_id = 0;
    size_t n_vocab = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab) {
        uint32_t id;
        int why = json_id(it, &id);
        if (why) {
            char what[100];
            snprintf(what, sizeof what, "vocab entry '%.60s'", it->string);
            return bad_id(t, what, it, why);
        }
        if (id + 1 > max_id) max_id = id + 1;
        n_vocab++;
    }
    if (cJSON_IsArray(added)) {
        cJSON_ArrayForEach(it, added) {
            uint32_t id;
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(it, "id");
            int why = json_id(v, &id);
            if (why) return bad_id(t, "an added token", v, why);
            if (id + 1 > max_id) max_id = id + 1;
        }
    }
    if (max_id == 0) return olmo_error("'%s': empty vocabulary", t->path);
    t->vocab_size = max_id;
    t->id_token = olmo_calloc(max_id, sizeof(char *), "vocabulary");
    t->is_special = olmo_calloc(max_id, sizeof(bool), "vocabulary");
    if (!t->id_token || !t->is_special) return -1;
    if (strmap_init(&t->by_content, n_vocab) || strmap_init(&t->by_bytes, n_vocab)) return -1;
    for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
    uint8_t *buf = NULL;
    size_t buf_cap = 0;
    cJSON_ArrayForEach(it, vocab) {
        uint32_t id = 0;
        json_id(it, &id);
        size_t n = strlen(it->string);
        if (n + 1 > buf_cap) {
            buf_cap = 2 * (n + 1);
            uint8_t *nb = realloc(buf, buf_cap);
            if (!nb) {
                free(buf);
                return olmo_error("out of memory");
            }
            buf = nb;
        }
        if (set_token(t, id, it->string) || strmap_put(&t->by_content, it->string, n, (int32_t)id)) {
            free(buf);
            return -1;
        }
        long nb = spelling_to_bytes(it->string, n, buf);
        if (nb > 0) {
            if (strmap_put(&t->by_bytes, buf, (size_t)nb, (int32_t)id)) {
                free(buf);
                return -1;
            }
            if (nb == 1) t->byte_id[buf[0]] = (int32_t)id;
        }
    }
    free(buf);

    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
    t->unk_id = -1;
    if (cJSON_IsString(unk)) {
        t->unk_id = strmap_get(&t->by_content, unk->valuestring, strlen(unk->valuestring));
        if (t->unk_id < 0)
            return olmo_error("'%s': unk_token '%s' is not in the vocabulary", t->path, unk->valuestring);
    }

    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    size_t n_merges = cJSON_IsArray(merges) ? (size_t)cJSON_GetArraySize(merges) : 0;
    t->merges.cap = 16;
    while (t->merges.cap < 2 * n_merges + 2) t->merges.cap <<= 1;
    t->merges.keys = olmo_malloc(t->merges.cap * sizeof(uint64_t), "merges");
    t->merges.rank = olmo_malloc(t->merges.cap * sizeof(uint32_t), "merges");
    t->merges.merged = olmo_malloc(t->merges.cap * sizeof(uint32_t), "merges");
    if (!t->merges.keys || !t->merges.rank || !t->merges.merged) return -1;
    for (size_t i = 0; i < t->merges.cap; i++) t->merges.keys[i] = PAIR_EMPTY;
    uint32_t rank = 0;
    char *joined = NULL;
    size_t joined_cap = 0;
    cJSON_ArrayForEach(it, merges) {
        const char *a, *b;
        size_t la, lb;
        char *space = NULL;
        if (cJSON_IsString(it)) {
            space = strchr(it->valuestring, ' ');
            if (!space || strchr(space + 1, ' ')) {
                free(joined);
                return olmo_error("'%s': merge #%u '%.60s' is not two tokens separated by a space", t->path, rank,
                                  it->valuestring);
            }
            a = it->valuestring;
            la = (size_t)(space - a);
            b = space + 1;
            lb = strlen(b);
        } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 && cJSON_IsString(it->child) &&
                   cJSON_IsString(it->child->next)) {
            a = it->child->valuestring;
            b = it->child->next->valuestring;
            la = strlen(a);
            lb = strlen(b);
        } else {
            free(joined);
            return olmo_error("'%s': merge #%u is neither \"a b\" nor [\"a\", \"b\"]", t->path, rank);
        }
        if (la + lb + 1 > joined_cap) {
            joined_cap = 2 * (la + lb + 1);
            char *nj = realloc(joined, joined_cap);
            if (!nj) {
                free(joined);
                return olmo_error("out of memory");
            }
            joined = nj;
        }
        memcpy(joined, a, la);
        memcpy(joined + la, b, lb);
        int32_t ia = strmap_get(&t->by_content, a, la), ib = strmap_get(&t->by_content, b, lb);
        int32_t ij = strmap_get(&t->by_content, joined, la + lb);
        if (ia < 0 || ib < 0 || ij < 0) {
            joined[la + lb] = 0;
            olmo_error("'%s': merge #%u: token '%.60s' is not in the vocabulary", t->path, rank,
                       ia < 0 ? a : ib < 0 ? b : joined);
            free(joined);
            return -1;
        }
        uint64_t k = (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib;
        size_t mask = t->merges.cap - 1, j = hash_u64(k) & mask;
        while (t->merges.keys[j] != PAIR_EMPTY && t->merges.keys[j] != k) j = (j + 1) & mask;
        if (t->merges.keys[j] == PAIR_EMPTY) { /* first occurrence of a pair wins, as in tokenizers */
            t->merges.keys[j] = k;
            t->merges.rank[j] = rank;
            t->merges.merged[j] = (uint32_t)ij;
        }
        rank++;
    }
    free(joined);
    return 0;
}

static int load_added(struct olmo_tokenizer *t, const cJSON *root) {
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (!cJSON_IsArray(added)) return 0;
    size_t n = (size_t)cJSON_GetArraySize(added);
    t->added = olmo_calloc(n, sizeof *t->added, "added tokens");
    if (!t->added) return -1;
    const cJSON *it;
    cJSON_ArrayForEach(it, added) {
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(it, "content");
        uint32_t id = 0;
        json_id(cJSON_GetObjectItemCaseSensitive(it, "id"), &id);
        if (!cJSON_IsString(content) || !content->valuestring[0])
            return olmo_error("'%s': added token %u has no content", t->path, id);
        struct added_token *a = &t->added[t->n_added++];
        a->len = strlen(content->valuestring);
        a->content = (uint8_t *)strdup(content->valuestring);
        if (!a->content) return olmo_error("out of memory");
        a->id = id;
        a->special = json_bool(it, "special", false);
        a->lstrip = json_bool(it, "lstrip", false);
        a->rstrip = json_bool(it, "rstrip", false);
        a->single_word = json_bool(it, "single_word", false);
        if (a->lstrip) t->any_lstrip = true;
        if (a->single_word) t->any_single_word = true;
        if (a->len > t->max_added_len) t->max_added_len = a->len;
        if (set_token(t, id, content->valuestring)) return -1;
        t->is_special[id] = a->special;
    }
    qsort(t->added, t->n_added, sizeof *t->added, cmp_added);
    for (size_t i = t->n_added; i-- > 0;) {
        uint8_t b = t->added[i].content[0];
        t->added_first[b] = i;
        t->added_count[b]++;
    }
    return 0;
}

/* Decode bytes of every token: the ByteLevel decoder maps each character
 * back to its byte, unless a character is outside the alphabet, in which
 * case the token's UTF-8 is used as it is. */
static int build_decode_table(struct olmo_tokenizer *t) {
    size_t total = 0;
    for (uint32_t i = 0; i < t->vocab_size; i++)
        if (t->id_token[i]) total += strlen(t->id_token[i]);
    t->dec_arena = olmo_malloc(total + 1, "decode table");
    t->dec_off = olmo_calloc(t->vocab_size, sizeof(uint32_t), "decode table");
    t->dec_len = olmo_calloc(t->vocab_size, sizeof(uint32_t), "decode table");
    if (!t->dec_arena || !t->dec_off || !t->dec_len) return -1;
    size_t o = 0;
    for (uint32_t i = 0; i < t->vocab_size; i++) {
        const char *s = t->id_token[i];
        if (!s) continue;
        size_t n = strlen(s);
        long nb = spelling_to_bytes(s, n, t->dec_arena + o);
        if (nb < 0) {
            memcpy(t->dec_arena + o, s, n);
            nb = (long)n;
        }
        t->dec_off[i] = (uint32_t)o;
        t->dec_len[i] = (uint32_t)nb;
        o += (size_t)nb;
    }
    return 0;
}

int olmo_tokenizer_load(struct olmo_tokenizer **out, const char *path) {
    init_byte_alphabet();
    *out = NULL;
    size_t len;
    char *text = read_whole_file(path, &len);
    if (!text) return -1;
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!root) {
        const char *where = cJSON_GetErrorPtr();
        size_t off = where && where >= text && where <= text + len ? (size_t)(where - text) : 0;
        free(text);
        return olmo_error("'%s': not valid JSON (error near byte offset %zu)", path, off);
    }
    free(text);
    struct olmo_tokenizer *t = olmo_calloc(1, sizeof *t, "tokenizer");
    if (!t) {
        cJSON_Delete(root);
        return -1;
    }
    snprintf(t->path, sizeof t->path, "%s", path);
    int rc = -1;
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    if (norm && !cJSON_IsNull(norm)) {
        const cJSON *nt = cJSON_GetObjectItemCaseSensitive(norm, "type");
        olmo_error("'%s': normalizer '%s' is not supported (only null)", path,
                   cJSON_IsString(nt) ? nt->valuestring : "?");
        goto done;
    }
    if (load_model(t, root) || load_added(t, root)) goto done;
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    if (pt && !cJSON_IsNull(pt) && add_step(t, pt)) goto done;
    int bl = -1;
    for (int i = 0; i < t->n_steps; i++)
        if (t->steps[i].byte_level) bl = i;
    if (bl != t->n_steps - 1 || bl < 0) {
        olmo_error("'%s': the pre_tokenizer must end with ByteLevel (only byte-level BPE is supported)", path);
        goto done;
    }
    for (int i = 0; i < bl; i++)
        if (t->steps[i].byte_level) {
            olmo_error("'%s': ByteLevel may appear only once, as the last pre_tokenizer", path);
            goto done;
        }
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(dec, "type");
    t->has_decoder = cJSON_IsString(dt) && !strcmp(dt->valuestring, "ByteLevel");
    if (build_decode_table(t)) goto done;
    if (t->any_single_word) {
        int err;
        PCRE2_SIZE eo;
        t->word_re = pcre2_compile((PCRE2_SPTR) "^[\\p{Alphabetic}\\p{N}_]", PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP, &err, &eo, NULL);
        if (!t->word_re) {
            olmo_error("internal: word-character regex does not compile");
            goto done;
        }
    }
    rc = 0;
done:
    cJSON_Delete(root);
    if (rc) {
        olmo_tokenizer_free(t);
        return -1;
    }
    *out = t;
    return 0;
}

void olmo_tokenizer_free(struct olmo_tokenizer *t) {
    if (!t) return;
    if (t->id_token)
        for (uint32_t i = 0; i < t->vocab_size; i++) free(t->id_token[i]);
    free(t->id_token);
    free(t->is_special);
    free(t->dec_arena);
    free(t->dec_off);
    free(t->dec_len);
    strmap_free(&t->by_content);
    strmap_free(&t->by_bytes);
    free(t->merges.keys);
    free(t->merges.rank);
    free(t->merges.merged);
    for (size_t i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t->added);
    for (int i = 0; i < t->n_steps; i++) pcre2_code_free(t->steps[i].re);
    pcre2_code_free(t->word_re);
    free(t);
}

uint32_t olmo_tokenizer_vocab_size(const struct olmo_tokenizer *t) { return t->vocab_size; }

size_t olmo_tokenizer_max_added_len(const struct olmo_tokenizer *t) { return t->max_added_len; }

int64_t olmo_tokenizer_token_to_id(const struct olmo_tokenizer *t, const char *token) {
    size_t n = strlen(token);
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && !memcmp(t->added[i].content, token, n)) return t->added[i].id;
    return strmap_get(&t->by_content, token, n);
}

const char *olmo_tokenizer_id_to_token(const struct olmo_tokenizer *t, uint32_t id) {
    return id < t->vocab_size ? t->id_token[id] : NULL;
}

bool olmo_tokenizer_is_special(const struct olmo_tokenizer *t, uint32_t id) {
    return id < t->vocab_size && t->is_special[id];
}

/* --------------------------------------------------------------- encoder */

struct elem {
    size_t s, e;
    bool m;
};

struct vec {
    void *p;
    size_t n, cap;
};

static int vec_reserve(struct vec *v, size_t n, size_t elem) {
    if (n <= v->cap) return 0;
    size_t nc = v->cap ? v->cap : 64;
    while (nc < n) nc *= 2;
    void *np = realloc(v->p, nc * elem);
    if (!np) return olmo_error("out of memory in the encoder");
    v->p = np;
    v->cap = nc;
    return 0;
}

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

struct olmo_encoder *olmo_encoder_new(const struct olmo_tokenizer *t) {
    struct olmo_encoder *e = olmo_calloc(1, sizeof *e, "encoder");
    if (!e) return NULL;
    e->t = t;
    e->cache = olmo_calloc(CACHE_SLOTS, sizeof *e->cache, "word cache");
    e->mctx = pcre2_match_context_create(NULL);
    e->jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
    if (!e->cache || !e->mctx || !e->jit_stack) goto fail;
    pcre2_jit_stack_assign(e->mctx, NULL, e->jit_stack);
    if (t->word_re && !(e->word_md = pcre2_match_data_create(1, NULL))) goto fail;
    for (int i = 0; i < t->n_steps; i++)
        if (t->steps[i].re && !(e->md[i] = pcre2_match_data_create_from_pattern(t->steps[i].re, NULL))) goto fail;
    return e;
fail:
    olmo_error("out of memory creating an encoder");
    olmo_encoder_free(e);
    return NULL;
}

void olmo_encoder_free(struct olmo_encoder *e) {
    if (!e) return;
    for (int i = 0; i < MAX_STEPS; i++) {
        pcre2_match_data_free(e->md[i]);
        free(e->elems[i].p);
        free(e->pieces[i].p);
        free(e->prefixed[i].p);
    }
    pcre2_match_data_free(e->word_md);
    pcre2_match_context_free(e->mctx);
    pcre2_jit_stack_free(e->jit_stack);
    free(e->fixed.p);
    free(e->sym.p);
    free(e->prev.p);
    free(e->next.p);
    free(e->heap.p);
    free(e->cache);
    free(e->cache_keys.p);
    free(e->cache_vals.p);
    free(e);
}

int olmo_ids_push(struct olmo_ids *v, uint32_t id) {
    if (v->n == v->cap) {
        size_t nc = v->cap ? v->cap * 2 : 1024;
        uint32_t *np = realloc(v->ids, nc * sizeof(uint32_t));
        if (!np) return olmo_error("out of memory for token ids");
        v->ids = np;
        v->cap = nc;
    }
    v->ids[v->n++] = id;
    return 0;
}

void olmo_ids_free(struct olmo_ids *v) {
    free(v->ids);
    memset(v, 0, sizeof *v);
}

static void cache_clear(struct olmo_encoder *e) {
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
        int32_t id = strmap_get(&t->by_bytes, p, n);
        if (id >= 0) return olmo_ids_push(out, (uint32_t)id);
    }
    uint64_t h = 0;
    size_t slot = 0;
    if (n <= CACHE_MAX_KEY) {
        h = hash_bytes(p, n) | 1;
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
    if (vec_reserve(&e->sym, n, sizeof(uint32_t)) || vec_reserve(&e->prev, n, sizeof(int32_t)) ||
        vec_reserve(&e->next, n, sizeof(int32_t)) || vec_reserve(&e->heap, 2 * n + 2, sizeof(struct heap_entry)))
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
        if (pairmap_get(&t->merges, sym[i], sym[i + 1], &r, &mg))
            heap_push(heap, &hn, (struct heap_entry){r, (uint32_t)i, mg});
    }
    const uint32_t REMOVED = UINT32_MAX;
    while (hn) {
        struct heap_entry top = heap_pop(heap, &hn);
        uint32_t pos = top.pos;
        if (sym[pos] == REMOVED || next[pos] < 0) continue;
        uint32_t nx = (uint32_t)next[pos];
        uint32_t r, mg;
        if (!pairmap_get(&t->merges, sym[pos], sym[nx], &r, &mg) || mg != top.merged) continue;
        sym[pos] = top.merged;
        sym[nx] = REMOVED;
        next[pos] = next[nx];
        if (next[nx] >= 0) prev[next[nx]] = (int32_t)pos;
        if (hn + 2 > e->heap.cap) {
            if (vec_reserve(&e->heap, hn + 2, sizeof(struct heap_entry))) return -1;
            heap = e->heap.p;
        }
        if (prev[pos] >= 0 && pairmap_get(&t->merges, sym[prev[pos]], sym[pos], &r, &mg))
            heap_push(heap, &hn, (struct heap_entry){r, (uint32_t)prev[pos], mg});
        if (next[pos] >= 0 && pairmap_get(&t->merges, sym[pos], sym[next[pos]], &r, &mg))
            heap_push(heap, &hn, (struct heap_entry){r, pos, mg});
    }
    size_t first = out->n;
    for (size_t i = 0; i < m; i++)
        if (sym[i] != REMOVED && olmo_ids_push(out, sym[i])) return -1;
    size_t n_ids = out->n - first;
    if (n <= CACHE_MAX_KEY && n_ids <= UINT16_MAX) {
        if (e->cache_n * 2 >= CACHE_SLOTS || e->cache_keys.n + n > (1u << 24) ||
            e->cache_vals.n + n_ids > (1u << 22)) {
            cache_clear(e);
            for (slot = h & (CACHE_SLOTS - 1); e->cache[slot].hash; slot = (slot + 1) & (CACHE_SLOTS - 1)) {
            }
        }
        if (vec_reserve(&e->cache_keys, e->cache_keys.n + n, 1) ||
            vec_reserve(&e->cache_vals, e->cache_vals.n + n_ids, sizeof(uint32_t)))
            return -1;
        memcpy((uint8_t *)e->cache_keys.p + e->cache_keys.n, p, n);
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
static int bpe_word(struct olmo_encoder *e, const uint8_t *p, size_t n, struct olmo_ids *out) {
    while (n > OLMO_MAX_PRETOKEN_BYTES) {
        size_t cut = OLMO_MAX_PRETOKEN_BYTES;
        while (cut > OLMO_MAX_PRETOKEN_BYTES - 4 && (p[cut] & 0xC0) == 0x80) cut--;
        if (bpe_one(e, p, cut, out)) return -1;
        p += cut;
        n -= cut;
    }
    return bpe_one(e, p, n, out);
}

/* Runs step d's regex over p[0, len) and lists the (gap, match) elements
 * covering it, like tokenizers' Pattern::find_matches.  In partial mode it
 * stops where more text could change a match and sets *end to that point. */
static int find_elems(struct olmo_encoder *e, int d, const uint8_t *p, size_t len, bool partial, size_t *end) {
    const struct pt_step *st = &e->t->steps[d];
    struct vec *v = &e->elems[d];
    v->n = 0;
    pcre2_match_data *md = e->md[d];
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    uint32_t opts = PCRE2_NO_UTF_CHECK | (partial ? PCRE2_PARTIAL_HARD : 0);
    size_t off = 0, prev = 0;
    *end = len;
    /* PCRE2's default match limit (10M steps) fails a 16 MB run of spaces
     * (\s*[\r\n] backtracks over it once); allow steps linear in the text. */
    pcre2_set_match_limit(e->mctx, len < 100000000 ? 10000000 + 40 * (uint32_t)len : 0xFFFFFFFFu);
    while (off <= len) {
        int rc = st->jit ? pcre2_jit_match(st->re, p, len, off, opts, md, e->mctx)
                         : pcre2_match(st->re, p, len, off, opts, md, e->mctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc == PCRE2_ERROR_PARTIAL) {
            *end = ov[0];
            break;
        }
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return olmo_error("pre-tokenizer regex failed at byte %zu of a %zu-byte piece of text: %s", off, len,
                              (const char *)msg);
        }
        size_t s = ov[0], en = ov[1];
        if (vec_reserve(v, v->n + 2, sizeof(struct elem))) return -1;
        struct elem *el = v->p;
        if (prev != s) el[v->n++] = (struct elem){prev, s, st->invert};
        el[v->n++] = (struct elem){s, en, !st->invert};
        prev = en;
        if (en == s) {
            if (en >= len) break;
            off = en + utf8_char_len(p[en]);
        } else {
            off = en;
        }
    }
    if (prev < *end) {
        if (vec_reserve(v, v->n + 1, sizeof(struct elem))) return -1;
        ((struct elem *)v->p)[v->n++] = (struct elem){prev, *end, st->invert};
    }
    return 0;
}

static int process(struct olmo_encoder *e, int d, const uint8_t *p, size_t len, bool partial, bool skip_prefix,
                   struct olmo_ids *out, size_t *consumed);

/* Splits p[0, len) with step d's regex and behaviour, then hands every
 * piece to the next step. */
static int split_step(struct olmo_encoder *e, int d, const uint8_t *p, size_t len, bool partial,
                      struct olmo_ids *out, size_t *consumed) {
    const struct pt_step *st = &e->t->steps[d];
    size_t end;
    if (find_elems(e, d, p, len, partial, &end)) return -1;
    struct vec *ev = &e->elems[d];
    struct elem *el = ev->p;
    size_t n = ev->n;
    if (partial) {
        /* Keep only what more text cannot change.  A complete regex match
         * is final (PCRE2 reports a partial match as soon as an attempt
         * reaches the end), a trailing gap is not (it may extend); then an
         * element that a future element could merge with is dropped too. */
        size_t keep = n;
        while (keep > 0 && el[keep - 1].m == st->invert) keep--; /* back to the last regex match */
        if (keep > 0) {
            if ((st->behavior == B_MERGED_PREV && st->invert) || (st->behavior == B_MERGED_NEXT && !st->invert)) {
                keep--;
            } else if (st->behavior == B_CONTIGUOUS) {
                bool flag = el[keep - 1].m;
                while (keep > 0 && el[keep - 1].m == flag) keep--;
            }
        }
        n = keep;
        end = keep ? el[keep - 1].e : 0;
    }
    /* fold the elements into pieces as tokenizers' NormalizedString::split */
    struct vec *pv = &e->pieces[d];
    pv->n = 0;
    if (vec_reserve(pv, n + 1, sizeof(struct elem))) return -1;
    struct elem *pc = pv->p;
    switch (st->behavior) {
    case B_ISOLATED:
        for (size_t i = 0; i < n; i++) pc[pv->n++] = el[i];
        break;
    case B_REMOVED:
        for (size_t i = 0; i < n; i++)
            if (!el[i].m) pc[pv->n++] = el[i];
        break;
    case B_CONTIGUOUS: {
        bool prev_m = false;
        for (size_t i = 0; i < n; i++) {
            if (el[i].m == prev_m && pv->n) pc[pv->n - 1].e = el[i].e;
            else pc[pv->n++] = el[i];
            prev_m = el[i].m;
        }
        break;
    }
    case B_MERGED_PREV: {
        bool prev_m = false;
        for (size_t i = 0; i < n; i++) {
            if (el[i].m && !prev_m && pv->n) pc[pv->n - 1].e = el[i].e;
            else pc[pv->n++] = el[i];
            prev_m = el[i].m;
        }
        break;
    }
    case B_MERGED_NEXT: {
        bool prev_m = false; /* "previous" in reverse order = next element */
        for (size_t i = n; i-- > 0;) {
            if (el[i].m && !prev_m && pv->n) pc[pv->n - 1].s = el[i].s;
            else pc[pv->n++] = el[i];
            prev_m = el[i].m;
        }
        for (size_t i = 0; i < pv->n / 2; i++) {
            struct elem tmp = pc[i];
            pc[i] = pc[pv->n - 1 - i];
            pc[pv->n - 1 - i] = tmp;
        }
        break;
    }
    }
    /* pieces[d] is reused by deeper levels only at other depths, so the
     * array stays valid while we iterate (reload the pointer anyway). */
    for (size_t i = 0; i < pv->n; i++) {
        struct elem piece = ((struct elem *)pv->p)[i];
        if (piece.e <= piece.s) continue;
        if (process(e, d + 1, p + piece.s, piece.e - piece.s, false, false, out, NULL)) return -1;
    }
    if (consumed) *consumed = end;
    return 0;
}

/* Pre-tokenizer step d (and the following ones) on one piece; after the
 * last step, BPE.  skip_prefix: ByteLevel must not add its prefix space
 * (a streamed continuation of a segment). */
static int process(struct olmo_encoder *e, int d, const uint8_t *p, size_t len, bool partial, bool skip_prefix,
                   struct olmo_ids *out, size_t *consumed) {
    const struct olmo_tokenizer *t = e->t;
    if (d == t->n_steps) {
        if (consumed) *consumed = len;
        return len ? bpe_word(e, p, len, out) : 0;
    }
    const struct pt_step *st = &t->steps[d];
    size_t prefix = 0;
    if (st->byte_level && st->add_prefix_space && !skip_prefix && len > 0 && p[0] != ' ') {
        struct vec *b = &e->prefixed[d];
        if (vec_reserve(b, len + 1, 1)) return -1;
        ((uint8_t *)b->p)[0] = ' ';
        memcpy((uint8_t *)b->p + 1, p, len);
        p = b->p;
        len++;
        prefix = 1;
    }
    size_t n0 = out->n, c = len;
    int rc = st->re ? split_step(e, d, p, len, partial, out, &c)
                    : process(e, d + 1, p, len, partial, skip_prefix, out, &c);
    if (rc) return -1;
    if (partial) {
        if (c <= prefix) { /* nothing of the caller's text is final yet */
            out->n = n0;
            c = 0;
        } else {
            c -= prefix;
        }
        *consumed = c;
    }
    return 0;
}

static size_t ws_run_before(const uint8_t *p, size_t start, size_t floor) {
    /* start of the whitespace run that ends at `start` (Unicode White_Space) */
    size_t i = start;
    while (i > floor) {
        size_t j = i - 1;
        while (j > floor && (p[j] & 0xC0) == 0x80) j--;
        uint32_t cp;
        utf8_decode(p + j, i - j, &cp);
        if (!is_ws_cp(cp)) break;
        i = j;
    }
    return i;
}

static size_t ws_run_after(const uint8_t *p, size_t stop, size_t len) {
    size_t i = stop;
    while (i < len) {
        uint32_t cp;
        size_t n = utf8_decode(p + i, len - i, &cp);
        if (!is_ws_cp(cp)) break;
        i += n;
    }
    return i;
}

/* A word character for single_word tokens: Rust char::is_alphanumeric or '_'. */
static bool is_word_cp(struct olmo_encoder *e, uint32_t cp) {
    if (cp < 128) return (cp >= '0' && cp <= '9') || ((cp | 32) >= 'a' && (cp | 32) <= 'z') || cp == '_';
    uint8_t buf[4];
    size_t n;
    if (cp < 0x800) {
        buf[0] = (uint8_t)(0xC0 | cp >> 6);
        buf[1] = (uint8_t)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        buf[0] = (uint8_t)(0xE0 | cp >> 12);
        buf[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        buf[2] = (uint8_t)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        buf[0] = (uint8_t)(0xF0 | cp >> 18);
        buf[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
        buf[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        buf[3] = (uint8_t)(0x80 | (cp & 0x3F));
        n = 4;
    }
    return pcre2_match(e->t->word_re, buf, n, 0, PCRE2_NO_UTF_CHECK, e->word_md, NULL) >= 0;
}

int olmo_encode(struct olmo_encoder *e, const char *text, size_t len, int flags, struct olmo_ids *out,
                size_t *consumed, size_t *n_replaced) {
    const struct olmo_tokenizer *t = e->t;
    const bool partial = flags & OLMO_ENCODE_PARTIAL;
    const bool split_special = flags & OLMO_ENCODE_SPLIT_SPECIAL;
    const uint8_t *p = (const uint8_t *)text;
    if (n_replaced) *n_replaced = 0;
    if (olmo_utf8_valid_prefix(p, len) != len) {
        if (partial) return olmo_error("internal: streamed text must be valid UTF-8");
        if (vec_reserve(&e->fixed, 3 * len + 1, 1)) return -1;
        len = olmo_utf8_sanitize(p, len, e->fixed.p, true, NULL, n_replaced);
        p = e->fixed.p;
    }
    size_t n0 = out->n;
    size_t limit = len;
    if (partial && t->n_added) {
        /* the tail might be the start of an added token: wait for more text */
        size_t from = len > t->max_added_len ? len - t->max_added_len + 1 : 0;
        for (size_t q = from; q < len; q++) {
            uint8_t b = p[q];
            bool pref = false;
            for (size_t k = 0; k < t->added_count[b] && !pref; k++) {
                const struct added_token *a = &t->added[t->added_first[b] + k];
                pref = a->len > len - q && !memcmp(a->content, p + q, len - q);
            }
            if (pref) {
                limit = q;
                break;
            }
        }
        if (t->any_lstrip) limit = ws_run_before(p, limit, 0);
    }
    size_t seg = 0, pos = 0;
    bool have_tok = false;
    size_t tok_start = 0, tok_out = 0; /* where the last added token began, in the text and in out */
    while (pos < limit && t->n_added) {
        /* leftmost-longest added token starting in [pos, limit) */
        size_t i = pos;
        const struct added_token *hit = NULL;
        for (; i < limit && !hit; i++) {
            uint8_t b = p[i];
            for (size_t k = 0; k < t->added_count[b]; k++) {
                const struct added_token *a = &t->added[t->added_first[b] + k];
                if (a->len <= len - i && !memcmp(a->content, p + i, a->len)) {
                    hit = a;
                    break;
                }
            }
        }
        if (!hit) break;
        size_t start = i - 1, stop = start + hit->len;
        pos = stop;
        if (split_special && hit->special) continue;
        if (hit->single_word) {
            if (partial && stop == len) {
                limit = start;
                break;
            }
            uint32_t cb = 0, ca = 0;
            if (start > 0) {
                size_t j = start - 1;
                while (j > 0 && (p[j] & 0xC0) == 0x80) j--;
                utf8_decode(p + j, start - j, &cb);
            }
            if (stop < len) utf8_decode(p + stop, len - stop, &ca);
            if ((start > 0 && is_word_cp(e, cb)) || (stop < len && is_word_cp(e, ca))) continue;
        }
        size_t s2 = hit->lstrip ? ws_run_before(p, start, 0) : start;
        if (s2 < seg) s2 = seg;
        size_t e2 = hit->rstrip ? ws_run_after(p, stop, len) : stop;
        if (partial && hit->rstrip && e2 == len) {
            limit = s2;
            break;
        }
        if (seg < s2 && process(e, 0, p + seg, s2 - seg, false, seg == 0 && (flags & OLMO_ENCODE_CONTINUATION),
                                out, NULL))
            return -1;
        have_tok = true;
        tok_start = s2;
        tok_out = out->n;
        if (olmo_ids_push(out, hit->id)) return -1;
        seg = e2;
    }
    size_t done = len;
    if (seg < limit) {
        size_t c = limit - seg;
        if (process(e, 0, p + seg, limit - seg, partial, seg == 0 && (flags & OLMO_ENCODE_CONTINUATION), out,
                    partial ? &c : NULL))
            return -1;
        done = seg + c;
    } else if (partial) {
        done = seg > limit ? seg : limit;
    }
    if (partial) {
        /* Never stop right after an added token: the text after it starts a
         * new segment (ByteLevel would add its prefix space there), which a
         * continuation call could not tell.  Give the token back instead. */
        if (have_tok && done == seg && done > tok_start) {
            out->n = tok_out;
            done = tok_start;
        }
        if (done == 0) out->n = n0;
        *consumed = done;
    } else if (consumed) {
        *consumed = len;
    }
    return 0;
}

int olmo_decode(const struct olmo_tokenizer *t, const uint32_t *ids, size_t n, bool skip_special, char **out,
                size_t *out_len) {
    *out = NULL;
    if (!t->has_decoder) return olmo_error("'%s': decoding needs a ByteLevel decoder", t->path);
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] >= t->vocab_size || !t->id_token[ids[i]])
            return olmo_error("cannot decode token id %u at position %zu: not in the vocabulary", ids[i], i);
        total += t->dec_len[ids[i]];
    }
    uint8_t *raw = olmo_malloc(total + 1, "decoded text");
    if (!raw) return -1;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (skip_special && t->is_special[ids[i]]) continue;
        memcpy(raw + o, t->dec_arena + t->dec_off[ids[i]], t->dec_len[ids[i]]);
        o += t->dec_len[ids[i]];
    }
    uint8_t *fixed = olmo_malloc(3 * o + 1, "decoded text");
    if (!fixed) {
        free(raw);
        return -1;
    }
    size_t m = olmo_utf8_sanitize(raw, o, fixed, true, NULL, NULL);
    free(raw);
    fixed[m] = 0;
    *out = (char *)fixed;
    if (out_len) *out_len = m;
    return 0;
}
