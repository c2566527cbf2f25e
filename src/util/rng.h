/* Deterministic random numbers (xoshiro256**, seeded by splitmix64): the same
 * seed gives the same weights and data order on every machine. */
#ifndef OLMOC_RNG_H
#define OLMOC_RNG_H

#include <stdint.h>

struct olmo_rng {
    uint64_t s[4];
};

void olmo_rng_seed(struct olmo_rng *rng, uint64_t seed);
uint64_t olmo_rng_next(struct olmo_rng *rng);
double olmo_rng_uniform(struct olmo_rng *rng);           /* [0, 1) */
double olmo_rng_normal(struct olmo_rng *rng);            /* standard normal */
/* Normal(0, std) resampled until it falls inside [-cut*std, cut*std]. */
double olmo_rng_trunc_normal(struct olmo_rng *rng, double std, double cut);

#endif
