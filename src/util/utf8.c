/* UTF-8: the one decoder (with the "maximal subpart" rule of the Unicode
 * standard, chapter 3, U+FFFD substitution, which Python's
 * decode(errors="replace") and Rust's String::from_utf8_lossy both follow),
 * validation, repair and encoding. */
#include "util/utf8.h"

#include <string.h>

/* Length of the well-formed sequence starting at s[0] (1..4), or 0 when
 * s[0..] is not well formed; *sub gets the length of the maximal subpart
 * (>= 1) in that case.  *incomplete is set when the sequence is a valid
 * prefix cut short by the end of the buffer. */
static size_t utf8_seq(const uint8_t *s, size_t avail, size_t *sub, int *incomplete) {
    uint8_t b = s[0];
    *incomplete = 0;
    if (b < 0x80) return 1;
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (b >= 0xC2 && b <= 0xDF) {
        need = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
        need = 3;
        if (b == 0xE0) lo = 0xA0;
        if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
        need = 4;
        if (b == 0xF0) lo = 0x90;
        if (b == 0xF4) hi = 0x8F;
    } else {
        *sub = 1;
        return 0;
    }
    size_t i = 1;
    for (; i < need; i++) {
        if (i >= avail) {
            *incomplete = 1;
            *sub = i;
            return 0;
        }
        uint8_t c = s[i];
        uint8_t l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
        if (c < l || c > h) break;
    }
    if (i == need) return need;
    *sub = i;
    return 0;
}

size_t olmo_utf8_decode(const uint8_t *s, size_t n, uint32_t *cp) {
    if (n == 0) return 0;
    size_t sub;
    int inc;
    size_t k = utf8_seq(s, n, &sub, &inc);
    static const uint8_t lead_mask[5] = {0, 0x7F, 0x1F, 0x0F, 0x07};
    if (k) {
        uint32_t c = s[0] & lead_mask[k];
        for (size_t i = 1; i < k; i++) c = c << 6 | (s[i] & 0x3F);
        *cp = c;
    }
    return k;
}

size_t olmo_utf8_encode(uint32_t cp, uint8_t *out) {
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xC0 | cp >> 6);
        out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | cp >> 12);
        out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | cp >> 18);
    out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

size_t olmo_utf8_char_start(const uint8_t *s, size_t i, size_t floor) {
    size_t j = i;
    while (j > floor && i - j < 3 && (s[j] & 0xC0) == 0x80) j--;
    return j;
}

size_t olmo_utf8_valid_prefix(const uint8_t *s, size_t len) {
    size_t i = 0;
    while (i < len) {
        /* ASCII fast path, 8 bytes at a time */
        while (i + 8 <= len) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ULL) break;
            i += 8;
        }
        if (i >= len) break;
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t sub;
        int inc;
        size_t n = utf8_seq(s + i, len - i, &sub, &inc);
        if (!n) return i;
        i += n;
    }
    return len;
}

size_t olmo_utf8_sanitize(const uint8_t *in, size_t len, uint8_t *out, bool final, size_t *in_consumed,
                          size_t *n_replaced) {
    size_t i = 0, o = 0, repl = 0;
    while (i < len) {
        size_t v = olmo_utf8_valid_prefix(in + i, len - i);
        memcpy(out + o, in + i, v);
        o += v;
        i += v;
        if (i >= len) break;
        size_t sub;
        int inc;
        utf8_seq(in + i, len - i, &sub, &inc);
        if (inc && !final) break; /* wait for the rest of the character */
        out[o++] = 0xEF;
        out[o++] = 0xBF;
        out[o++] = 0xBD;
        repl++;
        i += sub;
    }
    if (in_consumed) *in_consumed = i;
    if (n_replaced) *n_replaced = repl;
    return o;
}
