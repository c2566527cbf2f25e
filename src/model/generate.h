/* Inference with a KV cache: the same Olmo 3 forward pass as model.c, fed a
 * chunk of new tokens at a time (batch 1), keeping each layer's rotated keys
 * and values.  Full-attention layers keep every position; sliding-window
 * layers keep a ring of window + chunk - 1 positions (all a chunk's queries
 * can see).  RoPE uses absolute positions.  Plus the token sampler: greedy,
 * temperature, top-p (nucleus), driven by a seeded RNG. */
#ifndef OLMOC_GENERATE_H
#define OLMOC_GENERATE_H

#include <stdint.h>

#include "model/model.h"
#include "util/rng.h"

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

/* Next token from logits: argmax when temperature <= 0; otherwise softmax(logits /
 * temperature) restricted to the smallest set of most likely tokens whose
 * probability reaches top_p (top_p >= 1: all), sampled with rng. */
int olmo_sample_token(const float *logits, int vocab, double temperature, double top_p, struct olmo_rng *rng);

#endif
