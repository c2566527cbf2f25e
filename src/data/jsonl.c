#include "data/jsonl.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util/utf8.h"

#define MAX_DEPTH 512

struct parser {
    const unsigned char *p;
    size_t n, i;
    const char *err;
    size_t err_off;
    int depth;
    size_t n_replaced;
};

static int fail(struct parser *ps, const char *msg) {
    if (!ps->err) {
        ps->err = msg;
        ps->err_off = ps->i;
    }
    return -1;
}

static void skip_ws(struct parser *ps) {
    while (ps->i < ps->n) {
        unsigned char c = ps->p[ps->i];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        ps->i++;
    }
}

static bool reserve(struct olmo_json_text *t, size_t need) {
    if (need <= t->cap) return true;
    size_t nc = t->cap ? t->cap : 256;
    while (nc < need) nc *= 2;
    char *nb = realloc(t->buf, nc);
    if (!nb) return false;
    t->buf = nb;
    t->cap = nc;
    return true;
}

static void put_utf8(struct olmo_json_text *t, uint32_t cp) {
    t->len += olmo_utf8_encode(cp, (uint8_t *)t->buf + t->len);
}

static int hex4(struct parser *ps, uint32_t *v) {
    if (ps->i + 4 > ps->n) return fail(ps, "truncated \\u escape");
    uint32_t x = 0;
    for (int k = 0; k < 4; k++) {
        unsigned char c = ps->p[ps->i + (size_t)k];
        x <<= 4;
        if (c >= '0' && c <= '9') x |= (uint32_t)(c - '0');
        else if ((c | 32) >= 'a' && (c | 32) <= 'f') x |= (uint32_t)((c | 32) - 'a' + 10);
        else return fail(ps, "bad hex digit in \\u escape");
    }
    ps->i += 4;
    *v = x;
    return 0;
}

/* Parses a string at ps->i (which is '"'); decodes into out when not NULL. */
static int parse_string(struct parser *ps, struct olmo_json_text *out) {
    ps->i++; /* opening quote */
    if (out) {
        out->len = 0;
        /* decoded text is never longer than the raw text */
        if (!reserve(out, ps->n - ps->i + 4)) return fail(ps, "out of memory");
    }
    for (;;) {
        size_t start = ps->i;
        while (ps->i < ps->n) {
            unsigned char c = ps->p[ps->i];
            if (c == '"' || c == '\\' || c < 0x20) break;
            ps->i++;
        }
        if (out) {
            memcpy(out->buf + out->len, ps->p + start, ps->i - start);
            out->len += ps->i - start;
        }
        if (ps->i >= ps->n) return fail(ps, "unterminated string");
        unsigned char c = ps->p[ps->i];
        if (c == '"') {
            ps->i++;
            return 0;
        }
        if (c < 0x20) return fail(ps, "control character in string");
        /* escape */
        ps->i++;
        if (ps->i >= ps->n) return fail(ps, "unterminated string");
        unsigned char e = ps->p[ps->i++];
        char lit;
        switch (e) {
        case '"': lit = '"'; break;
        case '\\': lit = '\\'; break;
        case '/': lit = '/'; break;
        case 'b': lit = '\b'; break;
        case 'f': lit = '\f'; break;
        case 'n': lit = '\n'; break;
        case 'r': lit = '\r'; break;
        case 't': lit = '\t'; break;
        case 'u': {
            uint32_t cp;
            if (hex4(ps, &cp)) return -1;
            if (cp >= 0xD800 && cp <= 0xDBFF && ps->i + 6 <= ps->n && ps->p[ps->i] == '\\' &&
                ps->p[ps->i + 1] == 'u') {
                size_t save = ps->i;
                ps->i += 2;
                uint32_t lo;
                if (hex4(ps, &lo)) return -1;
                if (lo >= 0xDC00 && lo <= 0xDFFF) cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                else ps->i = save; /* lone high surrogate; the next escape stands alone */
            }
            if (cp >= 0xD800 && cp <= 0xDFFF) { /* lone surrogate: not encodable in UTF-8 */
                cp = 0xFFFD;
                ps->n_replaced++;
            }
            if (out) put_utf8(out, cp);
            continue;
        }
        default:
            ps->i--;
            return fail(ps, "invalid escape in string");
        }
        if (out) out->buf[out->len++] = lit;
    }
}

static int parse_value(struct parser *ps);

static int parse_number(struct parser *ps) {
    size_t i = ps->i;
    const unsigned char *p = ps->p;
    if (i < ps->n && p[i] == '-') i++;
    if (i >= ps->n) return fail(ps, "bad number");
    if (p[i] == '0') {
        i++;
    } else if (p[i] >= '1' && p[i] <= '9') {
        while (i < ps->n && p[i] >= '0' && p[i] <= '9') i++;
    } else {
        return fail(ps, "unexpected character");
    }
    if (i < ps->n && p[i] == '.') {
        i++;
        if (i >= ps->n || p[i] < '0' || p[i] > '9') {
            ps->i = i;
            return fail(ps, "bad number");
        }
        while (i < ps->n && p[i] >= '0' && p[i] <= '9') i++;
    }
    if (i < ps->n && (p[i] == 'e' || p[i] == 'E')) {
        i++;
        if (i < ps->n && (p[i] == '+' || p[i] == '-')) i++;
        if (i >= ps->n || p[i] < '0' || p[i] > '9') {
            ps->i = i;
            return fail(ps, "bad number");
        }
        while (i < ps->n && p[i] >= '0' && p[i] <= '9') i++;
    }
    ps->i = i;
    return 0;
}

static int parse_literal(struct parser *ps, const char *lit) {
    size_t n = strlen(lit);
    if (ps->i + n > ps->n || memcmp(ps->p + ps->i, lit, n)) return fail(ps, "unexpected character");
    ps->i += n;
    return 0;
}

static int parse_container(struct parser *ps, bool object) {
    if (++ps->depth > MAX_DEPTH) return fail(ps, "nesting too deep");
    ps->i++;
    skip_ws(ps);
    char close = object ? '}' : ']';
    if (ps->i < ps->n && ps->p[ps->i] == (unsigned char)close) {
        ps->i++;
        ps->depth--;
        return 0;
    }
    for (;;) {
        if (object) {
            if (ps->i >= ps->n || ps->p[ps->i] != '"') return fail(ps, "expected a string key");
            if (parse_string(ps, NULL)) return -1;
            skip_ws(ps);
            if (ps->i >= ps->n || ps->p[ps->i] != ':') return fail(ps, "expected ':'");
            ps->i++;
            skip_ws(ps);
        }
        if (parse_value(ps)) return -1;
        skip_ws(ps);
        if (ps->i >= ps->n) return fail(ps, object ? "unterminated object" : "unterminated array");
        if (ps->p[ps->i] == ',') {
            ps->i++;
            skip_ws(ps);
            continue;
        }
        if (ps->p[ps->i] == (unsigned char)close) {
            ps->i++;
            ps->depth--;
            return 0;
        }
        return fail(ps, object ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static int parse_value(struct parser *ps) {
    if (ps->i >= ps->n) return fail(ps, "unexpected end of line");
    switch (ps->p[ps->i]) {
    case '"': return parse_string(ps, NULL);
    case '{': return parse_container(ps, true);
    case '[': return parse_container(ps, false);
    case 't': return parse_literal(ps, "true");
    case 'f': return parse_literal(ps, "false");
    case 'n': return parse_literal(ps, "null");
    default: return parse_number(ps);
    }
}

int olmo_json_get_string(const char *line, size_t len, const char *key, struct olmo_json_text *out, size_t *err_off,
                         const char **err) {
    struct parser ps = {(const unsigned char *)line, len, 0, NULL, 0, 0, 0};
    struct olmo_json_text keybuf = {0};
    size_t key_len = strlen(key);
    bool found = false, wrong_type = false;
    out->len = 0;
    out->n_replaced = 0;
    skip_ws(&ps);
    if (ps.i >= ps.n || ps.p[ps.i] != '{') {
        fail(&ps, ps.i >= ps.n ? "empty line" : "a JSONL line must be an object");
        goto malformed;
    }
    ps.i++;
    ps.depth = 1;
    skip_ws(&ps);
    if (ps.i < ps.n && ps.p[ps.i] == '}') {
        ps.i++;
    } else {
        for (;;) {
            if (ps.i >= ps.n || ps.p[ps.i] != '"') {
                fail(&ps, "expected a string key");
                goto malformed;
            }
            size_t rep0 = ps.n_replaced;
            if (parse_string(&ps, &keybuf)) goto malformed;
            ps.n_replaced = rep0; /* replacements in keys do not matter */
            skip_ws(&ps);
            if (ps.i >= ps.n || ps.p[ps.i] != ':') {
                fail(&ps, "expected ':'");
                goto malformed;
            }
            ps.i++;
            skip_ws(&ps);
            bool match = keybuf.len == key_len && !memcmp(keybuf.buf, key, key_len);
            if (match && ps.i < ps.n && ps.p[ps.i] == '"') {
                ps.n_replaced = 0;
                if (parse_string(&ps, out)) goto malformed;
                out->n_replaced = ps.n_replaced;
                found = true;
                wrong_type = false;
            } else {
                if (parse_value(&ps)) goto malformed;
                if (match) {
                    found = false;
                    wrong_type = true;
                }
            }
            skip_ws(&ps);
            if (ps.i >= ps.n) {
                fail(&ps, "unterminated object");
                goto malformed;
            }
            if (ps.p[ps.i] == ',') {
                ps.i++;
                skip_ws(&ps);
                continue;
            }
            if (ps.p[ps.i] == '}') {
                ps.i++;
                break;
            }
            fail(&ps, "expected ',' or '}'");
            goto malformed;
        }
    }
    skip_ws(&ps);
    if (ps.i != ps.n) {
        fail(&ps, "extra characters after the object");
        goto malformed;
    }
    olmo_json_text_free(&keybuf);
    if (!found) {
        *err = wrong_type ? "the field is not a string" : "no such field";
        *err_off = 0;
        return OLMO_JSON_NO_KEY;
    }
    return OLMO_JSON_OK;
malformed:
    olmo_json_text_free(&keybuf);
    *err = ps.err ? ps.err : "malformed JSON";
    *err_off = ps.err_off;
    return OLMO_JSON_MALFORMED;
}

void olmo_json_text_free(struct olmo_json_text *t) {
    free(t->buf);
    t->buf = NULL;
    t->len = t->cap = 0;
}
