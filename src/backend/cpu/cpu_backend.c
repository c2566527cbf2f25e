/* CPU backend (src/backend/cpu/, see cpu_internal.h for its files): GEMMs from oneDNN or OpenBLAS (attention's tiles: its own
 * AVX-512 kernel, else OpenBLAS), OpenMP loops for everything else.
 *
 * Numerics: reductions are done in double where an fp32 sum over a long axis
 * would lose the 1e-5 agreement with the PyTorch reference; exponentials use
 * a vectorisable exp (fast_expf, within 2 ulp of expf).
 *
 * Determinism: every result is the same from run to run with the same
 * thread count.  No floating-point reduction depends on OpenMP's reduction
 * clause (whose combination order is unspecified) or on which thread ran
 * what under dynamic scheduling: partial sums live in per-row, per-chunk or
 * per-column slots that are combined in a fixed order.  Except for
 * attention's dq (per-thread partials under a fixed task-to-thread
 * assignment, summed in thread order), results do not even depend on the
 * thread count. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "util/error.h"

static void *cpu_alloc(size_t bytes) {
    /* 64-byte alignment keeps SIMD loads aligned; round size up as required. */
    size_t rounded = (bytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, rounded ? rounded : 64);
    if (!p) {
        olmo_error("out of memory allocating %zu bytes", bytes);
        return NULL;
    }
    memset(p, 0, rounded);
    return p;
}

void *cpu_scratch(size_t bytes) {
    void *p = aligned_alloc(64, ((bytes + 63) & ~(size_t)63) + 64);
    if (!p) {
        fprintf(stderr, "olmoc: out of memory for %zu bytes of CPU scratch space\n", bytes);
        abort();
    }
    return p;
}

/* Large per-call buffers are kept between calls, one set per calling thread:
 * fresh multi-megabyte allocations come from mmap and pay a page fault per
 * 4 KiB on every call (10% of attention at seq_len 512).  Grow-only. */
static _Thread_local struct {
    void *p;
    size_t bytes;
} slots[N_SLOTS];

void *cpu_cached_scratch(int slot, size_t bytes) {
    if (slots[slot].bytes < bytes) {
        free(slots[slot].p);
        slots[slot].p = cpu_scratch(bytes);
        slots[slot].bytes = bytes;
    }
    return slots[slot].p;
}


static void cpu_free(void *p) { free(p); }
static void cpu_copy(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }
static void cpu_zero(void *p, size_t bytes) { memset(p, 0, bytes); }

/* Every op but the GEMM and attention's precision is the same in all CPU variants. */
#define CPU_OPS(attn_fwd, attn_bwd)                                                                                \
    .host_memory = true, .alloc = cpu_alloc, .free = cpu_free, .to_device = cpu_copy, .to_host = cpu_copy,         \
    .zero = cpu_zero, .copy = cpu_copy, .embedding_fwd = cpu_embedding_fwd, .embedding_bwd = cpu_embedding_bwd,    \
    .rmsnorm_fwd = cpu_rmsnorm_fwd, .rmsnorm_bwd = cpu_rmsnorm_bwd, .rope_fwd = cpu_rope_fwd,                      \
    .rope_bwd = cpu_rope_bwd, .attention_fwd = attn_fwd, .attention_bwd = attn_bwd, .swiglu_fwd = cpu_swiglu_fwd,  \
    .swiglu_bwd = cpu_swiglu_bwd, .add = cpu_add, .cross_entropy = cpu_cross_entropy,                              \
    .sum_squares = cpu_sum_squares, .scale = cpu_scale, .adamw = cpu_adamw, .attention_cached = cpu_attention_cached
#define CPU_FP32_OPS CPU_OPS(cpu_attention_fwd, cpu_attention_bwd)

/* "cpu-onednn"; NULL, error set, in a build without oneDNN. */
static const struct olmo_backend *onednn_fp32(void) {
#ifdef OLMOC_HAVE_ONEDNN
    static const struct olmo_backend onednn = {
        .name = "cpu-onednn", .gemm = cpu_gemm_onednn, .describe = cpu_describe_onednn, CPU_FP32_OPS};
    return &onednn;
#else
    olmo_error("backend 'cpu-onednn': this build has no oneDNN (install libdnnl-dev and reconfigure)");
    return NULL;
#endif
}

/* cpu-bf16 on oneDNN's bf16 matmul; NULL, error set, where this build or processor has none. */
static const struct olmo_backend *onednn_bf16(void) {
#if defined(OLMOC_CPU_BF16)
    static const struct olmo_backend matmul = {
        .name = "cpu-bf16", .gemm = cpu_gemm_onednn_bf16, .describe = cpu_describe_onednn_bf16,
        CPU_OPS(cpu_attention_fwd_bf16, cpu_attention_bwd_bf16)};
    return cpu_bf16_available() ? &matmul : NULL;
#elif defined(OLMOC_HAVE_ONEDNN)
    olmo_error("cpu-bf16's bf16 matmul needs oneDNN 2.x's matmul API (this build has oneDNN %d)", DNNL_VERSION_MAJOR);
    return NULL;
#else
    olmo_error("cpu-bf16's bf16 matmul needs oneDNN (this build has none: install libdnnl-dev and reconfigure)");
    return NULL;
#endif
}

const struct olmo_backend *olmo_backend_cpu_gemm(enum olmo_cpu_gemm_library library) {
    static const struct olmo_backend openblas = {
        .name = "cpu-openblas", .gemm = cpu_gemm_openblas, .describe = cpu_describe_openblas, CPU_FP32_OPS};
#ifdef OLMOC_HAVE_ONEDNN
    static const struct olmo_backend best = {
        .name = "cpu", .gemm = cpu_gemm_onednn, .describe = cpu_describe_onednn, CPU_FP32_OPS};
#else
    static const struct olmo_backend best = {
        .name = "cpu", .gemm = cpu_gemm_openblas, .describe = cpu_describe_openblas, CPU_FP32_OPS};
#endif
    static const struct olmo_backend bf16_convert = {
        .name = "cpu-bf16", .gemm = cpu_gemm_bf16_convert, .describe = cpu_describe_bf16_convert,
        CPU_OPS(cpu_attention_fwd_bf16, cpu_attention_bwd_bf16)};
    switch (library) {
    case OLMO_CPU_GEMM_BEST: return &best;
    case OLMO_CPU_GEMM_OPENBLAS: return &openblas;
    case OLMO_CPU_GEMM_ONEDNN: return onednn_fp32();
    case OLMO_CPU_GEMM_ONEDNN_BF16: return onednn_bf16();
    case OLMO_CPU_GEMM_BF16_CONVERT: return &bf16_convert;
    case OLMO_CPU_GEMM_BF16: {
        const char *path = getenv("OLMOC_CPU_BF16");
        if (path && !strcmp(path, "convert")) return &bf16_convert;
        if (path && !strcmp(path, "onednn")) return onednn_bf16(); /* NULL, error set, where it is missing */
        if (path && path[0]) {
            olmo_error("OLMOC_CPU_BF16=%s: expected 'onednn' (the bf16 matmul, or fail) or 'convert' (bf16 rounding + "
                       "fp32 GEMM)",
                       path);
            return NULL;
        }
        const struct olmo_backend *matmul = onednn_bf16();
        return matmul ? matmul : &bf16_convert;
    }
    }
    olmo_error("unknown CPU GEMM library %d", (int)library);
    return NULL;
}

const struct olmo_backend *olmo_backend_cpu(void) { return olmo_backend_cpu_gemm(OLMO_CPU_GEMM_BEST); }
