/* Text generation: continues a prompt of token ids with a KV cache
 * (model/generate.h), drawing each next token with olmo_sample_token
 * (greedy, temperature, top-p) from a seeded RNG, and stopping after EOS
 * unless told to go on. */
#ifndef OLMOC_SAMPLE_H
#define OLMOC_SAMPLE_H

#include <stdbool.h>
#include <stdint.h>

#include "model/model.h"

struct olmo_sample_options {
    int max_new_tokens;
    double temperature; /* <= 0: greedy */
    double top_p;       /* nucleus mass; >= 1: all tokens */
    uint64_t seed;
    int eos_id;         /* stop after generating it ... */
    bool ignore_eos;    /* ... unless this is set */
};

struct olmo_sample_result {
    int n_new;                  /* tokens generated (EOS included) */
    double prefill_s, decode_s; /* wall time of the prompt and of the new tokens */
};

/* ids[0, n_prompt) is the prompt; ids must have room for n_prompt +
 * max_new_tokens ids, the generated ones follow the prompt. */
int olmo_generate_tokens(struct olmo_model *m, int32_t *ids, int n_prompt, const struct olmo_sample_options *o,
                         struct olmo_sample_result *r);

#endif
