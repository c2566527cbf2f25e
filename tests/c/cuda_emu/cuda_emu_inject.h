/* Failure injection in the CUDA emulation (cuda_emu.cpp), for tests of the
 * CUDA backend's error paths: the nth next call of a kind (1: the very next)
 * fails as CUDA reports that failure; nth 0 cancels.  Callable from C.
 *   CUDA_EMU_FAIL_MALLOC  cudaMalloc: cudaErrorMemoryAllocation (not sticky)
 *   CUDA_EMU_FAIL_LAUNCH  a kernel launch: cudaErrorLaunchOutOfResources,
 *                         reported by the next cudaGetLastError; the kernel does not run
 *   CUDA_EMU_FAIL_BLAS    cublasSgemm / cublasGemmEx: CUBLAS_STATUS_EXECUTION_FAILED
 *   CUDA_EMU_FAIL_CUDNN   emulated cuDNN (emu_cudnn_sdpa.cpp): building a graph fails as cuDNN
 *                         refuses a shape (check_support); the refusal is cached per shape */
#ifndef OLMOC_CUDA_EMU_INJECT_H
#define OLMOC_CUDA_EMU_INJECT_H

#ifdef __cplusplus
extern "C" {
#endif

enum cuda_emu_fault { CUDA_EMU_FAIL_MALLOC, CUDA_EMU_FAIL_LAUNCH, CUDA_EMU_FAIL_BLAS, CUDA_EMU_FAIL_CUDNN, CUDA_EMU_FAULTS };
void cuda_emu_inject(enum cuda_emu_fault kind, int nth);

/* Counters since the start: copies to the host (cudaMemcpy / cudaMemcpyAsync device to host), copies
 * to the device, and explicit synchronisations (cudaDeviceSynchronize, cudaStreamSynchronize).  With
 * OLMOC_EMU_COUNTS=1 in the environment the emulation prints them to stderr at exit:
 * "cuda_emu: counts: D D2H copies, H H2D copies, S synchronisations". */
struct cuda_emu_counts {
    unsigned long long d2h_copies, h2d_copies, syncs;
};
typedef struct cuda_emu_counts emu_counts_t;
void cuda_emu_get_counts(struct cuda_emu_counts *out);

#ifdef __cplusplus
}
#endif

#endif
