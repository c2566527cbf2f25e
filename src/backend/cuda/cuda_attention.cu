/* Flash-style causal attention for the CUDA backend, fp32, with the sliding
 * window (window = keys visible including self, 0 = full causal), optional
 * intra-document masking (doc_ids: a key is visible only from queries of the
 * same document) and GQA (query head h reads kv head h / (n_heads / n_kv_heads)).
 *
 * Tiling: 64 queries x 64 keys per step, 256 threads as a 16 x 16 grid, each
 * thread owning a 4 x 4 block of the score tile (rows ty + 16 i, columns
 * tx + 16 j) and, for outputs, 4 rows x head_dim/16 columns (d = tx + 16 c).
 * Tiles live in shared memory with an odd row stride, so both the row-wise
 * and column-wise reads are free of bank conflicts.  The head dimension is a
 * template parameter only to size the per-thread register accumulators
 * (head_dim <= 64 or <= 128; Olmo 3 uses 128).
 *
 * Forward: online softmax over key tiles (running max and sum per row), one
 * block per (query tile, head, batch); saves lse = max + log(sum) of the
 * scaled scores.  Key tiles entirely outside the window are skipped.
 *
 * Backward (FlashAttention-2 style, but deterministic: no atomics):
 *   delta[row] = dO . O (a warp per row and head);
 *   dK, dV: one block per (key tile, kv head, batch) loops over the query
 *     heads of its group and over the query tiles that can see the keys,
 *     recomputing P = exp(S - lse) and dS = P (dO V^T - delta) scale;
 *   dQ: one block per (query tile, head, batch) loops over the key tiles,
 *     recomputing the same P and dS.
 * S and dP are recomputed once more than in the atomic variant (about 1.4x
 * the FLOPs of a single backward pass) in exchange for bitwise-reproducible
 * gradients. */
#include <math.h>

#include "backend/cuda/cuda_internal.h"

#define ATT_TILE OLMO_ATT_TILE
#define ATT_TPD 16 /* threads per tile dimension */
#define ATT_PLD (ATT_TILE + 1)

struct att_params {
    int T, H, HK, D, group, window, ld;
    float scale;
    size_t q_stride, kv_stride;
};

/* Copies rows row0 .. row0+63 (of T) of a [T, stride] matrix, columns 0..D-1,
 * into a [64, ld] shared tile; rows past T are zero. */
static __device__ void att_load_tile(float *dst, const float *src, size_t stride, int row0, int T, int D, int ld) {
    const int tid = threadIdx.y * ATT_TPD + threadIdx.x;
    for (int e = tid; e < ATT_TILE * D; e += ATT_TPD * ATT_TPD) {
        const int r = e / D, c = e - r * D, t = row0 + r;
        dst[r * ld + c] = t < T ? src[(size_t)t * stride + c] : 0.0f;
    }
}

/* Document ids of a tile's rows; rows past T get `pad` (never equal to a real id or to the other pad). */
static __device__ void att_load_docs(int *dst, const int32_t *docs, int row0, int T, int pad) {
    const int tid = threadIdx.y * ATT_TPD + threadIdx.x;
    if (tid < ATT_TILE) {
        const int t = row0 + tid;
        dst[tid] = t < T ? (docs ? docs[t] : 0) : pad;
    }
}

/* Reductions over the 16 threads sharing ty (lanes differing in bits 0..3). */
static __device__ __forceinline__ float row16_max(float v) {
    for (int o = 8; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
static __device__ __forceinline__ float row16_sum(float v) {
    for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* ---------------------------------------------------------------- forward */

template <int DMAX>
static __global__ void __launch_bounds__(256) att_fwd_kernel(float *out, float *lse, const float *q,
                                                             const float *k, const float *v,
                                                             const int32_t *doc_ids, struct att_params p) {
    constexpr int DPT = DMAX / ATT_TPD;
    OLMO_DYNAMIC_SMEM(float, smem);
    __shared__ int qdoc[ATT_TILE], kdoc[ATT_TILE];
    const int ld = p.ld, D = p.D, T = p.T;
    float *Qs = smem, *KVs = Qs + ATT_TILE * ld, *Ps = KVs + ATT_TILE * ld;
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int q0 = blockIdx.x * ATT_TILE, h = blockIdx.y, b = blockIdx.z, kh = h / p.group;
    const float *qb = q + (size_t)b * T * p.q_stride + (size_t)h * D;
    const float *kb = k + (size_t)b * T * p.kv_stride + (size_t)kh * D;
    const float *vb = v + (size_t)b * T * p.kv_stride + (size_t)kh * D;
    const int32_t *docs = doc_ids ? doc_ids + (size_t)b * T : NULL;

    att_load_tile(Qs, qb, p.q_stride, q0, T, D, ld);
    att_load_docs(qdoc, docs, q0, T, -1);

    float m_run[4], l_run[4], acc[4][DPT];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        m_run[i] = -INFINITY;
        l_run[i] = 0.0f;
#pragma unroll
        for (int c = 0; c < DPT; c++) acc[i][c] = 0.0f;
    }

    const int k_end = min(T, q0 + ATT_TILE);
    for (int k0 = olmo_att_first_key_tile(q0, p.window); k0 < k_end; k0 += ATT_TILE) {
        __syncthreads(); /* previous tile's K/V and P are no longer read */
        att_load_tile(KVs, kb, p.kv_stride, k0, T, D, ld);
        att_load_docs(kdoc, docs, k0, T, -2);
        __syncthreads();

        float s[4][4];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) s[i][j] = 0.0f;
        for (int d = 0; d < D; d++) {
            float qa[4], ka[4];
#pragma unroll
            for (int i = 0; i < 4; i++) qa[i] = Qs[(ty + ATT_TPD * i) * ld + d];
#pragma unroll
            for (int j = 0; j < 4; j++) ka[j] = KVs[(tx + ATT_TPD * j) * ld + d];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) s[i][j] = fmaf(qa[i], ka[j], s[i][j]);
        }

#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = ty + ATT_TPD * i, t = q0 + r;
            float mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int c = tx + ATT_TPD * j;
                s[i][j] = olmo_att_visible(t, k0 + c, p.window, qdoc[r], kdoc[c]) ? s[i][j] * p.scale : -INFINITY;
                mx = fmaxf(mx, s[i][j]);
            }
            mx = row16_max(mx);
            const float m_new = fmaxf(m_run[i], mx);
            float alpha = 1.0f, rowsum = 0.0f;
            if (m_new != -INFINITY) { /* otherwise nothing visible yet: p = 0, state unchanged */
                alpha = expf(m_run[i] - m_new);
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    s[i][j] = expf(s[i][j] - m_new);
                    rowsum += s[i][j];
                }
            } else {
#pragma unroll
                for (int j = 0; j < 4; j++) s[i][j] = 0.0f;
            }
            rowsum = row16_sum(rowsum);
            l_run[i] = l_run[i] * alpha + rowsum;
            m_run[i] = m_new;
#pragma unroll
            for (int c = 0; c < DPT; c++) acc[i][c] *= alpha;
#pragma unroll
            for (int j = 0; j < 4; j++) Ps[r * ATT_PLD + tx + ATT_TPD * j] = s[i][j];
        }
        __syncthreads(); /* all reads of K done, P written */
        att_load_tile(KVs, vb, p.kv_stride, k0, T, D, ld);
        __syncthreads();

        const int kn = min(ATT_TILE, T - k0);
        for (int j = 0; j < kn; j++) {
            float va[DPT];
#pragma unroll
            for (int c = 0; c < DPT; c++) {
                const int d = tx + ATT_TPD * c;
                va[c] = d < D ? KVs[j * ld + d] : 0.0f;
            }
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float pij = Ps[(ty + ATT_TPD * i) * ATT_PLD + j];
#pragma unroll
                for (int c = 0; c < DPT; c++) acc[i][c] = fmaf(pij, va[c], acc[i][c]);
            }
        }
    }

#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int t = q0 + ty + ATT_TPD * i;
        if (t >= T) continue;
        const float inv = 1.0f / l_run[i];
        float *ot = out + ((size_t)b * T + t) * p.q_stride + (size_t)h * D;
#pragma unroll
        for (int c = 0; c < DPT; c++) {
            const int d = tx + ATT_TPD * c;
            if (d < D) ot[d] = acc[i][c] * inv;
        }
        if (tx == 0) lse[((size_t)b * p.H + h) * T + t] = m_run[i] + logf(l_run[i]);
    }
}

/* --------------------------------------------------------------- backward */

/* delta[b, h, t] = sum_d dO[b, t, h, d] * O[b, t, h, d]; one warp per (row, head). */
static __global__ void att_delta_kernel(float *delta, const float *dout, const float *out, int T, int H, int D,
                                        size_t n_rows) {
    const size_t w = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x & 31;
    if (w >= n_rows * H) return; /* whole warps exit together */
    const size_t row = w / H;
    const int h = (int)(w % H);
    const float *o = out + row * H * D + (size_t)h * D, *g = dout + row * H * D + (size_t)h * D;
    float acc = 0.0f;
    for (int d = lane; d < D; d += 32) acc = fmaf(g[d], o[d], acc);
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) {
        const size_t b = row / T, t = row % T;
        delta[(b * H + h) * T + t] = acc;
    }
}

/* Scores S = Q K^T and dP = dO V^T of one 64 x 64 tile (rows: queries). */
static __device__ __forceinline__ void att_s_dp(float s[4][4], float dp[4][4], const float *Qs, const float *dOs,
                                                const float *Ks, const float *Vs, int D, int ld) {
    const int tx = threadIdx.x, ty = threadIdx.y;
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) s[i][j] = dp[i][j] = 0.0f;
    for (int d = 0; d < D; d++) {
        float qa[4], oa[4], ka[4], va[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            qa[i] = Qs[(ty + ATT_TPD * i) * ld + d];
            oa[i] = dOs[(ty + ATT_TPD * i) * ld + d];
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            ka[j] = Ks[(tx + ATT_TPD * j) * ld + d];
            va[j] = Vs[(tx + ATT_TPD * j) * ld + d];
        }
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                s[i][j] = fmaf(qa[i], ka[j], s[i][j]);
                dp[i][j] = fmaf(oa[i], va[j], dp[i][j]);
            }
    }
}

template <int DMAX>
static __global__ void __launch_bounds__(256) att_bwd_dkdv_kernel(float *dk, float *dv, const float *dout,
                                                                  const float *q, const float *k, const float *v,
                                                                  const float *lse, const float *delta,
                                                                  const int32_t *doc_ids, struct att_params p) {
    constexpr int DPT = DMAX / ATT_TPD;
    OLMO_DYNAMIC_SMEM(float, smem);
    __shared__ int qdoc[ATT_TILE], kdoc[ATT_TILE];
    __shared__ float lse_s[ATT_TILE], delta_s[ATT_TILE];
    const int ld = p.ld, D = p.D, T = p.T;
    float *Ks = smem, *Vs = Ks + ATT_TILE * ld, *Qs = Vs + ATT_TILE * ld, *dOs = Qs + ATT_TILE * ld;
    float *Ps = dOs + ATT_TILE * ld, *dSs = Ps + ATT_TILE * ATT_PLD;
    const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * ATT_TPD + tx;
    const int k0 = blockIdx.x * ATT_TILE, kh = blockIdx.y, b = blockIdx.z;
    const int32_t *docs = doc_ids ? doc_ids + (size_t)b * T : NULL;

    att_load_tile(Ks, k + (size_t)b * T * p.kv_stride + (size_t)kh * D, p.kv_stride, k0, T, D, ld);
    att_load_tile(Vs, v + (size_t)b * T * p.kv_stride + (size_t)kh * D, p.kv_stride, k0, T, D, ld);
    att_load_docs(kdoc, docs, k0, T, -2);

    float dk_acc[4][DPT], dv_acc[4][DPT]; /* keys ty + 16 a, columns tx + 16 c */
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int c = 0; c < DPT; c++) dk_acc[a][c] = dv_acc[a][c] = 0.0f;

    /* Queries that can see keys k0 .. k0+63: t >= k0 and, with a window, t < k0 + 63 + window. */
    const int q_end = p.window > 0 ? min(T, k0 + ATT_TILE - 1 + p.window) : T;
    for (int h = kh * p.group; h < (kh + 1) * p.group; h++) {
        const float *qb = q + (size_t)b * T * p.q_stride + (size_t)h * D;
        const float *ob = dout + (size_t)b * T * p.q_stride + (size_t)h * D;
        const float *lse_h = lse + ((size_t)b * p.H + h) * T, *delta_h = delta + ((size_t)b * p.H + h) * T;
        for (int q0 = k0; q0 < q_end; q0 += ATT_TILE) {
            __syncthreads(); /* previous Q/dO/P/dS no longer read */
            att_load_tile(Qs, qb, p.q_stride, q0, T, D, ld);
            att_load_tile(dOs, ob, p.q_stride, q0, T, D, ld);
            att_load_docs(qdoc, docs, q0, T, -1);
            if (tid < ATT_TILE) {
                const int t = q0 + tid;
                lse_s[tid] = t < T ? lse_h[t] : 0.0f;
                delta_s[tid] = t < T ? delta_h[t] : 0.0f;
            }
            __syncthreads();

            float s[4][4], dp[4][4];
            att_s_dp(s, dp, Qs, dOs, Ks, Vs, D, ld);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int r = ty + ATT_TPD * i, t = q0 + r;
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const int c = tx + ATT_TPD * j;
                    float pij = 0.0f, dsij = 0.0f;
                    if (olmo_att_visible(t, k0 + c, p.window, qdoc[r], kdoc[c])) {
                        pij = expf(s[i][j] * p.scale - lse_s[r]);
                        dsij = pij * (dp[i][j] - delta_s[r]) * p.scale;
                    }
                    Ps[r * ATT_PLD + c] = pij;
                    dSs[r * ATT_PLD + c] = dsij;
                }
            }
            __syncthreads();

            const int qn = min(ATT_TILE, T - q0);
            for (int r = 0; r < qn; r++) {
                float qa[DPT], oa[DPT];
#pragma unroll
                for (int c = 0; c < DPT; c++) {
                    const int d = tx + ATT_TPD * c;
                    qa[c] = d < D ? Qs[r * ld + d] : 0.0f;
                    oa[c] = d < D ? dOs[r * ld + d] : 0.0f;
                }
#pragma unroll
                for (int a = 0; a < 4; a++) {
                    const float pv = Ps[r * ATT_PLD + ty + ATT_TPD * a], dsv = dSs[r * ATT_PLD + ty + ATT_TPD * a];
#pragma unroll
                    for (int c = 0; c < DPT; c++) {
                        dv_acc[a][c] = fmaf(pv, oa[c], dv_acc[a][c]);
                        dk_acc[a][c] = fmaf(dsv, qa[c], dk_acc[a][c]);
                    }
                }
            }
        }
    }

#pragma unroll
    for (int a = 0; a < 4; a++) {
        const int key = k0 + ty + ATT_TPD * a;
        if (key >= T) continue;
        const size_t off = ((size_t)b * T + key) * p.kv_stride + (size_t)kh * D;
#pragma unroll
        for (int c = 0; c < DPT; c++) {
            const int d = tx + ATT_TPD * c;
            if (d < D) {
                dk[off + d] = dk_acc[a][c];
                dv[off + d] = dv_acc[a][c];
            }
        }
    }
}

template <int DMAX>
static __global__ void __launch_bounds__(256) att_bwd_dq_kernel(float *dq, const float *dout, const float *q,
                                                                const float *k, const float *v, const float *lse,
                                                                const float *delta, const int32_t *doc_ids,
                                                                struct att_params p) {
    constexpr int DPT = DMAX / ATT_TPD;
    OLMO_DYNAMIC_SMEM(float, smem);
    __shared__ int qdoc[ATT_TILE], kdoc[ATT_TILE];
    __shared__ float lse_s[ATT_TILE], delta_s[ATT_TILE];
    const int ld = p.ld, D = p.D, T = p.T;
    float *Qs = smem, *dOs = Qs + ATT_TILE * ld, *Ks = dOs + ATT_TILE * ld, *Vs = Ks + ATT_TILE * ld;
    float *dSs = Vs + ATT_TILE * ld;
    const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * ATT_TPD + tx;
    const int q0 = blockIdx.x * ATT_TILE, h = blockIdx.y, b = blockIdx.z, kh = h / p.group;
    const int32_t *docs = doc_ids ? doc_ids + (size_t)b * T : NULL;
    const float *kb = k + (size_t)b * T * p.kv_stride + (size_t)kh * D;
    const float *vb = v + (size_t)b * T * p.kv_stride + (size_t)kh * D;

    att_load_tile(Qs, q + (size_t)b * T * p.q_stride + (size_t)h * D, p.q_stride, q0, T, D, ld);
    att_load_tile(dOs, dout + (size_t)b * T * p.q_stride + (size_t)h * D, p.q_stride, q0, T, D, ld);
    att_load_docs(qdoc, docs, q0, T, -1);
    if (tid < ATT_TILE) {
        const int t = q0 + tid;
        lse_s[tid] = t < T ? lse[((size_t)b * p.H + h) * T + t] : 0.0f;
        delta_s[tid] = t < T ? delta[((size_t)b * p.H + h) * T + t] : 0.0f;
    }

    float dq_acc[4][DPT]; /* rows ty + 16 i, columns tx + 16 c */
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int c = 0; c < DPT; c++) dq_acc[i][c] = 0.0f;

    const int k_end = min(T, q0 + ATT_TILE);
    for (int k0 = olmo_att_first_key_tile(q0, p.window); k0 < k_end; k0 += ATT_TILE) {
        __syncthreads();
        att_load_tile(Ks, kb, p.kv_stride, k0, T, D, ld);
        att_load_tile(Vs, vb, p.kv_stride, k0, T, D, ld);
        att_load_docs(kdoc, docs, k0, T, -2);
        __syncthreads();

        float s[4][4], dp[4][4];
        att_s_dp(s, dp, Qs, dOs, Ks, Vs, D, ld);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = ty + ATT_TPD * i, t = q0 + r;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int c = tx + ATT_TPD * j;
                float dsij = 0.0f;
                if (olmo_att_visible(t, k0 + c, p.window, qdoc[r], kdoc[c])) {
                    const float pij = expf(s[i][j] * p.scale - lse_s[r]);
                    dsij = pij * (dp[i][j] - delta_s[r]) * p.scale;
                }
                dSs[r * ATT_PLD + c] = dsij;
            }
        }
        __syncthreads();

        const int kn = min(ATT_TILE, T - k0);
        for (int j = 0; j < kn; j++) {
            float ka[DPT];
#pragma unroll
            for (int c = 0; c < DPT; c++) {
                const int d = tx + ATT_TPD * c;
                ka[c] = d < D ? Ks[j * ld + d] : 0.0f;
            }
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float dsv = dSs[(ty + ATT_TPD * i) * ATT_PLD + j];
#pragma unroll
                for (int c = 0; c < DPT; c++) dq_acc[i][c] = fmaf(dsv, ka[c], dq_acc[i][c]);
            }
        }
    }

#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int t = q0 + ty + ATT_TPD * i;
        if (t >= T) continue;
        float *dqt = dq + ((size_t)b * T + t) * p.q_stride + (size_t)h * D;
#pragma unroll
        for (int c = 0; c < DPT; c++) {
            const int d = tx + ATT_TPD * c;
            if (d < D) dqt[d] = dq_acc[i][c];
        }
    }
}

/* ------------------------------------------------- inference: KV cache */

#define CACHED_THREADS 128

/* One block per (new query row i, head h): the scaled scores of the visible
 * cached keys (a warp per key, lanes across head_dim) go to scratch, then the
 * softmax over them, then out[d] = sum_j p_j v_j[d] with a thread per d and
 * the keys in order, as cpu.c sums them.  Decoding is one row at a time, so
 * this favours simplicity over the tiling of the training kernels. */
static __global__ void __launch_bounds__(CACHED_THREADS)
    att_cached_kernel(float *out, const float *q, const float *k_cache, const float *v_cache, float *scores, int pos0,
                      int cap, int H, int group, int D, int window, int max_keys, float scale) {
    __shared__ float q_row[128];
    __shared__ float warp_max[CACHED_THREADS / 32];
    __shared__ double warp_sum[CACHED_THREADS / 32];
    const int i = blockIdx.x, h = blockIdx.y, kh = h / group;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    const int t = pos0 + i, lo = window > 0 && t - window + 1 > 0 ? t - window + 1 : 0;
    const size_t q_stride = (size_t)H * D, kv_stride = (size_t)(H / group) * D;
    float *sc = scores + ((size_t)i * H + h) * (size_t)max_keys;
    for (int d = threadIdx.x; d < D; d += blockDim.x) q_row[d] = q[(size_t)i * q_stride + (size_t)h * D + d];
    __syncthreads();
    float mx = -INFINITY;
    for (int j = lo + warp; j <= t; j += n_warps) { /* warp-uniform loop: every lane reaches the shuffles */
        const float *kj = k_cache + (size_t)(j % cap) * kv_stride + (size_t)kh * D;
        float acc = 0.0f;
        for (int d = lane; d < D; d += 32) acc = fmaf(q_row[d], kj[d], acc);
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        const float s = acc * scale;
        if (lane == 0) sc[j - lo] = s;
        mx = fmaxf(mx, s);
    }
    if (lane == 0) warp_max[warp] = mx;
    __syncthreads(); /* also publishes the scores */
    mx = warp_max[0];
    for (int w = 1; w < n_warps; w++) mx = fmaxf(mx, warp_max[w]);
    double part = 0.0;
    for (int j = lo + (int)threadIdx.x; j <= t; j += blockDim.x) {
        const float p = expf(sc[j - lo] - mx);
        sc[j - lo] = p;
        part += p;
    }
    for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
    if (lane == 0) warp_sum[warp] = part;
    __syncthreads(); /* also publishes the probabilities */
    double denom = 0.0;
    for (int w = 0; w < n_warps; w++) denom += warp_sum[w];
    const float inv = (float)(1.0 / denom);
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        const float *vd = v_cache + (size_t)kh * D + d;
        float acc = 0.0f;
        for (int j = lo; j <= t; j++) {
            const float p = sc[j - lo] * inv;
            acc += p * vd[(size_t)(j % cap) * kv_stride];
        }
        out[(size_t)i * q_stride + (size_t)h * D + d] = acc;
    }
}

/* ------------------------------------------------------------------ host */

static struct att_params att_make_params(const struct olmo_attn_shape *s) {
    struct att_params p;
    p.T = s->seq_len;
    p.H = s->n_heads;
    p.HK = s->n_kv_heads;
    p.D = s->head_dim;
    p.group = s->n_heads / s->n_kv_heads;
    p.window = s->window > 0 ? s->window : 0;
    p.ld = s->head_dim | 1; /* odd stride: conflict-free row and column reads */
    p.scale = s->scale;
    p.q_stride = (size_t)s->n_heads * s->head_dim;
    p.kv_stride = (size_t)s->n_kv_heads * s->head_dim;
    return p;
}

static size_t att_fwd_smem(int ld) { return sizeof(float) * ((size_t)2 * ATT_TILE * ld + ATT_TILE * ATT_PLD); }
static size_t att_bwd_smem(int ld, int n_pd) {
    return sizeof(float) * ((size_t)4 * ATT_TILE * ld + (size_t)n_pd * ATT_TILE * ATT_PLD);
}

/* The capability query (backend.h check_attention): the fp32 kernels and the
 * cached kernel hold head_dim in fixed-size tiles (64 or 128 columns); the
 * tensor-core kernels fall back to them where head_dim is not a multiple of 16. */
int olmo_cuda_check_attention(OLMO_BE, const struct olmo_attn_shape *s) {
    (void)be;
    if (s->head_dim > 128)
        return olmo_error("head_dim %d: the CUDA attention kernels support head_dim 1..128", s->head_dim);
    return 0;
}

/* A shape the capability query refuses is a bug of the caller here: refused again. */
static int att_check_shape(const struct olmo_attn_shape *s) {
    if (s->head_dim < 1 || s->head_dim > 128 || s->n_kv_heads < 1 || s->n_heads % s->n_kv_heads)
        return olmo_error("CUDA attention: unsupported shape (head_dim %d must be 1..128; n_heads %d a multiple of "
                          "n_kv_heads %d)",
                          s->head_dim, s->n_heads, s->n_kv_heads);
    return 0;
}

int olmo_cuda_allow_smem(const void *kernel, size_t bytes, bool *done, const char *name) {
    if (*done) return 0;
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (err != cudaSuccess) return olmo_cuda_failed(name, __FILE__, __LINE__, cudaGetErrorString(err));
    *done = true;
    return 0;
}

template <int DMAX>
static int att_fwd_launch(float *out, float *lse, const float *q, const float *k, const float *v,
                          const int32_t *doc_ids, const struct att_params &p, int batch) {
    static bool smem_ok;
    const size_t smem = att_fwd_smem(DMAX + 1);
    if (olmo_cuda_allow_smem((const void *)att_fwd_kernel<DMAX>, smem, &smem_ok, "att_fwd_kernel smem attribute"))
        return -1;
    dim3 grid((unsigned)((p.T + ATT_TILE - 1) / ATT_TILE), (unsigned)p.H, (unsigned)batch);
    OLMO_LAUNCH(att_fwd_kernel<DMAX>, grid, dim3(ATT_TPD, ATT_TPD), att_fwd_smem(p.ld), out, lse, q, k, v, doc_ids,
                p);
    OLMO_CUDA_LAUNCHED("att_fwd_kernel");
    return 0;
}

template <int DMAX>
static int att_bwd_launch(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                          const float *v, const float *lse, const float *delta, const int32_t *doc_ids,
                          const struct att_params &p, int batch) {
    static bool smem_dkdv_ok, smem_dq_ok;
    if (olmo_cuda_allow_smem((const void *)att_bwd_dkdv_kernel<DMAX>, att_bwd_smem(DMAX + 1, 2), &smem_dkdv_ok,
                             "att_bwd_dkdv_kernel smem attribute") ||
        olmo_cuda_allow_smem((const void *)att_bwd_dq_kernel<DMAX>, att_bwd_smem(DMAX + 1, 1), &smem_dq_ok,
                             "att_bwd_dq_kernel smem attribute"))
        return -1;
    const unsigned tiles = (unsigned)((p.T + ATT_TILE - 1) / ATT_TILE);
    OLMO_LAUNCH(att_bwd_dkdv_kernel<DMAX>, dim3(tiles, (unsigned)p.HK, (unsigned)batch), dim3(ATT_TPD, ATT_TPD),
                att_bwd_smem(p.ld, 2), dk, dv, dout, q, k, v, lse, delta, doc_ids, p);
    OLMO_CUDA_LAUNCHED("att_bwd_dkdv_kernel");
    OLMO_LAUNCH(att_bwd_dq_kernel<DMAX>, dim3(tiles, (unsigned)p.H, (unsigned)batch), dim3(ATT_TPD, ATT_TPD),
                att_bwd_smem(p.ld, 1), dq, dout, q, k, v, lse, delta, doc_ids, p);
    OLMO_CUDA_LAUNCHED("att_bwd_dq_kernel");
    return 0;
}

int olmo_cuda_attention_fwd(OLMO_BE, float *out, float *lse, const float *q, const float *k, const float *v,
                             const int32_t *doc_ids, const struct olmo_attn_shape *s) {
    (void)be;
    if (s->batch <= 0 || s->seq_len <= 0) return 0;
    if (att_check_shape(s)) return -1;
    const struct att_params p = att_make_params(s);
    if (p.D <= 64) return att_fwd_launch<64>(out, lse, q, k, v, doc_ids, p, s->batch);
    return att_fwd_launch<128>(out, lse, q, k, v, doc_ids, p, s->batch);
}

/* delta = rowsum(dO * O) [batch, heads, seq], in scratch memory; NULL: the error is set. */
static const float *att_delta(OLMO_BE, const float *dout, const float *out, const struct olmo_attn_shape *s) {
    const size_t n_rows = (size_t)s->batch * s->seq_len;
    float *delta = (float *)olmo_cuda_scratch(be, SCRATCH_ATTN_DELTA, sizeof(float) * n_rows * s->n_heads);
    if (!delta) return NULL;
    const size_t threads = n_rows * s->n_heads * 32;
    OLMO_LAUNCH(att_delta_kernel, (unsigned)((threads + 255) / 256), 256, 0, delta, dout, out, s->seq_len, s->n_heads,
                s->head_dim, n_rows);
    return olmo_cuda_check_launch("att_delta_kernel", __FILE__, __LINE__) ? NULL : delta;
}

int olmo_cuda_attention_bwd(OLMO_BE, float *dq, float *dk, float *dv, const float *dout, const float *out,
                             const float *lse, const float *q, const float *k, const float *v,
                             const int32_t *doc_ids, const struct olmo_attn_shape *s) {
    if (s->batch <= 0 || s->seq_len <= 0) return 0;
    if (att_check_shape(s)) return -1;
    const struct att_params p = att_make_params(s);
    const float *delta = att_delta(be, dout, out, s);
    if (!delta) return -1;
    if (p.D <= 64) return att_bwd_launch<64>(dq, dk, dv, dout, q, k, v, lse, delta, doc_ids, p, s->batch);
    return att_bwd_launch<128>(dq, dk, dv, dout, q, k, v, lse, delta, doc_ids, p, s->batch);
}

/* cuda-bf16: tensor cores (cuda_attention_tc.cu) where head_dim allows, else the fp32 kernels. */
int olmo_cuda_attention_fwd_bf16(OLMO_BE, float *out, float *lse, const float *q, const float *k, const float *v,
                                  const int32_t *doc_ids, const struct olmo_attn_shape *s) {
    const int cudnn = olmo_cuda_cudnn_fwd(be, out, lse, q, k, v, doc_ids, s);
    if (cudnn <= 0) return cudnn; /* cuDNN ran it, or failed */
    if (!olmo_cuda_attention_tc_supported(s)) {
        return olmo_cuda_attention_fwd(be, out, lse, q, k, v, doc_ids, s);
    }
    return olmo_cuda_attention_tc_fwd(be, out, lse, q, k, v, doc_ids, s);
}

int olmo_cuda_attention_bwd_bf16(OLMO_BE, float *dq, float *dk, float *dv, const float *dout, const float *out,
                                  const float *lse, const float *q, const float *k, const float *v,
                                  const int32_t *doc_ids, const struct olmo_attn_shape *s) {
    const int cudnn = olmo_cuda_cudnn_bwd(be, dq, dk, dv, dout, out, lse, q, k, v, doc_ids, s);
    if (cudnn <= 0) return cudnn;
    if (!olmo_cuda_attention_tc_supported(s)) {
        return olmo_cuda_attention_bwd(be, dq, dk, dv, dout, out, lse, q, k, v, doc_ids, s);
    }
    if (s->batch <= 0 || s->seq_len <= 0) return 0;
    const float *delta = att_delta(be, dout, out, s);
    if (!delta) return -1;
    return olmo_cuda_attention_tc_bwd(be, dq, dk, dv, dout, lse, delta, q, k, v, doc_ids, s);
}

int olmo_cuda_attention_cached(OLMO_BE, float *out, const float *q, const float *k_cache, const float *v_cache, int n,
                                int pos0, int cap, const struct olmo_attn_shape *s) {
    if (n <= 0) return 0;
    if (att_check_shape(s)) return -1;
    const int window = s->window > 0 ? s->window : 0;
    const int max_keys = window > 0 && window < pos0 + n ? window : pos0 + n;
    float *scores = (float *)olmo_cuda_scratch(be, SCRATCH_ATTN_SCORES,
                                               sizeof(float) * (size_t)n * s->n_heads * (size_t)max_keys);
    if (!scores) return -1;
    OLMO_LAUNCH(att_cached_kernel, dim3((unsigned)n, (unsigned)s->n_heads), CACHED_THREADS, 0, out, q, k_cache,
                v_cache, scores, pos0, cap, s->n_heads, s->n_heads / s->n_kv_heads, s->head_dim, window, max_keys,
                s->scale);
    OLMO_CUDA_LAUNCHED("att_cached_kernel");
    return 0;
}
