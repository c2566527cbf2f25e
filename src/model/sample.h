/* The token sampler of text generation (model/generate.h): greedy,
 * temperature, top-p (nucleus), driven by a seeded RNG. */
#ifndef OLMOC_SAMPLE_H
#define OLMOC_SAMPLE_H

#include "util/rng.h"

/* Next token from logits: argmax when temperature <= 0; otherwise softmax(logits /
 * temperature) restricted to the smallest set of most likely tokens whose
 * probability reaches top_p (top_p >= 1: all), sampled with rng. */
int olmo_sample_token(const float *logits, int vocab, double temperature, double top_p, struct olmo_rng *rng);

#endif
