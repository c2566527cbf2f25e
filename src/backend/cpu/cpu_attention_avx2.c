/* The attention kernels (cpu_attention_kernels.h) built for AVX2+FMA: this
 * file is compiled with -mavx2 -mfma -mno-avx512f (CMakeLists.txt), so it
 * holds no AVX-512 instruction whatever the build's -march, and runs on any
 * processor with AVX2 and FMA.  cpu_attention.c calls it when chosen
 * (cpu_attention_select).  fp32 products only: bf16 ones need AVX512-BF16. */
#include "backend/cpu/cpu_attention_kernels.h"

#if !defined(__AVX2__) || !defined(__FMA__) || defined(__AVX512F__)
#error "cpu_attention_avx2.c must be compiled with -mavx2 -mfma -mno-avx512f"
#endif

int cpu_attention_fwd_avx2(struct cpu_state *st, float *out, float *lse, const float *q, const float *k,
                           const float *v, const int32_t *doc_ids, const struct olmo_attn_shape *s) {
    return attention_fwd(st, false, out, lse, q, k, v, doc_ids, s);
}

int cpu_attention_bwd_avx2(struct cpu_state *st, float *dq, float *dk, float *dv, const float *dout,
                           const float *out, const float *lse, const float *q, const float *k, const float *v,
                           const int32_t *doc_ids, const struct olmo_attn_shape *s) {
    return attention_bwd(st, false, dq, dk, dv, dout, out, lse, q, k, v, doc_ids, s);
}
