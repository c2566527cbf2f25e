/* CUDA backend: device memory (cudaMalloc, never managed memory), cuBLAS
 * GEMMs, and one kernel per op of backend.h.  See cuda_internal.h for the
 * execution and error model, backend.h for the GEMM precision variants.
 *
 * Fidelity to the CPU backend (src/backend/cpu/): every kernel evaluates the
 * same expressions in the same order per element, reductions are done in
 * double where cpu.c uses double, and device code is compiled without FMA
 * contraction (-fmad=false), so elementwise ops round like the CPU; only
 * summation order (and libm vs CUDA expf, both within 2 ulp) differs.
 *
 * Determinism: no floating-point atomics.  Every reduction has a fixed
 * shape that does not depend on timing or on the device's SM count:
 *   - rmsnorm dw: per-chunk partial sums, then one ordered pass over chunks;
 *   - embedding backward: token positions sorted by id (stable counting sort
 *     on the host, O(n + vocab)), then one thread per (id, column) adds the
 *     rows in token order -- the same order as cpu.c, so bitwise equal;
 *   - cross-entropy and sum_squares: per-row / per-block partials, then a
 *     single-block tree reduction;
 *   - attention: see cuda_attention.cu (dK/dV and dQ in separate kernels). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_internal.h"

/* ------------------------------------------------------------------ state */

/* The process's device, probed once (which device, whether usable, OLMOC_CUDA_SYNC);
 * everything an instance changes is in its struct olmo_cuda_state. */
static struct {
    bool initialised, usable;
    bool sync_each_launch;
    char why_unusable[256];
} g_cuda;

void olmo_cuda_fatal(const char *what, const char *file, int line, const char *detail) {
    fprintf(stderr, "olmoc: CUDA backend: %s failed at %s:%d: %s\n", what, file, line, detail);
    abort();
}

void olmo_cuda_check_launch(const char *kernel, const char *file, int line) {
    cudaError_t err = cudaGetLastError();
    if (err == cudaSuccess && g_cuda.sync_each_launch) err = cudaDeviceSynchronize();
    if (err != cudaSuccess) olmo_cuda_fatal(kernel, file, line, cudaGetErrorString(err));
}

#define BLAS_CHECK(call)                                                                             \
    do {                                                                                             \
        cublasStatus_t st_ = (call);                                                                 \
        if (st_ != CUBLAS_STATUS_SUCCESS) olmo_cuda_fatal(#call, __FILE__, __LINE__, cublasGetStatusString(st_)); \
    } while (0)

void *olmo_cuda_scratch(OLMO_BE, enum olmo_cuda_scratch_slot slot, size_t bytes) {
    struct olmo_cuda_state *st = CUDA_STATE(be);
    if (bytes > st->scratch_bytes[slot]) {
        /* cudaFree synchronises with the device, so pending kernels are done with the old buffer. */
        if (st->scratch[slot]) OLMO_CUDA_CHECK(cudaFree(st->scratch[slot]));
        st->scratch[slot] = NULL;
        size_t want = bytes + bytes / 4;
        OLMO_CUDA_CHECK(cudaMalloc(&st->scratch[slot], want));
        olmo_memcount_scratch(&st->mem, st->scratch_bytes[slot], want);
        st->scratch_bytes[slot] = want;
    }
    return st->scratch[slot];
}

/* Threads per block of the row kernels; reductions assume a multiple of 32. */
#define ROW_THREADS 256
#define EW_THREADS 256

static unsigned ew_blocks(size_t n) {
    size_t blocks = (n + EW_THREADS - 1) / EW_THREADS;
    if (blocks > (1u << 20)) blocks = 1u << 20; /* grid-stride loops cover the rest */
    return blocks ? (unsigned)blocks : 1u;
}

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

/* ----------------------------------------------------------------- memory */

static void *cu_alloc(OLMO_BE, size_t bytes) {
    void *p = NULL;
    size_t rounded = (bytes + 255) & ~(size_t)255;
    if (!rounded) rounded = 256;
    cudaError_t err = cudaMalloc(&p, rounded);
    if (err != cudaSuccess) {
        cudaGetLastError(); /* allocation failures are not sticky; clear them */
        olmo_error("CUDA: cannot allocate %zu bytes of device memory (%s)", bytes, cudaGetErrorString(err));
        return NULL;
    }
    if (olmo_memcount_add(&CUDA_STATE(be)->mem, p, rounded)) {
        cudaFree(p);
        return NULL;
    }
    OLMO_CUDA_CHECK(cudaMemset(p, 0, rounded));
    return p;
}

static void cu_free(OLMO_BE, void *p) {
    olmo_memcount_remove(&CUDA_STATE(be)->mem, p);
    if (p) OLMO_CUDA_CHECK(cudaFree(p));
}

static void cu_mem_stats(OLMO_BE, struct olmo_mem_stats *out) {
    const struct olmo_memcount *c = &CUDA_STATE(be)->mem;
    out->live = c->live;
    out->peak = c->peak;
    out->scratch = c->scratch;
    out->n_live = c->n_live;
}

static int cu_to_device(OLMO_BE, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (bytes) OLMO_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
    return 0;
}

static int cu_to_host(OLMO_BE, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (bytes) OLMO_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
    return 0;
}

static int cu_zero(OLMO_BE, void *p, size_t bytes) {
    if (bytes) OLMO_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, olmo_cuda_current_stream(be)));
    return 0;
}

static int cu_copy(OLMO_BE, void *dst, const void *src, size_t bytes) {
    if (bytes && dst != src)
        OLMO_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, olmo_cuda_current_stream(be)));
    return 0;
}

/* ---- the side stream ---- */

static int cu_side_begin(OLMO_BE) {
    struct olmo_cuda_state *st = CUDA_STATE(be);
    if (st->on_side) return olmo_error("CUDA backend: side_begin twice without side_end");
    if (!st->side) {
        /* non-blocking: no implicit ordering against the legacy default stream, only the events below */
        OLMO_CUDA_CHECK(cudaStreamCreateWithFlags(&st->side, cudaStreamNonBlocking));
        OLMO_CUDA_CHECK(cudaEventCreateWithFlags(&st->main_mark, cudaEventDisableTiming));
        for (int i = 0; i < 2; i++) OLMO_CUDA_CHECK(cudaEventCreateWithFlags(&st->side_mark[i], cudaEventDisableTiming));
    }
    OLMO_CUDA_CHECK(cudaEventRecord(st->main_mark, 0));
    OLMO_CUDA_CHECK(cudaStreamWaitEvent(st->side, st->main_mark, 0));
    st->on_side = true;
    return 0;
}

static int cu_side_end(OLMO_BE, int slot) {
    struct olmo_cuda_state *st = CUDA_STATE(be);
    if (!st->on_side) return olmo_error("CUDA backend: side_end(%d) without side_begin", slot);
    st->on_side = false; /* back on the default stream, whatever follows */
    if (slot < 0 || slot > 1) {
        /* nothing can wait for the side work now: finish it here */
        OLMO_CUDA_CHECK(cudaStreamSynchronize(st->side));
        return olmo_error("CUDA backend: side_end(%d): the slots are 0 and 1", slot);
    }
    OLMO_CUDA_CHECK(cudaEventRecord(st->side_mark[slot], st->side));
    return 0;
}

static int cu_side_wait(OLMO_BE, int slot) {
    struct olmo_cuda_state *st = CUDA_STATE(be);
    if (st->on_side || slot < 0 || slot > 1 || !st->side)
        return olmo_error("CUDA backend: side_wait(%d) on the side stream or before any side work", slot);
    OLMO_CUDA_CHECK(cudaStreamWaitEvent(0, st->side_mark[slot], 0));
    return 0;
}

static int cu_synchronize(OLMO_BE) {
    (void)be;
    OLMO_CUDA_CHECK(cudaDeviceSynchronize());
    return 0;
}

/* ------------------------------------------------------------------- GEMM */

static __global__ void f32_to_bf16_kernel(__nv_bfloat16 *dst, const float *src, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16(src[i]); /* round to nearest even */
}

static __global__ void bf16_to_f32_kernel(float *dst, const __nv_bfloat16 *src, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __bfloat162float(src[i]); /* exact */
}

static int cu_convert(OLMO_BE, void *dst, enum olmo_float_type dst_type, const void *src, enum olmo_float_type src_type,
                      size_t n) {
    if (!n) return 0;
    const cudaStream_t stream = olmo_cuda_current_stream(be);
    if (dst_type == src_type) {
        OLMO_CUDA_CHECK(
            cudaMemcpyAsync(dst, src, n * olmo_float_type_size(dst_type), cudaMemcpyDeviceToDevice, stream));
    } else if (dst_type == OLMO_BF16) {
        OLMO_LAUNCH_ON(stream, f32_to_bf16_kernel, ew_blocks(n), EW_THREADS, 0, (__nv_bfloat16 *)dst,
                       (const float *)src, n);
        OLMO_CUDA_LAUNCHED("f32_to_bf16_kernel");
    } else {
        OLMO_LAUNCH_ON(stream, bf16_to_f32_kernel, ew_blocks(n), EW_THREADS, 0, (float *)dst,
                       (const __nv_bfloat16 *)src, n);
        OLMO_CUDA_LAUNCHED("bf16_to_f32_kernel");
    }
    return 0;
}

/* Elements of a row-major operand of rows x cols with leading dimension ld that cuBLAS reads. */
static size_t operand_span(int rows, int cols, int ld) {
    return rows > 0 && cols > 0 ? (size_t)(rows - 1) * ld + cols : 0;
}

/* An fp32 operand as it is, a bf16 one widened into scratch (same leading dimension). */
static const float *f32_operand(OLMO_BE, enum olmo_cuda_scratch_slot slot, const void *src, enum olmo_float_type type,
                                int rows, int cols, int ld) {
    if (type == OLMO_F32) return (const float *)src;
    const size_t n = operand_span(rows, cols, ld);
    float *dst = (float *)olmo_cuda_scratch(be, slot, (n ? n : 1) * sizeof(float));
    cu_convert(be, dst, OLMO_F32, src, OLMO_BF16, n);
    return dst;
}

/* A row-major operand stored as rows x cols with leading dimension ld, as a
 * bf16 copy with the same leading dimension (only the elements cuBLAS reads);
 * a bf16 operand (a compute copy of the weights) as it is. */
static const __nv_bfloat16 *bf16_operand(OLMO_BE, enum olmo_cuda_scratch_slot slot, const void *src_any,
                                         enum olmo_float_type type, int rows, int cols, int ld) {
    if (type == OLMO_BF16) return (const __nv_bfloat16 *)src_any;
    const float *src = (const float *)src_any;
    size_t n = rows > 0 && cols > 0 ? (size_t)(rows - 1) * ld + cols : 0;
    __nv_bfloat16 *dst = (__nv_bfloat16 *)olmo_cuda_scratch(be, slot, (n ? n : 1) * sizeof(__nv_bfloat16));
    if (n) {
        OLMO_LAUNCH(f32_to_bf16_kernel, ew_blocks(n), EW_THREADS, 0, dst, src, n);
        OLMO_CUDA_LAUNCHED("f32_to_bf16_kernel");
    }
    return dst;
}

/* Row-major C = alpha op(A) op(B) + beta C through column-major cuBLAS: a
 * row-major matrix is its transpose in column-major, so compute
 * C^T = op(B)^T op(A)^T, i.e. swap the operands and m/n, keep the op flags. */
static void cu_gemm_impl(OLMO_BE, enum olmo_cuda_gemm_precision precision, bool ta, bool tb, int m, int n, int k,
                         float alpha, const void *a_any, enum olmo_float_type a_type, int lda, const void *b_any,
                         enum olmo_float_type b_type, int ldb, float beta, float *c, int ldc) {
    if (m <= 0 || n <= 0) return;
    /* fp32 operands for every variant but cuda-bf16 (bf16 ones widened, exactly) */
    const float *a = precision == OLMO_CUDA_BF16
                         ? NULL
                         : f32_operand(be, SCRATCH_GEMM_A, a_any, a_type, ta ? k : m, ta ? m : k, lda);
    const float *b = precision == OLMO_CUDA_BF16
                         ? NULL
                         : f32_operand(be, SCRATCH_GEMM_B, b_any, b_type, tb ? n : k, tb ? k : n, ldb);
    const cublasOperation_t op_a = ta ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    switch (precision) {
    case OLMO_CUDA_FP32:
        BLAS_CHECK(cublasSgemm(CUDA_STATE(be)->blas, op_b, op_a, n, m, k, &alpha, b, ldb, a, lda, &beta, c, ldc));
        break;
    case OLMO_CUDA_TF32:
        BLAS_CHECK(cublasGemmEx(CUDA_STATE(be)->blas, op_b, op_a, n, m, k, &alpha, b, CUDA_R_32F, ldb, a, CUDA_R_32F, lda,
                                &beta, c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT));
        break;
    case OLMO_CUDA_BF16: {
        /* Stored shapes: A is (ta ? k x m : m x k), B is (tb ? n x k : k x n). */
        const __nv_bfloat16 *a16 = bf16_operand(be, SCRATCH_GEMM_A, a_any, a_type, ta ? k : m, ta ? m : k, lda);
        const __nv_bfloat16 *b16 = bf16_operand(be, SCRATCH_GEMM_B, b_any, b_type, tb ? n : k, tb ? k : n, ldb);
        BLAS_CHECK(cublasGemmEx(CUDA_STATE(be)->blas, op_b, op_a, n, m, k, &alpha, b16, CUDA_R_16BF, ldb, a16, CUDA_R_16BF,
                                lda, &beta, c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        break;
    }
    case OLMO_CUDA_BF16_CUBLAS:
        BLAS_CHECK(cublasGemmEx(CUDA_STATE(be)->blas, op_b, op_a, n, m, k, &alpha, b, CUDA_R_32F, ldb, a, CUDA_R_32F, lda,
                                &beta, c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F_FAST_16BF, CUBLAS_GEMM_DEFAULT));
        break;
    }
    if (g_cuda.sync_each_launch) OLMO_CUDA_CHECK(cudaDeviceSynchronize());
}

/* The instance's precision (CUDA_STATE(be)->precision) picks the cuBLAS call. */
static int cu_gemm(OLMO_BE, bool ta, bool tb, int m, int n, int k, float alpha, const void *a, enum olmo_float_type a_type,
                   int lda, const void *b, enum olmo_float_type b_type, int ldb, float beta, float *c, int ldc) {
    cu_gemm_impl(be, CUDA_STATE(be)->precision, ta, tb, m, n, k, alpha, a, a_type, lda, b, b_type, ldb, beta, c, ldc);
    return 0;
}

/* -------------------------------------------------------------- embedding */

static __global__ void embedding_fwd_kernel(float *out, const float *table, const int32_t *tokens, int dim) {
    const size_t i = blockIdx.x;
    const float *src = table + (size_t)tokens[i] * dim;
    float *dst = out + i * dim;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) dst[j] = src[j];
}

static int cu_embedding_fwd(OLMO_BE, float *out, const float *table, const int32_t *tokens, int n, int dim) {
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

static int cu_embedding_bwd(OLMO_BE, float *dtable, const float *dout, const int32_t *tokens, int n, int dim) {
    if (n <= 0 || dim <= 0) return 0;
    int32_t *tok = (int32_t *)malloc(sizeof(int32_t) * (size_t)n);
    if (!tok) olmo_cuda_fatal("malloc", __FILE__, __LINE__, "out of host memory (embedding backward)");
    cu_to_host(be, tok, tokens, sizeof(int32_t) * (size_t)n);
    int32_t max_tok = -1;
    for (int i = 0; i < n; i++)
        if (tok[i] > max_tok) max_tok = tok[i];
    if (max_tok < 0) { /* negative ids are skipped (the model never passes them) */
        free(tok);
        return 0;
    }
    /* Stable counting sort of positions by id: start[v] = first slot of id v. */
    int32_t *start = (int32_t *)calloc((size_t)max_tok + 2, sizeof(int32_t));
    int32_t *packed = (int32_t *)malloc(sizeof(int32_t) * (3 * (size_t)n + 1));
    if (!start || !packed) olmo_cuda_fatal("malloc", __FILE__, __LINE__, "out of host memory (embedding backward)");
    for (int i = 0; i < n; i++)
        if (tok[i] >= 0) start[tok[i] + 1]++;
    for (int32_t v = 0; v <= max_tok; v++) start[v + 1] += start[v];
    const int n_valid = start[max_tok + 1];
    int32_t *order = packed;
    for (int i = 0; i < n; i++)
        if (tok[i] >= 0) order[start[tok[i]]++] = i;
    /* Segments of equal ids; packed layout: order[n_valid], seg_begin[n_seg+1], seg_token[n_seg]. */
    int32_t *seg_begin = packed + n_valid;
    int n_seg = 0;
    for (int p = 0; p < n_valid; p++)
        if (p == 0 || tok[order[p]] != tok[order[p - 1]]) seg_begin[n_seg++] = p;
    seg_begin[n_seg] = n_valid;
    int32_t *seg_token = seg_begin + n_seg + 1;
    for (int s = 0; s < n_seg; s++) seg_token[s] = tok[order[seg_begin[s]]];
    const size_t packed_n = (size_t)n_valid + 2 * (size_t)n_seg + 1;
    int32_t *dev = (int32_t *)olmo_cuda_scratch(be, SCRATCH_EMBED_INDEX, packed_n * sizeof(int32_t));
    cu_to_device(be, dev, packed, packed_n * sizeof(int32_t));
    free(tok);
    free(start);
    free(packed);
    dim3 grid((unsigned)n_seg, (unsigned)((dim + ROW_THREADS - 1) / ROW_THREADS));
    OLMO_LAUNCH(embedding_bwd_kernel, grid, ROW_THREADS, 0, dtable, dout, dev, dev + n_valid,
                dev + n_valid + n_seg + 1, dim);
    OLMO_CUDA_LAUNCHED("embedding_bwd_kernel");
    return 0;
}

/* ---------------------------------------------------------------- RMSNorm */

static __global__ void rmsnorm_fwd_kernel(float *y, float *rstd, const float *x, const float *w, int dim,
                                          float eps) {
    __shared__ double red[32];
    const size_t row = blockIdx.x;
    const float *xi = x + row * dim;
    float *yi = y + row * dim;
    double ss = 0.0;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) ss += (double)xi[j] * xi[j];
    ss = block_sum(ss, red);
    const float r = (float)(1.0 / sqrt(ss / dim + eps));
    if (threadIdx.x == 0) rstd[row] = r;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) yi[j] = w[j] * (xi[j] * r);
}

static int cu_rmsnorm_fwd(OLMO_BE, float *y, float *rstd, const float *x, const float *w, int n, int dim, float eps) {
    (void)be;
    if (n <= 0 || dim <= 0) return 0;
    OLMO_LAUNCH(rmsnorm_fwd_kernel, n, ROW_THREADS, 0, y, rstd, x, w, dim, eps);
    OLMO_CUDA_LAUNCHED("rmsnorm_fwd_kernel");
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

/* dx may alias dy: each element is read and then written by the same thread. */
static __global__ void rmsnorm_dx_kernel(float *dx, const float *dy, const float *x, const float *w,
                                         const float *rstd, int dim) {
    __shared__ double red[32];
    const size_t row = blockIdx.x;
    const float *xi = x + row * dim, *dyi = dy + row * dim;
    float *dxi = dx + row * dim;
    const float r = rstd[row];
    double dot = 0.0;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) {
        const float xhat = xi[j] * r;
        dot += (double)dyi[j] * w[j] * xhat;
    }
    dot = block_sum(dot, red);
    const float mean = (float)(dot / dim);
    for (int j = threadIdx.x; j < dim; j += blockDim.x) dxi[j] = r * (dyi[j] * w[j] - xi[j] * r * mean);
}

static int cu_rmsnorm_bwd(OLMO_BE, float *dx, float *dw, const float *dy, const float *x, const float *w,
                           const float *rstd, int n, int dim) {
    if (n <= 0 || dim <= 0) return 0;
    /* dw first: it reads dy, which dx may overwrite. */
    const int max_chunks = 256;
    const int rows_per_chunk = (n + max_chunks - 1) / max_chunks;
    const int chunks = (n + rows_per_chunk - 1) / rows_per_chunk;
    double *partial = (double *)olmo_cuda_scratch(be, SCRATCH_RMS_DW, sizeof(double) * (size_t)chunks * dim);
    const unsigned col_blocks = (unsigned)((dim + ROW_THREADS - 1) / ROW_THREADS);
    OLMO_LAUNCH(rmsnorm_dw_partial_kernel, dim3(col_blocks, (unsigned)chunks), ROW_THREADS, 0, partial, dy, x, rstd,
                n, dim, rows_per_chunk);
    OLMO_CUDA_LAUNCHED("rmsnorm_dw_partial_kernel");
    OLMO_LAUNCH(rmsnorm_dw_finish_kernel, col_blocks, ROW_THREADS, 0, dw, partial, chunks, dim);
    OLMO_CUDA_LAUNCHED("rmsnorm_dw_finish_kernel");
    OLMO_LAUNCH(rmsnorm_dx_kernel, n, ROW_THREADS, 0, dx, dy, x, w, rstd, dim);
    OLMO_CUDA_LAUNCHED("rmsnorm_dx_kernel");
    return 0;
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

static void rope_launch(float *x, const float *cos_t, const float *sin_t, int n_rows, int seq_len, int heads,
                        int head_dim, float sign) {
    const size_t total = (size_t)n_rows * heads * (head_dim / 2);
    if (!total) return;
    OLMO_LAUNCH(rope_kernel, ew_blocks(total), EW_THREADS, 0, x, cos_t, sin_t, total, seq_len, heads, head_dim, sign);
    OLMO_CUDA_LAUNCHED("rope_kernel");
}

static int cu_rope_fwd(OLMO_BE, float *x, const float *cos_t, const float *sin_t, int n_rows, int seq_len, int heads,
                        int head_dim) {
    (void)be;
    rope_launch(x, cos_t, sin_t, n_rows, seq_len, heads, head_dim, 1.0f);
    return 0;
}

static int cu_rope_bwd(OLMO_BE, float *dx, const float *cos_t, const float *sin_t, int n_rows, int seq_len, int heads,
                        int head_dim) {
    (void)be;
    rope_launch(dx, cos_t, sin_t, n_rows, seq_len, heads, head_dim, -1.0f);
    return 0;
}

/* ------------------------------------------------- SwiGLU, add, scale */

static __global__ void swiglu_fwd_kernel(float *out, const float *g, const float *u, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float x = g[i];
        out[i] = x / (1.0f + expf(-x)) * u[i];
    }
}

static __global__ void swiglu_bwd_kernel(float *dg, float *du, const float *ds, const float *g, const float *u,
                                         size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float gi = g[i], ui = u[i], dsi = ds[i];
        const float sig = 1.0f / (1.0f + expf(-gi));
        const float sl = gi * sig;
        du[i] = dsi * sl;
        dg[i] = dsi * ui * sig * (1.0f + gi * (1.0f - sig));
    }
}

static int cu_swiglu_fwd(OLMO_BE, float *out, const float *g, const float *u, size_t n) {
    (void)be;
    if (!n) return 0;
    OLMO_LAUNCH(swiglu_fwd_kernel, ew_blocks(n), EW_THREADS, 0, out, g, u, n);
    OLMO_CUDA_LAUNCHED("swiglu_fwd_kernel");
    return 0;
}

static int cu_swiglu_bwd(OLMO_BE, float *dg, float *du, const float *ds, const float *g, const float *u, size_t n) {
    (void)be;
    if (!n) return 0;
    OLMO_LAUNCH(swiglu_bwd_kernel, ew_blocks(n), EW_THREADS, 0, dg, du, ds, g, u, n);
    OLMO_CUDA_LAUNCHED("swiglu_bwd_kernel");
    return 0;
}

static __global__ void add_kernel(float *y, const float *a, const float *b, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = a[i] + b[i];
}

static int cu_add(OLMO_BE, float *y, const float *a, const float *b, size_t n) {
    (void)be;
    if (!n) return 0;
    OLMO_LAUNCH(add_kernel, ew_blocks(n), EW_THREADS, 0, y, a, b, n);
    OLMO_CUDA_LAUNCHED("add_kernel");
    return 0;
}

static __global__ void scale_kernel(float *x, size_t n, float s) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] *= s;
}

static int cu_scale(OLMO_BE, float *x, size_t n, float s) {
    (void)be;
    if (!n) return 0;
    OLMO_LAUNCH(scale_kernel, ew_blocks(n), EW_THREADS, 0, x, n, s);
    OLMO_CUDA_LAUNCHED("scale_kernel");
    return 0;
}

/* ---------------------------------------------------------- cross-entropy */

#define CE_THREADS 512

/* One block per row: max, then sum of fp32 exponentials in double, lse; the
 * row is overwritten with d(grad_scale * (ce + z_mult * lse^2))/dlogits. */
static __global__ void cross_entropy_kernel(float *logits, const int32_t *targets, int vocab, float grad_scale,
                                            float z_mult, double *ce_rows, double *z_rows) {
    __shared__ double red[32];
    __shared__ float redf[32];
    const size_t i = blockIdx.x;
    float *row = logits + i * vocab;
    const int target = targets[i];
    if (target < 0) { /* block-uniform */
        for (int j = threadIdx.x; j < vocab; j += blockDim.x) row[j] = 0.0f;
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
    sum = block_sum(sum, red);
    const double lse = mx + log(sum);
    if (threadIdx.x == 0) {
        ce_rows[i] = lse - x_target;
        z_rows[i] = lse * lse;
    }
    const float lse_f = (float)lse, soft_scale = (float)(grad_scale * (1.0 + 2.0 * z_mult * lse));
    for (int j = threadIdx.x; j < vocab; j += blockDim.x) {
        float d = expf(row[j] - lse_f) * soft_scale;
        if (j == target) d -= grad_scale;
        row[j] = d;
    }
}

static int cu_cross_entropy(OLMO_BE, float *logits, const int32_t *targets, int n, int vocab, float grad_scale,
                             float z_mult, double *ce_sum, double *z_sum) {
    *ce_sum = *z_sum = 0.0;
    if (n <= 0 || vocab <= 0) return 0;
    double *rows = (double *)olmo_cuda_scratch(be, SCRATCH_REDUCE, 2 * sizeof(double) * (size_t)n);
    double *out = (double *)olmo_cuda_scratch(be, SCRATCH_REDUCE_OUT, 2 * sizeof(double));
    OLMO_LAUNCH(cross_entropy_kernel, n, CE_THREADS, 0, logits, targets, vocab, grad_scale, z_mult, rows, rows + n);
    OLMO_CUDA_LAUNCHED("cross_entropy_kernel");
    OLMO_LAUNCH(sum_doubles_kernel, 1, 1024, 0, out, rows, (size_t)n);
    OLMO_CUDA_LAUNCHED("sum_doubles_kernel");
    OLMO_LAUNCH(sum_doubles_kernel, 1, 1024, 0, out + 1, rows + n, (size_t)n);
    OLMO_CUDA_LAUNCHED("sum_doubles_kernel");
    double host[2];
    cu_to_host(be, host, out, sizeof host);
    *ce_sum = host[0];
    *z_sum = host[1];
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

static int cu_sum_squares(OLMO_BE, const float *x, size_t n, double *result) {
    *result = 0.0;
    if (!n) return 0;
    double *partial = (double *)olmo_cuda_scratch(be, SCRATCH_REDUCE, SUMSQ_BLOCKS * sizeof(double));
    double *out = (double *)olmo_cuda_scratch(be, SCRATCH_REDUCE_OUT, 2 * sizeof(double));
    OLMO_LAUNCH(sum_squares_kernel, SUMSQ_BLOCKS, EW_THREADS, 0, partial, x, n);
    OLMO_CUDA_LAUNCHED("sum_squares_kernel");
    OLMO_LAUNCH(sum_doubles_kernel, 1, 1024, 0, out, partial, SUMSQ_BLOCKS);
    OLMO_CUDA_LAUNCHED("sum_doubles_kernel");
    double host;
    cu_to_host(be, &host, out, sizeof host);
    *result = host;
    return 0;
}

/* ------------------------------------------------------------------ AdamW */

static __global__ void adamw_kernel(float *param, const float *grad, float *m, float *v, size_t n, float beta1,
                                    float beta2, float eps, float bc2_sqrt, float step_size, float decay) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float gi = grad[i];
        float p = param[i] * decay;
        float mi = m[i];
        mi += (gi - mi) * (1.0f - beta1);
        const float vi = v[i] * beta2 + (1.0f - beta2) * gi * gi;
        const float denom = sqrtf(vi) / bc2_sqrt + eps;
        p -= step_size * mi / denom;
        m[i] = mi;
        v[i] = vi;
        param[i] = p;
    }
}

static int cu_adamw(OLMO_BE, float *param, const float *grad, float *m, float *v, size_t n, double lr, float beta1,
                     float beta2, float eps, double weight_decay, long step) {
    (void)be;
    if (!n) return 0;
    /* Same scalars, computed on the host in double, as cpu.c (torch's single-tensor AdamW). */
    const double bc1 = 1.0 - pow(beta1, (double)step);
    const float bc2_sqrt = (float)sqrt(1.0 - pow(beta2, (double)step));
    const float step_size = (float)(lr / bc1);
    const float decay = (float)(1.0 - lr * weight_decay);
    OLMO_LAUNCH(adamw_kernel, ew_blocks(n), EW_THREADS, 0, param, grad, m, v, n, beta1, beta2, eps, bc2_sqrt,
                step_size, decay);
    OLMO_CUDA_LAUNCHED("adamw_kernel");
    return 0;
}

/* --------------------------------------------------------------- backends */

static bool cuda_init(void) {
    if (g_cuda.initialised) {
        if (!g_cuda.usable) olmo_error("%s", g_cuda.why_unusable);
        return g_cuda.usable;
    }
    g_cuda.initialised = true;
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        cudaGetLastError();
        snprintf(g_cuda.why_unusable, sizeof g_cuda.why_unusable, "CUDA backend: no usable CUDA device (%s)",
                 err != cudaSuccess ? cudaGetErrorString(err) : "none found");
        olmo_error("%s", g_cuda.why_unusable);
        return false;
    }
    /* Under mpirun each rank of a node takes its own device (local rank modulo the count). */
    const char *local_vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK"};
    for (size_t i = 0; i < sizeof local_vars / sizeof local_vars[0]; i++) {
        const char *v = getenv(local_vars[i]);
        if (v && *v) {
            err = cudaSetDevice(atoi(v) % count);
            if (err != cudaSuccess) {
                snprintf(g_cuda.why_unusable, sizeof g_cuda.why_unusable,
                         "CUDA backend: cannot select device %d for local rank %s (%s)", atoi(v) % count, v,
                         cudaGetErrorString(err));
                olmo_error("%s", g_cuda.why_unusable);
                return false;
            }
            break;
        }
    }
    const char *sync = getenv("OLMOC_CUDA_SYNC");
    g_cuda.sync_each_launch = sync && *sync && strcmp(sync, "0") != 0;
    g_cuda.usable = true;
    return true;
}

static void cu_destroy(struct olmo_backend *be) {
    struct olmo_cuda_state *st = CUDA_STATE(be);
    if (!st) return;
#ifdef OLMOC_HAVE_NCCL
    olmo_cuda_comm_destroy(be);
#endif
    for (int i = 0; i < SCRATCH_SLOTS; i++)
        if (st->scratch[i]) cudaFree(st->scratch[i]);
    if (st->side) {
        cudaStreamSynchronize(st->side);
        cudaStreamDestroy(st->side);
        cudaEventDestroy(st->main_mark);
        for (int i = 0; i < 2; i++) cudaEventDestroy(st->side_mark[i]);
    }
    olmo_memcount_free(&st->mem);
    if (st->blas) cublasDestroy(st->blas);
    free(st);
    be->state = NULL;
}

static const char *const variant_names[] = {"cuda", "cuda-tf32", "cuda-bf16", "cuda-bf16-cublas"};

extern "C" struct olmo_backend *olmo_backend_cuda_create(enum olmo_cuda_gemm_precision precision) {
    if (precision < OLMO_CUDA_FP32 || precision > OLMO_CUDA_BF16_CUBLAS) {
        olmo_error("CUDA backend: unknown GEMM precision %d", (int)precision);
        return NULL;
    }
    if (!cuda_init()) return NULL;
    struct olmo_backend *be = (struct olmo_backend *)olmo_calloc(1, sizeof *be, "backend");
    struct olmo_cuda_state *st = be ? (struct olmo_cuda_state *)olmo_calloc(1, sizeof *st, "CUDA backend state") : NULL;
    if (!st) {
        free(be);
        return NULL;
    }
    st->precision = precision;
    be->state = st;
    be->destroy = cu_destroy;
    cublasStatus_t bst = cublasCreate(&st->blas);
    if (bst != CUBLAS_STATUS_SUCCESS) {
        st->blas = NULL;
        olmo_error("CUDA backend: cublasCreate failed (%s)", cublasGetStatusString(bst));
        olmo_backend_destroy(be);
        return NULL;
    }
    /* Plain fp32 SGEMM (no TF32) unless a variant asks for it per call. */
    BLAS_CHECK(cublasSetMathMode(st->blas, CUBLAS_DEFAULT_MATH));
    const bool bf16 = precision == OLMO_CUDA_BF16 || precision == OLMO_CUDA_BF16_CUBLAS;
    be->name = variant_names[precision];
    be->alloc = cu_alloc;
    be->free = cu_free;
    be->mem_stats = cu_mem_stats;
    be->to_device = cu_to_device;
    be->to_host = cu_to_host;
    be->zero = cu_zero;
    be->copy = cu_copy;
    be->synchronize = cu_synchronize;
    be->convert = cu_convert;
    be->side_begin = cu_side_begin;
    be->side_end = cu_side_end;
    be->side_wait = cu_side_wait;
    /* cuda-bf16 multiplies a bf16 compute copy of the weights; cuda-bf16-cublas rounds inside cuBLAS */
    be->compute_dtype = precision == OLMO_CUDA_BF16 ? OLMO_BF16 : OLMO_F32;
    be->check_attention = olmo_cuda_check_attention;
    be->gemm = cu_gemm;
    be->embedding_fwd = cu_embedding_fwd;
    be->embedding_bwd = cu_embedding_bwd;
    be->rmsnorm_fwd = cu_rmsnorm_fwd;
    be->rmsnorm_bwd = cu_rmsnorm_bwd;
    be->rope_fwd = cu_rope_fwd;
    be->rope_bwd = cu_rope_bwd;
    /* bf16 operands for attention's products too (tensor cores), as for the GEMMs */
    be->attention_fwd = bf16 ? olmo_cuda_attention_fwd_bf16 : olmo_cuda_attention_fwd;
    be->attention_bwd = bf16 ? olmo_cuda_attention_bwd_bf16 : olmo_cuda_attention_bwd;
    be->swiglu_fwd = cu_swiglu_fwd;
    be->swiglu_bwd = cu_swiglu_bwd;
    be->add = cu_add;
    be->cross_entropy = cu_cross_entropy;
    be->sum_squares = cu_sum_squares;
    be->scale = cu_scale;
    be->adamw = cu_adamw;
    be->attention_cached = olmo_cuda_attention_cached;
#ifdef OLMOC_HAVE_NCCL
    be->comm_init = olmo_cuda_comm_init;
    be->comm_allreduce_sum = olmo_cuda_comm_allreduce_sum;
    be->comm_allgather = olmo_cuda_comm_allgather;
    be->comm_destroy = olmo_cuda_comm_destroy;
    be->comm_group_create = olmo_cuda_comm_group_create;
    be->comm_group_allgather = olmo_cuda_comm_group_allgather;
    be->comm_group_reduce_scatter = olmo_cuda_comm_group_reduce_scatter;
    be->comm_group_allreduce_sum = olmo_cuda_comm_group_allreduce_sum;
    be->comm_group_destroy = olmo_cuda_comm_group_destroy;
#endif
    return be;
}
