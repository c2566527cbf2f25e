/* Inference with a KV cache: the same Olmo 3 forward pass as model.c, fed a
 * chunk of new tokens at a time (batch 1), keeping each layer's rotated keys
 * and values.  Full-attention layers keep every position; sliding-window
 * layers keep a ring of window + chunk - 1 positions (all a chunk's queries
 * can see).  RoPE uses absolute positions.
 *
 * Text generation on it: continues a prompt of token ids, drawing each next
 * token with olmo_sample_token (model/sample.h: greedy, temperature, top-p)
 * from a seeded RNG, and stopping after EOS unless told to go on; and the
 * streaming detokenizer that writes the generated text as it comes. */
#ifndef OLMOC_GENERATE_H
#define OLMOC_GENERATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "model/model.h"
#include "tokenizer/tokenizer.h"

struct olmo_gen {
    struct olmo_model *m;
    int max_len, chunk, len; /* capacity in positions, tokens per feed, positions filled */
    int *cap;                /* cache rows per layer */
    float **k_cache, **v_cache;
    float *rope_cos, *rope_sin; /* [max_len, head_dim/2] */
    int32_t *tokens;
    /* chunk activations */
    float *x, *q, *k, *v, *rstd, *att, *o, *tmp, *h, *g, *u, *s, *mo, *xn, *logits;
    float *xn_all, *logits_all; /* [chunk, d_model], [chunk, vocab]: olmo_gen_feed_all's, allocated on first use */
};

/* Caches up to max_len positions; feeds of at most `chunk` tokens. */
int olmo_gen_create(struct olmo_gen *g, struct olmo_model *m, int max_len, int chunk);
void olmo_gen_destroy(struct olmo_gen *g);
void olmo_gen_reset(struct olmo_gen *g);
/* Runs n (<= chunk) tokens at positions len..len+n-1 and copies the logits of
 * the last one to logits_out (host, vocab floats). */
int olmo_gen_feed(struct olmo_gen *g, const int32_t *tokens, int n, float *logits_out);
/* The same, copying the logits of all n (<= min(chunk, OLMO_GEN_FEED_ALL_MAX))
 * positions to logits_out (host, n x vocab floats). */
#define OLMO_GEN_FEED_ALL_MAX 64
int olmo_gen_feed_all(struct olmo_gen *g, const int32_t *tokens, int n, float *logits_out);
/* Forgets the positions from len on (len <= the positions filled), so that the
 * next feed continues the first len positions: several continuations of one
 * prefix are scored from one prefill.  With a sliding-window ring cache
 * (chunk < max_len) a rewound feed must stay within chunk positions past len. */
int olmo_gen_rewind(struct olmo_gen *g, int len);

/* Text generation: how olmo_generate_tokens draws tokens and when it stops. */
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
