/* The narrow interface between the model and the hardware: a backend
 * instance (struct olmo_backend, below) owns its state and is passed first to
 * every op; ops return 0 or -1 with the error set; the capability query
 * (check_attention) runs at model creation, so a shape the backend cannot run
 * is an error there rather than an abort in the first step.  Every pointer
 * passed to an op is backend memory (allocated with `alloc`); the model never
 * dereferences it.  Conventions shared by all ops:
 *   - tensors are row-major float32, rows = tokens (b * seq_len + t);
 *   - parameter gradients are ACCUMULATED (+=), so gradient accumulation over
 *     micro-batches needs no extra buffers; activation gradients are written;
 *   - weights use the PyTorch nn.Linear layout [out_features, in_features]. */
#ifndef OLMOC_BACKEND_H
#define OLMOC_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct olmo_attn_shape {
    int batch, seq_len;
    int n_heads, n_kv_heads, head_dim;
    int window;  /* sliding window in tokens (query sees keys q-window+1..q); 0 = full causal */
    float scale; /* softmax scale, 1/sqrt(head_dim) */
};

/* Element types of backend buffers and GEMM operands (OLMO_I32: token and document ids, a buffer type
 * only, never a GEMM or convert operand). */
enum olmo_float_type { OLMO_F32, OLMO_BF16, OLMO_I32 };
size_t olmo_float_type_size(enum olmo_float_type dtype);

/* What a buffer holds.  Master weights, their gradients and the optimizer
 * state are fp32 on every backend; a backend that computes in bf16
 * (compute_dtype below) multiplies by a bf16 COMPUTE_COPY of the weights,
 * which the model refreshes (convert) whenever the weights change. */
enum olmo_buf_role {
    OLMO_BUF_WEIGHT,       /* fp32 master weights */
    OLMO_BUF_GRAD,         /* fp32 gradients */
    OLMO_BUF_OPTIM_STATE,  /* fp32 AdamW moments */
    OLMO_BUF_COMPUTE_COPY, /* the weights in compute_dtype, refreshed from the master weights */
    OLMO_BUF_ACTIVATION,   /* saved for the backward pass */
    OLMO_BUF_SCRATCH       /* reused within a step */
};

/* A typed buffer of backend memory (olmo_buf_alloc / olmo_buf_free). */
struct olmo_buf {
    void *data;
    size_t numel;
    enum olmo_float_type dtype;
    enum olmo_buf_role role;
};

/* What an instance's memory counters say (olmo_backend_mem_stats). */
struct olmo_mem_stats {
    size_t live;    /* bytes held now: buffers from alloc not yet freed, plus the instance's scratch */
    size_t peak;    /* the most `live` has been since the instance was made */
    size_t scratch; /* of live: the instance's own scratch (grow-only buffers its ops keep between calls) */
    size_t n_live;  /* buffers from alloc not yet freed */
};

struct olmo_dist;
struct olmo_adamw_flat;
struct olmo_backend;
/* Every op takes the backend instance first (its state: scratch memory,
 * library handles, communicator, counters) and returns 0, or -1 with the error
 * set (util/error.h).  Shorthand for that parameter in the table below: */
#define OLMO_BE const struct olmo_backend *be

/* A backend instance: olmo_backend_create(name) makes one, olmo_backend_destroy
 * frees it and everything it holds.  Instances share no mutable state, so a
 * process may hold several (two devices, a profiled wrapper around another
 * instance); one instance runs one op at a time (its scratch memory is its
 * own, not per thread).  Callers hold a const pointer: the table and name are
 * fixed when the instance is made, and only the ops change `state`. */
struct olmo_backend {
    const char *name;
    /* The device's name (CUDA: cudaDeviceProp.name, e.g. "NVIDIA H100 80GB HBM3"), for the datasheet
     * peak of MFU (train/peak.h); NULL on the host. */
    const char *device;
    bool host_memory; /* alloc returns host memory (MPI can move it directly) */
    void *state;      /* the implementation's own; callers never touch it */
    /* The type its GEMMs multiply in: OLMO_BF16 (cpu-bf16, cuda-bf16) makes the
     * model keep a bf16 compute copy of the weights and pass that to gemm, so
     * the weight operand is not converted on every call; OLMO_F32 otherwise. */
    enum olmo_float_type compute_dtype;
    /* Frees `state` and whatever it holds (called by olmo_backend_destroy); may be NULL. */
    void (*destroy)(struct olmo_backend *be);
    /* What computes, for log headers, e.g. "GEMMs: oneDNN 2.6.3, AVX-512 JIT kernels"; may be NULL. */
    const char *(*describe)(OLMO_BE);

    void *(*alloc)(OLMO_BE, size_t bytes); /* zero-filled; NULL on failure (error set) */
    void (*free)(OLMO_BE, void *p);
    /* The instance's memory counters: every allocation it makes counts, at the size it really
     * holds (alloc's rounding, scratch growth), from creation on.  Not counted: memory the
     * libraries it calls allocate for themselves (oneDNN, OpenBLAS, cuBLAS workspaces, NCCL),
     * the CUDA context, and an op's short-lived per-call host buffers.  NULL: no counters. */
    void (*mem_stats)(OLMO_BE, struct olmo_mem_stats *out);
    /* Host memory that to_host copies into at full speed and that outlives an op (an asynchronous
     * checkpoint's snapshot of the weights and optimizer state): page-locked on a device (CUDA:
     * cudaHostAlloc, so the copy is one DMA, no staging).  Not zero-filled; NULL on failure (error
     * set).  Host memory, so not in mem_stats.  NULL entries: malloc and free (olmo_host_alloc). */
    void *(*host_alloc)(OLMO_BE, size_t bytes);
    void (*host_free)(OLMO_BE, void *p);
    int (*to_device)(OLMO_BE, void *dst, const void *src, size_t bytes);
    int (*to_host)(OLMO_BE, void *dst, const void *src, size_t bytes);
    int (*zero)(OLMO_BE, void *p, size_t bytes);
    int (*copy)(OLMO_BE, void *dst, const void *src, size_t bytes); /* device to device */
    /* Capability query, asked at model creation (olmo_model_create, through
     * olmo_backend_check_attention) for each layer's attention, with batch and
     * seq_len 0 (not known yet), and again by olmo_model_reserve with them:
     * 0 when attention_fwd/bwd and attention_cached run this shape; -1 with the
     * error set, saying why, when they do not (e.g. the CUDA kernels' head_dim
     * limit).  NULL: every shape valid for the interface is supported. */
    int (*check_attention)(OLMO_BE, const struct olmo_attn_shape *shape);
    /* Returns when every op queued so far has run (a device runs them
     * asynchronously); NULL where each op returns when it is done (CPU). */
    int (*synchronize)(OLMO_BE);

    /* dst[i] = src[i] for n elements, converting between types (fp32 -> bf16
     * rounds to nearest even, bf16 -> fp32 is exact). */
    int (*convert)(OLMO_BE, void *dst, enum olmo_float_type dst_type, const void *src, enum olmo_float_type src_type, size_t n);

    /* c = alpha * op(a) @ op(b) + beta * c; op(a) is m x k, op(b) is k x n; c is
     * fp32, a and b are of a_type / b_type (leading dimensions in elements).
     * A bf16-computing backend rounds fp32 operands to bf16 first; an fp32 one
     * widens bf16 operands (exactly). */
    int (*gemm)(OLMO_BE, bool trans_a, bool trans_b, int m, int n, int k, float alpha, const void *a,
                enum olmo_float_type a_type, int lda, const void *b, enum olmo_float_type b_type, int ldb, float beta, float *c,
                int ldc);

    int (*embedding_fwd)(OLMO_BE, float *out, const float *table, const int32_t *tokens, int n, int dim);
    int (*embedding_bwd)(OLMO_BE, float *dtable, const float *dout, const int32_t *tokens, int n, int dim);
    /* The same with the ids in host memory (host_tokens: the n ids of `tokens`, which a device
     * backend would otherwise copy back to sort them).  NULL: the model calls embedding_bwd. */
    int (*embedding_bwd_ids)(OLMO_BE, float *dtable, const float *dout, const int32_t *host_tokens, int n, int dim);

    /* y = x / rms(x) * w over the last dim; rstd[n] is kept for backward. */
    int (*rmsnorm_fwd)(OLMO_BE, float *y, float *rstd, const float *x, const float *w, int n, int dim, float eps);
    /* dx may alias dy. */
    int (*rmsnorm_bwd)(OLMO_BE, float *dx, float *dw, const float *dy, const float *x, const float *w,
                       const float *rstd, int n, int dim);

    /* In-place rotary embedding (rotate-half convention) of rows laid out as
     * [n_rows, heads, head_dim]; row r is at position r % seq_len.
     * cos/sin are [seq_len, head_dim/2]. */
    int (*rope_fwd)(OLMO_BE, float *x, const float *cos, const float *sin, int n_rows, int seq_len, int heads,
                    int head_dim);
    int (*rope_bwd)(OLMO_BE, float *dx, const float *cos, const float *sin, int n_rows, int seq_len, int heads,
                    int head_dim);

    /* Causal (optionally sliding-window, optionally intra-document) softmax
     * attention.  q/out: [batch*seq, n_heads*head_dim]; k, v: [batch*seq,
     * n_kv_heads*head_dim]; lse: [batch, n_heads, seq] log-sum-exp of the
     * scaled scores, saved so backward recomputes probabilities instead of
     * storing seq^2 of them.  doc_ids [batch*seq] or NULL: keys of another
     * document are masked out (a document is a run of equal ids, as the
     * model numbers them: non-decreasing along each sequence).  Scratch
     * memory must stay O(seq) per head: no seq^2 buffers. */
    int (*attention_fwd)(OLMO_BE, float *out, float *lse, const float *q, const float *k, const float *v,
                         const int32_t *doc_ids, const struct olmo_attn_shape *shape);
    int (*attention_bwd)(OLMO_BE, float *dq, float *dk, float *dv, const float *dout, const float *out,
                         const float *lse, const float *q, const float *k, const float *v, const int32_t *doc_ids,
                         const struct olmo_attn_shape *shape);

    /* s = silu(g) * u, elementwise. */
    int (*swiglu_fwd)(OLMO_BE, float *s, const float *g, const float *u, size_t n);
    int (*swiglu_bwd)(OLMO_BE, float *dg, float *du, const float *ds, const float *g, const float *u, size_t n);

    int (*add)(OLMO_BE, float *y, const float *a, const float *b, size_t n); /* y = a + b (y may alias a) */

    /* Cross-entropy with optional z-loss, computed row-wise over logits
     * [n, vocab].  Targets < 0 are ignored.  Overwrites logits with
     * d(total)/d(logits) where total = grad_scale * sum_rows(ce + z_mult*lse^2).
     * Returns the unscaled sums of ce and of lse^2 through ce_sum / z_sum. */
    int (*cross_entropy)(OLMO_BE, float *logits, const int32_t *targets, int n, int vocab, float grad_scale,
                         float z_mult, double *ce_sum, double *z_sum);
    /* Where set (a device backend), cross_entropy also takes ce_sum and z_sum NULL: it then adds the
     * sums to an accumulator in device memory instead of copying them to the host, so a micro-batch
     * needs no copy back; loss_sums returns the accumulated sums (one copy to the host) and clears the
     * accumulator (ce_sum and z_sum NULL: clears only).  The accumulator adds in double, in call order,
     * as a caller adding the returned sums would.  NULL: cross_entropy always returns its sums. */
    int (*loss_sums)(OLMO_BE, double *ce_sum, double *z_sum);

    /* Fused variants for a backend that multiplies in bf16 (NULL where a backend has none: the model
     * then calls the ops above).  Each computes what the unfused ops compute, in the same fp32
     * expressions, and rounds to bf16 (nearest even) only where a bf16 GEMM would round the value
     * anyway, so results are bit-identical to the unfused path:
     *   cross_entropy_bf16: cross_entropy, writing the gradient as bf16 into dlogits (row i at
     *     dlogits + i * ld, ld >= vocab, in bf16 elements) instead of over the logits; dlogits may be
     *     the logits buffer itself with ld = 2 * vocab (each row's gradient in the first half of its
     *     own fp32 row), and the logits are undefined afterwards.  It may run over a micro-batch of
     *     n_total rows in runs of consecutive rows (the model's logits chunks): this call is rows
     *     [row0, row0 + n) (logits, dlogits and targets point at row row0), runs of n > 0 rows go in
     *     row order from row 0, and each row's sums are kept until the run that ends at n_total, which returns (or
     *     accumulates) the sums of all n_total rows added in the order one call over them adds them,
     *     so the loss has the same bits however the rows are cut; the earlier runs return 0 (and add
     *     nothing to the accumulator).  row0 0 and n_total n: the whole micro-batch in one call;
     *   swiglu_fwd_bf16: s = bf16(silu(g) * u), the down projection's operand;
     *   rmsnorm_add_fwd: y = resid + w * (x * rstd) (rmsnorm_fwd then add, without the normed tensor
     *     in memory); y may alias resid;
     *   swiglu_bwd_bf16: swiglu_bwd with dg and du written as bf16 (the gate and up projections'
     *     backward GEMMs are all that read them);
     *   rmsnorm_bwd_bf16: rmsnorm_bwd with dx written as bf16 (where only GEMMs read it); dx must not
     *     overlap dy. */
    int (*cross_entropy_bf16)(OLMO_BE, float *logits, void *dlogits, size_t ld, const int32_t *targets, int n,
                              int vocab, float grad_scale, float z_mult, int row0, int n_total, double *ce_sum,
                              double *z_sum);
    int (*swiglu_fwd_bf16)(OLMO_BE, void *s, const float *g, const float *u, size_t n);
    int (*rmsnorm_add_fwd)(OLMO_BE, float *y, float *rstd, const float *resid, const float *x, const float *w,
                           int n, int dim, float eps);
    int (*swiglu_bwd_bf16)(OLMO_BE, void *dg, void *du, const float *ds, const float *g, const float *u, size_t n);
    int (*rmsnorm_bwd_bf16)(OLMO_BE, void *dx, float *dw, const float *dy, const float *x, const float *w,
                            const float *rstd, int n, int dim);

    int (*sum_squares)(OLMO_BE, const float *x, size_t n, double *out); /* *out = sum of x[i]^2 */
    int (*scale)(OLMO_BE, float *x, size_t n, float s);

    /* One decoupled-weight-decay Adam step (PyTorch AdamW semantics), step >= 1. */
    int (*adamw)(OLMO_BE, float *param, const float *grad, float *m, float *v, size_t n, double lr, float beta1,
                 float beta2, float eps, double weight_decay, long step);
    /* Optional: the same step over n contiguous elements of several tensors in one pass (a
     * multi-tensor AdamW): weight decay f->weight_decay, except elements [f->wd2_lo, f->wd2_hi) (the
     * embeddings), which use f->weight_decay2; each gradient multiplied by f->grad_scale first, as
     * scale(grad, grad_scale) then adamw would (1: no clipping; grad itself is not written); and,
     * when f->compute is not NULL, the updated values rounded to bf16 there (the compute copy, as
     * convert would).  The same results as those calls one after another.  NULL: adamw per tensor. */
    int (*adamw_flat)(OLMO_BE, float *param, const float *grad, float *m, float *v, size_t n, double lr,
                      float beta1, float beta2, float eps, const struct olmo_adamw_flat *f, long step);

    /* Inference attention (batch 1) of n new query rows over a KV cache.
     * q/out: [n, n_heads*head_dim], rows at absolute positions pos0..pos0+n-1
     * (already rotated); k_cache/v_cache: [cap, n_kv_heads*head_dim], position
     * p stored in row p % cap.  Query t sees keys max(0, t-window+1)..t
     * (shape->window 0: 0..t), all of which must still be in the cache.
     * shape->batch and shape->seq_len are ignored.  May be NULL in a backend
     * without inference support (olmoc generate then refuses to run). */
    int (*attention_cached)(OLMO_BE, float *out, const float *q, const float *k_cache, const float *v_cache, int n,
                            int pos0, int cap, const struct olmo_attn_shape *shape);

    /* Data parallelism on backend memory (NCCL in the CUDA backend).  NULL in
     * a host-memory backend, whose buffers go to MPI as they are.  comm_init is
     * collective over the ranks of dist (it uses MPI to share the NCCL id);
     * allgather: rank r contributes buf[offsets[r] .. offsets[r+1]) and every
     * rank ends up with all slices (offsets has world + 1 entries).  The
     * communicator is the instance's (comm_destroy or destroying it frees it). */
    int (*comm_init)(OLMO_BE, const struct olmo_dist *dist);
    int (*comm_allreduce_sum)(OLMO_BE, float *buf, size_t n);
    int (*comm_allgather)(OLMO_BE, float *buf, const size_t *offsets);
    void (*comm_destroy)(OLMO_BE);

    /* Fully sharded training (train/fsdp.c) on backend memory: a communicator
     * over a group of ranks (a shard or replica group from olmo_dist_split;
     * collective over the group's ranks, and every group of a split is
     * created at the same time on all ranks), NULL with the error set; then
     * collectives on equal blocks: allgather: rank r's bytes [r*n, (r+1)*n)
     * of buf to every rank (any element type); reduce_scatter (n floats):
     * out[0, n) = the sum
     * over the group of each rank's in[r*n, (r+1)*n) (in: world*n floats);
     * allreduce_sum: in place.  NULL where comm_init is. */
    void *(*comm_group_create)(OLMO_BE, const struct olmo_dist *group);
    int (*comm_group_allgather)(OLMO_BE, void *comm, void *buf, size_t n);
    int (*comm_group_reduce_scatter)(OLMO_BE, void *comm, const float *in, float *out, size_t n);
    int (*comm_group_allreduce_sum)(OLMO_BE, void *comm, float *buf, size_t n);
    void (*comm_group_destroy)(OLMO_BE, void *comm);

    /* A second queue for work that overlaps the main one (fully sharded training gathers the
     * next block's weights there while the current block computes; CUDA: a second stream and
     * events).  side_begin: the ops called until side_end go to the side queue, after
     * everything queued on the main one so far; only zero, copy, convert and
     * comm_group_allgather may be called in between.  side_end(slot): back to the main queue;
     * mark `slot` (0 or 1) done when the side work queued so far is.  side_wait(slot): ops
     * queued on the main queue from now on run after `slot`'s work.  The main queue never
     * waits for the side one otherwise (synchronize does, as it waits for everything).  NULL
     * where ops run in order as they are called (CPU). */
    int (*side_begin)(OLMO_BE);
    int (*side_end)(OLMO_BE, int slot);
    int (*side_wait)(OLMO_BE, int slot);
    /* A third queue with the same contract, for the gradients' reduce-scatters (fully sharded
     * training reduce-scatters a block's gradients there while the next block's backward pass
     * runs; CUDA: a third stream): between grad_begin and grad_end only zero, copy, add and
     * comm_group_reduce_scatter may be called.  A communicator is used from one queue only
     * (NCCL's rule): the caller gives the reduce-scatters their own.  NULL where ops run in order. */
    int (*grad_begin)(OLMO_BE);
    int (*grad_end)(OLMO_BE, int slot);
    int (*grad_wait)(OLMO_BE, int slot);
};

/* adamw_flat's per-call settings. */
struct olmo_adamw_flat {
    double weight_decay, weight_decay2;
    size_t wd2_lo, wd2_hi;
    float grad_scale;
    void *compute; /* bf16, n elements, or NULL */
};

/* The CPU backend.  Its variants differ in where the GEMMs come from:
 *   OLMO_CPU_GEMM_BEST      "cpu": oneDNN when this build has it, else OpenBLAS;
 *   OLMO_CPU_GEMM_OPENBLAS  "cpu-openblas";
 *   OLMO_CPU_GEMM_ONEDNN    "cpu-onednn" (NULL, error set, in a build without oneDNN);
 *   OLMO_CPU_GEMM_BF16      "cpu-bf16": operands rounded to bf16, fp32 accumulation
 *                           and output, and the same for attention's products in
 *                           builds with AVX512-BF16.  Always available: oneDNN 2.x's
 *                           bf16 matmul where it has kernels for the processor
 *                           (AVX-512), else the next variant.  OLMOC_CPU_BF16=convert
 *                           in the environment forces the fallback, =onednn the
 *                           matmul (NULL, error set, where it is missing);
 *   OLMO_CPU_GEMM_ONEDNN_BF16   cpu-bf16 on oneDNN's bf16 matmul only (NULL, error set,
 *                           where the build or the processor has none);
 *   OLMO_CPU_GEMM_BF16_CONVERT  cpu-bf16 on any processor: the operands rounded to bf16
 *                           and widened back (exact), then the fp32 GEMM; products of
 *                           bf16 values are exact in fp32, so the numerics are those
 *                           of the matmul up to summation order.
 * oneDNN picks its kernels from the instruction sets the processor reports;
 * OpenBLAS from its processor table or OPENBLAS_CORETYPE. */
enum olmo_cpu_gemm_library {
    OLMO_CPU_GEMM_BEST,
    OLMO_CPU_GEMM_OPENBLAS,
    OLMO_CPU_GEMM_ONEDNN,
    OLMO_CPU_GEMM_ONEDNN_BF16,
    OLMO_CPU_GEMM_BF16_CONVERT,
    OLMO_CPU_GEMM_BF16
};
/* A new CPU backend instance; NULL (error set) where the variant is unavailable. */
struct olmo_backend *olmo_backend_cpu_create(enum olmo_cpu_gemm_library library);
/* The processor has AVX-512 (F, BW, DQ, VL): what oneDNN's bf16 matmul and our AVX-512 kernels need. */
bool olmo_cpu_has_avx512(void);
/* Whether the processor has AVX2 and FMA (attention's AVX2 kernels, forced with OLMOC_CPU_ISA=avx2). */
bool olmo_cpu_has_avx2_fma(void);
/* Whether cpu-bf16's attention multiplies bf16 pairs: a build with the AVX512-BF16 kernels, not forced
 * to the AVX2 ones (OLMOC_CPU_ISA=avx2, whose products are fp32); for even head_dim (the memory plan). */
bool olmo_cpu_attention_bf16_products(void);

#ifdef OLMOC_HAVE_CUDA
/* CUDA backend (src/backend/cuda/): device memory, cuBLAS GEMMs, deterministic
 * kernels.  GEMM precision is the only difference between the variants; every
 * other op, the master weights, gradients and AdamW state are fp32 in all:
 *   OLMO_CUDA_FP32  fp32 SGEMM (matches the CPU backend within fp32 rounding);
 *   OLMO_CUDA_TF32  fp32 operands on TF32 tensor cores, fp32 accumulation;
 *   OLMO_CUDA_BF16  bf16 operands (weights from the model's bf16 compute copy, activations
 *                   rounded per call), fp32 accumulation and output;
 *   OLMO_CUDA_BF16_CUBLAS  the same inside cuBLAS (CUBLAS_COMPUTE_32F_FAST_16BF on the
 *                   fp32 operands: no conversion passes, cuBLAS's own rounding).
 * Both bf16 variants also run attention's products on bf16 tensor cores.
 * An instance has its own cuBLAS handle and scratch memory (and NCCL
 * communicator) on the current device; NULL (error set) when no CUDA device
 * is usable. */
enum olmo_cuda_gemm_precision { OLMO_CUDA_FP32, OLMO_CUDA_TF32, OLMO_CUDA_BF16, OLMO_CUDA_BF16_CUBLAS };
struct olmo_backend *olmo_backend_cuda_create(enum olmo_cuda_gemm_precision precision);
#endif

/* Whether `be` runs attention of this shape: the interface's own rules
 * (head_dim >= 1, n_kv_heads >= 1 dividing n_heads, window >= 0, batch and
 * seq_len >= 0), then the backend's check_attention.  0, or -1 with the error
 * set naming the backend and the reason. */
int olmo_backend_check_attention(const struct olmo_backend *be, const struct olmo_attn_shape *shape);

/* be's memory counters (the mem_stats entry): 0, or -1 with the error set when it has none. */
int olmo_backend_mem_stats(const struct olmo_backend *be, struct olmo_mem_stats *out);
/* With OLMOC_MEMSTATS set (and not "0"): be's counters as one line on out, "olmoc memstats: rank R of W |
 * backend NAME | peak N bytes | ..." (scripts/gpu_check.sh reads the peak); nothing where be has none. */
void olmo_backend_report_mem_stats(const struct olmo_backend *be, int rank, int world, FILE *out);

/* numel elements of dtype in be's memory (zero-filled), labelled with role;
 * 0, or -1 with the error set.  olmo_buf_free frees it (and zeroes *buf). */
int olmo_buf_alloc(const struct olmo_backend *be, struct olmo_buf *buf, size_t numel, enum olmo_float_type dtype,
                   enum olmo_buf_role role);
void olmo_buf_free(const struct olmo_backend *be, struct olmo_buf *buf);

/* bytes of host memory from be's host_alloc (page-locked on a device), else malloc: NULL on failure
 * (error set); olmo_host_free(be, p) frees it (NULL: nothing). */
void *olmo_host_alloc(const struct olmo_backend *be, size_t bytes);
void olmo_host_free(const struct olmo_backend *be, void *p);

/* A new instance of the backend named "cpu", "cpu-openblas", "cpu-onednn",
 * "cpu-bf16", and when built with CUDA "cuda" (fp32), "cuda-tf32", "cuda-bf16",
 * "cuda-bf16-cublas".  NULL (error set) for an unknown or unavailable backend. */
struct olmo_backend *olmo_backend_create(const char *name);
/* Frees the instance and everything it holds (NULL: nothing). */
void olmo_backend_destroy(struct olmo_backend *be);

#endif
