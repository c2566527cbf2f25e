/* CUDA backend: device memory (cudaMalloc, never managed memory), the side
 * and gradient streams, cuBLAS GEMMs and the op table; the other ops' kernels are in
 * cuda_ops.cu, attention's in cuda_attention.cu and cuda_attention_tc.cu.
 * See cuda_internal.h for the execution and error model, backend.h for the
 * GEMM precision variants.
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
    char device_name[256]; /* the selected device's, "" when CUDA does not say */
} g_cuda;

/* what up to its first '(': the called function's name, without its arguments */
int olmo_cuda_failed(const char *what, const char *file, int line, const char *detail) {
    return olmo_error("CUDA backend: %.*s failed at %s:%d: %s", (int)strcspn(what, "("), what, file, line, detail);
}

void olmo_cuda_fatal(const char *what, const char *file, int line, const char *detail) {
    fprintf(stderr, "olmoc: CUDA backend: %.*s failed at %s:%d: %s\n", (int)strcspn(what, "("), what, file, line,
            detail);
    abort();
}

int olmo_cuda_check_launch(const char *kernel, const char *file, int line) {
    cudaError_t err = cudaGetLastError();
    if (err == cudaSuccess && g_cuda.sync_each_launch) err = cudaDeviceSynchronize();
    if (err != cudaSuccess) return olmo_cuda_failed(kernel, file, line, cudaGetErrorString(err));
    return 0;
}

void *olmo_cuda_scratch(OLMO_BE, enum olmo_cuda_scratch_slot slot, size_t bytes) {
    struct olmo_cuda_state *st = CUDA_STATE(be);
    if (bytes > st->scratch_bytes[slot]) {
        /* cudaFree synchronises with the device, so pending kernels are done with the old buffer. */
        cudaError_t err = st->scratch[slot] ? cudaFree(st->scratch[slot]) : cudaSuccess;
        st->scratch[slot] = NULL;
        olmo_memcount_scratch(&st->mem, st->scratch_bytes[slot], 0);
        st->scratch_bytes[slot] = 0;
        if (err != cudaSuccess) {
            olmo_cuda_failed("cudaFree of scratch", __FILE__, __LINE__, cudaGetErrorString(err));
            return NULL;
        }
        const size_t want = bytes + bytes / 4;
        if ((err = cudaMalloc(&st->scratch[slot], want)) != cudaSuccess) {
            cudaGetLastError(); /* allocation failures are not sticky; clear them */
            st->scratch[slot] = NULL;
            olmo_error("CUDA backend: cannot allocate %zu bytes of scratch device memory (%s)", want,
                       cudaGetErrorString(err));
            return NULL;
        }
        olmo_memcount_scratch(&st->mem, 0, want);
        st->scratch_bytes[slot] = want;
    }
    return st->scratch[slot];
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
    if ((err = cudaMemset(p, 0, rounded)) != cudaSuccess) {
        olmo_memcount_remove(&CUDA_STATE(be)->mem, p);
        cudaFree(p);
        olmo_cuda_failed("cudaMemset of a new buffer", __FILE__, __LINE__, cudaGetErrorString(err));
        return NULL;
    }
    return p;
}

/* The one abort left: free has no status (backend.h: void free), and a cudaFree that fails means the
 * pointer or the device is broken, so nothing after it could be trusted. */
static void cu_free(OLMO_BE, void *p) {
    olmo_memcount_remove(&CUDA_STATE(be)->mem, p);
    cudaError_t err = p ? cudaFree(p) : cudaSuccess;
    if (err != cudaSuccess) olmo_cuda_fatal("cudaFree", __FILE__, __LINE__, cudaGetErrorString(err));
}

/* Page-locked host memory: cudaMemcpy from the device into it is one DMA (pageable memory goes
 * through the driver's staging buffer in pieces). */
static void *cu_host_alloc(OLMO_BE, size_t bytes) {
    (void)be;
    void *p = NULL;
    cudaError_t err = cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault);
    if (err != cudaSuccess) {
        cudaGetLastError();
        olmo_error("CUDA: cannot allocate %zu bytes of page-locked host memory (%s)", bytes, cudaGetErrorString(err));
        return NULL;
    }
    return p;
}

static void cu_host_free(OLMO_BE, void *p) {
    (void)be;
    cudaError_t err = p ? cudaFreeHost(p) : cudaSuccess;
    if (err != cudaSuccess) olmo_cuda_fatal("cudaFreeHost", __FILE__, __LINE__, cudaGetErrorString(err));
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
    if (bytes) OLMO_CUDA_TRY(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
    return 0;
}

static int cu_to_host(OLMO_BE, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (bytes) OLMO_CUDA_WAIT(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
    return 0;
}

static int cu_zero(OLMO_BE, void *p, size_t bytes) {
    if (bytes) OLMO_CUDA_TRY(cudaMemsetAsync(p, 0, bytes, olmo_cuda_current_stream(be)));
    return 0;
}

static int cu_copy(OLMO_BE, void *dst, const void *src, size_t bytes) {
    if (bytes && dst != src)
        OLMO_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, olmo_cuda_current_stream(be)));
    return 0;
}

/* ---- the side and gradient streams ---- */

/* A stream and its three events (the main stream's mark, two slot marks), all or none. */
static int queue_create(cudaStream_t *stream, cudaEvent_t ev_out[3], const char *what) {
    cudaStream_t s = NULL;
    cudaEvent_t ev[3] = {NULL, NULL, NULL};
    /* non-blocking: no implicit ordering against the legacy default stream, only the events */
    cudaError_t err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    for (int i = 0; i < 3 && err == cudaSuccess; i++) err = cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming);
    if (err != cudaSuccess) {
        for (int i = 0; i < 3; i++)
            if (ev[i]) cudaEventDestroy(ev[i]);
        if (s) cudaStreamDestroy(s);
        return olmo_cuda_failed(what, __FILE__, __LINE__, cudaGetErrorString(err));
    }
    *stream = s;
    for (int i = 0; i < 3; i++) ev_out[i] = ev[i];
    return 0;
}

static void queue_destroy(cudaStream_t s, cudaEvent_t main_mark, cudaEvent_t marks[2]) {
    if (!s) return;
    cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
    cudaEventDestroy(main_mark);
    for (int i = 0; i < 2; i++) cudaEventDestroy(marks[i]);
}

/* One of the two queues (grad: the gradient stream, else the side stream). */
struct queue_ref {
    cudaStream_t *stream;
    cudaEvent_t *main_mark, *marks;
    bool *on;
    const char *name;
};
static struct queue_ref queue_of(struct olmo_cuda_state *st, bool grad) {
    if (grad) return (struct queue_ref){&st->grad, &st->grad_main_mark, st->grad_mark, &st->on_grad, "grad"};
    return (struct queue_ref){&st->side, &st->main_mark, st->side_mark, &st->on_side, "side"};
}

static int queue_begin(OLMO_BE, bool grad) {
    struct olmo_cuda_state *st = CUDA_STATE(be);
    struct queue_ref q = queue_of(st, grad);
    if (st->on_side || st->on_grad)
        return olmo_error("CUDA backend: %s_begin while the %s stream is selected", q.name, st->on_side ? "side" : "grad");
    if (!*q.stream) {
        cudaEvent_t ev[3] = {NULL, NULL, NULL};
        if (queue_create(q.stream, ev, grad ? "creating the gradient stream" : "creating the side stream")) return -1;
        *q.main_mark = ev[0], q.marks[0] = ev[1], q.marks[1] = ev[2];
    }
    OLMO_CUDA_TRY(cudaEventRecord(*q.main_mark, 0));
    OLMO_CUDA_TRY(cudaStreamWaitEvent(*q.stream, *q.main_mark, 0));
    *q.on = true;
    return 0;
}

static int queue_end(OLMO_BE, bool grad, int slot) {
    struct queue_ref q = queue_of(CUDA_STATE(be), grad);
    if (!*q.on) return olmo_error("CUDA backend: %s_end(%d) without %s_begin", q.name, slot, q.name);
    *q.on = false; /* back on the default stream, whatever follows */
    if (slot < 0 || slot > 1) {
        /* nothing can wait for the queued work now: finish it here */
        OLMO_CUDA_TRY(cudaStreamSynchronize(*q.stream));
        return olmo_error("CUDA backend: %s_end(%d): the slots are 0 and 1", q.name, slot);
    }
    OLMO_CUDA_TRY(cudaEventRecord(q.marks[slot], *q.stream));
    return 0;
}

static int queue_wait(OLMO_BE, bool grad, int slot) {
    struct olmo_cuda_state *st = CUDA_STATE(be);
    struct queue_ref q = queue_of(st, grad);
    if (st->on_side || st->on_grad || slot < 0 || slot > 1 || !*q.stream)
        return olmo_error("CUDA backend: %s_wait(%d) off the default stream or before any %s work", q.name, slot,
                          q.name);
    OLMO_CUDA_TRY(cudaStreamWaitEvent(0, q.marks[slot], 0));
    return 0;
}

static int cu_side_begin(OLMO_BE) { return queue_begin(be, false); }
static int cu_side_end(OLMO_BE, int slot) { return queue_end(be, false, slot); }
static int cu_side_wait(OLMO_BE, int slot) { return queue_wait(be, false, slot); }
static int cu_grad_begin(OLMO_BE) { return queue_begin(be, true); }
static int cu_grad_end(OLMO_BE, int slot) { return queue_end(be, true, slot); }
static int cu_grad_wait(OLMO_BE, int slot) { return queue_wait(be, true, slot); }

static int cu_synchronize(OLMO_BE) {
    (void)be;
    OLMO_CUDA_WAIT(cudaDeviceSynchronize());
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
        OLMO_CUDA_TRY(
            cudaMemcpyAsync(dst, src, n * olmo_float_type_size(dst_type), cudaMemcpyDeviceToDevice, stream));
    } else if (dst_type == OLMO_BF16) {
        OLMO_LAUNCH_ON(stream, f32_to_bf16_kernel, olmo_cuda_ew_blocks(n), EW_THREADS, 0, (__nv_bfloat16 *)dst,
                       (const float *)src, n);
        OLMO_CUDA_LAUNCHED("f32_to_bf16_kernel");
    } else {
        OLMO_LAUNCH_ON(stream, bf16_to_f32_kernel, olmo_cuda_ew_blocks(n), EW_THREADS, 0, (float *)dst,
                       (const __nv_bfloat16 *)src, n);
        OLMO_CUDA_LAUNCHED("bf16_to_f32_kernel");
    }
    return 0;
}

/* Elements of a row-major operand of rows x cols with leading dimension ld that cuBLAS reads. */
static size_t operand_span(int rows, int cols, int ld) {
    return rows > 0 && cols > 0 ? (size_t)(rows - 1) * ld + cols : 0;
}

/* An fp32 operand as it is, a bf16 one widened into scratch (same leading dimension); NULL: the error is set. */
static const float *f32_operand(OLMO_BE, enum olmo_cuda_scratch_slot slot, const void *src, enum olmo_float_type type,
                                int rows, int cols, int ld) {
    if (type == OLMO_F32) return (const float *)src;
    const size_t n = operand_span(rows, cols, ld);
    float *dst = (float *)olmo_cuda_scratch(be, slot, (n ? n : 1) * sizeof(float));
    return dst && !cu_convert(be, dst, OLMO_F32, src, OLMO_BF16, n) ? dst : NULL;
}

/* A row-major operand stored as rows x cols with leading dimension ld, as a
 * bf16 copy with the same leading dimension (only the elements cuBLAS reads);
 * a bf16 operand (a compute copy of the weights) as it is; NULL: the error is set. */
static const __nv_bfloat16 *bf16_operand(OLMO_BE, enum olmo_cuda_scratch_slot slot, const void *src_any,
                                         enum olmo_float_type type, int rows, int cols, int ld) {
    if (type == OLMO_BF16) return (const __nv_bfloat16 *)src_any;
    const float *src = (const float *)src_any;
    size_t n = rows > 0 && cols > 0 ? (size_t)(rows - 1) * ld + cols : 0;
    __nv_bfloat16 *dst = (__nv_bfloat16 *)olmo_cuda_scratch(be, slot, (n ? n : 1) * sizeof(__nv_bfloat16));
    if (dst && n) {
        OLMO_LAUNCH(f32_to_bf16_kernel, olmo_cuda_ew_blocks(n), EW_THREADS, 0, dst, src, n);
        if (olmo_cuda_check_launch("f32_to_bf16_kernel", __FILE__, __LINE__)) return NULL;
    }
    return dst;
}

/* Row-major C = alpha op(A) op(B) + beta C through column-major cuBLAS: a
 * row-major matrix is its transpose in column-major, so compute
 * C^T = op(B)^T op(A)^T, i.e. swap the operands and m/n, keep the op flags. */
static int cu_gemm_impl(OLMO_BE, enum olmo_cuda_gemm_precision precision, bool ta, bool tb, int m, int n, int k,
                        float alpha, const void *a_any, enum olmo_float_type a_type, int lda, const void *b_any,
                        enum olmo_float_type b_type, int ldb, float beta, float *c, int ldc) {
    if (m <= 0 || n <= 0) return 0;
    /* fp32 operands for every variant but cuda-bf16 (bf16 ones widened, exactly) */
    const float *a = precision == OLMO_CUDA_BF16
                         ? NULL
                         : f32_operand(be, SCRATCH_GEMM_A, a_any, a_type, ta ? k : m, ta ? m : k, lda);
    const float *b = precision == OLMO_CUDA_BF16
                         ? NULL
                         : f32_operand(be, SCRATCH_GEMM_B, b_any, b_type, tb ? n : k, tb ? k : n, ldb);
    if (precision != OLMO_CUDA_BF16 && ((a_type != OLMO_F32 && !a) || (b_type != OLMO_F32 && !b))) return -1;
    const cublasOperation_t op_a = ta ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasHandle_t blas = CUDA_STATE(be)->blas;
    switch (precision) {
    case OLMO_CUDA_FP32:
        OLMO_BLAS_TRY(cublasSgemm(blas, op_b, op_a, n, m, k, &alpha, b, ldb, a, lda, &beta, c, ldc));
        break;
    case OLMO_CUDA_TF32:
        OLMO_BLAS_TRY(cublasGemmEx(blas, op_b, op_a, n, m, k, &alpha, b, CUDA_R_32F, ldb, a, CUDA_R_32F, lda, &beta, c,
                                   CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT));
        break;
    case OLMO_CUDA_BF16: {
        /* Stored shapes: A is (ta ? k x m : m x k), B is (tb ? n x k : k x n). */
        const __nv_bfloat16 *a16 = bf16_operand(be, SCRATCH_GEMM_A, a_any, a_type, ta ? k : m, ta ? m : k, lda);
        const __nv_bfloat16 *b16 = bf16_operand(be, SCRATCH_GEMM_B, b_any, b_type, tb ? n : k, tb ? k : n, ldb);
        if ((a_type != OLMO_BF16 && !a16) || (b_type != OLMO_BF16 && !b16)) return -1;
        OLMO_BLAS_TRY(cublasGemmEx(blas, op_b, op_a, n, m, k, &alpha, b16, CUDA_R_16BF, ldb, a16, CUDA_R_16BF, lda,
                                   &beta, c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        break;
    }
    case OLMO_CUDA_BF16_CUBLAS:
        OLMO_BLAS_TRY(cublasGemmEx(blas, op_b, op_a, n, m, k, &alpha, b, CUDA_R_32F, ldb, a, CUDA_R_32F, lda, &beta, c,
                                   CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F_FAST_16BF, CUBLAS_GEMM_DEFAULT));
        break;
    }
    if (g_cuda.sync_each_launch) OLMO_CUDA_TRY(cudaDeviceSynchronize());
    return 0;
}

/* The instance's precision (CUDA_STATE(be)->precision) picks the cuBLAS call. */
static int cu_gemm(OLMO_BE, bool ta, bool tb, int m, int n, int k, float alpha, const void *a, enum olmo_float_type a_type,
                   int lda, const void *b, enum olmo_float_type b_type, int ldb, float beta, float *c, int ldc) {
    return cu_gemm_impl(be, CUDA_STATE(be)->precision, ta, tb, m, n, k, alpha, a, a_type, lda, b, b_type, ldb, beta, c,
                        ldc);
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
    int dev = 0;
    cudaDeviceProp prop;
    if (cudaGetDevice(&dev) == cudaSuccess && cudaGetDeviceProperties(&prop, dev) == cudaSuccess)
        snprintf(g_cuda.device_name, sizeof g_cuda.device_name, "%s", prop.name);
    cudaGetLastError(); /* the name only labels the MFU peak: a failure here is not the run's */
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
    olmo_cuda_cudnn_destroy(be);
    for (int i = 0; i < SCRATCH_SLOTS; i++)
        if (st->scratch[i]) cudaFree(st->scratch[i]);
    queue_destroy(st->side, st->main_mark, st->side_mark);
    queue_destroy(st->grad, st->grad_main_mark, st->grad_mark);
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
    if ((bst = cublasSetMathMode(st->blas, CUBLAS_DEFAULT_MATH)) != CUBLAS_STATUS_SUCCESS) {
        olmo_error("CUDA backend: cublasSetMathMode failed (%s)", cublasGetStatusString(bst));
        olmo_backend_destroy(be);
        return NULL;
    }
    const bool bf16 = precision == OLMO_CUDA_BF16 || precision == OLMO_CUDA_BF16_CUBLAS;
    be->name = variant_names[precision];
    be->device = g_cuda.device_name[0] ? g_cuda.device_name : NULL;
    be->alloc = cu_alloc;
    be->free = cu_free;
    be->mem_stats = cu_mem_stats;
    be->host_alloc = cu_host_alloc;
    be->host_free = cu_host_free;
    be->to_device = cu_to_device;
    be->to_host = cu_to_host;
    be->zero = cu_zero;
    be->copy = cu_copy;
    be->synchronize = cu_synchronize;
    be->convert = cu_convert;
    be->side_begin = cu_side_begin;
    be->side_end = cu_side_end;
    be->side_wait = cu_side_wait;
    be->grad_begin = cu_grad_begin;
    be->grad_end = cu_grad_end;
    be->grad_wait = cu_grad_wait;
    /* cuda-bf16 multiplies a bf16 compute copy of the weights; cuda-bf16-cublas rounds inside cuBLAS */
    be->compute_dtype = precision == OLMO_CUDA_BF16 ? OLMO_BF16 : OLMO_F32;
    be->check_attention = olmo_cuda_check_attention;
    be->gemm = cu_gemm;
    be->embedding_fwd = olmo_cuda_embedding_fwd;
    be->embedding_bwd = olmo_cuda_embedding_bwd;
    be->embedding_bwd_ids = olmo_cuda_embedding_bwd_ids;
    be->rmsnorm_fwd = olmo_cuda_rmsnorm_fwd;
    be->rmsnorm_bwd = olmo_cuda_rmsnorm_bwd;
    be->rope_fwd = olmo_cuda_rope_fwd;
    be->rope_bwd = olmo_cuda_rope_bwd;
    /* bf16 operands for attention's products too (tensor cores), as for the GEMMs */
    be->attention_fwd = bf16 ? olmo_cuda_attention_fwd_bf16 : olmo_cuda_attention_fwd;
    be->attention_bwd = bf16 ? olmo_cuda_attention_bwd_bf16 : olmo_cuda_attention_bwd;
    be->swiglu_fwd = olmo_cuda_swiglu_fwd;
    be->swiglu_bwd = olmo_cuda_swiglu_bwd;
    be->add = olmo_cuda_add;
    be->cross_entropy = olmo_cuda_cross_entropy;
    /* the fused ops (backend.h) in cuda-bf16, whose GEMMs round operands to bf16 themselves; the other
     * variants run op for op what the CPU backend runs (the profile's op counts agree) */
    if (precision == OLMO_CUDA_BF16) {
        be->cross_entropy_bf16 = olmo_cuda_cross_entropy_bf16;
        be->swiglu_fwd_bf16 = olmo_cuda_swiglu_fwd_bf16;
        be->rmsnorm_add_fwd = olmo_cuda_rmsnorm_add_fwd;
        be->swiglu_bwd_bf16 = olmo_cuda_swiglu_bwd_bf16;
        be->rmsnorm_bwd_bf16 = olmo_cuda_rmsnorm_bwd_bf16;
    }
    be->loss_sums = olmo_cuda_loss_sums;
    be->sum_squares = olmo_cuda_sum_squares;
    be->scale = olmo_cuda_scale;
    be->adamw = olmo_cuda_adamw;
    be->adamw_flat = olmo_cuda_adamw_flat;
    be->attention_cached = olmo_cuda_attention_cached;
    if (precision == OLMO_CUDA_BF16) { /* attention through cuDNN where it is found (cuda_attention_cudnn.cu) */
        olmo_cuda_cudnn_init(be);
        be->describe = olmo_cuda_describe;
    }
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
