/* The CUDA backend's elementwise, normalisation and reduction ops (one kernel
 * or a few per op of backend.h): embedding, RMSNorm, RoPE, SwiGLU, add,
 * scale, cross-entropy, sum of squares, AdamW, and the fused ops of a
 * backend that multiplies in bf16 (rmsnorm + add, SwiGLU and its backward
 * to bf16, RMSNorm backward to bf16, cross-entropy to bf16 gradients).  Fidelity and determinism
 * rules are at the top of cuda_backend.cu; errors as in cuda_internal.h. */
#include <math.h>
#include <stdlib.h>

#include "backend/cuda/cuda_internal.h"

/* Threads per block of the row kernels; reductions assume a multiple of 32. */
#define ROW_THREADS 256

/* ------------------------------------------------------- block reductions */

/* Sum over the block, in a fixed order (warp shuffles, then warp 0 over the
 * per-warp sums).  Every thread gets the result.  shared: 32 doubles. */
static __device__ double block_sum(double v, double *shared) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = (blockDim.x + 31) >> 5;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < n_warps ? shared[lane] : 0.0;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) shared[0] = v;
    }
    __syncthreads();
    v = shared[0];
    __syncthreads(); /* shared may be reused right after */
    return v;
}

static __device__ float block_max(float v, float *shared) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = (blockDim.x + 31) >> 5;
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < n_warps ? shared[lane] : -INFINITY;
        for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
        if (lane == 0) shared[0] = v;
    }
    __syncthreads();
    v = shared[0];
    __syncthreads();
    return v;
}

/* Single block: out[0] = sum(in[0..n)) in a fixed order. */
static __global__ void sum_doubles_kernel(double *out, const double *in, size_t n) {
    __shared__ double red[32];
    double acc = 0.0;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) acc += in[i];
    acc = block_sum(acc, red);
    if (threadIdx.x == 0) out[0] = acc;
}

/* -------------------------------------------------------------- embedding */

static __global__ void embedding_fwd_kernel(float *out, const float *table, const int32_t *tokens, int dim) {
    const size_t i = blockIdx.x;
    const float *src = table + (size_t)tokens[i] * dim;
    float *dst = out + i * dim;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) dst[j] = src[j];
}

int olmo_cuda_embedding_fwd(OLMO_BE, float *out, const float *table, const int32_t *tokens, int n, int dim) {
    (void)be;
    if (n <= 0 || dim <= 0) return 0;
    OLMO_LAUNCH(embedding_fwd_kernel, n, ROW_THREADS, 0, out, table, tokens, dim);
    OLMO_CUDA_LAUNCHED("embedding_fwd_kernel");
    return 0;
}

/* One thread per (distinct id, column): adds the rows of that id's tokens in
 * token order, starting from the current gradient (as cpu.c does). */
static __global__ void embedding_bwd_kernel(float *dtable, const float *dout, const int32_t *order,
                                            const int32_t *seg_begin, const int32_t *seg_token, int dim) {
    const int s = blockIdx.x, j = blockIdx.y * blockDim.x + threadIdx.x;
    if (j >= dim) return;
    float *dst = dtable + (size_t)seg_token[s] * dim + j;
    float acc = *dst;
    for (int p = seg_begin[s]; p < seg_begin[s + 1]; p++) acc += dout[(size_t)order[p] * dim + j];
    *dst = acc;
}

/* The ids sorted on the host (tok: host memory), then the kernel. */
static int embedding_bwd_sorted(OLMO_BE, float *dtable, const float *dout, const int32_t *tok, int n, int dim) {
    int32_t *start = NULL, *packed = NULL, *dev = NULL;
    int rc = -1, n_valid = 0, n_seg = 0;
    do { /* the host's part, with one exit that frees its buffers */
        cudaError_t err;
        int32_t max_tok = -1;
        for (int i = 0; i < n; i++)
            if (tok[i] > max_tok) max_tok = tok[i];
        if (max_tok < 0) { /* negative ids are skipped (the model never passes them): nothing to add */
            rc = 0;
            break;
        }
        /* Stable counting sort of positions by id: start[v] = first slot of id v. */
        start = (int32_t *)olmo_calloc((size_t)max_tok + 2, sizeof(int32_t), "CUDA embedding backward: id counts");
        packed = start ? (int32_t *)olmo_malloc(sizeof(int32_t) * (3 * (size_t)n + 1), "CUDA embedding backward: order")
                       : NULL;
        if (!packed) break;
        for (int i = 0; i < n; i++)
            if (tok[i] >= 0) start[tok[i] + 1]++;
        for (int32_t v = 0; v <= max_tok; v++) start[v + 1] += start[v];
        n_valid = start[max_tok + 1];
        int32_t *order = packed;
        for (int i = 0; i < n; i++)
            if (tok[i] >= 0) order[start[tok[i]]++] = i;
        /* Segments of equal ids; packed layout: order[n_valid], seg_begin[n_seg+1], seg_token[n_seg]. */
        int32_t *seg_begin = packed + n_valid;
        for (int p = 0; p < n_valid; p++)
            if (p == 0 || tok[order[p]] != tok[order[p - 1]]) seg_begin[n_seg++] = p;
        seg_begin[n_seg] = n_valid;
        int32_t *seg_token = seg_begin + n_seg + 1;
        for (int s = 0; s < n_seg; s++) seg_token[s] = tok[order[seg_begin[s]]];
        const size_t packed_n = (size_t)n_valid + 2 * (size_t)n_seg + 1;
        dev = (int32_t *)olmo_cuda_scratch(be, SCRATCH_EMBED_INDEX, packed_n * sizeof(int32_t));
        if (!dev) break;
        if ((err = cudaMemcpy(dev, packed, packed_n * sizeof(int32_t), cudaMemcpyHostToDevice)) != cudaSuccess) {
            olmo_cuda_failed("cudaMemcpy of the index to the device", __FILE__, __LINE__, cudaGetErrorString(err));
            break;
        }
        rc = 0;
    } while (0);
    free(start);
    free(packed);
    if (rc || !n_seg) return rc;
    dim3 grid((unsigned)n_seg, (unsigned)((dim + ROW_THREADS - 1) / ROW_THREADS));
    OLMO_LAUNCH(embedding_bwd_kernel, grid, ROW_THREADS, 0, dtable, dout, dev, dev + n_valid,
                dev + n_valid + n_seg + 1, dim);
    OLMO_CUDA_LAUNCHED("embedding_bwd_kernel");
    return 0;
}

/* The ids copied back to the host first (a synchronisation): embedding_bwd_ids avoids it. */
int olmo_cuda_embedding_bwd(OLMO_BE, float *dtable, const float *dout, const int32_t *tokens, int n, int dim) {
    if (n <= 0 || dim <= 0) return 0;
    int32_t *tok = (int32_t *)olmo_malloc(sizeof(int32_t) * (size_t)n, "CUDA embedding backward: token ids");
    if (!tok) return -1;
    cudaError_t err = cudaMemcpy(tok, tokens, sizeof(int32_t) * (size_t)n, cudaMemcpyDeviceToHost);
    const int rc = err != cudaSuccess ? olmo_cuda_failed("cudaMemcpy of the token ids to the host", __FILE__, __LINE__,
                                                         cudaGetErrorString(err))
                                      : embedding_bwd_sorted(be, dtable, dout, tok, n, dim);
    free(tok);
    return rc;
}

int olmo_cuda_embedding_bwd_ids(OLMO_BE, float *dtable, const float *dout, const int32_t *host_tokens, int n,
                                int dim) {
    if (n <= 0 || dim <= 0) return 0;
    return embedding_bwd_sorted(be, dtable, dout, host_tokens, n, dim);
}

/* ---------------------------------------------------------------- RMSNorm */

/* The block's row: 1 / sqrt(mean(x^2) + eps), summed in double, also stored in rstd[row]. */
static __device__ __forceinline__ float row_rstd(const float *xi, int dim, float eps, float *rstd, size_t row) {
    __shared__ double red[32];
    double ss = 0.0;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) ss += (double)xi[j] * xi[j];
    ss = block_sum(ss, red);
    const float r = (float)(1.0 / sqrt(ss / dim + eps));
    if (threadIdx.x == 0) rstd[row] = r;
    return r;
}

static __global__ void rmsnorm_fwd_kernel(float *y, float *rstd, const float *x, const float *w, int dim,
                                          float eps) {
    const size_t row = blockIdx.x;
    const float *xi = x + row * dim;
    float *yi = y + row * dim;
    const float r = row_rstd(xi, dim, eps, rstd, row);
    for (int j = threadIdx.x; j < dim; j += blockDim.x) yi[j] = w[j] * (xi[j] * r);
}

int olmo_cuda_rmsnorm_fwd(OLMO_BE, float *y, float *rstd, const float *x, const float *w, int n, int dim, float eps) {
    (void)be;
    if (n <= 0 || dim <= 0) return 0;
    OLMO_LAUNCH(rmsnorm_fwd_kernel, n, ROW_THREADS, 0, y, rstd, x, w, dim, eps);
    OLMO_CUDA_LAUNCHED("rmsnorm_fwd_kernel");
    return 0;
}

/* y = resid + rmsnorm(x) * w: rmsnorm_fwd_kernel's statistics and expression, then the add (y may alias
 * resid: each element is read and then written by the same thread). */
static __global__ void rmsnorm_add_fwd_kernel(float *y, float *rstd, const float *resid, const float *x,
                                              const float *w, int dim, float eps) {
    const size_t row = blockIdx.x;
    const float *xi = x + row * dim, *ri = resid + row * dim;
    float *yi = y + row * dim;
    const float r = row_rstd(xi, dim, eps, rstd, row);
    for (int j = threadIdx.x; j < dim; j += blockDim.x) {
        const float normed = w[j] * (xi[j] * r);
        yi[j] = ri[j] + normed;
    }
}

int olmo_cuda_rmsnorm_add_fwd(OLMO_BE, float *y, float *rstd, const float *resid, const float *x, const float *w,
                               int n, int dim, float eps) {
    (void)be;
    if (n <= 0 || dim <= 0) return 0;
    OLMO_LAUNCH(rmsnorm_add_fwd_kernel, n, ROW_THREADS, 0, y, rstd, resid, x, w, dim, eps);
    OLMO_CUDA_LAUNCHED("rmsnorm_add_fwd_kernel");
    return 0;
}

/* dw partials: block (column tile, chunk of rows); partial[chunk][j] = sum over the chunk's rows. */
static __global__ void rmsnorm_dw_partial_kernel(double *partial, const float *dy, const float *x,
                                                 const float *rstd, int n, int dim, int rows_per_chunk) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x, chunk = blockIdx.y;
    if (j >= dim) return;
    const int r0 = chunk * rows_per_chunk, r1 = min(n, r0 + rows_per_chunk);
    double acc = 0.0;
    for (int i = r0; i < r1; i++) {
        const float xhat = x[(size_t)i * dim + j] * rstd[i];
        acc += (double)dy[(size_t)i * dim + j] * xhat;
    }
    partial[(size_t)chunk * dim + j] = acc;
}

static __global__ void rmsnorm_dw_finish_kernel(float *dw, const double *partial, int chunks, int dim) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= dim) return;
    double acc = 0.0;
    for (int c = 0; c < chunks; c++) acc += partial[(size_t)c * dim + j];
    dw[j] += (float)acc;
}

/* An element stored as fp32, or rounded to bf16 (nearest even, as f32_to_bf16_kernel rounds). */
static __device__ __forceinline__ void store_as(float *p, float v) { *p = v; }
static __device__ __forceinline__ void store_as(__nv_bfloat16 *p, float v) { *p = __float2bfloat16(v); }

/* dx (fp32 or bf16) may alias dy when it is fp32: each element is read and then written by the same thread. */
template <typename T>
static __global__ void rmsnorm_dx_kernel(T *dx, const float *dy, const float *x, const float *w, const float *rstd,
                                         int dim) {
    __shared__ double red[32];
    const size_t row = blockIdx.x;
    const float *xi = x + row * dim, *dyi = dy + row * dim;
    T *dxi = dx + row * dim;
    const float r = rstd[row];
    double dot = 0.0;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) {
        const float xhat = xi[j] * r;
        dot += (double)dyi[j] * w[j] * xhat;
    }
    dot = block_sum(dot, red);
    const float mean = (float)(dot / dim);
    for (int j = threadIdx.x; j < dim; j += blockDim.x) store_as(&dxi[j], r * (dyi[j] * w[j] - xi[j] * r * mean));
}

template <typename T>
static int rmsnorm_bwd_launch(OLMO_BE, T *dx, float *dw, const float *dy, const float *x, const float *w,
                              const float *rstd, int n, int dim) {
    if (n <= 0 || dim <= 0) return 0;
    /* dw first: it reads dy, which dx may overwrite. */
    const int max_chunks = 256;
    const int rows_per_chunk = (n + max_chunks - 1) / max_chunks;
    const int chunks = (n + rows_per_chunk - 1) / rows_per_chunk;
    double *partial = (double *)olmo_cuda_scratch(be, SCRATCH_RMS_DW, sizeof(double) * (size_t)chunks * dim);
    if (!partial) return -1;
    const unsigned col_blocks = (unsigned)((dim + ROW_THREADS - 1) / ROW_THREADS);
    OLMO_LAUNCH(rmsnorm_dw_partial_kernel, dim3(col_blocks, (unsigned)chunks), ROW_THREADS, 0, partial, dy, x, rstd,
                n, dim, rows_per_chunk);
    OLMO_CUDA_LAUNCHED("rmsnorm_dw_partial_kernel");
    OLMO_LAUNCH(rmsnorm_dw_finish_kernel, col_blocks, ROW_THREADS, 0, dw, partial, chunks, dim);
    OLMO_CUDA_LAUNCHED("rmsnorm_dw_finish_kernel");
    OLMO_LAUNCH(rmsnorm_dx_kernel<T>, n, ROW_THREADS, 0, dx, dy, x, w, rstd, dim);
    OLMO_CUDA_LAUNCHED("rmsnorm_dx_kernel");
    return 0;
}

int olmo_cuda_rmsnorm_bwd(OLMO_BE, float *dx, float *dw, const float *dy, const float *x, const float *w,
                           const float *rstd, int n, int dim) {
    return rmsnorm_bwd_launch(be, dx, dw, dy, x, w, rstd, n, dim);
}

/* dx as bf16 (only GEMMs read it): the same values rounded once, no fp32 dx in memory.  dx must not
 * overlap dy (a bf16 row is not where its fp32 row was). */
int olmo_cuda_rmsnorm_bwd_bf16(OLMO_BE, void *dx, float *dw, const float *dy, const float *x, const float *w,
                               const float *rstd, int n, int dim) {
    const size_t nd = n > 0 && dim > 0 ? (size_t)n * dim : 0;
    const uintptr_t d = (uintptr_t)dx, y = (uintptr_t)dy;
    if (nd && d < y + nd * sizeof(float) && y < d + nd * sizeof(__nv_bfloat16))
        return olmo_error("CUDA rmsnorm_bwd_bf16: dx overlaps dy");
    return rmsnorm_bwd_launch(be, (__nv_bfloat16 *)dx, dw, dy, x, w, rstd, n, dim);
}

/* ------------------------------------------------------------------- RoPE */

/* sign = +1 rotates forward, -1 applies the transpose (backward). */
static __global__ void rope_kernel(float *x, const float *cos_t, const float *sin_t, size_t total, int seq_len,
                                   int heads, int head_dim, float sign) {
    const int half = head_dim / 2;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        const int i = (int)(idx % half);
        const size_t row_head = idx / half;
        const int pos = (int)((row_head / heads) % seq_len);
        float *xh = x + row_head * head_dim;
        const float c = cos_t[(size_t)pos * half + i], s = sin_t[(size_t)pos * half + i];
        const float a = xh[i], b = xh[i + half];
        xh[i] = a * c - sign * b * s;
        xh[i + half] = b * c + sign * a * s;
    }
}

static int rope_launch(float *x, const float *cos_t, const float *sin_t, int n_rows, int seq_len, int heads,
                        int head_dim, float sign) {
    const size_t total = (size_t)n_rows * heads * (head_dim / 2);
    if (!total) return 0;
    OLMO_LAUNCH(rope_kernel, olmo_cuda_ew_blocks(total), EW_THREADS, 0, x, cos_t, sin_t, total, seq_len, heads,
                head_dim, sign);
    OLMO_CUDA_LAUNCHED("rope_kernel");
    return 0;
}

int olmo_cuda_rope_fwd(OLMO_BE, float *x, const float *cos_t, const float *sin_t, int n_rows, int seq_len, int heads,
                        int head_dim) {
    (void)be;
    return rope_launch(x, cos_t, sin_t, n_rows, seq_len, heads, head_dim, 1.0f);
}

int olmo_cuda_rope_bwd(OLMO_BE, float *dx, const float *cos_t, const float *sin_t, int n_rows, int seq_len, int heads,
                        int head_dim) {
    (void)be;
    return rope_launch(dx, cos_t, sin_t, n_rows, seq_len, heads, head_dim, -1.0f);
}

/* ------------------------------------------------- SwiGLU, add, scale */

/* The elementwise kernels: each thread takes four consecutive elements at a
 * time through 16-byte loads and stores (float4) where every pointer of the
 * call is 16-byte aligned, then the n % 4 left over one by one; otherwise
 * one element at a time.  Either way every element is the same expression of
 * its inputs, so the two paths give the same bits. */
static bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* Blocks for n elements taken four at a time. */
static unsigned ew4_blocks(size_t n) { return olmo_cuda_ew_blocks(n / 4 + 1); }

/* This thread's first index and the grid's stride (grid-stride loops). */
#define EW_TID ((size_t)blockIdx.x * blockDim.x + threadIdx.x)
#define EW_STRIDE ((size_t)gridDim.x * blockDim.x)

static __device__ __forceinline__ float silu_mul(float x, float u) { return x / (1.0f + expf(-x)) * u; }

static __device__ __forceinline__ void swiglu_grad(float gi, float ui, float dsi, float *dg, float *du) {
    const float sig = 1.0f / (1.0f + expf(-gi));
    const float sl = gi * sig;
    *du = dsi * sl;
    *dg = dsi * ui * sig * (1.0f + gi * (1.0f - sig));
}

template <bool VEC>
static __global__ void swiglu_fwd_kernel(float *out, const float *g, const float *u, size_t n) {
    if (VEC) {
        for (size_t v = EW_TID; v < n / 4; v += EW_STRIDE) {
            const float4 a = ((const float4 *)g)[v], b = ((const float4 *)u)[v];
            float4 r;
            r.x = silu_mul(a.x, b.x);
            r.y = silu_mul(a.y, b.y);
            r.z = silu_mul(a.z, b.z);
            r.w = silu_mul(a.w, b.w);
            ((float4 *)out)[v] = r;
        }
        for (size_t i = n / 4 * 4 + EW_TID; i < n; i += EW_STRIDE) out[i] = silu_mul(g[i], u[i]);
    } else {
        for (size_t i = EW_TID; i < n; i += EW_STRIDE) out[i] = silu_mul(g[i], u[i]);
    }
}

/* Four bf16 values: one 8-byte store. */
struct alignas(8) olmo_bf16x4 {
    __nv_bfloat16 v[4];
};

template <bool VEC>
static __global__ void swiglu_fwd_bf16_kernel(__nv_bfloat16 *out, const float *g, const float *u, size_t n) {
    if (VEC) {
        for (size_t v = EW_TID; v < n / 4; v += EW_STRIDE) {
            const float4 a = ((const float4 *)g)[v], b = ((const float4 *)u)[v];
            olmo_bf16x4 r;
            r.v[0] = __float2bfloat16(silu_mul(a.x, b.x));
            r.v[1] = __float2bfloat16(silu_mul(a.y, b.y));
            r.v[2] = __float2bfloat16(silu_mul(a.z, b.z));
            r.v[3] = __float2bfloat16(silu_mul(a.w, b.w));
            ((olmo_bf16x4 *)out)[v] = r;
        }
        for (size_t i = n / 4 * 4 + EW_TID; i < n; i += EW_STRIDE) out[i] = __float2bfloat16(silu_mul(g[i], u[i]));
    } else {
        for (size_t i = EW_TID; i < n; i += EW_STRIDE) out[i] = __float2bfloat16(silu_mul(g[i], u[i]));
    }
}

template <bool VEC>
static __global__ void swiglu_bwd_kernel(float *dg, float *du, const float *ds, const float *g, const float *u,
                                         size_t n) {
    if (VEC) {
        for (size_t v = EW_TID; v < n / 4; v += EW_STRIDE) {
            const float4 a = ((const float4 *)g)[v], b = ((const float4 *)u)[v], d = ((const float4 *)ds)[v];
            float4 rg, ru;
            swiglu_grad(a.x, b.x, d.x, &rg.x, &ru.x);
            swiglu_grad(a.y, b.y, d.y, &rg.y, &ru.y);
            swiglu_grad(a.z, b.z, d.z, &rg.z, &ru.z);
            swiglu_grad(a.w, b.w, d.w, &rg.w, &ru.w);
            ((float4 *)dg)[v] = rg;
            ((float4 *)du)[v] = ru;
        }
        for (size_t i = n / 4 * 4 + EW_TID; i < n; i += EW_STRIDE) swiglu_grad(g[i], u[i], ds[i], &dg[i], &du[i]);
    } else {
        for (size_t i = EW_TID; i < n; i += EW_STRIDE) swiglu_grad(g[i], u[i], ds[i], &dg[i], &du[i]);
    }
}

/* swiglu_bwd_kernel's values rounded to bf16: four of each through one 8-byte store. */
static __device__ __forceinline__ void swiglu_grad16(float gi, float ui, float dsi, __nv_bfloat16 *dg,
                                                     __nv_bfloat16 *du) {
    float rg, ru;
    swiglu_grad(gi, ui, dsi, &rg, &ru);
    *dg = __float2bfloat16(rg);
    *du = __float2bfloat16(ru);
}

template <bool VEC>
static __global__ void swiglu_bwd_bf16_kernel(__nv_bfloat16 *dg, __nv_bfloat16 *du, const float *ds, const float *g,
                                              const float *u, size_t n) {
    const size_t tail = VEC ? n / 4 * 4 : 0;
    if (VEC)
        for (size_t v = EW_TID; v < n / 4; v += EW_STRIDE) {
            const float4 a = ((const float4 *)g)[v], b = ((const float4 *)u)[v], d = ((const float4 *)ds)[v];
            olmo_bf16x4 og, ou;
            swiglu_grad16(a.x, b.x, d.x, &og.v[0], &ou.v[0]);
            swiglu_grad16(a.y, b.y, d.y, &og.v[1], &ou.v[1]);
            swiglu_grad16(a.z, b.z, d.z, &og.v[2], &ou.v[2]);
            swiglu_grad16(a.w, b.w, d.w, &og.v[3], &ou.v[3]);
            ((olmo_bf16x4 *)dg)[v] = og;
            ((olmo_bf16x4 *)du)[v] = ou;
        }
    for (size_t i = tail + EW_TID; i < n; i += EW_STRIDE) swiglu_grad16(g[i], u[i], ds[i], &dg[i], &du[i]);
}

int olmo_cuda_swiglu_fwd(OLMO_BE, float *out, const float *g, const float *u, size_t n) {
    (void)be;
    if (!n) return 0;
    if (aligned16(out) && aligned16(g) && aligned16(u))
        OLMO_LAUNCH(swiglu_fwd_kernel<true>, ew4_blocks(n), EW_THREADS, 0, out, g, u, n);
    else
        OLMO_LAUNCH(swiglu_fwd_kernel<false>, olmo_cuda_ew_blocks(n), EW_THREADS, 0, out, g, u, n);
    OLMO_CUDA_LAUNCHED("swiglu_fwd_kernel");
    return 0;
}

int olmo_cuda_swiglu_fwd_bf16(OLMO_BE, void *out, const float *g, const float *u, size_t n) {
    (void)be;
    if (!n) return 0;
    __nv_bfloat16 *o = (__nv_bfloat16 *)out;
    if (((uintptr_t)out & 7u) == 0 && aligned16(g) && aligned16(u))
        OLMO_LAUNCH(swiglu_fwd_bf16_kernel<true>, ew4_blocks(n), EW_THREADS, 0, o, g, u, n);
    else
        OLMO_LAUNCH(swiglu_fwd_bf16_kernel<false>, olmo_cuda_ew_blocks(n), EW_THREADS, 0, o, g, u, n);
    OLMO_CUDA_LAUNCHED("swiglu_fwd_bf16_kernel");
    return 0;
}

int olmo_cuda_swiglu_bwd(OLMO_BE, float *dg, float *du, const float *ds, const float *g, const float *u, size_t n) {
    (void)be;
    if (!n) return 0;
    if (aligned16(dg) && aligned16(du) && aligned16(ds) && aligned16(g) && aligned16(u))
        OLMO_LAUNCH(swiglu_bwd_kernel<true>, ew4_blocks(n), EW_THREADS, 0, dg, du, ds, g, u, n);
    else
        OLMO_LAUNCH(swiglu_bwd_kernel<false>, olmo_cuda_ew_blocks(n), EW_THREADS, 0, dg, du, ds, g, u, n);
    OLMO_CUDA_LAUNCHED("swiglu_bwd_kernel");
    return 0;
}

int olmo_cuda_swiglu_bwd_bf16(OLMO_BE, void *dg, void *du, const float *ds, const float *g, const float *u,
                              size_t n) {
    (void)be;
    if (!n) return 0;
    __nv_bfloat16 *g16 = (__nv_bfloat16 *)dg, *u16 = (__nv_bfloat16 *)du;
    if (((uintptr_t)dg & 7u) == 0 && ((uintptr_t)du & 7u) == 0 && aligned16(ds) && aligned16(g) && aligned16(u))
        OLMO_LAUNCH(swiglu_bwd_bf16_kernel<true>, ew4_blocks(n), EW_THREADS, 0, g16, u16, ds, g, u, n);
    else
        OLMO_LAUNCH(swiglu_bwd_bf16_kernel<false>, olmo_cuda_ew_blocks(n), EW_THREADS, 0, g16, u16, ds, g, u, n);
    OLMO_CUDA_LAUNCHED("swiglu_bwd_bf16_kernel");
    return 0;
}

/* y may alias a or b: each element is read and then written by the same thread. */
template <bool VEC>
static __global__ void add_kernel(float *y, const float *a, const float *b, size_t n) {
    if (VEC) {
        for (size_t v = EW_TID; v < n / 4; v += EW_STRIDE) {
            const float4 p = ((const float4 *)a)[v], q = ((const float4 *)b)[v];
            float4 r;
            r.x = p.x + q.x;
            r.y = p.y + q.y;
            r.z = p.z + q.z;
            r.w = p.w + q.w;
            ((float4 *)y)[v] = r;
        }
        for (size_t i = n / 4 * 4 + EW_TID; i < n; i += EW_STRIDE) y[i] = a[i] + b[i];
    } else {
        for (size_t i = EW_TID; i < n; i += EW_STRIDE) y[i] = a[i] + b[i];
    }
}

/* on the gradient stream when it is selected (a reduce-scattered shard added to the gradients) */
int olmo_cuda_add(OLMO_BE, float *y, const float *a, const float *b, size_t n) {
    if (!n) return 0;
    const cudaStream_t stream = olmo_cuda_current_stream(be);
    if (aligned16(y) && aligned16(a) && aligned16(b))
        OLMO_LAUNCH_ON(stream, add_kernel<true>, ew4_blocks(n), EW_THREADS, 0, y, a, b, n);
    else
        OLMO_LAUNCH_ON(stream, add_kernel<false>, olmo_cuda_ew_blocks(n), EW_THREADS, 0, y, a, b, n);
    OLMO_CUDA_LAUNCHED("add_kernel");
    return 0;
}

template <bool VEC>
static __global__ void scale_kernel(float *x, size_t n, float s) {
    if (VEC) {
        for (size_t v = EW_TID; v < n / 4; v += EW_STRIDE) {
            float4 p = ((float4 *)x)[v];
            p.x *= s;
            p.y *= s;
            p.z *= s;
            p.w *= s;
            ((float4 *)x)[v] = p;
        }
        for (size_t i = n / 4 * 4 + EW_TID; i < n; i += EW_STRIDE) x[i] *= s;
    } else {
        for (size_t i = EW_TID; i < n; i += EW_STRIDE) x[i] *= s;
    }
}

int olmo_cuda_scale(OLMO_BE, float *x, size_t n, float s) {
    (void)be;
    if (!n) return 0;
    if (aligned16(x))
        OLMO_LAUNCH(scale_kernel<true>, ew4_blocks(n), EW_THREADS, 0, x, n, s);
    else
        OLMO_LAUNCH(scale_kernel<false>, olmo_cuda_ew_blocks(n), EW_THREADS, 0, x, n, s);
    OLMO_CUDA_LAUNCHED("scale_kernel");
    return 0;
}

/* ---------------------------------------------------------- cross-entropy */

#define CE_THREADS 512

/* One block per row: max, then sum of fp32 exponentials in double, lse; the
 * row's d(grad_scale * (ce + z_mult * lse^2))/dlogits goes over the row
 * (D16 false) or, rounded to bf16, to d16 + row * ld16 (D16 true), which may
 * be the first half of the row itself (ld16 = 2 * vocab): each chunk of
 * blockDim.x gradients is computed from the logits, then, after a barrier,
 * stored, and chunk c's stores land in bytes [2 c B, 2 (c + 1) B) of the row,
 * below every logit a later chunk reads (from byte 4 (c + 1) B on). */
template <bool D16>
static __global__ void cross_entropy_kernel(float *logits, __nv_bfloat16 *d16, size_t ld16, const int32_t *targets,
                                            int vocab, float grad_scale, float z_mult, double *ce_rows,
                                            double *z_rows) {
    __shared__ double red[32];
    __shared__ float redf[32];
    const size_t i = blockIdx.x;
    float *row = logits + i * vocab;
    __nv_bfloat16 *row16 = D16 ? d16 + i * ld16 : NULL;
    const int target = targets[i];
    if (target < 0) { /* block-uniform */
        for (int j = threadIdx.x; j < vocab; j += blockDim.x) {
            if (D16) row16[j] = __float2bfloat16(0.0f);
            else row[j] = 0.0f;
        }
        if (threadIdx.x == 0) ce_rows[i] = z_rows[i] = 0.0;
        return;
    }
    const float x_target = row[target]; /* read before any thread overwrites the row */
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < vocab; j += blockDim.x)
        if (row[j] > mx) mx = row[j];
    mx = block_max(mx, redf);
    double sum = 0.0;
    for (int j = threadIdx.x; j < vocab; j += blockDim.x) sum += expf(row[j] - mx);
    sum = block_sum(sum, red); /* ends with a barrier: every logit read above is read before any store */
    const double lse = mx + log(sum);
    if (threadIdx.x == 0) {
        ce_rows[i] = lse - x_target;
        z_rows[i] = lse * lse;
    }
    const float lse_f = (float)lse, soft_scale = (float)(grad_scale * (1.0 + 2.0 * z_mult * lse));
    for (int base = 0; base < vocab; base += blockDim.x) { /* block-uniform trip count (the barrier) */
        const int j = base + (int)threadIdx.x;
        float d = 0.0f;
        if (j < vocab) {
            d = expf(row[j] - lse_f) * soft_scale;
            if (j == target) d -= grad_scale;
        }
        if (D16) {
            __syncthreads();
            if (j < vocab) row16[j] = __float2bfloat16(d);
        } else if (j < vocab) {
            row[j] = d;
        }
    }
}

/* The deferred loss sums (backend.h, loss_sums): two doubles in device memory, zero when first made. */
static double *loss_accumulator(OLMO_BE) {
    const bool fresh = !CUDA_STATE(be)->scratch[SCRATCH_LOSS_SUMS];
    double *acc = (double *)olmo_cuda_scratch(be, SCRATCH_LOSS_SUMS, 2 * sizeof(double));
    cudaError_t err;
    if (acc && fresh && (err = cudaMemsetAsync(acc, 0, 2 * sizeof(double), 0)) != cudaSuccess) {
        olmo_cuda_failed("cudaMemsetAsync of the loss sums", __FILE__, __LINE__, cudaGetErrorString(err));
        return NULL;
    }
    return acc;
}

/* acc[i] += sums[i]: the order and rounding of a host loop adding the micro-batches' sums */
static __global__ void add_loss_sums_kernel(double *acc, const double *sums) {
    if (threadIdx.x < 2) acc[threadIdx.x] += sums[threadIdx.x];
}

static int loss_accumulate(OLMO_BE, const double *sums) {
    double *acc = loss_accumulator(be);
    if (!acc) return -1;
    OLMO_LAUNCH(add_loss_sums_kernel, 1, 32, 0, acc, sums);
    OLMO_CUDA_LAUNCHED("add_loss_sums_kernel");
    return 0;
}

/* Both variants: the row kernel over rows [row0, row0 + n) of n_total, its per-row sums kept in
 * SCRATCH_REDUCE (ce at [0, n_total), lse^2 after: the first run sizes the slot for all the rows, so the
 * later runs get the same buffer, and only GEMMs run between runs); after the run that ends at n_total,
 * the two sums over all the rows (one fixed order however the rows were cut) copied to the host (or,
 * with ce_sum / z_sum NULL, added to the deferred accumulator that olmo_cuda_loss_sums reads). */
static int cross_entropy_launch(OLMO_BE, float *logits, __nv_bfloat16 *d16, size_t ld16, const int32_t *targets, int n,
                                int vocab, float grad_scale, float z_mult, int row0, int n_total, double *ce_sum,
                                double *z_sum) {
    if (ce_sum && z_sum) *ce_sum = *z_sum = 0.0; /* NULL: deferred (olmo_cuda_loss_sums) */
    if (n <= 0 || vocab <= 0) return 0;
    double *rows = (double *)olmo_cuda_scratch(be, SCRATCH_REDUCE, 2 * sizeof(double) * (size_t)n_total);
    double *out = rows ? (double *)olmo_cuda_scratch(be, SCRATCH_REDUCE_OUT, 2 * sizeof(double)) : NULL;
    if (!out) return -1;
    if (d16) {
        OLMO_LAUNCH(cross_entropy_kernel<true>, n, CE_THREADS, 0, logits, d16, ld16, targets, vocab, grad_scale,
                    z_mult, rows + row0, rows + n_total + row0);
    } else {
        OLMO_LAUNCH(cross_entropy_kernel<false>, n, CE_THREADS, 0, logits, d16, ld16, targets, vocab, grad_scale,
                    z_mult, rows + row0, rows + n_total + row0);
    }
    OLMO_CUDA_LAUNCHED("cross_entropy_kernel");
    if (row0 + n < n_total) return 0; /* the sums after the last run */
    OLMO_LAUNCH(sum_doubles_kernel, 1, 1024, 0, out, rows, (size_t)n_total);
    OLMO_CUDA_LAUNCHED("sum_doubles_kernel");
    OLMO_LAUNCH(sum_doubles_kernel, 1, 1024, 0, out + 1, rows + n_total, (size_t)n_total);
    OLMO_CUDA_LAUNCHED("sum_doubles_kernel");
    if (!ce_sum || !z_sum) return loss_accumulate(be, out);
    double host[2];
    OLMO_CUDA_WAIT(cudaMemcpy(host, out, sizeof host, cudaMemcpyDeviceToHost));
    *ce_sum = host[0];
    *z_sum = host[1];
    return 0;
}

int olmo_cuda_cross_entropy(OLMO_BE, float *logits, const int32_t *targets, int n, int vocab, float grad_scale,
                             float z_mult, double *ce_sum, double *z_sum) {
    return cross_entropy_launch(be, logits, NULL, 0, targets, n, vocab, grad_scale, z_mult, 0, n, ce_sum, z_sum);
}

int olmo_cuda_cross_entropy_bf16(OLMO_BE, float *logits, void *dlogits, size_t ld, const int32_t *targets, int n,
                                  int vocab, float grad_scale, float z_mult, int row0, int n_total, double *ce_sum,
                                  double *z_sum) {
    if (ce_sum && z_sum) *ce_sum = *z_sum = 0.0;
    struct olmo_cuda_state *st = CUDA_STATE(be);
    if (n < 0 || row0 < 0 || n_total < row0 + n || (n == 0 && n_total > 0))
        return olmo_error("CUDA cross_entropy_bf16: rows [%d, %d + %d) are not a run of rows within the micro-batch's %d",
                          row0, row0, n, n_total);
    if (row0 != 0 && (row0 != st->ce_next_row || n_total != st->ce_rows))
        return olmo_error("CUDA cross_entropy_bf16: rows from %d of %d follow rows up to %d of %d (runs go in row "
                          "order from row 0)",
                          row0, n_total, st->ce_next_row, st->ce_rows);
    if (ld < (size_t)(vocab > 0 ? vocab : 0))
        return olmo_error("CUDA cross_entropy_bf16: leading dimension %zu is less than the vocabulary %d", ld, vocab);
    /* in place: each row's gradient must fall inside its own logits row (ld 2 * vocab) */
    const char *lo = (const char *)logits, *d = (const char *)dlogits;
    if (d >= lo && d < lo + sizeof(float) * (size_t)(n > 0 ? n : 0) * (size_t)(vocab > 0 ? vocab : 0) &&
        (d != lo || ld != 2 * (size_t)vocab))
        return olmo_error("CUDA cross_entropy_bf16: a gradient inside the logits must start at them with leading "
                          "dimension 2 * vocab (%d), got offset %td bytes and %zu",
                          2 * vocab, d - lo, ld);
    st->ce_next_row = st->ce_rows = 0; /* a failed run ends the sequence */
    if (cross_entropy_launch(be, logits, (__nv_bfloat16 *)dlogits, ld, targets, n, vocab, grad_scale, z_mult, row0,
                             n_total, ce_sum, z_sum))
        return -1;
    if (row0 + n < n_total) {
        st->ce_next_row = row0 + n;
        st->ce_rows = n_total;
    }
    return 0;
}

int olmo_cuda_loss_sums(OLMO_BE, double *ce_sum, double *z_sum) {
    double *acc = loss_accumulator(be);
    if (!acc) return -1;
    if (ce_sum && z_sum) {
        double host[2];
        OLMO_CUDA_WAIT(cudaMemcpy(host, acc, sizeof host, cudaMemcpyDeviceToHost));
        *ce_sum = host[0];
        *z_sum = host[1];
    }
    OLMO_CUDA_TRY(cudaMemsetAsync(acc, 0, 2 * sizeof(double), 0));
    return 0;
}

/* ------------------------------------------------------------ sum_squares */

#define SUMSQ_BLOCKS 1024 /* fixed, so the reduction order never depends on the device */

static __global__ void sum_squares_kernel(double *partial, const float *x, size_t n) {
    __shared__ double red[32];
    double acc = 0.0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        acc += (double)x[i] * x[i];
    acc = block_sum(acc, red);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

int olmo_cuda_sum_squares(OLMO_BE, const float *x, size_t n, double *result) {
    *result = 0.0;
    if (!n) return 0;
    double *partial = (double *)olmo_cuda_scratch(be, SCRATCH_REDUCE, SUMSQ_BLOCKS * sizeof(double));
    double *out = partial ? (double *)olmo_cuda_scratch(be, SCRATCH_REDUCE_OUT, 2 * sizeof(double)) : NULL;
    if (!out) return -1;
    OLMO_LAUNCH(sum_squares_kernel, SUMSQ_BLOCKS, EW_THREADS, 0, partial, x, n);
    OLMO_CUDA_LAUNCHED("sum_squares_kernel");
    OLMO_LAUNCH(sum_doubles_kernel, 1, 1024, 0, out, partial, SUMSQ_BLOCKS);
    OLMO_CUDA_LAUNCHED("sum_doubles_kernel");
    double host;
    OLMO_CUDA_WAIT(cudaMemcpy(&host, out, sizeof host, cudaMemcpyDeviceToHost));
    *result = host;
    return 0;
}

/* ------------------------------------------------------------------ AdamW */

/* One element's AdamW update (torch's single-tensor arithmetic, as cpu.c): m, v and the parameter,
 * which it returns. */
static __device__ __forceinline__ float adamw_element(float *param, float gi, float *m, float *v, float beta1,
                                                      float beta2, float eps, float bc2_sqrt, float step_size,
                                                      float decay) {
    float p = *param * decay;
    float mi = *m;
    mi += (gi - mi) * (1.0f - beta1);
    const float vi = *v * beta2 + (1.0f - beta2) * gi * gi;
    const float denom = sqrtf(vi) / bc2_sqrt + eps;
    p -= step_size * mi / denom;
    *m = mi;
    *v = vi;
    *param = p;
    return p;
}

/* The AdamW update over several tensors at once: the decay of the element's range, the gradient scaled
 * first (scale_kernel's product; a scale of 1 leaves it as it is), the bf16 compute copy written where
 * there is one (f32_to_bf16's rounding). */
static __global__ void adamw_flat_kernel(float *param, const float *grad, float *m, float *v, size_t n, float beta1,
                                         float beta2, float eps, float bc2_sqrt, float step_size, float decay,
                                         float decay2, size_t lo2, size_t hi2, float grad_scale,
                                         __nv_bfloat16 *compute) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float p = adamw_element(param + i, grad[i] * grad_scale, m + i, v + i, beta1, beta2, eps, bc2_sqrt,
                                      step_size, i >= lo2 && i < hi2 ? decay2 : decay);
        if (compute) compute[i] = __float2bfloat16(p);
    }
}

int olmo_cuda_adamw_flat(OLMO_BE, float *param, const float *grad, float *m, float *v, size_t n, double lr,
                         float beta1, float beta2, float eps, const struct olmo_adamw_flat *f, long step) {
    if (!n) return 0;
    if (f->compute && be->compute_dtype != OLMO_BF16)
        return olmo_error("CUDA backend: adamw_flat writes a bf16 compute copy; this variant computes in fp32");
    /* the scalars computed on the host in double, as cpu.c (torch's single-tensor AdamW) */
    const double bc1 = 1.0 - pow(beta1, (double)step);
    const float bc2_sqrt = (float)sqrt(1.0 - pow(beta2, (double)step));
    const float step_size = (float)(lr / bc1);
    const float decay = (float)(1.0 - lr * f->weight_decay), decay2 = (float)(1.0 - lr * f->weight_decay2);
    OLMO_LAUNCH(adamw_flat_kernel, olmo_cuda_ew_blocks(n), EW_THREADS, 0, param, grad, m, v, n, beta1, beta2, eps,
                bc2_sqrt, step_size, decay, decay2, f->wd2_lo, f->wd2_hi, f->grad_scale,
                (__nv_bfloat16 *)f->compute);
    OLMO_CUDA_LAUNCHED("adamw_flat_kernel");
    return 0;
}

/* One tensor: adamw_flat with one weight decay, no clipping and no compute copy (the same arithmetic). */
int olmo_cuda_adamw(OLMO_BE, float *param, const float *grad, float *m, float *v, size_t n, double lr, float beta1,
                    float beta2, float eps, double weight_decay, long step) {
    const struct olmo_adamw_flat f = {.weight_decay = weight_decay, .weight_decay2 = weight_decay, .wd2_lo = 0,
                                      .wd2_hi = 0, .grad_scale = 1.0f, .compute = NULL};
    return olmo_cuda_adamw_flat(be, param, grad, m, v, n, lr, beta1, beta2, eps, &f, step);
}
