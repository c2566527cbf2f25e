/* One JSONL line -> the string value of one top-level key.
 *
 * A strict RFC 8259 parser that validates the whole line (an object, with
 * any nested values) without building a tree, and decodes only the wanted
 * string.  Thread-safe (no global state), unlike cJSON's error reporting. */
#ifndef OLMOC_JSONL_H
#define OLMOC_JSONL_H

#include <stddef.h>

struct olmo_json_text {
    char *buf; /* decoded value (UTF-8, not NUL-terminated); reused between calls */
    size_t len, cap;
    size_t n_replaced; /* lone UTF-16 surrogates in \u escapes, replaced by U+FFFD */
};

enum { OLMO_JSON_OK = 0, OLMO_JSON_NO_KEY = 1, OLMO_JSON_MALFORMED = -1 };

/* Parses line[0, len) (surrounding whitespace allowed).  Returns
 * OLMO_JSON_OK with the value of `key` (the last one if repeated) in out,
 * OLMO_JSON_NO_KEY when the object has no such key or its value is not a
 * string (*err says which), or OLMO_JSON_MALFORMED with *err_off the byte
 * offset of the problem in the line and *err a short description. */
int olmo_json_get_string(const char *line, size_t len, const char *key, struct olmo_json_text *out, size_t *err_off,
                         const char **err);
void olmo_json_text_free(struct olmo_json_text *t);

#endif
