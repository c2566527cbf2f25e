/* The pre-tokenizer: Split / ByteLevel steps read from tokenizer.json, their
 * Oniguruma patterns translated for PCRE2, and the splitting of text into
 * pre-tokens as tokenizers' Pattern::find_matches and NormalizedString::split. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/internal.h"
#include "util/error.h"

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

int olmo_tok_add_step(struct olmo_tokenizer *t, const cJSON *pt) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(pt, "type");
    if (!cJSON_IsString(type)) return olmo_error("'%s': pre_tokenizer without a \"type\"", t->path);
    if (!strcmp(type->valuestring, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(pt, "pretokenizers");
        if (!cJSON_IsArray(list)) return olmo_error("'%s': Sequence pre_tokenizer without \"pretokenizers\"", t->path);
        const cJSON *it;
        cJSON_ArrayForEach(it, list) if (olmo_tok_add_step(t, it)) return -1;
        return 0;
    }
    if (t->n_steps == MAX_STEPS) return olmo_error("'%s': more than %d pre-tokenizers", t->path, MAX_STEPS);
    struct pt_step *st = &t->steps[t->n_steps];
    memset(st, 0, sizeof *st);
    if (!strcmp(type->valuestring, "ByteLevel")) {
        st->byte_level = true;
        st->add_prefix_space = olmo_tok_json_bool(pt, "add_prefix_space", true);
        st->behavior = B_ISOLATED;
        if (olmo_tok_json_bool(pt, "use_regex", true) && compile_regex(t, st, GPT2_PATTERN, strlen(GPT2_PATTERN), false))
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
        else {
            /* the step is not counted, so the tokenizer's cleanup would not free its regex */
            olmo_error("'%s': unknown Split behavior '%s'", t->path, b);
            pcre2_code_free(st->re);
            st->re = NULL;
            return -1;
        }
        st->invert = olmo_tok_json_bool(pt, "invert", false);
    } else {
        return olmo_error("'%s': pre_tokenizer type '%s' is not supported (only Sequence, Split, ByteLevel)",
                          t->path, type->valuestring);
    }
    t->n_steps++;
    return 0;
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
        if (olmo_tok_vec_reserve(v, v->n + 2, sizeof(struct elem))) return -1;
        struct elem *el = v->p;
        if (prev != s) el[v->n++] = (struct elem){prev, s, st->invert};
        el[v->n++] = (struct elem){s, en, !st->invert};
        prev = en;
        if (en == s) {
            if (en >= len) break;
            uint32_t cp;
            size_t k = olmo_utf8_decode(p + en, len - en, &cp);
            off = en + (k ? k : 1);
        } else {
            off = en;
        }
    }
    if (prev < *end) {
        if (olmo_tok_vec_reserve(v, v->n + 1, sizeof(struct elem))) return -1;
        ((struct elem *)v->p)[v->n++] = (struct elem){prev, *end, st->invert};
    }
    return 0;
}

/* Splits p[0, len) with step d's regex and behaviour, then hands every
 * piece to the next step. */
int olmo_tok_split_step(struct olmo_encoder *e, int d, const uint8_t *p, size_t len, bool partial,
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
    if (olmo_tok_vec_reserve(pv, n + 1, sizeof(struct elem))) return -1;
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
        if (olmo_tok_process(e, d + 1, p + piece.s, piece.e - piece.s, false, false, out, NULL)) return -1;
    }
    if (consumed) *consumed = end;
    return 0;
}

