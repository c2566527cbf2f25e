/* Encoding: encoders, added tokens, the pre-tokenizer steps and BPE
 * applied to text (whole or streamed), and decoding ids back to text. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/internal.h"
#include "util/error.h"

int olmo_tok_vec_reserve(struct vec *v, size_t n, size_t elem) {
    if (n <= v->cap) return 0;
    size_t nc = v->cap ? v->cap : 64;
    while (nc < n) nc *= 2;
    void *np = realloc(v->p, nc * elem);
    if (!np) return olmo_error("out of memory in the encoder");
    v->p = np;
    v->cap = nc;
    return 0;
}

/* Unicode White_Space (Rust char::is_whitespace). */
static bool is_ws_cp(uint32_t c) {
    return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

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

/* Pre-tokenizer step d (and the following ones) on one piece; after the
 * last step, BPE.  skip_prefix: ByteLevel must not add its prefix space
 * (a streamed continuation of a segment). */
int olmo_tok_process(struct olmo_encoder *e, int d, const uint8_t *p, size_t len, bool partial, bool skip_prefix,
                     struct olmo_ids *out, size_t *consumed) {
    const struct olmo_tokenizer *t = e->t;
    if (d == t->n_steps) {
        if (consumed) *consumed = len;
        return len ? olmo_tok_bpe_word(e, p, len, out) : 0;
    }
    const struct pt_step *st = &t->steps[d];
    size_t prefix = 0;
    if (st->byte_level && st->add_prefix_space && !skip_prefix && len > 0 && p[0] != ' ') {
        struct vec *b = &e->prefixed[d];
        if (olmo_tok_vec_reserve(b, len + 1, 1)) return -1;
        ((uint8_t *)b->p)[0] = ' ';
        memcpy((uint8_t *)b->p + 1, p, len);
        p = b->p;
        len++;
        prefix = 1;
    }
    size_t n0 = out->n, c = len;
    int rc = st->re ? olmo_tok_split_step(e, d, p, len, partial, out, &c)
                    : olmo_tok_process(e, d + 1, p, len, partial, skip_prefix, out, &c);
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
        size_t j = olmo_utf8_char_start(p, i - 1, floor);
        uint32_t cp;
        if (!olmo_utf8_decode(p + j, i - j, &cp) || !is_ws_cp(cp)) break;
        i = j;
    }
    return i;
}

static size_t ws_run_after(const uint8_t *p, size_t stop, size_t len) {
    size_t i = stop;
    while (i < len) {
        uint32_t cp;
        size_t n = olmo_utf8_decode(p + i, len - i, &cp);
        if (!n || !is_ws_cp(cp)) break;
        i += n;
    }
    return i;
}

/* A word character for single_word tokens: Rust char::is_alphanumeric or '_'. */
static bool is_word_cp(struct olmo_encoder *e, uint32_t cp) {
    if (cp < 128) return (cp >= '0' && cp <= '9') || ((cp | 32) >= 'a' && (cp | 32) <= 'z') || cp == '_';
    uint8_t buf[4];
    size_t n = olmo_utf8_encode(cp, buf);
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
        if (olmo_tok_vec_reserve(&e->fixed, 3 * len + 1, 1)) return -1;
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
                size_t j = olmo_utf8_char_start(p, start - 1, 0);
                olmo_utf8_decode(p + j, start - j, &cb);
            }
            if (stop < len) olmo_utf8_decode(p + stop, len - stop, &ca);
            if ((start > 0 && is_word_cp(e, cb)) || (stop < len && is_word_cp(e, ca))) continue;
        }
        size_t s2 = hit->lstrip ? ws_run_before(p, start, 0) : start;
        if (s2 < seg) s2 = seg;
        size_t e2 = hit->rstrip ? ws_run_after(p, stop, len) : stop;
        if (partial && hit->rstrip && e2 == len) {
            limit = s2;
            break;
        }
        if (seg < s2 && olmo_tok_process(e, 0, p + seg, s2 - seg, false, seg == 0 && (flags & OLMO_ENCODE_CONTINUATION),
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
        if (olmo_tok_process(e, 0, p + seg, limit - seg, partial, seg == 0 && (flags & OLMO_ENCODE_CONTINUATION), out,
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

const uint8_t *olmo_tokenizer_token_bytes(const struct olmo_tokenizer *t, uint32_t id, size_t *len) {
    *len = 0;
    if (!t->has_decoder || id >= t->vocab_size || !t->id_token[id]) return NULL;
    *len = t->dec_len[id];
    return t->dec_arena + t->dec_off[id];
}
