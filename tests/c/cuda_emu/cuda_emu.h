/* A host emulation of the small part of CUDA and cuBLAS that the CUDA backend
 * (src/backend/cuda/) uses, so that its kernels -- the same source -- run on
 * CPU threads in the tests of machines without a GPU.  Included instead of
 * the CUDA headers when OLMOC_CUDA_EMULATION is defined.
 *
 * Execution model: one block at a time, each of its threads a fiber with
 * its own stack, scheduled cooperatively on the calling thread:
 * __syncthreads waits until every thread of the block has arrived, a warp
 * shuffle is an exchange between the 32 threads of a warp (lane = linear
 * thread id % 32, as on the GPU).  Warps run one after another, each as far
 * as it can get before the next starts, in alternating order, so a missing
 * __syncthreads shows up as a read of shared data not yet written or already
 * overwritten by another warp; dynamic shared memory and new device memory are
 * filled with NaNs so such reads are visible.  Barriers reached by only part of a block or
 * warp (divergence, early exit) abort with a message instead of hanging.
 * Device memory is host memory from malloc, so AddressSanitizer sees
 * out-of-bounds kernel accesses to it.
 *
 * Launch checks as on the device: at most 1024 threads per block, grid y/z
 * at most 65535, dynamic shared memory above 48 KiB only after
 * cudaFuncSetAttribute(MaxDynamicSharedMemorySize), and never above the
 * smallest opt-in limit of the architectures we build for (sm_80: 163 KiB).
 *
 * cuBLAS: cublasSgemm / cublasGemmEx compute the column-major product exactly
 * as the cuBLAS documentation defines it (op(A) m x k, op(B) k x n, leading
 * dimensions checked), in double; FAST_TF32 rounds operands to TF32 and bf16
 * operands are real bf16.  This checks the backend's row-major mapping against
 * the interface's definition, not cuBLAS itself.
 *
 * WMMA (nvcuda::wmma, m16n16k16, bf16 operands, fp32 accumulators): a
 * fragment's element-to-lane mapping is unspecified by CUDA, so code that only
 * fills, loads, stores and multiplies fragments cannot depend on it; here every
 * lane holds the whole 16 x 16 tile.  The calls are warp-collective (all 32
 * lanes must arrive, as at a shuffle) and check the documented pointer
 * alignment (32 bytes) and leading-dimension rules.  mma_sync adds the exact
 * bf16 products to the fp32 accumulator in k order.
 *
 * NCCL (nccl_emu.cpp): the calls of the backend's data-parallel path, done
 * with MPI on the emulated device memory (host memory), with the checks NCCL
 * makes: the same unique id on every rank of a communicator (ncclGetUniqueId
 * returns random bytes, so a missing broadcast of the root's id is caught),
 * rank and size consistent with the ranks given that id, balanced groups.
 * ncclCommInitRank is collective over every rank of the launch here (an
 * MPI_Comm_split by id), so all communicators of a split (fully sharded
 * training's shard and replica groups) must be created at the same time.
 *
 * Failures can be injected (cuda_emu_inject.h): the nth next cudaMalloc,
 * kernel launch or cuBLAS GEMM fails as on the device, so tests reach the
 * backend's error paths.
 *
 * Not emulated (unverifiable without a GPU): the memory model between warps,
 * performance, real shared-memory capacity with static shared memory added,
 * cuBLAS's own numerics. */
#ifndef OLMOC_CUDA_EMU_H
#define OLMOC_CUDA_EMU_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include <functional>
#include <type_traits>

#include "cuda_emu_inject.h"
/* Whether this call of the kind is the one cuda_emu_inject chose to fail (for stand-ins of libraries). */
bool cuda_emu_injected(enum cuda_emu_fault kind);

#define __global__
#define __device__
#define __host__
#define __shared__ static /* one block runs at a time, so a static is the block's shared memory */
#define __forceinline__ inline
#define __launch_bounds__(...)

struct uint3 {
    unsigned x, y, z;
};
struct alignas(16) float4 { /* the 16-byte vector type of the elementwise kernels */
    float x, y, z, w;
};
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

extern uint3 threadIdx;
extern uint3 blockIdx;
extern dim3 blockDim;
extern dim3 gridDim;

void __syncthreads(void);
float __shfl_xor_sync(unsigned mask, float v, int lane_mask);
double __shfl_xor_sync(unsigned mask, double v, int lane_mask);
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }

void *emu_dynamic_smem(void);
void emu_launch(const void *kernel, const char *name, dim3 grid, dim3 block, size_t smem_bytes,
                const std::function<void()> &body);
#define OLMO_LAUNCH(kernel, grid, block, smem, ...) \
    emu_launch((const void *)(kernel), #kernel, (grid), (block), (smem), [=]() { kernel(__VA_ARGS__); })
/* On a stream: the legacy default stream (0) runs it now, another stream queues it (see Streams below). */
#define OLMO_LAUNCH_ON(stream, kernel, grid, block, smem, ...)                                     \
    emu_launch_on((stream), (const void *)(kernel), #kernel, (grid), (block), (smem), \
                  [=]() { kernel(__VA_ARGS__); })
#define OLMO_DYNAMIC_SMEM(type, name) type *name = (type *)emu_dynamic_smem()

/* ---- runtime ---- */
typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorLaunchOutOfResources = 701,
} cudaError_t;
enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
typedef struct emu_stream *cudaStream_t;
typedef struct emu_event *cudaEvent_t;
enum { cudaStreamNonBlocking = 1, cudaEventDisableTiming = 2 };

/* Streams.  The legacy default stream (0) runs everything at once, as the
 * rest of this emulation does.  A created stream (non-blocking only) queues
 * its work -- kernels, async copies and sets, NCCL calls -- and runs it only
 * when something must wait for it: cudaStreamWaitEvent on the default stream
 * for an event recorded on it, cudaStreamSynchronize, cudaDeviceSynchronize,
 * cudaFree, or its destruction.  So a read on the default stream of what side
 * work writes, without the event wait, sees the old contents: the missing
 * wait shows up as wrong results.  (The other way round -- side work that
 * should have waited for the default stream -- is not caught: the default
 * stream's work is always done when side work is queued.) */
void emu_launch_on(cudaStream_t stream, const void *kernel, const char *name, dim3 grid, dim3 block,
                   size_t smem_bytes, const std::function<void()> &body);
/* Runs fn now on the default stream, else queues it on `stream`. */
void emu_stream_submit(cudaStream_t stream, std::function<void()> fn);
/* Work items submitted to `stream` so far (NCCL's check of one communicator used from several streams). */
unsigned long long emu_stream_seq(cudaStream_t stream);
/* Whether work queued on s from now on is ordered after the first n items of `other`: through events
 * (cudaStreamWaitEvent, transitively) or because the host synchronised with them. */
bool emu_stream_ordered(cudaStream_t s, cudaStream_t other, unsigned long long n);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags);

cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
#define cudaHostAllocDefault 0u
cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t stream);
cudaError_t cudaMemset(void *p, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t stream);
cudaError_t cudaGetLastError(void);
cudaError_t cudaDeviceSynchronize(void);
const char *cudaGetErrorString(cudaError_t err);
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int *device);
struct cudaDeviceProp {
    char name[256];
};
/* name: $OLMOC_EMU_DEVICE_NAME, else "emulated CUDA device" (the tests name a real GPU for the MFU peak). */
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device);
cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value);

/* ---- bf16 ---- */
struct __nv_bfloat16 {
    uint16_t bits;
};
__nv_bfloat16 __float2bfloat16(float f); /* round to nearest even */
float emu_bfloat162float(__nv_bfloat16 h);
static inline float __bfloat162float(__nv_bfloat16 h) { return emu_bfloat162float(h); }

/* ---- cuBLAS ---- */
typedef struct emu_cublas *cublasHandle_t;
typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
} cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUBLAS_DEFAULT_MATH = 0 } cublasMath_t;
typedef enum { CUDA_R_32F = 0, CUDA_R_16BF = 14 } cudaDataType;
typedef enum {
    CUBLAS_COMPUTE_32F = 68,
    CUBLAS_COMPUTE_32F_FAST_16BF = 75,
    CUBLAS_COMPUTE_32F_FAST_TF32 = 77
} cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;

cublasStatus_t cublasCreate(cublasHandle_t *handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode);
const char *cublasGetStatusString(cublasStatus_t status);
cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                           int k, const float *alpha, const float *A, int lda, const float *B, int ldb,
                           const float *beta, float *C, int ldc);
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void *alpha, const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t algo);

/* ---- WMMA ---- */
void emu_warp_barrier(void);
void emu_wmma_check(const void *p, unsigned ldm, size_t elem_bytes, const char *what);
namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };
template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "only m16n16k16 is emulated");
    float tile[16][16]; /* row-major, the whole tile in every lane */
};
template <typename Use, typename T, typename Layout>
inline void fill_fragment(fragment<Use, 16, 16, 16, T, Layout> &f, float v) {
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) f.tile[r][c] = v;
}
template <typename Use, typename Layout>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, __nv_bfloat16, Layout> &f, const __nv_bfloat16 *p,
                             unsigned ldm) {
    emu_wmma_check(p, ldm, sizeof *p, "load_matrix_sync");
    const bool row = std::is_same<Layout, row_major>::value;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) f.tile[r][c] = emu_bfloat162float(row ? p[r * ldm + c] : p[c * ldm + r]);
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p, unsigned ldm,
                             layout_t layout) {
    emu_wmma_check(p, ldm, sizeof *p, "load_matrix_sync");
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) f.tile[r][c] = layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
}
inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f, unsigned ldm,
                              layout_t layout) {
    emu_wmma_check(p, ldm, sizeof *p, "store_matrix_sync");
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) (layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.tile[r][c];
}
/* Not instrumented by the sanitizers (the emulation's time under ASan goes here): it reads and writes
 * only the fragments, whole arrays of this lane; the loads and stores, which touch device memory,
 * stay checked. */
template <typename LA, typename LB>
__attribute__((noinline, no_sanitize("address", "undefined"))) void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
                     const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA> &a,
                     const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB> &b,
                     const fragment<accumulator, 16, 16, 16, float> &c) {
    emu_warp_barrier();
    float out[16][16];
    for (int r = 0; r < 16; r++)
        for (int col = 0; col < 16; col++) {
            float acc = c.tile[r][col];
            for (int k = 0; k < 16; k++) acc += a.tile[r][k] * b.tile[k][col]; /* bf16 products are exact */
            out[r][col] = acc;
        }
    for (int r = 0; r < 16; r++)
        for (int col = 0; col < 16; col++) d.tile[r][col] = out[r][col];
}
} // namespace wmma
} // namespace nvcuda

/* ---- NCCL ---- */
typedef enum { ncclSuccess = 0, ncclInvalidArgument = 4, ncclInvalidUsage = 5, ncclSystemError = 2 } ncclResult_t;
typedef enum { ncclInt8 = 0, ncclFloat32 = 7 } ncclDataType_t;
typedef enum { ncclSum = 0 } ncclRedOp_t;
typedef struct {
    char internal[128];
} ncclUniqueId;
typedef struct emu_nccl_comm *ncclComm_t;
const char *ncclGetErrorString(ncclResult_t result);
ncclResult_t ncclGetUniqueId(ncclUniqueId *id);
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank);
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

#endif
