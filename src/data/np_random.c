#include "data/np_random.h"

/* SeedSequence constants (numpy/random/bit_generator.pyx, after Melissa
 * O'Neill's seed_seq_fe) */
#define SS_POOL 4
#define SS_INIT_A 0x43b0d7e5u
#define SS_MULT_A 0x931e8875u
#define SS_INIT_B 0x8b51f9ddu
#define SS_MULT_B 0x58f38dedu
#define SS_MIX_L 0xca01f9ddu
#define SS_MIX_R 0x4973f715u
#define SS_XSHIFT 16

static uint32_t hashmix(uint32_t value, uint32_t *hash_const) {
    value ^= *hash_const;
    *hash_const *= SS_MULT_A;
    value *= *hash_const;
    return value ^ (value >> SS_XSHIFT);
}

static uint32_t mix(uint32_t x, uint32_t y) {
    uint32_t r = SS_MIX_L * x - SS_MIX_R * y;
    return r ^ (r >> SS_XSHIFT);
}

void olmo_seed_sequence_u64x4(uint64_t seed, uint64_t out[4]) {
    /* the entropy: the seed's 32-bit words, least significant first (0 is one word) */
    uint32_t entropy[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    const int n_entropy = seed >> 32 ? 2 : 1;
    uint32_t pool[SS_POOL];
    uint32_t hc = SS_INIT_A;
    for (int i = 0; i < SS_POOL; i++) pool[i] = hashmix(i < n_entropy ? entropy[i] : 0, &hc);
    for (int src = 0; src < SS_POOL; src++)
        for (int dst = 0; dst < SS_POOL; dst++)
            if (src != dst) pool[dst] = mix(pool[dst], hashmix(pool[src], &hc));
    /* (entropy beyond the pool size would be mixed in here: a 64-bit seed has at most 2 words) */
    uint32_t words[8];
    uint32_t hb = SS_INIT_B;
    for (int i = 0; i < 8; i++) {
        uint32_t v = pool[i % SS_POOL];
        v ^= hb;
        hb *= SS_MULT_B;
        v *= hb;
        words[i] = v ^ (v >> SS_XSHIFT);
    }
    /* viewed as little-endian uint64 */
    for (int i = 0; i < 4; i++) out[i] = (uint64_t)words[2 * i] | (uint64_t)words[2 * i + 1] << 32;
}

/* 128-bit arithmetic on (hi, lo) pairs */
#define PCG_MULT_HI 0x2360ed051fc65da4ULL
#define PCG_MULT_LO 0x4385df649fccf645ULL

static void mul128(uint64_t ahi, uint64_t alo, uint64_t bhi, uint64_t blo, uint64_t *rhi, uint64_t *rlo) {
    /* low 128 bits of a * b */
    const uint64_t a0 = alo & 0xffffffffu, a1 = alo >> 32, b0 = blo & 0xffffffffu, b1 = blo >> 32;
    const uint64_t p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0, p11 = a1 * b1;
    const uint64_t mid = (p00 >> 32) + (p01 & 0xffffffffu) + (p10 & 0xffffffffu);
    *rlo = (mid << 32) | (p00 & 0xffffffffu);
    *rhi = p11 + (p01 >> 32) + (p10 >> 32) + (mid >> 32) + ahi * blo + alo * bhi;
}

static void add128(uint64_t *hi, uint64_t *lo, uint64_t bhi, uint64_t blo) {
    const uint64_t l = *lo + blo;
    *hi += bhi + (l < blo);
    *lo = l;
}

static void pcg_step(struct olmo_pcg64 *g) {
    mul128(g->state_hi, g->state_lo, PCG_MULT_HI, PCG_MULT_LO, &g->state_hi, &g->state_lo);
    add128(&g->state_hi, &g->state_lo, g->inc_hi, g->inc_lo);
}

void olmo_pcg64_seed(struct olmo_pcg64 *g, uint64_t seed) {
    uint64_t w[4];
    olmo_seed_sequence_u64x4(seed, w);
    /* pcg_setseq_128_srandom_r(initstate = w[0]:w[1], initseq = w[2]:w[3]) */
    g->state_hi = g->state_lo = 0;
    g->inc_hi = (w[2] << 1) | (w[3] >> 63);
    g->inc_lo = (w[3] << 1) | 1u;
    pcg_step(g);
    add128(&g->state_hi, &g->state_lo, w[0], w[1]);
    pcg_step(g);
    g->has_uint32 = 0;
    g->uinteger = 0;
}

uint64_t olmo_pcg64_next64(struct olmo_pcg64 *g) {
    pcg_step(g);
    const uint64_t x = g->state_hi ^ g->state_lo;
    const unsigned rot = (unsigned)(g->state_hi >> 58);
    return (x >> rot) | (x << ((64u - rot) & 63u));
}

uint32_t olmo_pcg64_next32(struct olmo_pcg64 *g) {
    if (g->has_uint32) {
        g->has_uint32 = 0;
        return g->uinteger;
    }
    const uint64_t next = olmo_pcg64_next64(g);
    g->has_uint32 = 1;
    g->uinteger = (uint32_t)(next >> 32);
    return (uint32_t)next;
}

uint64_t olmo_pcg64_interval(struct olmo_pcg64 *g, uint64_t max) {
    if (max == 0) return 0;
    uint64_t mask = max;
    for (int s = 1; s < 64; s <<= 1) mask |= mask >> s;
    uint64_t v;
    if (max <= 0xffffffffULL) {
        while ((v = (olmo_pcg64_next32(g) & mask)) > max) {
        }
    } else {
        while ((v = (olmo_pcg64_next64(g) & mask)) > max) {
        }
    }
    return v;
}

void olmo_np_shuffle_u32(uint64_t seed, uint32_t *x, size_t n) {
    struct olmo_pcg64 g;
    olmo_pcg64_seed(&g, seed);
    for (size_t i = n > 0 ? n - 1 : 0; i >= 1; i--) {
        const size_t j = (size_t)olmo_pcg64_interval(&g, i);
        const uint32_t t = x[i];
        x[i] = x[j];
        x[j] = t;
    }
}
