/* Shared between the CPU backend's files (src/backend/cpu/):
 *   cpu_backend.c    the op tables, allocation, scratch memory, selection;
 *   cpu_gemm.c       GEMMs: OpenBLAS, oneDNN sgemm, oneDNN bf16 matmul, bf16 rounding + fp32 GEMM;
 *   cpu_attention.c  attention's ops, the choice of their instruction set, KV-cache attention;
 *   cpu_attention_kernels.h  tiled flash attention (forward, backward), compiled per
 *                    instruction set by cpu_attention.c and cpu_attention_avx2.c; it
 *                    includes, by concern, cpu_attention_{parts,blocks,tile,pack,fwd,bwd}.h;
 *   cpu_ops.c        embedding, rmsnorm, rope, swiglu, add, cross-entropy, sum of
 *                    squares, scale, AdamW.
 * Numerics and determinism rules are at the top of cpu_backend.c. */
#ifndef OLMOC_CPU_INTERNAL_H
#define OLMOC_CPU_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "backend/memcount.h"

#ifdef OLMOC_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl_version.h>
/* cpu-bf16's GEMMs use oneDNN 2.x's matmul API. */
#if DNNL_VERSION_MAJOR == 2
#define OLMOC_CPU_BF16 1
#endif
#endif

/* Loops over fewer elements than this run on the calling thread: waking the
 * team costs more than the work. */
#define PAR_MIN 16384

/* Scratch memory inside an op, 64-byte aligned (free with free); NULL with
 * the error set when memory runs out, and the op returns -1.  Parallel
 * regions have no error path: their per-thread buffers are allocated before. */
void *cpu_scratch(size_t bytes);
/* dst = src's bytes, or zeros where src is NULL: split among the threads from 1 MiB on, each thread's part
 * cut at multiples of 4 KiB (cpu_copy, cpu_zero and cpu_convert between equal types) */
void cpu_move_bytes(void *dst, const void *src, size_t bytes);

/* Large per-call buffers kept between calls, per instance. */
enum cpu_scratch_slot {
    SLOT_KT, SLOT_VT, SLOT_DELTA, SLOT_DQ_PARTS, SLOT_BF16_A, SLOT_BF16_B,
    SLOT_Q16, SLOT_DO16, SLOT_QP, SLOT_DOP, SLOT_KP, SLOT_VP, /* cpu-bf16 attention's operands */
    SLOT_NORM_RUNS, /* rmsnorm_bwd's run sums */
    N_SLOTS
};

struct cpu_bf16_cache; /* oneDNN engine, stream and bf16 matmul primitives (cpu_gemm.c) */

/* A CPU backend instance's state (olmo_backend.state). */
struct cpu_state {
    struct {
        void *p;
        size_t bytes;
    } slots[N_SLOTS];          /* grow-only; fresh multi-megabyte buffers would page-fault on every call */
    struct olmo_memcount mem;    /* alloc'd buffers and the slots above (mem_stats) */
    struct cpu_bf16_cache *bf16; /* cpu-bf16 on oneDNN's matmul; NULL otherwise */
    const char *why;           /* why this variant was chosen (cpu-bf16's fallback says) */
    bool attn_avx2;            /* attention runs cpu_attention_avx2.c's kernels (cpu_attention_select) */
    char attn_text[160];       /* which attention kernels, for describe() */
    char text[512];            /* describe()'s line */
};
#define CPU_STATE(be) ((struct cpu_state *)(be)->state)

/* The slot's buffer, grown to at least `bytes`; NULL, error set, when memory runs out. */
void *cpu_cached_scratch(struct cpu_state *st, int slot, size_t bytes);

/* cpu_gemm.c: the backend's gemm op, per library, and the log line describing it. */
int cpu_gemm_openblas(OLMO_BE, bool ta, bool tb, int m, int n, int k, float alpha, const void *a,
    enum olmo_float_type a_type, int lda, const void *b, enum olmo_float_type b_type, int ldb, float beta, float *c, int ldc);
const char *cpu_describe_openblas(OLMO_BE);
#ifdef OLMOC_HAVE_ONEDNN
int cpu_gemm_onednn(OLMO_BE, bool ta, bool tb, int m, int n, int k, float alpha, const void *a,
    enum olmo_float_type a_type, int lda, const void *b, enum olmo_float_type b_type, int ldb, float beta, float *c, int ldc);
const char *cpu_describe_onednn(OLMO_BE);
#endif
#ifdef OLMOC_CPU_BF16
int cpu_gemm_onednn_bf16(OLMO_BE, bool ta, bool tb, int m, int n, int k, float alpha, const void *a,
    enum olmo_float_type a_type, int lda, const void *b, enum olmo_float_type b_type, int ldb, float beta, float *c, int ldc);
const char *cpu_describe_onednn_bf16(OLMO_BE);
/* Whether oneDNN has a bf16 matmul on this processor (makes st->bf16); error set when not. */
bool cpu_bf16_available(struct cpu_state *st);
void cpu_bf16_cache_free(struct cpu_bf16_cache *cache);
#endif

/* cpu-bf16 anywhere: operands rounded to bf16, then an fp32 GEMM (cpu_gemm.c). */
int cpu_gemm_bf16_convert(OLMO_BE, bool ta, bool tb, int m, int n, int k, float alpha, const void *a,
    enum olmo_float_type a_type, int lda, const void *b, enum olmo_float_type b_type, int ldb, float beta, float *c, int ldc);
const char *cpu_describe_bf16_convert(OLMO_BE);

/* cpu_attention.c: fp32 products, and bf16 products (cpu-bf16; fp32 where the
 * build has no AVX512-BF16 or head_dim is odd). */
int cpu_attention_fwd(OLMO_BE, float *out, float *lse, const float *q, const float *k, const float *v,
                      const int32_t *doc_ids, const struct olmo_attn_shape *s);
int cpu_attention_bwd(OLMO_BE, float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                      const float *q, const float *k, const float *v, const int32_t *doc_ids,
                      const struct olmo_attn_shape *s);
int cpu_attention_fwd_bf16(OLMO_BE, float *out, float *lse, const float *q, const float *k, const float *v,
                           const int32_t *doc_ids, const struct olmo_attn_shape *s);
int cpu_attention_bwd_bf16(OLMO_BE, float *dq, float *dk, float *dv, const float *dout, const float *out,
                           const float *lse, const float *q, const float *k, const float *v, const int32_t *doc_ids,
                           const struct olmo_attn_shape *s);
/* Chooses attention's kernels for this processor, or as OLMOC_CPU_ISA says
 * ("avx2": the AVX2+FMA ones even where AVX-512 ones exist; "auto" or unset:
 * the best the build has); -1, error set, for a value it cannot honour.
 * bf16_backend: cpu-bf16 (for the line).  cpu_attention_line: "attention: ..." for describe(). */
int cpu_attention_select(struct cpu_state *st, bool bf16_backend);
const char *cpu_attention_line(const struct cpu_state *st);
#ifdef OLMOC_ATTN_AVX2
/* cpu_attention_avx2.c (x86-64 builds): the same kernels built for AVX2+FMA, fp32 products. */
int cpu_attention_fwd_avx2(struct cpu_state *st, float *out, float *lse, const float *q, const float *k,
                           const float *v, const int32_t *doc_ids, const struct olmo_attn_shape *s);
int cpu_attention_bwd_avx2(struct cpu_state *st, float *dq, float *dk, float *dv, const float *dout,
                           const float *out, const float *lse, const float *q, const float *k, const float *v,
                           const int32_t *doc_ids, const struct olmo_attn_shape *s);
#endif
int cpu_attention_cached(OLMO_BE, float *out, const float *q, const float *k_cache, const float *v_cache, int n,
                         int pos0, int cap, const struct olmo_attn_shape *s);

/* cpu_ops.c */
int cpu_convert(OLMO_BE, void *dst, enum olmo_float_type dst_type, const void *src, enum olmo_float_type src_type, size_t n);
int cpu_embedding_fwd(OLMO_BE, float *out, const float *table, const int32_t *tokens, int n, int dim);
int cpu_embedding_bwd(OLMO_BE, float *dtable, const float *dout, const int32_t *tokens, int n, int dim);
int cpu_rmsnorm_fwd(OLMO_BE, float *y, float *rstd, const float *x, const float *w, int n, int dim, float eps);
int cpu_rmsnorm_bwd(OLMO_BE, float *dx, float *dw, const float *dy, const float *x, const float *w,
                    const float *rstd, int n, int dim);
int cpu_rope_fwd(OLMO_BE, float *x, const float *cos_t, const float *sin_t, int n_rows, int seq_len, int heads,
                 int head_dim);
int cpu_rope_bwd(OLMO_BE, float *dx, const float *cos_t, const float *sin_t, int n_rows, int seq_len, int heads,
                 int head_dim);
int cpu_swiglu_fwd(OLMO_BE, float *out, const float *g, const float *u, size_t n);
int cpu_swiglu_bwd(OLMO_BE, float *dg, float *du, const float *ds, const float *g, const float *u, size_t n);
int cpu_add(OLMO_BE, float *y, const float *a, const float *b, size_t n);
int cpu_cross_entropy(OLMO_BE, float *logits, const int32_t *targets, int n, int vocab, float grad_scale,
                      float z_mult, double *ce_sum, double *z_sum);
int cpu_sum_squares(OLMO_BE, const float *x, size_t n, double *out);
int cpu_scale(OLMO_BE, float *x, size_t n, float s);
int cpu_adamw(OLMO_BE, float *param, const float *grad, float *m, float *v, size_t n, double lr, float beta1,
              float beta2, float eps, double weight_decay, long step);

#endif
