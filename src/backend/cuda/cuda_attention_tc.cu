/* Attention on tensor cores for the cuda-bf16 backend: the same flash-style
 * algorithm, masks, GQA and deterministic backward as cuda_attention.cu, with
 * every matrix product (S = Q K^T, O += P V; dP = dO V^T, dV += P^T dO,
 * dK += dS^T Q, dQ += dS K) on bf16 operands with fp32 accumulation through
 * WMMA (m16n16k16), as the bf16 GEMMs round their operands.  Softmax, the
 * running max / sum, lse, delta and every accumulator stay fp32.
 *
 * WMMA leaves the element-to-lane mapping of fragments unspecified, so the
 * kernels never touch fragment elements: products go through shared memory,
 * where threads do the elementwise work on a known layout.  The forward
 * output O is kept in shared memory (it is rescaled row by row); the
 * backward accumulators (dK, dV, dQ) stay in fragments for the whole loop.
 *
 * Blocks: 64 queries (forward, dQ) or 64 keys (dK/dV) x one head, 8 warps.
 * head_dim must be a multiple of 16 and at most 128 (olmo_cuda_attention_tc_supported). */
#include <math.h>
#include <stdio.h>

#include "backend/cuda/cuda_internal.h"

#ifndef OLMOC_CUDA_EMULATION
#include <mma.h>
#endif

using namespace nvcuda;

#define TC_TILE OLMO_ATT_TILE
#define TC_WARPS 8
#define TC_THREADS (TC_WARPS * 32)
#define TC_LDS 68 /* float tiles of 64 columns (a multiple of 4, and 16-row blocks stay 32-byte aligned) */
#define TC_LDP 72 /* bf16 tiles of 64 columns (a multiple of 8) */

typedef __nv_bfloat16 bf16;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> frag_a_row;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major> frag_a_col;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> frag_b_row;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> frag_b_col;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> frag_acc;

struct tc_params {
    int T, H, HK, D, group, window;
    int ldb; /* bf16 tiles of D columns: D + 8 */
    int ldo; /* float tiles of D columns: D + 4 */
    float scale;
    size_t q_stride, kv_stride;
};

/* Shared memory is carved into 128-byte aligned regions. */
static __host__ __device__ size_t tc_align(size_t bytes) { return (bytes + 127) / 128 * 128; }

struct tc_carver {
    unsigned char *base;
    size_t used;
    template <typename T>
    __device__ T *take(size_t count) {
        T *p = (T *)(base + used);
        used += tc_align(count * sizeof(T));
        return p;
    }
};

/* Rows row0 .. row0+63 (of T) of a [T, stride] fp32 matrix, columns 0..D-1,
 * rounded to bf16 into a [64, ld] tile; rows past T are zero. */
static __device__ void tc_load_tile(bf16 *dst, const float *src, size_t stride, int row0, int T, int D, int ld) {
    for (int e = threadIdx.x; e < TC_TILE * D; e += TC_THREADS) {
        const int r = e / D, c = e - r * D, t = row0 + r;
        dst[r * ld + c] = __float2bfloat16(t < T ? src[(size_t)t * stride + c] : 0.0f);
    }
}

static __device__ void tc_load_docs(int *dst, const int32_t *docs, int row0, int T, int pad) {
    if (threadIdx.x < TC_TILE) {
        const int t = row0 + threadIdx.x;
        dst[threadIdx.x] = t < T ? (docs ? docs[t] : 0) : pad;
    }
}

/* C[64 x 64] (fp32, ld TC_LDS) = A[64 x D] B[64 x D]^T, both bf16 row-major tiles
 * (ld ldb): S = Q K^T and dP = dO V^T.  Warp w computes the 16 x 16 blocks
 * (w / 2, 2 (w % 2)) and (w / 2, 2 (w % 2) + 1). */
static __device__ void tc_abt(float *C, const bf16 *A, const bf16 *B, int D, int ldb) {
    const int warp = threadIdx.x >> 5, rb = warp >> 1, cb = (warp & 1) * 2;
    frag_acc acc0, acc1;
    wmma::fill_fragment(acc0, 0.0f);
    wmma::fill_fragment(acc1, 0.0f);
    for (int k = 0; k < D; k += 16) {
        frag_a_row a;
        frag_b_col b0, b1;
        wmma::load_matrix_sync(a, A + rb * 16 * ldb + k, ldb);
        wmma::load_matrix_sync(b0, B + cb * 16 * ldb + k, ldb);
        wmma::load_matrix_sync(b1, B + (cb + 1) * 16 * ldb + k, ldb);
        wmma::mma_sync(acc0, a, b0, acc0);
        wmma::mma_sync(acc1, a, b1, acc1);
    }
    wmma::store_matrix_sync(C + rb * 16 * TC_LDS + cb * 16, acc0, TC_LDS, wmma::mem_row_major);
    wmma::store_matrix_sync(C + rb * 16 * TC_LDS + (cb + 1) * 16, acc1, TC_LDS, wmma::mem_row_major);
}

/* Fragments of a [64 x D] result owned by this warp: f = warp + 8 i, block (f / (D/16), f % (D/16)). */
template <int DMAX>
struct tc_out_frags {
    static constexpr int MAX = (TC_TILE / 16) * (DMAX / 16) / TC_WARPS;
    frag_acc f[MAX];
};

/* acc[i] += op(A)[64 x 64] B[64 x D] for this warp's output blocks; B bf16 row-major (ld ldb).
 * A is P or dS (bf16, ld TC_LDP): row-major as stored (dQ += dS K, O += P V), or
 * transposed (dV += P^T dO, dK += dS^T Q) when TRANS_A. */
template <int DMAX, bool TRANS_A>
static __device__ void tc_accumulate(tc_out_frags<DMAX> &acc, const bf16 *A, const bf16 *B, int D, int ldb) {
    const int warp = threadIdx.x >> 5, ndb = D / 16, n_frags = (TC_TILE / 16) * ndb;
#pragma unroll
    for (int i = 0; i < tc_out_frags<DMAX>::MAX; i++) {
        const int f = warp + TC_WARPS * i;
        if (f >= n_frags) break; /* warp-uniform */
        const int rb = f / ndb, db = f % ndb;
        for (int k = 0; k < TC_TILE; k += 16) {
            frag_b_row b;
            wmma::load_matrix_sync(b, B + k * ldb + db * 16, ldb);
            if (TRANS_A) {
                frag_a_col a; /* element (m, k) of A^T is A[k][m] */
                wmma::load_matrix_sync(a, A + k * TC_LDP + rb * 16, TC_LDP);
                wmma::mma_sync(acc.f[i], a, b, acc.f[i]);
            } else {
                frag_a_row a;
                wmma::load_matrix_sync(a, A + rb * 16 * TC_LDP + k, TC_LDP);
                wmma::mma_sync(acc.f[i], a, b, acc.f[i]);
            }
        }
    }
}

template <int DMAX>
static __device__ void tc_store_frags(float *dst, int ldo, const tc_out_frags<DMAX> &acc, int D) {
    const int warp = threadIdx.x >> 5, ndb = D / 16, n_frags = (TC_TILE / 16) * ndb;
#pragma unroll
    for (int i = 0; i < tc_out_frags<DMAX>::MAX; i++) {
        const int f = warp + TC_WARPS * i;
        if (f >= n_frags) break;
        wmma::store_matrix_sync(dst + (f / ndb) * 16 * ldo + (f % ndb) * 16, acc.f[i], ldo, wmma::mem_row_major);
    }
}

/* Rows of a [64, ldo] fp32 staging tile to global rows row0.. (of T), columns 0..D-1. */
static __device__ void tc_write_rows(float *dst, size_t stride, const float *src, int ldo, int row0, int T, int D) {
    for (int e = threadIdx.x; e < TC_TILE * D; e += TC_THREADS) {
        const int r = e / D, c = e - r * D, t = row0 + r;
        if (t < T) dst[(size_t)t * stride + c] = src[r * ldo + c];
    }
}

/* ---------------------------------------------------------------- forward */

static size_t tc_fwd_smem(const struct tc_params &p) {
    return 3 * tc_align(sizeof(bf16) * TC_TILE * p.ldb) + tc_align(sizeof(float) * TC_TILE * TC_LDS) +
           tc_align(sizeof(bf16) * TC_TILE * TC_LDP) + tc_align(sizeof(float) * TC_TILE * p.ldo) +
           3 * tc_align(sizeof(float) * TC_TILE) + 2 * tc_align(sizeof(int) * TC_TILE);
}

template <int DMAX>
static __global__ void __launch_bounds__(TC_THREADS)
    tc_fwd_kernel(float *out, float *lse, const float *q, const float *k, const float *v, const int32_t *doc_ids,
                  struct tc_params p) {
    OLMO_DYNAMIC_SMEM(unsigned char, smem);
    tc_carver sm = {smem, 0};
    const int ldb = p.ldb, ldo = p.ldo, D = p.D, T = p.T;
    bf16 *Qb = sm.take<bf16>(TC_TILE * ldb), *Kb = sm.take<bf16>(TC_TILE * ldb), *Vb = sm.take<bf16>(TC_TILE * ldb);
    float *Ss = sm.take<float>(TC_TILE * TC_LDS);
    bf16 *Pb = sm.take<bf16>(TC_TILE * TC_LDP);
    float *Os = sm.take<float>(TC_TILE * ldo);
    float *m_run = sm.take<float>(TC_TILE), *l_run = sm.take<float>(TC_TILE), *alpha = sm.take<float>(TC_TILE);
    int *qdoc = sm.take<int>(TC_TILE), *kdoc = sm.take<int>(TC_TILE);
    const int tid = threadIdx.x;
    const int q0 = blockIdx.x * TC_TILE, h = blockIdx.y, b = blockIdx.z, kh = h / p.group;
    const float *kb = k + (size_t)b * T * p.kv_stride + (size_t)kh * D;
    const float *vb = v + (size_t)b * T * p.kv_stride + (size_t)kh * D;
    const int32_t *docs = doc_ids ? doc_ids + (size_t)b * T : NULL;

    tc_load_tile(Qb, q + (size_t)b * T * p.q_stride + (size_t)h * D, p.q_stride, q0, T, D, ldb);
    tc_load_docs(qdoc, docs, q0, T, -1);
    for (int e = tid; e < TC_TILE * ldo; e += TC_THREADS) Os[e] = 0.0f;
    if (tid < TC_TILE) {
        m_run[tid] = -INFINITY;
        l_run[tid] = 0.0f;
    }

    /* softmax work: 4 threads per row (lanes 4r .. 4r+3 of a warp), 16 columns each */
    const int row = tid >> 2, part = tid & 3, t = q0 + row;
    const int k_end = min(T, q0 + TC_TILE);
    for (int k0 = olmo_att_first_key_tile(q0, p.window); k0 < k_end; k0 += TC_TILE) {
        __syncthreads(); /* the previous tile's K, V and P are no longer read */
        tc_load_tile(Kb, kb, p.kv_stride, k0, T, D, ldb);
        tc_load_tile(Vb, vb, p.kv_stride, k0, T, D, ldb);
        tc_load_docs(kdoc, docs, k0, T, -2);
        __syncthreads();
        tc_abt(Ss, Qb, Kb, D, ldb);
        __syncthreads();

        float s[16], mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const int c = part * 16 + j;
            s[j] = olmo_att_visible(t, k0 + c, p.window, qdoc[row], kdoc[c]) ? Ss[row * TC_LDS + c] * p.scale
                                                                              : -INFINITY;
            mx = fmaxf(mx, s[j]);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_old = m_run[row], m_new = fmaxf(m_old, mx);
        float a = 1.0f, rowsum = 0.0f;
        if (m_new != -INFINITY) { /* otherwise nothing visible yet: p = 0, state unchanged */
            a = expf(m_old - m_new);
#pragma unroll
            for (int j = 0; j < 16; j++) {
                s[j] = expf(s[j] - m_new);
                rowsum += s[j];
            }
        } else {
#pragma unroll
            for (int j = 0; j < 16; j++) s[j] = 0.0f;
        }
        rowsum += __shfl_xor_sync(0xffffffffu, rowsum, 1);
        rowsum += __shfl_xor_sync(0xffffffffu, rowsum, 2);
#pragma unroll
        for (int j = 0; j < 16; j++) Pb[row * TC_LDP + part * 16 + j] = __float2bfloat16(s[j]);
        __syncthreads(); /* every thread of the row has read m_run before it changes */
        if (part == 0) {
            l_run[row] = l_run[row] * a + rowsum;
            m_run[row] = m_new;
            alpha[row] = a;
        }
        __syncthreads();
        for (int e = tid; e < TC_TILE * D; e += TC_THREADS) {
            const int r = e / D, c = e - r * D;
            Os[r * ldo + c] *= alpha[r];
        }
        __syncthreads();

        /* O += P V, through fragments loaded from and stored back to Os */
        const int warp = tid >> 5, ndb = D / 16, n_frags = (TC_TILE / 16) * ndb;
        for (int f = warp; f < n_frags; f += TC_WARPS) {
            const int rb = f / ndb, db = f % ndb;
            frag_acc acc;
            wmma::load_matrix_sync(acc, Os + rb * 16 * ldo + db * 16, ldo, wmma::mem_row_major);
            for (int kk = 0; kk < TC_TILE; kk += 16) {
                frag_a_row pa;
                frag_b_row vbf;
                wmma::load_matrix_sync(pa, Pb + rb * 16 * TC_LDP + kk, TC_LDP);
                wmma::load_matrix_sync(vbf, Vb + kk * ldb + db * 16, ldb);
                wmma::mma_sync(acc, pa, vbf, acc);
            }
            wmma::store_matrix_sync(Os + rb * 16 * ldo + db * 16, acc, ldo, wmma::mem_row_major);
        }
    }
    __syncthreads();

    for (int e = tid; e < TC_TILE * D; e += TC_THREADS) {
        const int r = e / D, c = e - r * D, tt = q0 + r;
        if (tt < T) out[((size_t)b * T + tt) * p.q_stride + (size_t)h * D + c] = Os[r * ldo + c] * (1.0f / l_run[r]);
    }
    if (tid < TC_TILE && q0 + tid < T) lse[((size_t)b * p.H + h) * T + q0 + tid] = m_run[tid] + logf(l_run[tid]);
}

/* --------------------------------------------------------------- backward */

/* Shared layout of both backward kernels: four bf16 [64, D] tiles (the block's
 * own pair first), S and dP (fp32, contiguous: reused as a [64, ldo] staging
 * tile for the results), P and dS (bf16), lse, delta and document ids. */
struct tc_bwd_smem {
    bf16 *own0, *own1, *other0, *other1;
    float *Ss, *dPs;
    bf16 *Pb, *dSb;
    float *lse_s, *delta_s;
    int *qdoc, *kdoc;
};

static size_t tc_bwd_smem_bytes(const struct tc_params &p) {
    return 4 * tc_align(sizeof(bf16) * TC_TILE * p.ldb) + 2 * tc_align(sizeof(float) * TC_TILE * TC_LDS) +
           2 * tc_align(sizeof(bf16) * TC_TILE * TC_LDP) + 2 * tc_align(sizeof(float) * TC_TILE) +
           2 * tc_align(sizeof(int) * TC_TILE);
}

static __device__ tc_bwd_smem tc_bwd_carve(unsigned char *smem, int ldb) {
    tc_carver sm = {smem, 0};
    tc_bwd_smem s;
    s.own0 = sm.take<bf16>(TC_TILE * ldb);
    s.own1 = sm.take<bf16>(TC_TILE * ldb);
    s.other0 = sm.take<bf16>(TC_TILE * ldb);
    s.other1 = sm.take<bf16>(TC_TILE * ldb);
    s.Ss = sm.take<float>(TC_TILE * TC_LDS); /* 64 * 68 * 4 bytes: already a multiple of 128 */
    s.dPs = sm.take<float>(TC_TILE * TC_LDS);
    s.Pb = sm.take<bf16>(TC_TILE * TC_LDP);
    s.dSb = sm.take<bf16>(TC_TILE * TC_LDP);
    s.lse_s = sm.take<float>(TC_TILE);
    s.delta_s = sm.take<float>(TC_TILE);
    s.qdoc = sm.take<int>(TC_TILE);
    s.kdoc = sm.take<int>(TC_TILE);
    return s;
}

/* From S and dP of a (query tile q0, key tile k0) pair: P = exp(S scale - lse)
 * and dS = P (dP - delta) scale where visible, 0 elsewhere, as bf16 tiles. */
static __device__ void tc_p_ds(const tc_bwd_smem &s, const struct tc_params &p, int q0, int k0, bool want_p) {
    for (int e = threadIdx.x; e < TC_TILE * TC_TILE; e += TC_THREADS) {
        const int r = e >> 6, c = e & 63;
        float pij = 0.0f, dsij = 0.0f;
        if (olmo_att_visible(q0 + r, k0 + c, p.window, s.qdoc[r], s.kdoc[c])) {
            pij = expf(s.Ss[r * TC_LDS + c] * p.scale - s.lse_s[r]);
            dsij = pij * (s.dPs[r * TC_LDS + c] - s.delta_s[r]) * p.scale;
        }
        if (want_p) s.Pb[r * TC_LDP + c] = __float2bfloat16(pij);
        s.dSb[r * TC_LDP + c] = __float2bfloat16(dsij);
    }
}

static __device__ void tc_load_stats(const tc_bwd_smem &s, const float *lse_h, const float *delta_h, int q0, int T) {
    if (threadIdx.x < TC_TILE) {
        const int t = q0 + threadIdx.x;
        s.lse_s[threadIdx.x] = t < T ? lse_h[t] : 0.0f;
        s.delta_s[threadIdx.x] = t < T ? delta_h[t] : 0.0f;
    }
}

template <int DMAX>
static __global__ void __launch_bounds__(TC_THREADS)
    tc_bwd_dkdv_kernel(float *dk, float *dv, const float *dout, const float *q, const float *k, const float *v,
                       const float *lse, const float *delta, const int32_t *doc_ids, struct tc_params p) {
    OLMO_DYNAMIC_SMEM(unsigned char, smem);
    const int ldb = p.ldb, D = p.D, T = p.T;
    const tc_bwd_smem s = tc_bwd_carve(smem, ldb);
    bf16 *Kb = s.own0, *Vb = s.own1, *Qb = s.other0, *dOb = s.other1;
    const int k0 = blockIdx.x * TC_TILE, kh = blockIdx.y, b = blockIdx.z;
    const int32_t *docs = doc_ids ? doc_ids + (size_t)b * T : NULL;

    tc_load_tile(Kb, k + (size_t)b * T * p.kv_stride + (size_t)kh * D, p.kv_stride, k0, T, D, ldb);
    tc_load_tile(Vb, v + (size_t)b * T * p.kv_stride + (size_t)kh * D, p.kv_stride, k0, T, D, ldb);
    tc_load_docs(s.kdoc, docs, k0, T, -2);

    tc_out_frags<DMAX> dk_acc, dv_acc;
#pragma unroll
    for (int i = 0; i < tc_out_frags<DMAX>::MAX; i++) {
        wmma::fill_fragment(dk_acc.f[i], 0.0f);
        wmma::fill_fragment(dv_acc.f[i], 0.0f);
    }

    /* Queries that can see keys k0 .. k0+63: t >= k0 and, with a window, t < k0 + 63 + window. */
    const int q_end = p.window > 0 ? min(T, k0 + TC_TILE - 1 + p.window) : T;
    for (int h = kh * p.group; h < (kh + 1) * p.group; h++) {
        const float *qb = q + (size_t)b * T * p.q_stride + (size_t)h * D;
        const float *ob = dout + (size_t)b * T * p.q_stride + (size_t)h * D;
        const float *lse_h = lse + ((size_t)b * p.H + h) * T, *delta_h = delta + ((size_t)b * p.H + h) * T;
        for (int q0 = k0; q0 < q_end; q0 += TC_TILE) {
            __syncthreads(); /* the previous Q, dO, P and dS are no longer read */
            tc_load_tile(Qb, qb, p.q_stride, q0, T, D, ldb);
            tc_load_tile(dOb, ob, p.q_stride, q0, T, D, ldb);
            tc_load_docs(s.qdoc, docs, q0, T, -1);
            tc_load_stats(s, lse_h, delta_h, q0, T);
            __syncthreads();
            tc_abt(s.Ss, Qb, Kb, D, ldb);
            tc_abt(s.dPs, dOb, Vb, D, ldb);
            __syncthreads();
            tc_p_ds(s, p, q0, k0, true);
            __syncthreads();
            tc_accumulate<DMAX, true>(dv_acc, s.Pb, dOb, D, ldb);
            tc_accumulate<DMAX, true>(dk_acc, s.dSb, Qb, D, ldb);
        }
    }

    float *stage = s.Ss; /* S and dP are contiguous: 64 x 136 floats >= 64 x ldo */
    const size_t off = (size_t)b * T * p.kv_stride + (size_t)kh * D;
    __syncthreads();
    tc_store_frags(stage, p.ldo, dk_acc, D);
    __syncthreads();
    tc_write_rows(dk + off, p.kv_stride, stage, p.ldo, k0, T, D);
    __syncthreads();
    tc_store_frags(stage, p.ldo, dv_acc, D);
    __syncthreads();
    tc_write_rows(dv + off, p.kv_stride, stage, p.ldo, k0, T, D);
}

template <int DMAX>
static __global__ void __launch_bounds__(TC_THREADS)
    tc_bwd_dq_kernel(float *dq, const float *dout, const float *q, const float *k, const float *v, const float *lse,
                     const float *delta, const int32_t *doc_ids, struct tc_params p) {
    OLMO_DYNAMIC_SMEM(unsigned char, smem);
    const int ldb = p.ldb, D = p.D, T = p.T;
    const tc_bwd_smem s = tc_bwd_carve(smem, ldb);
    bf16 *Qb = s.own0, *dOb = s.own1, *Kb = s.other0, *Vb = s.other1;
    const int q0 = blockIdx.x * TC_TILE, h = blockIdx.y, b = blockIdx.z, kh = h / p.group;
    const int32_t *docs = doc_ids ? doc_ids + (size_t)b * T : NULL;
    const float *kb = k + (size_t)b * T * p.kv_stride + (size_t)kh * D;
    const float *vb = v + (size_t)b * T * p.kv_stride + (size_t)kh * D;

    tc_load_tile(Qb, q + (size_t)b * T * p.q_stride + (size_t)h * D, p.q_stride, q0, T, D, ldb);
    tc_load_tile(dOb, dout + (size_t)b * T * p.q_stride + (size_t)h * D, p.q_stride, q0, T, D, ldb);
    tc_load_docs(s.qdoc, docs, q0, T, -1);
    tc_load_stats(s, lse + ((size_t)b * p.H + h) * T, delta + ((size_t)b * p.H + h) * T, q0, T);

    tc_out_frags<DMAX> dq_acc;
#pragma unroll
    for (int i = 0; i < tc_out_frags<DMAX>::MAX; i++) wmma::fill_fragment(dq_acc.f[i], 0.0f);

    const int k_end = min(T, q0 + TC_TILE);
    for (int k0 = olmo_att_first_key_tile(q0, p.window); k0 < k_end; k0 += TC_TILE) {
        __syncthreads();
        tc_load_tile(Kb, kb, p.kv_stride, k0, T, D, ldb);
        tc_load_tile(Vb, vb, p.kv_stride, k0, T, D, ldb);
        tc_load_docs(s.kdoc, docs, k0, T, -2);
        __syncthreads();
        tc_abt(s.Ss, Qb, Kb, D, ldb);
        tc_abt(s.dPs, dOb, Vb, D, ldb);
        __syncthreads();
        tc_p_ds(s, p, q0, k0, false);
        __syncthreads();
        tc_accumulate<DMAX, false>(dq_acc, s.dSb, Kb, D, ldb);
    }

    __syncthreads();
    tc_store_frags(s.Ss, p.ldo, dq_acc, D);
    __syncthreads();
    tc_write_rows(dq + (size_t)b * T * p.q_stride + (size_t)h * D, p.q_stride, s.Ss, p.ldo, q0, T, D);
}

/* ------------------------------------------------------------------ host */

bool olmo_cuda_attention_tc_supported(const struct olmo_attn_shape *s) {
    return s->head_dim % 16 == 0 && s->head_dim >= 16 && s->head_dim <= 128 && s->n_kv_heads >= 1 &&
           s->n_heads % s->n_kv_heads == 0;
}

static struct tc_params tc_make_params(const struct olmo_attn_shape *s) {
    struct tc_params p;
    p.T = s->seq_len;
    p.H = s->n_heads;
    p.HK = s->n_kv_heads;
    p.D = s->head_dim;
    p.group = s->n_heads / s->n_kv_heads;
    p.window = s->window > 0 ? s->window : 0;
    p.ldb = s->head_dim + 8;
    p.ldo = s->head_dim + 4;
    p.scale = s->scale;
    p.q_stride = (size_t)s->n_heads * s->head_dim;
    p.kv_stride = (size_t)s->n_kv_heads * s->head_dim;
    return p;
}

/* The kernels opt in once, for the largest head_dim of their template bucket. */
static struct tc_params tc_bucket_params(int dmax) {
    struct olmo_attn_shape widest = {1, 1, 1, 1, dmax, 0, 1.0f};
    return tc_make_params(&widest);
}

template <int DMAX>
static int tc_fwd_launch(float *out, float *lse, const float *q, const float *k, const float *v,
                         const int32_t *doc_ids, const struct tc_params &p, int batch) {
    static bool smem_ok;
    if (olmo_cuda_allow_smem((const void *)tc_fwd_kernel<DMAX>, tc_fwd_smem(tc_bucket_params(DMAX)), &smem_ok,
                             "tc_fwd_kernel smem attribute"))
        return -1;
    dim3 grid((unsigned)((p.T + TC_TILE - 1) / TC_TILE), (unsigned)p.H, (unsigned)batch);
    OLMO_LAUNCH(tc_fwd_kernel<DMAX>, grid, TC_THREADS, tc_fwd_smem(p), out, lse, q, k, v, doc_ids, p);
    OLMO_CUDA_LAUNCHED("tc_fwd_kernel");
    return 0;
}

template <int DMAX>
static int tc_bwd_launch(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                         const float *v, const float *lse, const float *delta, const int32_t *doc_ids,
                         const struct tc_params &p, int batch) {
    static bool smem_dkdv_ok, smem_dq_ok;
    const size_t widest = tc_bwd_smem_bytes(tc_bucket_params(DMAX));
    if (olmo_cuda_allow_smem((const void *)tc_bwd_dkdv_kernel<DMAX>, widest, &smem_dkdv_ok,
                             "tc_bwd_dkdv_kernel smem attribute") ||
        olmo_cuda_allow_smem((const void *)tc_bwd_dq_kernel<DMAX>, widest, &smem_dq_ok,
                             "tc_bwd_dq_kernel smem attribute"))
        return -1;
    const unsigned tiles = (unsigned)((p.T + TC_TILE - 1) / TC_TILE);
    OLMO_LAUNCH(tc_bwd_dkdv_kernel<DMAX>, dim3(tiles, (unsigned)p.HK, (unsigned)batch), TC_THREADS,
                tc_bwd_smem_bytes(p), dk, dv, dout, q, k, v, lse, delta, doc_ids, p);
    OLMO_CUDA_LAUNCHED("tc_bwd_dkdv_kernel");
    OLMO_LAUNCH(tc_bwd_dq_kernel<DMAX>, dim3(tiles, (unsigned)p.H, (unsigned)batch), TC_THREADS,
                tc_bwd_smem_bytes(p), dq, dout, q, k, v, lse, delta, doc_ids, p);
    OLMO_CUDA_LAUNCHED("tc_bwd_dq_kernel");
    return 0;
}

int olmo_cuda_attention_tc_fwd(OLMO_BE, float *out, float *lse, const float *q, const float *k, const float *v,
                                const int32_t *doc_ids, const struct olmo_attn_shape *s) {
    (void)be;
    if (s->batch <= 0 || s->seq_len <= 0) return 0;
    const struct tc_params p = tc_make_params(s);
    if (p.D <= 64) return tc_fwd_launch<64>(out, lse, q, k, v, doc_ids, p, s->batch);
    return tc_fwd_launch<128>(out, lse, q, k, v, doc_ids, p, s->batch);
}

int olmo_cuda_attention_tc_bwd(OLMO_BE, float *dq, float *dk, float *dv, const float *dout, const float *lse,
                                const float *delta, const float *q, const float *k, const float *v,
                                const int32_t *doc_ids, const struct olmo_attn_shape *s) {
    (void)be;
    if (s->batch <= 0 || s->seq_len <= 0) return 0;
    const struct tc_params p = tc_make_params(s);
    if (p.D <= 64) return tc_bwd_launch<64>(dq, dk, dv, dout, q, k, v, lse, delta, doc_ids, p, s->batch);
    return tc_bwd_launch<128>(dq, dk, dv, dout, q, k, v, lse, delta, doc_ids, p, s->batch);
}
