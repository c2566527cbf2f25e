/* Byte-level BPE tokenizer compatible with Hugging Face `tokenizers`.
 *
 * Loads a tokenizer.json (the format `tokenizers` saves) whose model is BPE
 * and whose pre-tokenizer ends in ByteLevel: the GPT-2 / cl100k family, which
 * includes the Olmo 3 "dolma2" tokenizer (Sequence[Split(cl100k regex,
 * Isolated), ByteLevel(use_regex=false)]).  Supported pieces:
 *   - normalizer: null
 *   - pre_tokenizer: Split (Regex or String pattern, every behavior, invert),
 *     ByteLevel (add_prefix_space, use_regex), Sequence of those; ByteLevel last
 *   - model: BPE with merges as "a b" strings or [a, b] pairs, unk_token,
 *     fuse_unk, ignore_merges (dropout, byte_fallback and subword affixes are
 *     rejected with an error)
 *   - added_tokens: matched in the raw text before pre-tokenization, leftmost
 *     longest, honouring lstrip / rstrip / single_word
 *   - decoder: ByteLevel
 * Regexes run on PCRE2 with JIT (UTF + UCP), which agrees with the Oniguruma
 * engine `tokenizers` uses on the constructs these patterns need
 * (\p{L}, \p{N}, \s including U+0085, (?i:...), lookahead).
 *
 * Encoding equals `Tokenizer.encode(text, add_special_tokens=False).ids`.
 * Input is bytes: invalid UTF-8 is first replaced by U+FFFD exactly as
 * Python's bytes.decode("utf-8", errors="replace") does (one U+FFFD per
 * maximal invalid subpart), so encoding bytes b equals encoding
 * b.decode("utf-8", "replace") with `tokenizers`.
 *
 * A loaded tokenizer is read-only and can be shared by threads; each thread
 * encodes through its own olmo_encoder (scratch space, word cache). */
#ifndef OLMOC_TOKENIZER_H
#define OLMOC_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/utf8.h" /* olmo_utf8_sanitize: repair before streaming */

struct olmo_tokenizer;
struct olmo_encoder;

/* A growable array of token ids. */
struct olmo_ids {
    uint32_t *ids;
    size_t n, cap;
};
int olmo_ids_push(struct olmo_ids *v, uint32_t id);
void olmo_ids_free(struct olmo_ids *v);

/* Token ids must be below this (16M; the largest real vocabularies have
 * about 1M tokens): tables are sized by the largest id. */
#define OLMO_TOKENIZER_MAX_IDS (1u << 24)

/* Pre-tokens longer than this are merged in pieces of at most this many
 * bytes (see bpe_word), which bounds the encoder's memory. */
#define OLMO_MAX_PRETOKEN_BYTES ((size_t)1 << 20)

int olmo_tokenizer_load(struct olmo_tokenizer **out, const char *path);
void olmo_tokenizer_free(struct olmo_tokenizer *t);

/* 1 + the largest id of the vocabulary and the added tokens. */
uint32_t olmo_tokenizer_vocab_size(const struct olmo_tokenizer *t);
/* Id of a token given by its content (added tokens first, then the model
 * vocabulary in its byte-level spelling, e.g. "Ġthe"); -1 when absent. */
int64_t olmo_tokenizer_token_to_id(const struct olmo_tokenizer *t, const char *token);
/* Whether id is an added token marked "special". */
bool olmo_tokenizer_is_special(const struct olmo_tokenizer *t, uint32_t id);

struct olmo_encoder *olmo_encoder_new(const struct olmo_tokenizer *t);
void olmo_encoder_free(struct olmo_encoder *e);

enum {
    /* Treat added tokens marked "special" as plain text (tokenizers'
     * `encode_special_tokens = True`, dolma's --tokenizer.encode_special_tokens
     * used to prepare OLMo data).  Non-special added tokens are still matched. */
    OLMO_ENCODE_SPLIT_SPECIAL = 1,
    /* Streaming: more text of the same document follows.  The encoder stops
     * before the first place where more text could change the result and
     * reports it in *consumed; the caller passes the rest again, followed by
     * the next text.  Requires valid UTF-8 (see olmo_utf8_sanitize). */
    OLMO_ENCODE_PARTIAL = 2,
    /* Streaming: this text continues a previous call of the same document
     * (no ByteLevel prefix space is added at its start). */
    OLMO_ENCODE_CONTINUATION = 4,
};

/* Appends the ids of text[0, len) to out.  consumed may be NULL unless
 * OLMO_ENCODE_PARTIAL is set; without it, everything is consumed.
 * n_replaced (may be NULL) gets the number of U+FFFD substitutions made. */
int olmo_encode(struct olmo_encoder *e, const char *text, size_t len, int flags, struct olmo_ids *out,
                size_t *consumed, size_t *n_replaced);

/* Decodes ids to UTF-8 text (invalid byte sequences become U+FFFD, as
 * `tokenizers` does).  *out is malloc'ed and NUL-terminated. */
int olmo_decode(const struct olmo_tokenizer *t, const uint32_t *ids, size_t n, bool skip_special, char **out,
                size_t *out_len);
/* The raw bytes a token decodes to (before UTF-8 repair: a token may hold
 * part of a character), for streaming decoders; NULL when id is unknown or
 * the tokenizer has no ByteLevel decoder. */
const uint8_t *olmo_tokenizer_token_bytes(const struct olmo_tokenizer *t, uint32_t id, size_t *len);


#endif
