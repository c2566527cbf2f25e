/* Document boundaries and whitespace in text, as olmoc tokenize (and dolma) see them. */
#include "data/text_docs.h"

#include <string.h>

#include "util/utf8.h"

/* Python's str.isspace() for one code point (what dolma's strip() removes). */
static bool py_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

void olmo_text_strip_py(const uint8_t **p, size_t *n) {
    const uint8_t *s = *p;
    size_t len = *n;
    for (;;) {
        uint32_t cp;
        size_t k = olmo_utf8_decode(s, len, &cp);
        if (!k || !py_space(cp)) break;
        s += k;
        len -= k;
    }
    while (len) {
        size_t j = olmo_utf8_char_start(s, len - 1, 0);
        uint32_t cp;
        size_t k = olmo_utf8_decode(s + j, len - j, &cp);
        if (k != len - j || !py_space(cp)) break;
        len = j;
    }
    *p = s;
    *n = len;
}

bool olmo_text_blank_line(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r') return false;
    return true;
}

/* Offset just after the last document boundary in buf[0, n), 0 if none.
 * line (JSONL too): after a '\n'.  paragraph: after a blank line's '\n' (a
 * line holding only spaces, tabs or '\r'; when first_continues, the first
 * line is the tail of a longer line and never blank). */
size_t olmo_text_last_boundary(enum olmo_doc_unit docs, const uint8_t *buf, size_t n, bool first_continues) {
    if (docs == OLMO_DOCS_LINE) {
        const uint8_t *nl = memrchr(buf, '\n', n);
        return nl ? (size_t)(nl - buf) + 1 : 0;
    }
    if (docs == OLMO_DOCS_FILE) return 0;
    size_t end = n;
    while (end > 0) {
        const uint8_t *nl = memrchr(buf, '\n', end);
        if (!nl) return 0;
        size_t j = (size_t)(nl - buf); /* this '\n' ends the line [ls, j) */
        const uint8_t *prev = j ? memrchr(buf, '\n', j) : NULL;
        size_t ls = prev ? (size_t)(prev - buf) + 1 : 0;
        bool real_line = prev || !first_continues;
        if (real_line && olmo_text_blank_line(buf + ls, j - ls)) return j + 1;
        end = j;
    }
    return 0;
}

