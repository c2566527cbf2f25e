/* CPU backend (src/backend/cpu/, see cpu_internal.h for its files): GEMMs
 * from oneDNN or OpenBLAS (attention's tiles: its own
 * AVX-512 or AVX2+FMA kernels, else OpenBLAS), OpenMP loops for everything else.
 *
 * Numerics: reductions are done in double where an fp32 sum over a long axis
 * would lose the 1e-5 agreement with the PyTorch reference; exponentials use
 * a vectorisable exp (fast_expf, within 2 ulp of expf).
 *
 * Determinism: every result is the same from run to run with the same
 * thread count.  No floating-point reduction depends on OpenMP's reduction
 * clause (whose combination order is unspecified) or on which thread ran
 * what under dynamic scheduling: partial sums live in per-row, per-chunk or
 * per-column slots that are combined in a fixed order, so results do not
 * even depend on the thread count (attention's dq included: its copies
 * follow the shape's key runs, not the threads; test_attention checks 1 and
 * 3 threads against the default team). */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "util/error.h"

static void *cpu_alloc(OLMO_BE, size_t bytes) {
    /* 64-byte alignment keeps SIMD loads aligned; round size up as required. */
    size_t rounded = (bytes + 63) & ~(size_t)63;
    if (!rounded) rounded = 64;
    void *p = aligned_alloc(64, rounded);
    if (!p) {
        olmo_error("out of memory allocating %zu bytes", bytes);
        return NULL;
    }
    if (olmo_memcount_add(&CPU_STATE(be)->mem, p, rounded)) {
        free(p);
        return NULL;
    }
    memset(p, 0, rounded);
    return p;
}

/* What cpu_scratch(bytes) allocates. */
static size_t scratch_size(size_t bytes) { return ((bytes + 63) & ~(size_t)63) + 64; }

void *cpu_scratch(size_t bytes) {
    void *p = aligned_alloc(64, scratch_size(bytes));
    if (!p) olmo_error("out of memory for %zu bytes of CPU scratch space", bytes);
    return p;
}

/* Large per-call buffers are kept between calls: fresh multi-megabyte
 * allocations come from mmap and pay a page fault per 4 KiB on every call
 * (10% of attention at seq_len 512).  Grow-only; counted as the instance's scratch. */
void *cpu_cached_scratch(struct cpu_state *st, int slot, size_t bytes) {
    if (st->slots[slot].bytes < bytes) {
        const size_t old = st->slots[slot].p ? scratch_size(st->slots[slot].bytes) : 0;
        free(st->slots[slot].p);
        st->slots[slot].p = cpu_scratch(bytes);
        st->slots[slot].bytes = st->slots[slot].p ? bytes : 0;
        olmo_memcount_scratch(&st->mem, old, st->slots[slot].p ? scratch_size(bytes) : 0);
    }
    return st->slots[slot].p;
}

static void cpu_free(OLMO_BE, void *p) {
    olmo_memcount_remove(&CPU_STATE(be)->mem, p);
    free(p);
}

static void cpu_mem_stats(OLMO_BE, struct olmo_mem_stats *out) {
    const struct olmo_memcount *c = &CPU_STATE(be)->mem;
    *out = (struct olmo_mem_stats){.live = c->live, .peak = c->peak, .scratch = c->scratch, .n_live = c->n_live};
}
/* Copies and fills of at least this many bytes are split among the threads: one thread moves about
 * 10 GB/s here, two about 18 (the step's gradient zeroing, 110 MB at the 20m config: 11.6 -> 6.4 ms) */
enum { PAR_BYTES = 1 << 20 };

void cpu_move_bytes(void *dst, const void *src, size_t bytes) {
#pragma omp parallel if (bytes >= PAR_BYTES)
    {
        const size_t chunk = (bytes / (size_t)omp_get_num_threads() + 4095) & ~(size_t)4095;
        const size_t a = chunk * (size_t)omp_get_thread_num() < bytes ? chunk * (size_t)omp_get_thread_num() : bytes;
        const size_t b = a + chunk < bytes ? a + chunk : bytes;
        if (b > a && src) memcpy((char *)dst + a, (const char *)src + a, b - a);
        if (b > a && !src) memset((char *)dst + a, 0, b - a);
    }
}

static int cpu_copy(OLMO_BE, void *dst, const void *src, size_t bytes) {
    (void)be;
    cpu_move_bytes(dst, src, bytes);
    return 0;
}
static int cpu_zero(OLMO_BE, void *p, size_t bytes) {
    (void)be;
    cpu_move_bytes(p, NULL, bytes);
    return 0;
}

static void cpu_destroy(struct olmo_backend *be) {
    struct cpu_state *st = be->state;
    if (!st) return;
    for (int i = 0; i < N_SLOTS; i++) free(st->slots[i].p);
    olmo_memcount_free(&st->mem);
#ifdef OLMOC_CPU_BF16
    cpu_bf16_cache_free(st->bf16);
#endif
    free(st);
    be->state = NULL;
}

/* Every op but the GEMM and attention's precision is the same in all CPU variants. */
typedef int (*cpu_gemm_fn)(OLMO_BE, bool, bool, int, int, int, float, const void *, enum olmo_float_type, int,
                           const void *, enum olmo_float_type, int, float, float *, int);

/* bf16: cpu-bf16 (bf16 compute copies of the weights, attention's products in bf16) */
static struct olmo_backend *cpu_new(const char *name, cpu_gemm_fn gemm, const char *(*describe)(OLMO_BE), bool bf16) {
    struct olmo_backend *be = olmo_calloc(1, sizeof *be, "backend");
    struct cpu_state *st = be ? olmo_calloc(1, sizeof *st, "CPU backend state") : NULL;
    if (!st) {
        free(be);
        return NULL;
    }
    *be = (struct olmo_backend){
        .name = name, .host_memory = true, .state = st, .compute_dtype = bf16 ? OLMO_BF16 : OLMO_F32,
        .destroy = cpu_destroy, .describe = describe, .convert = cpu_convert,
        .alloc = cpu_alloc, .free = cpu_free, .mem_stats = cpu_mem_stats, .to_device = cpu_copy, .to_host = cpu_copy, .zero = cpu_zero,
        .copy = cpu_copy, .gemm = gemm, .embedding_fwd = cpu_embedding_fwd, .embedding_bwd = cpu_embedding_bwd,
        .rmsnorm_fwd = cpu_rmsnorm_fwd, .rmsnorm_bwd = cpu_rmsnorm_bwd, .rope_fwd = cpu_rope_fwd,
        .rope_bwd = cpu_rope_bwd, .attention_fwd = bf16 ? cpu_attention_fwd_bf16 : cpu_attention_fwd,
        .attention_bwd = bf16 ? cpu_attention_bwd_bf16 : cpu_attention_bwd, .swiglu_fwd = cpu_swiglu_fwd,
        .swiglu_bwd = cpu_swiglu_bwd, .add = cpu_add, .cross_entropy = cpu_cross_entropy,
        .sum_squares = cpu_sum_squares, .scale = cpu_scale, .adamw = cpu_adamw,
        .attention_cached = cpu_attention_cached};
    if (cpu_attention_select(st, bf16) != 0) { /* OLMOC_CPU_ISA it cannot honour */
        free(st);
        free(be);
        return NULL;
    }
    return be;
}

/* cpu-bf16 on oneDNN's bf16 matmul; NULL, error set, where this build or processor has none. */
static struct olmo_backend *onednn_bf16(void) {
#if defined(OLMOC_CPU_BF16)
    struct olmo_backend *be = cpu_new("cpu-bf16", cpu_gemm_onednn_bf16, cpu_describe_onednn_bf16, true);
    if (be && !cpu_bf16_available(be->state)) {
        olmo_backend_destroy(be);
        return NULL;
    }
    return be;
#elif defined(OLMOC_HAVE_ONEDNN)
    olmo_error("cpu-bf16's bf16 matmul needs oneDNN 2.x's matmul API (this build has oneDNN %d)", DNNL_VERSION_MAJOR);
    return NULL;
#else
    olmo_error("cpu-bf16's bf16 matmul needs oneDNN (this build has none: install libdnnl-dev and reconfigure)");
    return NULL;
#endif
}

/* cpu-bf16 through bf16 rounding and the fp32 GEMM, chosen for `why`. */
static struct olmo_backend *bf16_convert(const char *why) {
    struct olmo_backend *be = cpu_new("cpu-bf16", cpu_gemm_bf16_convert, cpu_describe_bf16_convert, true);
    if (be) CPU_STATE(be)->why = why;
    return be;
}

/* "cpu-bf16": the matmul where available, else the fallback; OLMOC_CPU_BF16 can force either. */
static struct olmo_backend *cpu_bf16(void) {
    const char *path = getenv("OLMOC_CPU_BF16");
    if (path && !strcmp(path, "convert")) return bf16_convert("forced by OLMOC_CPU_BF16=convert");
    if (path && !strcmp(path, "onednn")) return onednn_bf16(); /* NULL, error set, where it is missing */
    if (path && path[0]) {
        olmo_error("OLMOC_CPU_BF16=%s: expected 'onednn' (the bf16 matmul, or fail) or 'convert' (bf16 rounding + "
                   "fp32 GEMM)",
                   path);
        return NULL;
    }
    struct olmo_backend *matmul = onednn_bf16();
    return matmul ? matmul : bf16_convert("no oneDNN bf16 matmul in this build or for this processor");
}

struct olmo_backend *olmo_backend_cpu_create(enum olmo_cpu_gemm_library library) {
    switch (library) {
    case OLMO_CPU_GEMM_BEST:
#ifdef OLMOC_HAVE_ONEDNN
        return cpu_new("cpu", cpu_gemm_onednn, cpu_describe_onednn, false);
#else
        return cpu_new("cpu", cpu_gemm_openblas, cpu_describe_openblas, false);
#endif
    case OLMO_CPU_GEMM_OPENBLAS: return cpu_new("cpu-openblas", cpu_gemm_openblas, cpu_describe_openblas, false);
    case OLMO_CPU_GEMM_ONEDNN:
#ifdef OLMOC_HAVE_ONEDNN
        return cpu_new("cpu-onednn", cpu_gemm_onednn, cpu_describe_onednn, false);
#else
        olmo_error("backend 'cpu-onednn': this build has no oneDNN (install libdnnl-dev and reconfigure)");
        return NULL;
#endif
    case OLMO_CPU_GEMM_ONEDNN_BF16: return onednn_bf16();
    case OLMO_CPU_GEMM_BF16_CONVERT: return bf16_convert("chosen explicitly");
    case OLMO_CPU_GEMM_BF16: return cpu_bf16();
    }
    olmo_error("unknown CPU GEMM library %d", (int)library);
    return NULL;
}
