/* numpy's random generator as OLMo-core's data loader uses it:
 * np.random.Generator(np.random.PCG64(seed)).shuffle(indices).
 *
 * Implemented from the published algorithms (numpy 1.17+ / 2.x):
 *  - SeedSequence(seed): the integer seed as 32-bit words (least significant
 *    first) is hashed into a pool of four 32-bit words, and generate_state(4,
 *    uint64) hashes the pool into PCG64's 256 bits of seed material;
 *  - PCG64: the 128-bit LCG (multiplier 0x2360ed051fc65da44385df649fccf645)
 *    with the XSL-RR output function, seeded as pcg_setseq_128_srandom_r
 *    (state = words 0-1, increment = words 2-3, high word first);
 *  - next_uint32: the low half of one 64-bit output, the high half kept for
 *    the next call;
 *  - random_interval(max): the smallest all-ones mask >= max, rejection
 *    sampling next_uint32() & mask (next_uint64 when max >= 2^32);
 *  - Generator.shuffle of a 1-D array: Fisher-Yates from the last element,
 *    i = n-1 .. 1 swapped with random_interval(i).
 * tests/python/test_olmo_core_order.py checks every step against numpy. */
#ifndef OLMOC_NP_RANDOM_H
#define OLMOC_NP_RANDOM_H

#include <stddef.h>
#include <stdint.h>

struct olmo_pcg64 {
    uint64_t state_hi, state_lo, inc_hi, inc_lo;
    int has_uint32;
    uint32_t uinteger;
};

/* numpy.random.SeedSequence(seed).generate_state(4, np.uint64) */
void olmo_seed_sequence_u64x4(uint64_t seed, uint64_t out[4]);
/* np.random.PCG64(seed) */
void olmo_pcg64_seed(struct olmo_pcg64 *g, uint64_t seed);
uint64_t olmo_pcg64_next64(struct olmo_pcg64 *g);
uint32_t olmo_pcg64_next32(struct olmo_pcg64 *g);
/* Uniform in [0, max], numpy's random_interval. */
uint64_t olmo_pcg64_interval(struct olmo_pcg64 *g, uint64_t max);
/* np.random.Generator(PCG64(seed)).shuffle(x) for a 1-D array of n elements. */
void olmo_np_shuffle_u32(uint64_t seed, uint32_t *x, size_t n);

#endif
