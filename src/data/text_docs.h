/* Documents in plain text: where one ends (a file, a paragraph or a line
 * per document), and dolma's strip() of a document. */
#ifndef OLMOC_TEXT_DOCS_H
#define OLMOC_TEXT_DOCS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum olmo_doc_unit { OLMO_DOCS_FILE, OLMO_DOCS_PARAGRAPH, OLMO_DOCS_LINE };

/* Python's str.strip(): drops leading and trailing str.isspace() characters of *p[0, *n). */
void olmo_text_strip_py(const uint8_t **p, size_t *n);
/* A line holding only spaces, tabs or '\r'. */
bool olmo_text_blank_line(const uint8_t *s, size_t n);
/* Offset just after the last document boundary in buf[0, n), 0 if none
 * (first_continues: buf starts inside a line, see text_docs.c). */
size_t olmo_text_last_boundary(enum olmo_doc_unit docs, const uint8_t *buf, size_t n, bool first_continues);

#endif
