/* Text generation: continues a prompt of token ids with a KV cache
 * (model/generate.h), drawing each next token with olmo_sample_token
 * (greedy, temperature, top-p) from a seeded RNG, and stopping after EOS
 * unless told to go on. */
#ifndef OLMOC_SAMPLE_H
#define OLMOC_SAMPLE_H

#include <stdbool.h>
#include <stdint.h>

#include <stddef.h>
#include <stdio.h>

#include "model/model.h"
#include "tokenizer/tokenizer.h"

struct olmo_sample_options {
    int max_new_tokens;
    double temperature; /* <= 0: greedy */
    double top_p;       /* nucleus mass; >= 1: all tokens */
    uint64_t seed;
    int eos_id;         /* stop after generating it ... */
    bool ignore_eos;    /* ... unless this is set */
    /* Called with each generated token as soon as it is drawn (may be NULL);
     * a non-zero return stops generation with an error. */
    int (*on_token)(void *user, int32_t id);
    void *user;
};

struct olmo_sample_result {
    int n_new;                  /* tokens generated (EOS included) */
    double prefill_s, decode_s; /* wall time of the prompt and of the new tokens */
};

/* ids[0, n_prompt) is the prompt; ids must have room for n_prompt +
 * max_new_tokens ids, the generated ones follow the prompt. */
int olmo_generate_tokens(struct olmo_model *m, int32_t *ids, int n_prompt, const struct olmo_sample_options *o,
                         struct olmo_sample_result *r);

/* Streaming detokenization: each token's bytes are appended and every
 * complete character is written out (and flushed) at once; a character split
 * across tokens waits for its remaining bytes.  Invalid bytes become U+FFFD
 * as in olmo_decode (tokenizers' decode), so the text written for ids equals
 * olmo_decode(ids, skip_special) once olmo_text_stream_finish has run.  Ids
 * the tokenizer does not know (a model vocabulary padded past the tokenizer's)
 * write nothing, as tokenizers' decode skips them. */
struct olmo_text_stream {
    const struct olmo_tokenizer *tok;
    FILE *out;
    bool skip_special;
    uint8_t pending[4]; /* an incomplete character's first bytes */
    size_t n_pending;
};
void olmo_text_stream_init(struct olmo_text_stream *s, const struct olmo_tokenizer *tok, FILE *out, bool skip_special);
int olmo_text_stream_push(struct olmo_text_stream *s, uint32_t id);
/* Writes what is pending (an incomplete character becomes U+FFFD). */
int olmo_text_stream_finish(struct olmo_text_stream *s);

#endif
