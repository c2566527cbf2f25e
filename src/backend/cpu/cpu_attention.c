/* The CPU backend's attention: tiled flash attention (forward and backward,
 * fp32 or bf16 products; cpu_attention_kernels.h), the choice of its
 * instruction set, and inference attention over a KV cache. */
#include <stdio.h>

#include "backend/cpu/cpu_attention_kernels.h"
#include "util/error.h"

/* ---- the instruction set -------------------------------------------------- */
bool olmo_cpu_has_avx2_fma(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return false;
#endif
}

bool olmo_cpu_attention_bf16_products(void) {
#ifdef OLMOC_ATTN_BF16
    const char *isa = getenv("OLMOC_CPU_ISA");
    return !(isa && !strcmp(isa, "avx2")); /* cpu_attention_select: forced AVX2 kernels multiply fp32 */
#else
    return false;
#endif
}

int cpu_attention_select(struct cpu_state *st, bool bf16_backend) {
    const char *isa = getenv("OLMOC_CPU_ISA");
    const char *kernels = NULL, *why = "";
    st->attn_avx2 = false;
    if (isa && isa[0] && strcmp(isa, "auto") != 0) {
        if (strcmp(isa, "avx2") != 0)
            return olmo_error("OLMOC_CPU_ISA=%s: expected 'avx2' (attention's AVX2+FMA kernels, on any processor "
                              "that has AVX2 and FMA) or 'auto' (the best this build has for this processor)",
                              isa);
#ifndef OLMOC_ATTN_AVX2
        return olmo_error("OLMOC_CPU_ISA=avx2: this build has no AVX2 attention kernels (only x86-64 builds with "
                          "gcc or clang have them)");
#else
        if (!olmo_cpu_has_avx2_fma()) return olmo_error("OLMOC_CPU_ISA=avx2: this processor has no AVX2 and FMA");
        st->attn_avx2 = true;
        kernels = "AVX2+FMA", why = ", forced by OLMOC_CPU_ISA=avx2";
#endif
    }
    if (!kernels) {
#if defined(__AVX512F__)
        kernels = "AVX-512"; /* the whole build targets it (-march): this processor has it */
#elif defined(__AVX2__) && defined(__FMA__)
        kernels = "AVX2+FMA";
#else
#ifdef OLMOC_ATTN_AVX2
        if (olmo_cpu_has_avx2_fma()) st->attn_avx2 = true, kernels = "AVX2+FMA", why = ", chosen for this processor";
#endif
        if (!kernels) kernels = "OpenBLAS tile", why = " (no AVX2+FMA in this build's -march or this processor)";
#endif
    }
    /* bf16 products where cpu-bf16 asks for them and these kernels have them (the memory plan asks the same) */
    const bool bf16 = bf16_backend && olmo_cpu_attention_bf16_products();
    snprintf(st->attn_text, sizeof st->attn_text, "attention: %s kernels%s, %s", kernels, why,
             bf16 ? "bf16 products (AVX512-BF16) for even head_dim"
                  : bf16_backend ? "fp32 products (bf16 ones need AVX512-BF16 kernels)" : "fp32 products");
    return 0;
}

const char *cpu_attention_line(const struct cpu_state *st) { return st->attn_text; }

/* ---- the ops: these kernels, or cpu_attention_avx2.c's ---------------------- */
static int attn_fwd(struct cpu_state *st, bool bf16, float *out, float *lse, const float *q, const float *k,
                    const float *v, const int32_t *doc_ids, const struct olmo_attn_shape *s) {
#ifdef OLMOC_ATTN_AVX2
    if (st->attn_avx2) return cpu_attention_fwd_avx2(st, out, lse, q, k, v, doc_ids, s);
#endif
    return attention_fwd(st, bf16, out, lse, q, k, v, doc_ids, s);
}

static int attn_bwd(struct cpu_state *st, bool bf16, float *dq, float *dk, float *dv, const float *dout,
                    const float *out, const float *lse, const float *q, const float *k, const float *v,
                    const int32_t *doc_ids, const struct olmo_attn_shape *s) {
#ifdef OLMOC_ATTN_AVX2
    if (st->attn_avx2) return cpu_attention_bwd_avx2(st, dq, dk, dv, dout, out, lse, q, k, v, doc_ids, s);
#endif
    return attention_bwd(st, bf16, dq, dk, dv, dout, out, lse, q, k, v, doc_ids, s);
}

int cpu_attention_fwd(OLMO_BE, float *out, float *lse, const float *q, const float *k, const float *v,
                      const int32_t *doc_ids, const struct olmo_attn_shape *s) {
    return attn_fwd(CPU_STATE(be), false, out, lse, q, k, v, doc_ids, s);
}

int cpu_attention_bwd(OLMO_BE, float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                      const float *q, const float *k, const float *v, const int32_t *doc_ids,
                      const struct olmo_attn_shape *s) {
    return attn_bwd(CPU_STATE(be), false, dq, dk, dv, dout, out, lse, q, k, v, doc_ids, s);
}

/* cpu-bf16: the products on bf16 operands (see the top of cpu_attention_kernels.h) */
int cpu_attention_fwd_bf16(OLMO_BE, float *out, float *lse, const float *q, const float *k, const float *v,
                           const int32_t *doc_ids, const struct olmo_attn_shape *s) {
    return attn_fwd(CPU_STATE(be), true, out, lse, q, k, v, doc_ids, s);
}

int cpu_attention_bwd_bf16(OLMO_BE, float *dq, float *dk, float *dv, const float *dout, const float *out,
                           const float *lse, const float *q, const float *k, const float *v, const int32_t *doc_ids,
                           const struct olmo_attn_shape *s) {
    return attn_bwd(CPU_STATE(be), true, dq, dk, dv, dout, out, lse, q, k, v, doc_ids, s);
}

/* Inference attention over a KV cache (olmoc generate): a few query rows
 * against cached keys, so the plain per-row loop is fast enough. */
static float cached_dot(const float *a, const float *b, int n) {
    float acc = 0.0f;
    for (int i = 0; i < n; i++) acc += a[i] * b[i];
    return acc;
}

int cpu_attention_cached(OLMO_BE, float *out, const float *q, const float *k_cache, const float *v_cache, int n,
                                 int pos0, int cap, const struct olmo_attn_shape *s) {
    (void)be;
    const int H = s->n_heads, HK = s->n_kv_heads, D = s->head_dim, group = H / HK;
    const size_t q_stride = (size_t)H * D, kv_stride = (size_t)HK * D;
    const int max_keys = s->window > 0 && s->window < pos0 + n ? s->window : pos0 + n;
    size_t stride;
    float *all_scores = thread_tiles((size_t)(max_keys > 0 ? max_keys : 1), &stride);
    if (!all_scores) return -1;
#pragma omp parallel
    {
        float *scores = all_scores + stride * (size_t)omp_get_thread_num();
#pragma omp for collapse(2) schedule(static)
        for (int i = 0; i < n; i++)
            for (int h = 0; h < H; h++) {
                const int t = pos0 + i, kh = h / group;
                const int lo = s->window > 0 && t - s->window + 1 > 0 ? t - s->window + 1 : 0;
                const float *qt = q + (size_t)i * q_stride + (size_t)h * D;
                float *ot = out + (size_t)i * q_stride + (size_t)h * D;
                float mx = -INFINITY;
                for (int j = lo; j <= t; j++) {
                    const float *kj = k_cache + (size_t)(j % cap) * kv_stride + (size_t)kh * D;
                    float sc = cached_dot(qt, kj, D) * s->scale;
                    scores[j - lo] = sc;
                    if (sc > mx) mx = sc;
                }
                double denom = 0.0;
                for (int j = lo; j <= t; j++) {
                    float p = expf(scores[j - lo] - mx);
                    scores[j - lo] = p;
                    denom += p;
                }
                float inv = (float)(1.0 / denom);
                memset(ot, 0, sizeof(float) * (size_t)D);
                for (int j = lo; j <= t; j++) {
                    const float *vj = v_cache + (size_t)(j % cap) * kv_stride + (size_t)kh * D;
                    float p = scores[j - lo] * inv;
                    for (int d = 0; d < D; d++) ot[d] += p * vj[d];
                }
            }
    }
    free(all_scores);
    return 0;
}
