/* Shared between the CPU backend's files (src/backend/cpu/):
 *   cpu_backend.c    the op tables, allocation, scratch memory, selection;
 *   cpu_gemm.c       GEMMs: OpenBLAS, oneDNN sgemm, oneDNN bf16 matmul, bf16 rounding + fp32 GEMM;
 *   cpu_attention.c  tiled flash attention (forward, backward) and KV-cache attention;
 *   cpu_ops.c        embedding, rmsnorm, rope, swiglu, add, cross-entropy, sum of
 *                    squares, scale, AdamW.
 * Numerics and determinism rules are at the top of cpu_backend.c. */
#ifndef OLMOC_CPU_INTERNAL_H
#define OLMOC_CPU_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

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

/* Scratch memory inside an op, which has no error path: failing is fatal. */
void *cpu_scratch(size_t bytes);

/* Large per-call buffers kept between calls, one set per calling thread. */
enum cpu_scratch_slot {
    SLOT_KT, SLOT_VT, SLOT_DELTA, SLOT_DQ_PARTS, SLOT_BF16_A, SLOT_BF16_B,
    SLOT_Q16, SLOT_DO16, SLOT_QP, SLOT_DOP, SLOT_KP, SLOT_VP, /* cpu-bf16 attention's operands */
    N_SLOTS
};
void *cpu_cached_scratch(int slot, size_t bytes);

/* cpu_gemm.c: the backend's gemm op, per library, and the log line describing it. */
void cpu_gemm_openblas(bool ta, bool tb, int m, int n, int k, float alpha, const float *a, int lda, const float *b,
                       int ldb, float beta, float *c, int ldc);
const char *cpu_describe_openblas(void);
#ifdef OLMOC_HAVE_ONEDNN
void cpu_gemm_onednn(bool ta, bool tb, int m, int n, int k, float alpha, const float *a, int lda, const float *b,
                     int ldb, float beta, float *c, int ldc);
const char *cpu_describe_onednn(void);
#endif
#ifdef OLMOC_CPU_BF16
void cpu_gemm_onednn_bf16(bool ta, bool tb, int m, int n, int k, float alpha, const float *a, int lda,
                          const float *b, int ldb, float beta, float *c, int ldc);
const char *cpu_describe_onednn_bf16(void);
/* Whether oneDNN has a bf16 matmul on this processor; error set when not. */
bool cpu_bf16_available(void);
#endif

/* cpu-bf16 anywhere: operands rounded to bf16, then an fp32 GEMM (cpu_gemm.c). */
void cpu_gemm_bf16_convert(bool ta, bool tb, int m, int n, int k, float alpha, const float *a, int lda,
                           const float *b, int ldb, float beta, float *c, int ldc);
const char *cpu_describe_bf16_convert(void);

/* cpu_attention.c: fp32 products, and bf16 products (cpu-bf16; fp32 where the
 * build has no AVX512-BF16 or head_dim is odd). */
void cpu_attention_fwd(float *out, float *lse, const float *q, const float *k, const float *v, const int32_t *doc_ids,
                       const struct olmo_attn_shape *s);
void cpu_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                       const float *q, const float *k, const float *v, const int32_t *doc_ids,
                       const struct olmo_attn_shape *s);
void cpu_attention_fwd_bf16(float *out, float *lse, const float *q, const float *k, const float *v,
                            const int32_t *doc_ids, const struct olmo_attn_shape *s);
void cpu_attention_bwd_bf16(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                            const float *q, const float *k, const float *v, const int32_t *doc_ids,
                            const struct olmo_attn_shape *s);
void cpu_attention_cached(float *out, const float *q, const float *k_cache, const float *v_cache, int n, int pos0,
                          int cap, const struct olmo_attn_shape *s);

/* cpu_ops.c */
void cpu_embedding_fwd(float *out, const float *table, const int32_t *tokens, int n, int dim);
void cpu_embedding_bwd(float *dtable, const float *dout, const int32_t *tokens, int n, int dim);
void cpu_rmsnorm_fwd(float *y, float *rstd, const float *x, const float *w, int n, int dim, float eps);
void cpu_rmsnorm_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w, const float *rstd, int n,
                     int dim);
void cpu_rope_fwd(float *x, const float *cos_t, const float *sin_t, int n_rows, int seq_len, int heads, int head_dim);
void cpu_rope_bwd(float *dx, const float *cos_t, const float *sin_t, int n_rows, int seq_len, int heads,
                  int head_dim);
void cpu_swiglu_fwd(float *out, const float *g, const float *u, size_t n);
void cpu_swiglu_bwd(float *dg, float *du, const float *ds, const float *g, const float *u, size_t n);
void cpu_add(float *y, const float *a, const float *b, size_t n);
void cpu_cross_entropy(float *logits, const int32_t *targets, int n, int vocab, float grad_scale, float z_mult,
                       double *ce_sum, double *z_sum);
double cpu_sum_squares(const float *x, size_t n);
void cpu_scale(float *x, size_t n, float s);
void cpu_adamw(float *param, const float *grad, float *m, float *v, size_t n, double lr, float beta1, float beta2,
               float eps, double weight_decay, long step);

#endif
