/* Attention's forward (part of cpu_attention_kernels.h, compiled once per
 * instruction set with it): its schedule of tasks and attention_fwd. */
#ifndef OLMOC_CPU_ATTENTION_FWD_H
#define OLMOC_CPU_ATTENTION_FWD_H

#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "backend/cpu/cpu_attention_blocks.h"
#include "backend/cpu/cpu_attention_pack.h"

/* Forward tasks: query blocks qb0 .. qb1-1 of every head in kv head kh's group, sequence b. */
struct attn_fwd_task {
    int b, kh, qb0, qb1;
    double cost;
};

/* Forward tasks per thread that a shape aims for: fewer (batch, kv head) pairs than
 * ATT_FWD_TASKS x threads cut each pair's query blocks into runs of about equal cost. */
enum { ATT_FWD_TASKS = 4 };

static int fwd_task_cost_desc(const void *pa, const void *pb) {
    const struct attn_fwd_task *a = pa, *b = pb;
    if (a->cost != b->cost) return a->cost < b->cost ? 1 : -1;
    if (a->b != b->b) return a->b - b->b; /* ties: by position, so the order is total */
    if (a->kh != b->kh) return a->kh - b->kh;
    return a->qb0 - b->qb0;
}

/* A forward query block's cost for the schedule: its queries times the keys from its first one's first
 * visible key, plus a block's fixed work (lob: the sequence's bounds) */
static double fwd_block_cost(const int *lob, int qb, int T) {
    const int i0 = qb * ATT_QB, i1 = i0 + ATT_QB < T ? i0 + ATT_QB : T;
    return (double)(i1 - i0) * (i1 - lob[i0] + ATT_QB);
}

/* The forward's tasks, longest first: a (batch, kv head) pair's query blocks in `segs` runs of about
 * equal cost (keys seen, plus a block's fixed work); runs never change a result (each row is computed
 * whole by one task, the same way), so they may follow the thread count. */
static struct attn_fwd_task *attn_fwd_schedule(const struct olmo_attn_shape *s, const int *lo, int *n_tasks) {
    const int T = s->seq_len, HK = s->n_kv_heads, pairs = s->batch * HK, qblocks = (T + ATT_QB - 1) / ATT_QB;
    const int want = ATT_FWD_TASKS * omp_get_max_threads();
    int segs = pairs >= want ? 1 : (want + pairs - 1) / pairs;
    if (segs > qblocks) segs = qblocks;
    struct attn_fwd_task *tasks = cpu_scratch(sizeof *tasks * (size_t)pairs * segs);
    if (!tasks) return NULL;
    int n = 0;
    for (int pair = 0; pair < pairs; pair++) {
        const int b = pair / HK, kh = pair % HK;
        const int *lob = lo + (size_t)b * T;
        double total = 0;
        for (int qb = 0; qb < qblocks; qb++) total += fwd_block_cost(lob, qb, T);
        double sum = 0;
        for (int qb = 0, g = 0, qb0 = 0; qb < qblocks; qb++) {
            sum += fwd_block_cost(lob, qb, T);
            if (qb == qblocks - 1 || sum >= total * (g + 1) / segs) { /* run g ends with block qb */
                tasks[n++] = (struct attn_fwd_task){b, kh, qb0, qb + 1, sum};
                g++, qb0 = qb + 1, sum = 0;
            }
        }
    }
    qsort(tasks, (size_t)n, sizeof *tasks, fwd_task_cost_desc);
    *n_tasks = n;
    return tasks;
}

static int attention_fwd(struct cpu_state *st, bool bf16_products, float *out, float *lse, const float *q,
                          const float *k, const float *v, const int32_t *doc_ids, const struct olmo_attn_shape *s) {
    const int T = s->seq_len, H = s->n_heads, HK = s->n_kv_heads, D = s->head_dim;
    const int group = H / HK;
    const int q_stride = H * D, kv_stride = HK * D;
    const bool bf16 = attn_bf16(bf16_products, s);
    const int wq = bf16 ? 2 : 1; /* floats per element of Q's operand (a bf16 pair holds two) */
    const int kt_rows = D / wq, ldt = transposed_ld(T), pairs = (T + 1) / 2;
    ATTN_CALL_BEGIN();
    int *lo = attn_bounds(s, doc_ids);
    int n_tasks = 0;
    struct attn_fwd_task *tasks = lo ? attn_fwd_schedule(s, lo, &n_tasks) : NULL;
    /* bf16: K^T as [D/2][ld] pairs and V as position pairs, for every head ahead.  fp32: each task packs
     * the key blocks it reads, as it comes to them, into its thread's K^T blocks [D][ATT_KTB] and V rows
     * [ATT_KTB][D] (room for every block of a sequence), where its products then find them in cache: one
     * thread, T 2048, 6 heads of 64, forced AVX2, against K^T blocks and V rows per head made ahead in one
     * pass (three alternating rounds): window 256 68-70 -> 75 GFLOP/s, 4 x 512 window 256 65-66 -> 76. */
    const int nkb = (T + ATT_KTB - 1) / ATT_KTB;
    const size_t kv_floats = (size_t)nkb * ATT_KTB * D;
    float *kv_mine = !tasks || bf16 ? NULL
                                    : cpu_cached_scratch(st, SLOT_KT, sizeof(float) * 2 * kv_floats *
                                                                          (size_t)omp_get_max_threads());
    const void *kt = !tasks ? NULL : bf16 ? (const void *)transpose_heads_pairs(st, SLOT_KT, k, s->batch, T, HK, D)
                                          : kv_mine;
    const void *qa = !kt ? NULL : bf16 ? (const void *)bf16_rows(st, SLOT_Q16, q, s->batch, T, q_stride) : q;
    const uint32_t *vp = bf16 && qa ? bf16_position_pairs(st, SLOT_VP, v, s->batch, T, kv_stride) : NULL;
    /* per thread: scores (rows of ldsc, after ATT_KTB floats that the fp32 S product may write before
     * them), the output accumulator, and P as bf16 */
    const int ldsc = ATT_KC + ATT_KTB;
    size_t stride = 0;
    float *tiles = qa && (bf16 ? vp != NULL : true)
                       ? thread_tiles(ATT_KTB + (size_t)ATT_QB * ldsc + (size_t)ATT_QB * D +
                                          (bf16 ? (size_t)ATT_QB * ATT_KC / 2 : 0),
                                      &stride)
                       : NULL;
    if (!tiles) {
        free(tasks);
        free(lo);
        return -1;
    }
    /* Each task owns its output rows, so any schedule gives the same result. */
#pragma omp parallel if (n_tasks > 1)
    {
        float *sc = tiles + stride * (size_t)omp_get_thread_num() + ATT_KTB;
        float *acc = sc + (size_t)ATT_QB * ldsc;
        uint16_t *pb = bf16 ? (uint16_t *)(acc + (size_t)ATT_QB * D) : NULL; /* P as bf16 */
        float *ktb = bf16 ? NULL : kv_mine + 2 * kv_floats * (size_t)omp_get_thread_num();
        float *vrows = bf16 ? NULL : ktb + kv_floats;
        float mrow[ATT_QB], maxp[ATT_MAXP * ATT_QB]; /* partial maxima of each row of a chunk */
        double lrow[ATT_QB];
        int vis_a[ATT_QB], vis_e[ATT_QB]; /* each row's visible columns of the chunk */
        ATTN_THREAD_BEGIN();
#pragma omp for schedule(dynamic)
        for (int t = 0; t < n_tasks; t++) {
            const int b = tasks[t].b, kh = tasks[t].kh;
            const int *lob = lo + (size_t)b * T;
            /* fp32: key blocks base .. filled-1 packed so far (K^T block j - base at ktb + (j - base) D ATT_KTB,
             * key j's V row at vrows + (j - base ATT_KTB) D) */
            const int base = (lob[tasks[t].qb0 * ATT_QB] & ~1) / ATT_KTB;
            int filled = base;
            for (int qb = tasks[t].qb0; qb < tasks[t].qb1; qb++) {
                const int i0 = qb * ATT_QB, nq = i0 + ATT_QB < T ? ATT_QB : T - i0, i1 = i0 + nq;
                ATTN_BEGIN(ATTN_FWD_PACK);
                for (; !bf16 && filled * ATT_KTB < i1; filled++) { /* the blocks up to key i1-1 */
                    const int j0 = filled * ATT_KTB, nk = j0 + ATT_KTB < T ? ATT_KTB : T - j0;
                    const float *kr = k + ((size_t)b * T + j0) * kv_stride + (size_t)kh * D,
                                *vr = v + ((size_t)b * T + j0) * kv_stride + (size_t)kh * D;
                    pack_transposed(ktb + (size_t)(filled - base) * D * ATT_KTB, ATT_KTB, kr, kv_stride, nk, D);
                    pack_rows(vrows + (size_t)(filled - base) * ATT_KTB * D, vr, kv_stride, nk, D);
                }
                ATTN_END();
                for (int h = kh * group; h < (kh + 1) * group; h++) {
                    const size_t qoff = ((size_t)b * T + i0) * q_stride + (size_t)h * D;
                    const size_t kth = ((size_t)b * HK + kh) * kt_rows * ldt;
                    if (qb + 1 < tasks[t].qb1) /* the next block's Q rows of this head, into L2 ahead of it */
                        for (int r = i1; r < i1 + ATT_QB && r < T; r++)
                            for (int d = 0; d < D; d += 16)
                                __builtin_prefetch(q + ((size_t)b * T + r) * q_stride + (size_t)h * D + d, 0, 2);
                    memset(acc, 0, sizeof(float) * (size_t)nq * D);
                    for (int r = 0; r < nq; r++) {
                        mrow[r] = -INFINITY;
                        lrow[r] = 0.0;
                    }
                    /* keys from lob[i0] (rounded down to even, for the bf16 pairs) to i1-1, in chunks */
                    for (int j0 = lob[i0] & ~1, nk; j0 < i1; j0 += nk) {
                        nk = i1 - j0 < ATT_KC ? i1 - j0 : ATT_KC;
                        for (int r = 0; r < nq; r++) row_visible(lob, i0 + r, j0, nk, &vis_a[r], &vis_e[r]);
                        const struct tile_span cols = {vis_a, vis_e, false}, terms = {vis_a, vis_e, true};
#ifdef ATT_FUSED_MAX
                        const bool fused = !bf16; /* S and its rows' maxima in one pass */
#else
                        const bool fused = false;
#endif
                        ATTN_BEGIN(ATTN_FWD_S);
                        if (!bf16) { /* S, a block of K^T at a time */
                            if (fused)
                                for (int r = 0; r < ATT_MAXP * nq; r++) maxp[r] = -INFINITY;
                            /* from key j0a, the block's first: its columns before j0 land in the ATT_KTB floats
                             * before each row (not visible, never read) */
                            const int j0a = j0 / ATT_KTB * ATT_KTB, off = j0 - j0a;
                            int pa[ATT_QB], pe[ATT_QB];
                            const struct tile_span piece = {pa, pe, false};
                            for (int c = 0; c < off + nk; c += ATT_KTB) { /* columns c .. of S from key j0a */
                                const int w = off + nk - c < ATT_KTB ? off + nk - c : ATT_KTB;
                                const float *kblk = ktb + (size_t)((j0a + c) / ATT_KTB - base) * D * ATT_KTB;
                                for (int r = 0; r < nq; r++) pa[r] = vis_a[r] + off - c, pe[r] = vis_e[r] + off - c;
#ifdef ATT_FUSED_MAX
                                tile_gemm_max(&piece, nq, w, D, s->scale, q + qoff, q_stride, kblk, ATT_KTB, maxp,
                                              sc - off + c, ldsc);
#else
                                tile_product(&piece, false, false, nq, w, D, s->scale, q + qoff, q_stride, kblk,
                                             ATT_KTB, 0.0f, sc - off + c, ldsc);
#endif
                            }
                        } else {
                            tile_product(&cols, true, false, nq, nk, D, s->scale, word_at(qa, qoff / wq),
                                         q_stride / wq, word_at(kt, kth + j0), ldt, 0.0f, sc, ldsc);
                        }
                        ATTN_END();
                        ATTN_BEGIN(ATTN_FWD_SOFTMAX);
                        /* the last chunk: the output rows, which the block's last step writes, into L2 a row at a
                         * time among the softmax's work (one thread, T 2048, 6 heads of 64, window 256, forced
                         * AVX2: their stores had taken 5-7% of the forward, waiting for the lines) */
                        const bool last = j0 + nk == i1;
                        for (int r = 0; r < nq; r++) {
                            if (last)
                                for (int d = 0; d < D; d += 16)
                                    __builtin_prefetch(out + ((size_t)b * T + i0 + r) * q_stride + (size_t)h * D + d, 1, 2);
                            float *row = sc + (size_t)r * ldsc;
                            const int a = vis_a[r], e = vis_e[r];
                            if (e < a) {
                                memset(row, 0, sizeof(float) * (size_t)nk);
                                continue;
                            }
                            float mx = fused ? max_of(maxp + (size_t)ATT_MAXP * r, ATT_MAXP) : max_of(row + a, e - a + 1);
                            mx = mx > mrow[r] ? mx : mrow[r];
                            const float alpha = fast_expf(mrow[r] - mx); /* exp(-inf) = 0 on the first chunk */
                            const float sum = exp_visible(row, nk, a, e, mx);
                            if (mx != mrow[r]) {
                                float *ar = acc + (size_t)r * D;
#pragma omp simd
                                for (int d = 0; d < D; d++) ar[d] *= alpha;
                                lrow[r] *= alpha;
                            }
                            lrow[r] += sum;
                            mrow[r] = mx;
                        }
                        ATTN_END();
                        ATTN_BEGIN(ATTN_FWD_PV);
                        if (bf16) { /* O += P V: P's rows and V's position pairs (j0 is even) */
                            pack_bf16_rows(pb, ATT_KC, sc, ldsc, nq, nk);
                            tile_product(&terms, true, false, nq, D, nk, 1.0f, pb, ATT_KC / 2,
                                         vp + ((size_t)b * pairs + j0 / 2) * kv_stride + (size_t)kh * D, kv_stride,
                                         1.0f, acc, D);
                        } else {
                            tile_gemm(&terms, false, nq, D, nk, 1.0f, sc, ldsc,
                                      vrows + (size_t)(j0 - base * ATT_KTB) * D, D, 1.0f, acc, D);
                        }
                        ATTN_END();
                    }
                    ATTN_BEGIN(ATTN_FWD_OUT);
                    for (int r = 0; r < nq; r++) {
                        float *orow = out + ((size_t)b * T + i0 + r) * q_stride + (size_t)h * D;
                        const float *ar = acc + (size_t)r * D, inv = (float)(1.0 / lrow[r]);
#pragma omp simd
                        for (int d = 0; d < D; d++) orow[d] = ar[d] * inv;
                        lse[((size_t)b * H + h) * T + i0 + r] = mrow[r] + (float)log(lrow[r]);
                    }
                    ATTN_END();
                }
            }
        }
        ATTN_THREAD_END();
    }
    ATTN_CALL_END(0, lo, s);
    free(tiles);
    free(tasks);
    free(lo);
    return 0;
}

#endif
