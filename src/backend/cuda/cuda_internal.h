/* Shared by the CUDA backend's translation units (CUDA C, compiled by nvcc).
 *
 * Execution model: every op is enqueued on the legacy default stream, in
 * program order; ops that return values to the host (cross_entropy,
 * sum_squares) and to_host synchronise.  cuBLAS uses the same stream.  The
 * exceptions are the side stream (side_begin .. side_end: a non-blocking
 * stream created on first use, ordered against the default stream by events
 * only), where zero, copy, convert and comm_group_allgather go while it is
 * selected: fully sharded training gathers the next block there; and the
 * gradient stream (grad_begin .. grad_end, the same kind of stream), where
 * zero, copy, add and comm_group_reduce_scatter go while it is selected:
 * fully sharded training reduce-scatters a block's gradients there while the
 * next block's backward pass runs.
 *
 * Errors: every op returns 0, or -1 with the error set (util/error.h), as
 * the CPU backend does: a failed CUDA runtime or cuBLAS call (a launch, a
 * scratch allocation, a copy, a device fault reported by a synchronising
 * call) becomes -1 through OLMO_CUDA_TRY, OLMO_BLAS_TRY and
 * OLMO_CUDA_LAUNCHED, whose message names the call, the file and line, and
 * CUDA's own words; alloc returns NULL with the error set.  A device fault is
 * sticky: once one is reported every later call fails too, so the caller
 * should stop.  Only free, whose backend.h signature has no status, aborts
 * on a failure (olmo_cuda_fatal); teardown (destroy, comm_destroy) ignores
 * failures.  A shape the capability query refuses never reaches the
 * kernels, and is refused again, with -1, if it does.  OLMOC_CUDA_SYNC=1 in the
 * environment synchronises after every kernel so a fault is reported at the op
 * that caused it. */
#ifndef OLMOC_CUDA_INTERNAL_H
#define OLMOC_CUDA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

/* Kernel launches and dynamic shared memory go through these two macros so
 * that tests/c/cuda_emu can compile this code for the host and run the
 * kernels on CPU threads (OLMOC_CUDA_EMULATION; see tests/c/cuda_emu/cuda_emu.h). */
#ifdef OLMOC_CUDA_EMULATION
#include "cuda_emu.h"
#else
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#define OLMO_LAUNCH(kernel, grid, block, smem, ...) kernel<<<(grid), (block), (smem)>>>(__VA_ARGS__)
#define OLMO_LAUNCH_ON(stream, kernel, grid, block, smem, ...) \
    kernel<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__)
#define OLMO_DYNAMIC_SMEM(type, name) extern __shared__ type name[]
#endif

extern "C" {
#include "backend/backend.h"
#include "backend/memcount.h"
#include "dist/dist.h"
#include "util/error.h"
}

/* Sets the error for a failed call and returns -1 (what: the call; detail: CUDA's message). */
int olmo_cuda_failed(const char *what, const char *file, int line, const char *detail);
/* Prints the same message and aborts: only where the entry point cannot return a status. */
[[noreturn]] void olmo_cuda_fatal(const char *what, const char *file, int line, const char *detail);
/* 0, or -1 with the error set when the last launch failed (or, with OLMOC_CUDA_SYNC, the kernel did). */
int olmo_cuda_check_launch(const char *kernel, const char *file, int line);

/* In a function returning int: return -1 with the error set when the CUDA / cuBLAS call fails. */
#define OLMO_CUDA_TRY(call)                                                                        \
    do {                                                                                           \
        cudaError_t err_ = (call);                                                                 \
        if (err_ != cudaSuccess) return olmo_cuda_failed(#call, __FILE__, __LINE__, cudaGetErrorString(err_)); \
    } while (0)
#define OLMO_BLAS_TRY(call)                                                                        \
    do {                                                                                           \
        cublasStatus_t st_ = (call);                                                               \
        if (st_ != CUBLAS_STATUS_SUCCESS)                                                          \
            return olmo_cuda_failed(#call, __FILE__, __LINE__, cublasGetStatusString(st_));       \
    } while (0)
/* OLMO_CUDA_TRY for a call that makes the host wait for the device: NCCL
 * collectives run as kernels, so a rank that stopped responding shows here as
 * a wait that never ends; the collective watchdog (train.collective_timeout,
 * dist/dist.h) ends the process then. */
#define OLMO_CUDA_WAIT(call)                                                                       \
    do {                                                                                           \
        olmo_watchdog_enter("a wait for the GPU (its kernels and NCCL collectives)");              \
        cudaError_t err_ = (call);                                                                 \
        olmo_watchdog_leave();                                                                     \
        if (err_ != cudaSuccess) return olmo_cuda_failed(#call, __FILE__, __LINE__, cudaGetErrorString(err_)); \
    } while (0)
/* After a kernel launch, in a function returning int. */
#define OLMO_CUDA_LAUNCHED(name)                                                                   \
    do {                                                                                           \
        if (olmo_cuda_check_launch(name, __FILE__, __LINE__)) return -1;                           \
    } while (0)

/* Growable device scratch buffers, one per slot, reused across calls. */
enum olmo_cuda_scratch_slot {
    SCRATCH_ATTN_DELTA,  /* attention backward: rowsum(dO * O) [batch, heads, seq] */
    SCRATCH_ATTN_SCORES, /* cached (inference) attention: probabilities [rows, heads, keys] */
    SCRATCH_REDUCE,      /* per-block / per-row partial sums (double) */
    SCRATCH_REDUCE_OUT,  /* final reduced values (double) copied to the host */
    SCRATCH_RMS_DW,      /* rmsnorm backward: per-chunk dw partials (double) */
    SCRATCH_EMBED_INDEX, /* embedding backward: sorted token order and segments (int32) */
    SCRATCH_GEMM_A,      /* bf16 copies of GEMM operands */
    SCRATCH_GEMM_B,
    SCRATCH_ATTN_BF16,   /* cuDNN attention: bf16 q, k, v, o (and dO, dq, dk, dv in the backward) */
    SCRATCH_ATTN_WORK,   /* cuDNN attention: the graph's workspace */
    SCRATCH_LOSS_SUMS,   /* cross-entropy's deferred sums (loss_sums): ce, lse^2 (double) */
    SCRATCH_SLOTS
};

/* A CUDA backend instance's state (olmo_backend.state). */
struct olmo_cuda_state {
    enum olmo_cuda_gemm_precision precision;
    cublasHandle_t blas;
    void *scratch[SCRATCH_SLOTS];
    size_t scratch_bytes[SCRATCH_SLOTS];
    struct olmo_memcount mem; /* alloc'd buffers and the scratch above (mem_stats) */
    void *comm; /* ncclComm_t (cuda_comm.cu), NULL until comm_init */
    int comm_world;
    /* the side stream (side_begin / side_end / side_wait), NULL until first used */
    cudaStream_t side;
    cudaEvent_t main_mark, side_mark[2];
    bool on_side; /* between side_begin and side_end */
    /* cuda-bf16's attention through cuDNN (cuda_attention_cudnn.cu): NULL when the kernels run */
    struct olmo_sdpa *sdpa;
    char attn_line[512];              /* which attention runs and why (describe) */
    bool noted_doc, noted_refused, noted_dim; /* the one-line fallback messages, once per instance */
    /* the gradient stream (grad_begin / grad_end / grad_wait: fully sharded training's
     * reduce-scatters), NULL until first used */
    cudaStream_t grad;
    cudaEvent_t grad_main_mark, grad_mark[2];
    bool on_grad; /* between grad_begin and grad_end */
    /* cross_entropy_bf16 over runs of rows: the next row expected and the micro-batch's rows */
    int ce_next_row, ce_rows;
};
#define CUDA_STATE(be) ((struct olmo_cuda_state *)(be)->state)
/* The stream that zero, copy, convert, add and the group collectives enqueue on (0: the legacy
 * default stream). */
static inline cudaStream_t olmo_cuda_current_stream(const struct olmo_backend *be) {
    const struct olmo_cuda_state *st = (const struct olmo_cuda_state *)be->state;
    return st->on_side ? st->side : st->on_grad ? st->grad : (cudaStream_t)0;
}
/* The slot's buffer of at least `bytes`, or NULL with the error set. */
void *olmo_cuda_scratch(OLMO_BE, enum olmo_cuda_scratch_slot slot, size_t bytes);

/* Threads per block of the elementwise kernels, and their grid (grid-stride loops cover the rest). */
#define EW_THREADS 256
static inline unsigned olmo_cuda_ew_blocks(size_t n) {
    size_t blocks = (n + EW_THREADS - 1) / EW_THREADS;
    if (blocks > (1u << 20)) blocks = 1u << 20;
    return blocks ? (unsigned)blocks : 1u;
}

/* cuda_ops.cu: the ops of backend.h but memory, GEMM and attention */
int olmo_cuda_embedding_fwd(OLMO_BE, float *out, const float *table, const int32_t *tokens, int n, int dim);
int olmo_cuda_embedding_bwd(OLMO_BE, float *dtable, const float *dout, const int32_t *tokens, int n, int dim);
int olmo_cuda_embedding_bwd_ids(OLMO_BE, float *dtable, const float *dout, const int32_t *host_tokens, int n,
                                int dim);
int olmo_cuda_rmsnorm_fwd(OLMO_BE, float *y, float *rstd, const float *x, const float *w, int n, int dim, float eps);
int olmo_cuda_rmsnorm_bwd(OLMO_BE, float *dx, float *dw, const float *dy, const float *x, const float *w,
                          const float *rstd, int n, int dim);
int olmo_cuda_rope_fwd(OLMO_BE, float *x, const float *cos_t, const float *sin_t, int n_rows, int seq_len, int heads,
                       int head_dim);
int olmo_cuda_rope_bwd(OLMO_BE, float *dx, const float *cos_t, const float *sin_t, int n_rows, int seq_len, int heads,
                       int head_dim);
int olmo_cuda_swiglu_fwd(OLMO_BE, float *out, const float *g, const float *u, size_t n);
int olmo_cuda_swiglu_bwd(OLMO_BE, float *dg, float *du, const float *ds, const float *g, const float *u, size_t n);
int olmo_cuda_add(OLMO_BE, float *y, const float *a, const float *b, size_t n);
int olmo_cuda_rmsnorm_add_fwd(OLMO_BE, float *y, float *rstd, const float *resid, const float *x, const float *w,
                              int n, int dim, float eps);
int olmo_cuda_swiglu_fwd_bf16(OLMO_BE, void *s, const float *g, const float *u, size_t n);
int olmo_cuda_swiglu_bwd_bf16(OLMO_BE, void *dg, void *du, const float *ds, const float *g, const float *u, size_t n);
int olmo_cuda_rmsnorm_bwd_bf16(OLMO_BE, void *dx, float *dw, const float *dy, const float *x, const float *w,
                               const float *rstd, int n, int dim);
int olmo_cuda_cross_entropy_bf16(OLMO_BE, float *logits, void *dlogits, size_t ld, const int32_t *targets, int n,
                                 int vocab, float grad_scale, float z_mult, int row0, int n_total, double *ce_sum,
                                 double *z_sum);
int olmo_cuda_scale(OLMO_BE, float *x, size_t n, float s);
int olmo_cuda_cross_entropy(OLMO_BE, float *logits, const int32_t *targets, int n, int vocab, float grad_scale,
                            float z_mult, double *ce_sum, double *z_sum);
int olmo_cuda_loss_sums(OLMO_BE, double *ce_sum, double *z_sum);
int olmo_cuda_adamw_flat(OLMO_BE, float *param, const float *grad, float *m, float *v, size_t n, double lr,
                         float beta1, float beta2, float eps, const struct olmo_adamw_flat *f, long step);
int olmo_cuda_sum_squares(OLMO_BE, const float *x, size_t n, double *result);
int olmo_cuda_adamw(OLMO_BE, float *param, const float *grad, float *m, float *v, size_t n, double lr, float beta1,
                    float beta2, float eps, double weight_decay, long step);

/* ---- attention: shared by cuda_attention.cu and cuda_attention_tc.cu ---- */

#define OLMO_ATT_TILE 64 /* queries and keys per tile in both implementations */

/* Key `key` is visible from query t: causal, within the sliding window
 * (window 0 = full), same document. */
static __device__ __forceinline__ bool olmo_att_visible(int t, int key, int window, int qdoc, int kdoc) {
    return key <= t && (window == 0 || key > t - window) && qdoc == kdoc;
}

/* First key tile that any query of the tile starting at q0 can see. */
static __device__ __forceinline__ int olmo_att_first_key_tile(int q0, int window) {
    const int lo = window > 0 ? max(0, q0 - window + 1) : 0;
    return lo / OLMO_ATT_TILE * OLMO_ATT_TILE;
}

/* Opts a kernel in to `bytes` of dynamic shared memory (once: *done); 0 or -1 with the error set. */
int olmo_cuda_allow_smem(const void *kernel, size_t bytes, bool *done, const char *name);

/* cuda_attention.cu */
int olmo_cuda_check_attention(OLMO_BE, const struct olmo_attn_shape *shape);
int olmo_cuda_attention_fwd(OLMO_BE, float *out, float *lse, const float *q, const float *k, const float *v,
                             const int32_t *doc_ids, const struct olmo_attn_shape *shape);
int olmo_cuda_attention_bwd(OLMO_BE, float *dq, float *dk, float *dv, const float *dout, const float *out,
                             const float *lse, const float *q, const float *k, const float *v,
                             const int32_t *doc_ids, const struct olmo_attn_shape *shape);
int olmo_cuda_attention_fwd_bf16(OLMO_BE, float *out, float *lse, const float *q, const float *k, const float *v,
                                  const int32_t *doc_ids, const struct olmo_attn_shape *shape);
int olmo_cuda_attention_bwd_bf16(OLMO_BE, float *dq, float *dk, float *dv, const float *dout, const float *out,
                                  const float *lse, const float *q, const float *k, const float *v,
                                  const int32_t *doc_ids, const struct olmo_attn_shape *shape);
int olmo_cuda_attention_cached(OLMO_BE, float *out, const float *q, const float *k_cache, const float *v_cache, int n,
                                int pos0, int cap, const struct olmo_attn_shape *shape);

/* cuda_attention_tc.cu: bf16 tensor-core attention (head_dim a multiple of 16, at most 128) */
bool olmo_cuda_attention_tc_supported(const struct olmo_attn_shape *shape);
int olmo_cuda_attention_tc_fwd(OLMO_BE, float *out, float *lse, const float *q, const float *k, const float *v,
                                const int32_t *doc_ids, const struct olmo_attn_shape *shape);
int olmo_cuda_attention_tc_bwd(OLMO_BE, float *dq, float *dk, float *dv, const float *dout, const float *lse,
                                const float *delta, const float *q, const float *k, const float *v,
                                const int32_t *doc_ids, const struct olmo_attn_shape *shape);

/* cuda_attention_cudnn.cu: cuda-bf16's attention through cuDNN's fused SDPA (cudnn_sdpa.h).
 * init loads cuDNN unless OLMOC_CUDNN=0 and says which attention runs (st->attn_line);
 * fwd/bwd return 0 (done), -1 (error set), or 1: not taken, the kernels run (intra-document
 * masking, a shape cuDNN refuses, no cuDNN). */
void olmo_cuda_cudnn_init(OLMO_BE);
void olmo_cuda_cudnn_destroy(OLMO_BE);
const char *olmo_cuda_describe(OLMO_BE);
int olmo_cuda_cudnn_fwd(OLMO_BE, float *out, float *lse, const float *q, const float *k, const float *v,
                        const int32_t *doc_ids, const struct olmo_attn_shape *shape);
int olmo_cuda_cudnn_bwd(OLMO_BE, float *dq, float *dk, float *dv, const float *dout, const float *out,
                        const float *lse, const float *q, const float *k, const float *v, const int32_t *doc_ids,
                        const struct olmo_attn_shape *shape);

/* cuda_comm.cu, in builds with NCCL (OLMOC_HAVE_NCCL) */
struct olmo_dist;
int olmo_cuda_comm_init(OLMO_BE, const struct olmo_dist *dist);
int olmo_cuda_comm_allreduce_sum(OLMO_BE, float *buf, size_t n);
int olmo_cuda_comm_allgather(OLMO_BE, float *buf, const size_t *offsets);
void olmo_cuda_comm_destroy(OLMO_BE);
void *olmo_cuda_comm_group_create(OLMO_BE, const struct olmo_dist *group);
int olmo_cuda_comm_group_allgather(OLMO_BE, void *comm, void *buf, size_t n);
int olmo_cuda_comm_group_reduce_scatter(OLMO_BE, void *comm, const float *in, float *out, size_t n);
int olmo_cuda_comm_group_allreduce_sum(OLMO_BE, void *comm, float *buf, size_t n);
void olmo_cuda_comm_group_destroy(OLMO_BE, void *comm);

#endif
