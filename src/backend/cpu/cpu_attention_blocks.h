/* Attention's plan (part of cpu_attention_kernels.h, compiled once per
 * instruction set with it): how the kernels walk the tiles, their block
 * sizes, and the first key each query sees. */
#ifndef OLMOC_CPU_ATTENTION_BLOCKS_H
#define OLMOC_CPU_ATTENTION_BLOCKS_H

#include "backend/cpu/cpu_internal.h"

/* ---- attention -------------------------------------------------------------
 * Flash-style, with tile products (tile_gemm, single-threaded inside the
 * OpenMP region) and softmax in between:
 *   forward: a task per (batch, kv head, run of blocks of ATT_QB queries)
 *     walks, for each block and each head of the group, the visible keys in
 *     chunks of ATT_KC with an online softmax;
 *   backward: a task per (batch, kv head, run of blocks of ATT_KB keys)
 *     walks the queries that see each block in chunks of ATT_QC
 *     (FlashAttention-2 order).
 * K is transposed (bf16: per head ahead, [D/2][ld] pairs, ld = T rounded up;
 * fp32: each key block as a task comes to it, the forward's as [D][64] per
 * block of 64 keys with the block's V rows beside it, the backward's as it
 * packs the block) so every score tile is a plain NN product; the fp32
 * backward's other row operands (Q and dO) are copied, contiguous per head of
 * the group, as its tasks come to them.  Memory beyond inputs and outputs is
 * O(seq_len) per head (bounds, delta, bf16: the transposed K and V and the
 * bf16 copies; dq copies: fewer than ATT_BWD_TASKS) plus per thread: tiles
 * (forward: ATT_QB x (ATT_KC + ATT_KTB) scores and ATT_QB x head_dim;
 * backward: ATT_QC x ATT_KB, and in fp32 the key block packed: 3 x ATT_KB x
 * head_dim) and, fp32, the forward's K^T blocks and V rows of one sequence
 * (2 x seq_len x head_dim) and the backward's Q and dO rows of one sequence
 * per head of a group (2 x group x seq_len x head_dim): no seq_len^2 buffer.  The AVX2 backward computes
 * P = exp(S - lse) and dS = P (dP - delta) scale in the S and dP tiles'
 * epilogues (the same operations as exp_visible and ds_row).
 * Query t sees keys lo[t]..t, lo[t] = max(t - window + 1, start of t's
 * document): documents are runs of equal doc ids, as the model builds them.
 * lo is non-decreasing in t, which the block bounds below rely on.
 *
 * cpu-bf16 runs the seven products (S = Q K^T, O += P V; S, dP = dO V^T,
 * dV += P^T dO, dK += dS^T Q, dQ += dS K) on bf16 operands with fp32
 * accumulation, as cuda-bf16 does on tensor cores, when the build has
 * AVX512-BF16 (vdpbf16ps) and head_dim is even; softmax, lse, delta and the
 * accumulators stay fp32.  Its operands are rounded to bf16 (to nearest
 * even, as the GEMMs round them) and packed in pairs along the product's k:
 * elements k = 2p and 2p + 1 in the low and high half of one 32-bit word. */
/* ATT_KC = 320: a block of 64 queries under a 256-key window sees 319 keys, one chunk (256 cut it in
 * two, the second of 63 keys with the whole per-chunk softmax cost: windowed forward 58% -> 60% of
 * the one-thread FMA peak at head_dim 64 on Zen 3, full attention unchanged) */
/* ATT_KTB: keys per block of the fp32 forward's K^T (attention_fwd) */
enum { ATT_QB = 64, ATT_KC = 320, ATT_KB = 64, ATT_QC = 64, ATT_KTB = 64 };

/* lo[b * T + t]: first key visible from query t of sequence b. */
static int *attn_bounds(const struct olmo_attn_shape *s, const int32_t *doc_ids) {
    const int T = s->seq_len;
    int *lo = cpu_scratch(sizeof(int) * (size_t)s->batch * T);
    if (!lo) return NULL;
    for (int b = 0; b < s->batch; b++) {
        const int32_t *docs = doc_ids ? doc_ids + (size_t)b * T : NULL;
        int run_start = 0;
        for (int t = 0; t < T; t++) {
            if (docs && t > 0 && docs[t] != docs[t - 1]) run_start = t;
            int first = s->window > 0 && t - s->window + 1 > run_start ? t - s->window + 1 : run_start;
            lo[(size_t)b * T + t] = first;
        }
    }
    return lo;
}

#endif
