/* UTF-8 for the tokenizer, the tokenize pipeline and the JSONL reader: one
 * decoder (well-formed sequences only, as the Unicode standard defines
 * them), repair of invalid input and encoding. */
#ifndef OLMOC_UTF8_H
#define OLMOC_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Decodes the well-formed sequence that starts s[0, n): returns its length
 * (1..4) and sets *cp, or returns 0 (s is empty, or does not start a
 * well-formed sequence within n bytes). */
size_t olmo_utf8_decode(const uint8_t *s, size_t n, uint32_t *cp);
/* Writes cp (< 0x110000, not a surrogate) to out (room for 4); returns the length. */
size_t olmo_utf8_encode(uint32_t cp, uint8_t *out);
/* Start of the character holding byte i (steps back over at most three
 * continuation bytes, never below floor). */
size_t olmo_utf8_char_start(const uint8_t *s, size_t i, size_t floor);

/* UTF-8 repair: copies in[0, len) to out (capacity >= 3 * len) replacing
 * each maximal invalid subpart by U+FFFD (EF BF BD).  Returns the number of
 * bytes written; *n_replaced counts substitutions.  When !final, an
 * incomplete but so far valid sequence at the end is left out and
 * *in_consumed tells how many input bytes were used. */
size_t olmo_utf8_sanitize(const uint8_t *in, size_t len, uint8_t *out, bool final, size_t *in_consumed,
                          size_t *n_replaced);
/* Length of the valid UTF-8 prefix of s (== len when all of it is valid). */
size_t olmo_utf8_valid_prefix(const uint8_t *s, size_t len);

#endif
