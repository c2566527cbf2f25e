/* Attention's backward (part of cpu_attention_kernels.h, compiled once per
 * instruction set with it): its schedule of tasks, one key block's tiles,
 * and attention_bwd. */
#ifndef OLMOC_CPU_ATTENTION_BWD_H
#define OLMOC_CPU_ATTENTION_BWD_H

#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "backend/cpu/cpu_attention_blocks.h"
#include "backend/cpu/cpu_attention_pack.h"

/* Backward: a task per (batch, kv head, run of consecutive key blocks) owns
 * dk/dv of those keys and walks every query chunk (of every query head in
 * the GQA group) that sees them; P and dS are recomputed per tile from lse.
 * dq gets contributions from every key block: a (batch, kv head)'s key
 * blocks are cut into runs (attn_bwd_segments), the same for any thread count
 * (they follow the shape and the masks only), and the task of run s adds
 * its blocks' contributions, in key order, into dq itself for the queries
 * that no earlier run sees, and into dq copy s for the others (under a
 * window, only the queries near the run's first key); the copies are then
 * added to dq in run order.  Each region of dq and of a copy belongs to one
 * task, so the tasks can run on any thread in any order: every result, dq
 * included, has the same bits for any thread count.  A task's keys in order also keep its heads' Q, dO and dq
 * rows in cache from one key block to the next.  Nothing is zeroed ahead:
 * the first product into a dK, dV or dQ row sets it (beta 0), the later
 * ones add to it; zeroing them first (separate passes over cold rows) cost
 * the backward 7-9% at window 256 (one thread, head_dim 64, 6 heads). */
struct attn_task {
    int b, kh, kb0, kb1, seg; /* key blocks kb0 .. kb1-1, dq copy seg */
    double cost;
};

/* Tasks that a backward aims for: a shape with fewer (batch, kv head) pairs than this cuts each pair's
 * key blocks into several runs (and dq copies), so that a few long sequences still fill several threads.
 * Each copy costs the sum of its rows into dq: on one head of T = 2048 (one thread, Zen 3) 16 runs cost
 * the backward about 6%, 8 runs 1-2% (backward over forward time, against one task per pair's whole
 * sequence; measured when each copy's rows were also zeroed first).  A machine with more threads than
 * tasks leaves some idle in the backward. */
enum { ATT_BWD_TASKS = 8 };

static int task_cost_desc(const void *pa, const void *pb) {
    const struct attn_task *a = pa, *b = pb;
    if (a->cost != b->cost) return a->cost < b->cost ? 1 : -1;
    /* ties: by position, so the order is total */
    if (a->b != b->b) return a->b - b->b;
    if (a->kh != b->kh) return a->kh - b->kh;
    return a->seg - b->seg;
}

/* What backward's tasks share: the shape's constants, and the inputs in the
 * layouts the products read (bf16 only: Q and dO as rows for S and dP; Q, dO
 * and K as position pairs for dK, dV and dQ). */
struct attn_bwd {
    const struct olmo_attn_shape *s;
    int T, H, HK, D, group, q_stride, kv_stride, wq, kt_rows, ldt, pairs;
    bool bf16;
    const int *lo;
    int segs;
    const int *dq_rows; /* each run's rows in its dq copy (attn_bwd_schedule's rows) */
    float *dq;
    const float *q, *k, *v, *dout, *lse, *delta;
    const void *kt, *vt, *qa, *doa;
    const uint32_t *qp, *dop, *kp;
    float *dk, *dv;
};

/* A thread's tiles: P and dS; bf16 only: P^T and dS^T as query pairs, dS as rows; fp32 only:
 * the key block's K^T, V^T [D][ATT_KB] and K [ATT_KB][D], packed once per block (K^T and V^T
 * transposed from K and V rows) so that the products read them contiguous, and the task's Q and dO
 * rows per head of the group, contiguous: query t of the group's head g at qr / dor + (g T + t - qbase) D,
 * from the task's first query qbase, packed as its key blocks come to them (attn_bwd_block). */
struct attn_bwd_tiles {
    float *p, *ds, *kt, *vt, *kr, *qr, *dor;
    uint32_t *pt, *dst;
    uint16_t *dsr;
    int qbase;
};

/* delta[(b*H + h)*T + t] = dO . O (= sum_j p_j dO . v_j) */
static float *attn_delta(struct cpu_state *st, const float *out, const float *dout, const struct olmo_attn_shape *s) {
    const int T = s->seq_len, H = s->n_heads, D = s->head_dim, B = s->batch, q_stride = H * D;
    float *delta = cpu_cached_scratch(st, SLOT_DELTA, sizeof(float) * (size_t)B * H * T);
    if (!delta) return NULL;
#pragma omp parallel for if ((size_t)B * T * q_stride >= PAR_MIN)
    for (int bt = 0; bt < B * T; bt++)
        for (int h = 0; h < H; h++) {
            const float *o = out + (size_t)bt * q_stride + (size_t)h * D, *g = dout + (size_t)bt * q_stride + (size_t)h * D;
            float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
            for (int d = 0; d < D; d++) acc += g[d] * o[d];
            delta[((size_t)(bt / T) * H + h) * T + bt % T] = acc;
        }
    return delta;
}

/* Key blocks per (batch, kv head) run: as many runs as bring the tasks to ATT_BWD_TASKS (at most
 * one per key block), the same for every pair of the shape. */
static int attn_bwd_segments(const struct olmo_attn_shape *s) {
    const int kblocks = (s->seq_len + ATT_KB - 1) / ATT_KB, pairs = s->batch * s->n_kv_heads;
    int segs = pairs >= ATT_BWD_TASKS ? 1 : (ATT_BWD_TASKS + pairs - 1) / pairs;
    return segs < kblocks ? segs : kblocks > 0 ? kblocks : 1;
}

/* The tasks, longest first: each (batch, kv head)'s key blocks cut into `segs` runs of about equal
 * cost (queries that see a block x its keys), in key order.  rows[2 * ((b * HK + kh) * segs + g) + 0, 1]
 * = r0, r1: run g of that pair writes the rows of queries r0 .. r1-1 in its dq copy (an earlier run sees
 * them too), and those of the later queries it sees in dq itself (it is the first run they see).  Each
 * query sees itself, so every row of dq is one run's to set; run 0 has no copy (r0 = r1 = 0). */
static struct attn_task *attn_bwd_schedule(const struct olmo_attn_shape *s, const int *lo, int segs, int *n_tasks,
                                           int *rows) {
    const int T = s->seq_len, kblocks = (T + ATT_KB - 1) / ATT_KB;
    *n_tasks = s->batch * s->n_kv_heads * segs;
    struct attn_task *tasks = cpu_scratch(sizeof *tasks * (size_t)(*n_tasks > 0 ? *n_tasks : 1));
    double *cost = tasks ? cpu_scratch(sizeof(double) * (size_t)(kblocks > 0 ? kblocks : 1)) : NULL;
    if (!cost) {
        free(tasks);
        return NULL;
    }
    for (int b = 0, i = 0; b < s->batch; b++) {
        double total = 0.0;
        for (int kb = 0; kb < kblocks; kb++) {
            const int j0 = kb * ATT_KB, j1 = j0 + ATT_KB < T ? j0 + ATT_KB : T;
            int rows = 0; /* queries that see a key of this block */
            for (int t = j0; t < T && lo[(size_t)b * T + t] < j1; t++) rows++;
            cost[kb] = (double)rows * (j1 - j0) + 1.0;
            total += cost[kb];
        }
        /* run g ends at the first block where the cost so far reaches (g + 1) / segs of the total */
        for (int kh = 0; kh < s->n_kv_heads; kh++) {
            double sum = 0.0;
            int seen = 0; /* the end of the queries that the runs so far see (lo non-decreasing: a prefix) */
            for (int g = 0, kb = 0; g < segs; g++, i++) {
                const int kb0 = kb;
                double c = 0.0;
                while (kb < kblocks && (g == segs - 1 || sum + cost[kb] / 2 <= total * (g + 1) / segs))
                    sum += cost[kb], c += cost[kb], kb++;
                /* queries kb0 * ATT_KB .. tend-1 see keys of the run (lo non-decreasing) */
                const int j1 = kb * ATT_KB < T ? kb * ATT_KB : T;
                int tend = kb0 * ATT_KB;
                while (tend < T && lo[(size_t)b * T + tend] < j1) tend++;
                /* the run sees queries r0 .. end-1; those before `seen` an earlier run sees too */
                const int r0 = kb0 * ATT_KB, end = kb > kb0 ? tend : r0, r1 = seen < r0 ? r0 : seen > end ? end : seen;
                rows[2 * i] = r0, rows[2 * i + 1] = r1;
                if (end > seen) seen = end;
                tasks[i] = (struct attn_task){b, kh, kb0, kb, g, c};
            }
        }
    }
    free(cost);
    qsort(tasks, (size_t)*n_tasks, sizeof *tasks, task_cost_desc);
    return tasks;
}

/* dr[col] = pr[col] * (dr[col] - dl) * scale for a <= col <= e, 0 for the other col < n (dS from dP). */
#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
static inline void ds_row(float *dr, const float *pr, int n, int a, int e, float dl, float scale) {
    /* gcc leaves the portable loop scalar here (the conditional); the same operations on 8 lanes */
    const __m256 vdl = _mm256_set1_ps(dl), vscale = _mm256_set1_ps(scale);
    for (int c0 = 0; c0 < n; c0 += 8) {
        const __m256i visible = _mm256_andnot_si256(lane_mask8(a - c0), lane_mask8(e - c0 + 1));
        __m256 v = _mm256_setzero_ps();
        if (!_mm256_testz_si256(visible, visible))
            v = _mm256_and_ps(_mm256_castsi256_ps(visible),
                              _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(pr + c0),
                                                          _mm256_sub_ps(_mm256_loadu_ps(dr + c0), vdl)),
                                            vscale));
        if (c0 + 8 <= n)
            _mm256_storeu_ps(dr + c0, v);
        else
            _mm256_maskstore_ps(dr + c0, lane_mask8(n - c0), v);
    }
}
#else
static inline void ds_row(float *dr, const float *pr, int n, int a, int e, float dl, float scale) {
#pragma omp simd
    for (int col = 0; col < n; col++) dr[col] = col >= a && col <= e ? pr[col] * (dr[col] - dl) * scale : 0.0f;
}
#endif

/* One tile: queries i0 .. i0+nq-1 of head h against keys j0 .. j0+nk-1 of sequence b
 * (kv head kh): dK, dV of the keys, and dQ: the rows of queries before `own` in the task's dq copy dqt,
 * the others in dq.  No buffer is zeroed first: the key block's first tile (kv_first) sets dK and dV
 * (beta 0), the others add to them; dQ rows from `fresh` on have not been written yet and are set,
 * the earlier ones added to. */
static void attn_bwd_tile(const struct attn_bwd *c, const struct attn_bwd_tiles *w, int b, int kh, int h, int j0,
                          int nk, int i0, int nq, bool kv_first, int fresh, int own, float *dkblk, float *dvblk,
                          float *dqt) {
    const int T = c->T, D = c->D, q_stride = c->q_stride, kv_stride = c->kv_stride, wq = c->wq;
    const bool bf16 = c->bf16;
    const int *lob = c->lo + (size_t)b * T;
    const float *lse_bh = c->lse + ((size_t)b * c->H + h) * T, *delta_bh = c->delta + ((size_t)b * c->H + h) * T;
    const size_t kth = ((size_t)b * c->HK + kh) * c->kt_rows * c->ldt + j0; /* of kt and vt */
    const size_t qoff = ((size_t)b * T + i0) * q_stride + (size_t)h * D;
    /* fp32: the queries' Q and dO rows, contiguous (the dK and dV products' B operands) */
    const size_t hoff = ((size_t)(h - kh * c->group) * T + i0 - w->qbase) * D;
    const float *qblk = bf16 ? NULL : w->qr + hoff, *doblk = bf16 ? NULL : w->dor + hoff;
    /* fp32: the task's packed K^T, V^T and K; bf16: the shared arrays */
    const void *ktile = bf16 ? word_at(c->kt, kth) : w->kt, *vtile = bf16 ? word_at(c->vt, kth) : w->vt;
    const int ldkt = bf16 ? c->ldt : ATT_KB;
    float *p = w->p, *ds = w->ds;
    /* the visible keys of each query row, and the visible queries of each key row (both non-decreasing) */
    int vis_a[ATT_QC], vis_e[ATT_QC], seen_a[ATT_KB], seen_e[ATT_KB];
    for (int r = 0; r < nq; r++) row_visible(lob, i0 + r, j0, nk, &vis_a[r], &vis_e[r]);
    for (int col = 0, t = i0; col < nk; col++) {
        while (t < i0 + nq && lob[t] <= j0 + col) t++;
        seen_a[col] = j0 + col - i0 > 0 ? j0 + col - i0 : 0;
        seen_e[col] = t - 1 - i0;
    }
    const struct tile_span cols = {vis_a, vis_e, false}, queries = {seen_a, seen_e, true};
    const float kv_beta = kv_first ? 0.0f : 1.0f;
    ATTN_BEGIN(ATTN_BWD_S);
#ifdef ATT_FUSED_EXP
    if (!bf16)
        tile_gemm_exp(&cols, nq, nk, D, c->s->scale, qblk, D, ktile, ldkt, lse_bh + i0, p, ATT_KB);
    else
#endif
    {
        tile_product(&cols, bf16, false, nq, nk, D, c->s->scale, word_at(c->qa, qoff / wq), q_stride / wq, ktile, ldkt,
                     0.0f, p, ATT_KB);
        for (int r = 0; r < nq; r++) exp_visible(p + (size_t)r * ATT_KB, nk, vis_a[r], vis_e[r], lse_bh[i0 + r]);
    }
    ATTN_END();
    ATTN_BEGIN(ATTN_BWD_DV);
    /* dV += P^T dO (i0 is even: dO's pairs start at i0 / 2) */
    const size_t qpairs = ((size_t)b * c->pairs + i0 / 2) * q_stride + (size_t)h * D;
    if (bf16) {
        pack_bf16_pairs(w->pt, ATT_KB, p, ATT_KB, nq, nk);
        tile_product(&queries, true, true, nk, D, nq, 1.0f, w->pt, ATT_KB, c->dop + qpairs, q_stride, kv_beta, dvblk,
                     kv_stride);
    } else {
        tile_gemm(&queries, true, nk, D, nq, 1.0f, p, ATT_KB, doblk, D, kv_beta, dvblk, kv_stride);
    }
    ATTN_END();
    ATTN_BEGIN(ATTN_BWD_DS);
    /* dP = dO V^T, then dS = P * (dP - delta) * scale */
    const float scale = c->s->scale;
#ifdef ATT_FUSED_EXP
    if (!bf16) {
        tile_gemm_ds(&cols, nq, nk, D, doblk, D, vtile, ldkt, delta_bh + i0, p, scale, ds, ATT_KB);
    } else
#endif
    {
        tile_product(&cols, bf16, false, nq, nk, D, 1.0f, word_at(c->doa, qoff / wq), q_stride / wq, vtile, ldkt, 0.0f,
                     ds, ATT_KB);
        for (int r = 0; r < nq; r++) /* dP is not computed (nor read) outside the visible columns: dS is 0 there */
            ds_row(ds + (size_t)r * ATT_KB, p + (size_t)r * ATT_KB, nk, vis_a[r], vis_e[r], delta_bh[i0 + r], scale);
    }
    ATTN_END();
    ATTN_BEGIN(ATTN_BWD_DK);
    /* dK += dS^T Q;  dQ += dS K (j0 is even: K's pairs start at j0 / 2) */
    if (bf16) {
        pack_bf16_pairs(w->dst, ATT_KB, ds, ATT_KB, nq, nk);
        tile_product(&queries, true, true, nk, D, nq, 1.0f, w->dst, ATT_KB, c->qp + qpairs, q_stride, kv_beta, dkblk,
                     kv_stride);
        pack_bf16_rows(w->dsr, ATT_KB, ds, ATT_KB, nq, nk);
    } else {
        tile_gemm(&queries, true, nk, D, nq, 1.0f, ds, ATT_KB, qblk, D, kv_beta, dkblk, kv_stride);
    }
    ATTN_END(); /* bf16: dS's rows, packed above, count with dK */
    ATTN_BEGIN(ATTN_BWD_DQ);
    /* the dQ product's rows in up to three parts, cut where they go from added to (rows before `fresh`)
     * to set, and from the dq copy to dq (rows before `own` / from it) */
    const int split = fresh - i0 < 0 ? 0 : fresh - i0 > nq ? nq : fresh - i0;
    const int mine = own - i0 < 0 ? 0 : own - i0 > nq ? nq : own - i0;
    const int cut[4] = {0, split < mine ? split : mine, split < mine ? mine : split, nq};
    for (int part = 0; part < 3; part++) {
        const int r0 = cut[part], m = cut[part + 1] - r0;
        if (m == 0) continue;
        const struct tile_span terms = {vis_a + r0, vis_e + r0, true};
        float *dqr = (r0 < mine ? dqt : c->dq) + qoff + (size_t)r0 * q_stride;
        const float beta = r0 < split ? 1.0f : 0.0f;
        if (bf16)
            tile_product(&terms, true, false, m, D, nk, 1.0f, w->dsr + (size_t)r0 * ATT_KB, ATT_KB / 2,
                         c->kp + ((size_t)b * c->pairs + j0 / 2) * kv_stride + (size_t)kh * D, kv_stride, beta, dqr,
                         q_stride);
        else
            tile_gemm(&terms, false, m, D, nk, 1.0f, ds + (size_t)r0 * ATT_KB, ATT_KB, w->kr, D, beta, dqr, q_stride);
    }
    ATTN_END();
}

/* One key block: its dK and dV, over every query chunk of every head of the group that sees it;
 * its dQ contributions into dqt (queries before `own`) and dq, whose rows from `fresh` on are not
 * written yet.  Returns the end of the queries that see the block: the rows written so far, from the
 * run's first block's on. */
static int attn_bwd_block(const struct attn_bwd *c, const struct attn_bwd_tiles *w, int b, int kh, int kb,
                          int fresh, int own, float *dqt) {
    const int T = c->T, D = c->D, kv_stride = c->kv_stride;
    const int j0 = kb * ATT_KB;
    const int nk = j0 + ATT_KB < T ? ATT_KB : T - j0;
    const int *lob = c->lo + (size_t)b * T;
    const size_t koff = ((size_t)b * T + j0) * kv_stride + (size_t)kh * D;
    float *dkblk = c->dk + koff, *dvblk = c->dv + koff;
    /* queries j0 .. tend-1 see some of these keys (lo non-decreasing); tend >= j0 + nk (a query sees itself),
     * so the first chunk (i0 = j0) sees every key of the block: its tile sets every row of dK and dV */
    int tend = j0;
    while (tend < T && lob[tend] < j0 + nk) tend++;
    ATTN_BEGIN(ATTN_BWD_PACK);
    if (!c->bf16) { /* the keys' K^T, V^T and K, contiguous: transposed here, from K and V */
        pack_transposed(w->kt, ATT_KB, c->k + koff, kv_stride, nk, D);
        pack_transposed(w->vt, ATT_KB, c->v + koff, kv_stride, nk, D);
        pack_rows(w->kr, c->k + koff, kv_stride, nk, D);
        /* the Q and dO rows of the queries that no earlier block of the task saw (fresh .. tend-1) */
        for (int g = 0; g < c->group && fresh < tend; g++) {
            const size_t from = ((size_t)b * T + fresh) * c->q_stride + (size_t)(kh * c->group + g) * D;
            const size_t to = ((size_t)g * T + fresh - w->qbase) * D;
            pack_rows(w->qr + to, c->q + from, c->q_stride, tend - fresh, D);
            pack_rows(w->dor + to, c->dout + from, c->q_stride, tend - fresh, D);
        }
    }
    ATTN_END();
    for (int h = kh * c->group; h < (kh + 1) * c->group; h++)
        for (int i0 = j0; i0 < tend; i0 += ATT_QC) {
            const int nq = i0 + ATT_QC < tend ? ATT_QC : tend - i0;
            attn_bwd_tile(c, w, b, kh, h, j0, nk, i0, nq, h == kh * c->group && i0 == j0, fresh, own, dkblk,
                          dvblk, dqt);
        }
    return tend > fresh ? tend : fresh;
}

/* One task: its run of key blocks in order, their dQ contributions into the rows of this (batch, kv
 * head) that it owns (attn_bwd_schedule's rows: r0 .. r1-1 of its dq copy, the later ones of dq): the
 * queries that see the run, from kb0 * ATT_KB, each row set by its first tile and added to by the later
 * ones (the queries that see a block are a contiguous range from its first key, so those of the run's
 * blocks in order are too).  Every query sees itself: nothing is left to zero. */
static void attn_bwd_task(const struct attn_bwd *c, const struct attn_bwd_tiles *w, const struct attn_task *task,
                          float *dqt) {
    const int first = task->kb0 * ATT_KB;
    const int *run = c->dq_rows + 2 * (((size_t)task->b * c->HK + task->kh) * c->segs + task->seg);
    struct attn_bwd_tiles mine = *w;
    mine.qbase = first;
    int written = first; /* also the end of the Q and dO rows packed so far */
    for (int kb = task->kb0; kb < task->kb1; kb++)
        written = attn_bwd_block(c, &mine, task->b, task->kh, kb, written, run[1], dqt);
}

static int attention_bwd(struct cpu_state *st, bool bf16_products, float *dq, float *dk, float *dv,
                         const float *dout, const float *out, const float *lse, const float *q, const float *k,
                         const float *v, const int32_t *doc_ids, const struct olmo_attn_shape *s) {
    const int T = s->seq_len, H = s->n_heads, HK = s->n_kv_heads, D = s->head_dim, B = s->batch;
    const bool bf16 = attn_bf16(bf16_products, s);
    ATTN_CALL_BEGIN();
    struct attn_bwd c = {.s = s, .T = T, .H = H, .HK = HK, .D = D, .group = H / HK, .q_stride = H * D,
                         .kv_stride = HK * D, .wq = bf16 ? 2 : 1, /* floats per element of the operands with k = D */
                         .ldt = transposed_ld(T), .pairs = (T + 1) / 2, .bf16 = bf16, .q = q, .k = k, .v = v, .dout = dout,
                         .lse = lse, .dk = dk, .dv = dv};
    c.kt_rows = D / c.wq;
    const size_t n_q = (size_t)B * T * c.q_stride;
    int *lo = attn_bounds(s, doc_ids);
    c.lo = lo;
    /* bf16: K and V transposed per head as pairs (fp32 transposes each key block as it packs it) */
    c.kt = bf16 ? (const void *)transpose_heads_pairs(st, SLOT_KT, k, B, T, HK, D) : k;
    c.vt = bf16 ? (const void *)transpose_heads_pairs(st, SLOT_VT, v, B, T, HK, D) : v;
    c.qa = bf16 ? (const void *)bf16_rows(st, SLOT_Q16, q, B, T, c.q_stride) : q;
    c.doa = bf16 ? (const void *)bf16_rows(st, SLOT_DO16, dout, B, T, c.q_stride) : dout;
    /* fp32: each thread's Q and dO rows of a sequence, per head of a group (in the slot of the bf16 Q rows,
     * unused then), packed as the tasks come to them, where the products then find them in cache: one
     * thread, T 2048, 6 heads of 64, forced AVX2, against per-head copies made ahead in one pass (two
     * alternating rounds): window 256 61.7 / 64.0 -> 66.6 / 66.1 GFLOP/s, full 71.6 / 70.3 -> 71.7 / 76.2 */
    const size_t qd_floats = (size_t)c.group * T * D;
    float *qd_mine = bf16 ? NULL : cpu_cached_scratch(st, SLOT_Q16, sizeof(float) * 2 * qd_floats * (size_t)omp_get_max_threads());
    c.qp = bf16 ? bf16_position_pairs(st, SLOT_QP, q, B, T, c.q_stride) : NULL;
    c.dop = bf16 ? bf16_position_pairs(st, SLOT_DOP, dout, B, T, c.q_stride) : NULL;
    c.kp = bf16 ? bf16_position_pairs(st, SLOT_KP, k, B, T, c.kv_stride) : NULL;
    c.delta = attn_delta(st, out, dout, s);
    const int segs = c.segs = attn_bwd_segments(s);
    int n_tasks = 0;
    struct attn_task *tasks = NULL;
    float **dq_part = NULL, *parts = NULL, *tiles = NULL;
    int *rows = NULL;
    size_t stride = 0;
    const bool inputs = lo && c.kt && c.vt && c.qa && c.doa && c.delta && (bf16 ? c.qp && c.dop && c.kp : qd_mine != NULL);
    if (inputs && (c.dq_rows = rows = cpu_scratch(sizeof(int) * 2 * (size_t)B * HK * segs)) &&
        (tasks = attn_bwd_schedule(s, lo, segs, &n_tasks, rows)) &&
        (dq_part = cpu_scratch(sizeof(float *) * (size_t)segs)) &&
        (segs == 1 || (parts = cpu_cached_scratch(st, SLOT_DQ_PARTS, sizeof(float) * n_q * (size_t)(segs - 1)))))
        /* per thread: P, dS; bf16 only: P^T and dS^T as query pairs, dS as rows */
        tiles = thread_tiles(2 * (size_t)ATT_QC * ATT_KB + (bf16 ? 2 * (size_t)ATT_QC / 2 * ATT_KB +
                                                                     (size_t)ATT_QC * ATT_KB / 2
                                                                : 3 * (size_t)ATT_KB * D),
                             &stride);
    if (!tiles) {
        free(dq_part);
        free(tasks);
        free(rows);
        free(lo);
        return -1;
    }
    /* dq copies: run s > 0 writes copy s where an earlier run sees the queries too (run 0 has none) */
    c.dq = dq;
    dq_part[0] = dq;
    for (int g = 1; g < segs; g++) dq_part[g] = parts + n_q * (size_t)(g - 1);
    ATTN_SERIAL(ATTN_BWD_PREP, attn_t_call);
#pragma omp parallel if (n_tasks > 1)
    {
        ATTN_THREAD_BEGIN();
        float *mine = tiles + stride * (size_t)omp_get_thread_num();
        const size_t tile = (size_t)ATT_QC * ATT_KB;
        const struct attn_bwd_tiles w = {
            .p = mine,
            .ds = mine + tile,
            .kt = bf16 ? NULL : mine + 2 * tile,
            .vt = bf16 ? NULL : mine + 2 * tile + (size_t)ATT_KB * D,
            .kr = bf16 ? NULL : mine + 2 * tile + 2 * (size_t)ATT_KB * D,
            .pt = bf16 ? (uint32_t *)(mine + 2 * tile) : NULL,
            .dst = bf16 ? (uint32_t *)(mine + 2 * tile + tile / 2) : NULL,
            .dsr = bf16 ? (uint16_t *)(mine + 3 * tile) : NULL,
            .qr = bf16 ? NULL : qd_mine + 2 * qd_floats * (size_t)omp_get_thread_num(),
            .dor = bf16 ? NULL : qd_mine + 2 * qd_floats * (size_t)omp_get_thread_num() + qd_floats,
        };
        /* the longest first; each task owns what it writes, so any thread may take it */
#pragma omp for schedule(dynamic)
        for (int i = 0; i < n_tasks; i++) attn_bwd_task(&c, &w, &tasks[i], dq_part[tasks[i].seg]);
        ATTN_THREAD_END();
    }
    ATTN_MARK(attn_t_sum);
    if (segs > 1) { /* dq += the copies, in run order, on the rows each wrote there */
        const int width = c.group * D, row_blocks = (T + 63) / 64;
#pragma omp parallel for if (n_q >= PAR_MIN)
        for (int job = 0; job < B * HK * row_blocks; job++) {
            const int pair = job / row_blocks, b = pair / HK, kh = pair % HK, t0 = job % row_blocks * 64;
            const int t1 = t0 + 64 < T ? t0 + 64 : T;
            const int *run = rows + 2 * (size_t)pair * segs;
            for (int t = t0; t < t1; t++) {
                const size_t at = ((size_t)b * T + t) * c.q_stride + (size_t)kh * width;
                float *out = dq + at;
                for (int g = 1; g < segs; g++)
                    if (t >= run[2 * g] && t < run[2 * g + 1]) {
                        const float *part = dq_part[g] + at;
#pragma omp simd
                        for (int d = 0; d < width; d++) out[d] += part[d];
                    }
            }
        }
    }
    ATTN_SERIAL(ATTN_BWD_DQSUM, attn_t_sum);
    ATTN_CALL_END(1, lo, s);
    free(tiles);
    free(dq_part);
    free(tasks);
    free(rows);
    free(lo);
    return 0;
}

#endif
