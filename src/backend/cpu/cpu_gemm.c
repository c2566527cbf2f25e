/* The CPU backend's GEMM libraries: OpenBLAS's cblas_sgemm, oneDNN's
 * dnnl_sgemm, and cpu-bf16's two ways to multiply bf16 operands (oneDNN's
 * bf16 matmul, or the operands rounded to bf16 and an fp32 GEMM); and the log
 * line that says which kernels compute. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef OLMOC_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#endif

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_simd.h"
#include "util/error.h"

/* An operand stored as rows x cols (leading dimension *ld) as fp32: itself, or
 * its bf16 elements widened (exactly) into the slot's scratch, dense. */
static const float *f32_operand(struct cpu_state *st, int slot, const void *x, enum olmo_float_type type, int rows,
                                int cols, int *ld) {
    if (type == OLMO_F32) return x;
    float *w = cpu_cached_scratch(st, slot, sizeof(float) * (size_t)(rows > 0 ? rows : 1) * (cols > 0 ? cols : 1));
    if (!w) return NULL;
    const uint16_t *h = x;
#pragma omp parallel for schedule(static) if ((size_t)rows * cols >= PAR_MIN)
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) w[(size_t)r * cols + c] = from_bf16(h[(size_t)r * *ld + c]);
    *ld = cols > 0 ? cols : 1;
    return w;
}

/* ---- OpenBLAS ------------------------------------------------------------ */

int cpu_gemm_openblas(OLMO_BE, bool ta, bool tb, int m, int n, int k, float alpha, const void *a,
                      enum olmo_float_type a_type, int lda, const void *b, enum olmo_float_type b_type, int ldb, float beta,
                      float *c, int ldc) {
    const float *fa = f32_operand(CPU_STATE(be), SLOT_BF16_A, a, a_type, ta ? k : m, ta ? m : k, &lda);
    const float *fb = f32_operand(CPU_STATE(be), SLOT_BF16_B, b, b_type, tb ? n : k, tb ? k : n, &ldb);
    if (!fa || !fb) return -1;
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, fa,
                lda, fb, ldb, beta, c, ldc);
    return 0;
}


bool olmo_cpu_has_avx512(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#else
    return false;
#endif
}

/* OpenBLAS names its kernel family ("Haswell", "SkylakeX", ...): chosen for the
 * processor when it loads, or by OPENBLAS_CORETYPE.  Haswell and Zen are AVX2:
 * on a processor with full-width AVX-512 that is half the peak at best. */
static void openblas_line(char *text, size_t size) {
    const char *kernels = openblas_get_corename();
    const bool avx2_only = !strcmp(kernels, "Haswell") || !strcmp(kernels, "Zen");
#ifdef OLMOC_HAVE_ONEDNN
    const char *warning = ": AVX2 on an AVX-512 processor, half its peak at best; backend cpu has oneDNN's AVX-512 ones";
#else
    const char *warning = ": AVX2 on an AVX-512 processor, half its peak at best; docs/performance.md";
#endif
    snprintf(text, size, "GEMMs: OpenBLAS, %s kernels%s", kernels, avx2_only && olmo_cpu_has_avx512() ? warning : "");
}

const char *cpu_describe_openblas(OLMO_BE) {
    struct cpu_state *st = CPU_STATE(be);
    openblas_line(st->text, sizeof st->text);
    const size_t used = strlen(st->text);
    snprintf(st->text + used, sizeof st->text - used, "; %s", cpu_attention_line(st));
    return st->text;
}

/* ---- oneDNN sgemm --------------------------------------------------------- */
#ifdef OLMOC_HAVE_ONEDNN
/* dnnl_sgemm is row-major with BLAS semantics (C is not read when beta is 0). */
int cpu_gemm_onednn(OLMO_BE, bool ta, bool tb, int m, int n, int k, float alpha, const void *a,
                    enum olmo_float_type a_type, int lda, const void *b, enum olmo_float_type b_type, int ldb, float beta,
                    float *c, int ldc) {
    const float *fa = f32_operand(CPU_STATE(be), SLOT_BF16_A, a, a_type, ta ? k : m, ta ? m : k, &lda);
    const float *fb = f32_operand(CPU_STATE(be), SLOT_BF16_B, b, b_type, tb ? n : k, tb ? k : n, &ldb);
    if (!fa || !fb) return -1;
    dnnl_status_t status = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, fa, lda, fb, ldb, beta, c, ldc);
    if (status != dnnl_success) /* only invalid arguments fail */
        return olmo_error("oneDNN sgemm(%c%c, m %d n %d k %d, lda %d ldb %d ldc %d) failed with status %d",
                          ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, lda, ldb, ldc, (int)status);
    return 0;
}

static const char *onednn_isa_name(dnnl_cpu_isa_t isa) {
    switch (isa) {
    case dnnl_cpu_isa_sse41: return "SSE4.1";
    case dnnl_cpu_isa_avx: return "AVX";
    case dnnl_cpu_isa_avx2: return "AVX2";
    case dnnl_cpu_isa_avx2_vnni: return "AVX2-VNNI";
    case dnnl_cpu_isa_avx512_core: return "AVX-512";
    case dnnl_cpu_isa_avx512_core_vnni: return "AVX-512 VNNI";
    case dnnl_cpu_isa_avx512_core_bf16: return "AVX-512 BF16";
    case dnnl_cpu_isa_avx512_core_amx: return "AVX-512 AMX";
    default: return "other";
    }
}

static void onednn_line(char *text, size_t size) {
    const dnnl_version_t *v = dnnl_version();
    snprintf(text, size, "GEMMs: oneDNN %d.%d.%d, %s JIT kernels", v->major, v->minor, v->patch,
             onednn_isa_name(dnnl_get_effective_cpu_isa()));
}

const char *cpu_describe_onednn(OLMO_BE) {
    struct cpu_state *st = CPU_STATE(be);
    onednn_line(st->text, sizeof st->text);
    const size_t used = strlen(st->text);
    snprintf(st->text + used, sizeof st->text - used, "; %s", cpu_attention_line(st));
    return st->text;
}
#endif /* OLMOC_HAVE_ONEDNN */

/* ---- oneDNN bf16 matmul (cpu-bf16) ---------------------------------------- */
#ifdef OLMOC_CPU_BF16
/* cpu-bf16: GEMM operands rounded to bf16 (round to nearest even) and
 * multiplied with fp32 accumulation and fp32 output by oneDNN's matmul
 * primitive (AVX512-BF16 or AMX kernels where the processor has them); every
 * other op, the weights, gradients and AdamW state stay fp32: the numerics
 * of cuda-bf16.  The matmul API used here is oneDNN 2.x's. */
/* rows x cols of src (leading dimension ld), times scale, packed into dst[rows][cols] as bf16. */
static void pack_bf16(uint16_t *dst, const void *src, enum olmo_float_type type, int rows, int cols, int ld, float scale) {
#pragma omp parallel for schedule(static) if ((size_t)rows * cols >= PAR_MIN)
    for (int r = 0; r < rows; r++) {
        uint16_t *out = dst + (size_t)r * cols;
        if (type == OLMO_F32) {
            const float *in = (const float *)src + (size_t)r * ld;
            for (int c = 0; c < cols; c++) out[c] = to_bf16(in[c] * scale);
        } else {
            const uint16_t *in = (const uint16_t *)src + (size_t)r * ld;
            for (int c = 0; c < cols; c++) out[c] = scale == 1.0f ? in[c] : to_bf16(from_bf16(in[c]) * scale);
        }
    }
}

/* The operand as packed bf16 rows: a dense bf16 operand (a compute copy of
 * the weights) as it is, anything else packed into the slot's scratch. */
static const uint16_t *bf16_operand(struct cpu_state *st, int slot, const void *x, enum olmo_float_type type, int rows,
                                    int cols, int ld, float scale) {
    if (type == OLMO_BF16 && ld == cols && scale == 1.0f) return x;
    uint16_t *p = cpu_cached_scratch(st, slot, sizeof(uint16_t) * (size_t)rows * cols);
    if (p) pack_bf16(p, x, type, rows, cols, ld, scale);
    return p;
}

/* One matmul primitive per GEMM shape (a model has a dozen or two), made on first use. */
struct bf16_matmul {
    bool ta, tb, accumulate;
    int m, n, k, ldc;
    dnnl_memory_desc_t a_md, b_md, c_md;
    dnnl_primitive_t prim;
};
/* An instance's oneDNN engine, stream and matmul primitives. */
struct cpu_bf16_cache {
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    struct bf16_matmul *items;
    int count, cap;
    char impl[64]; /* the implementation oneDNN chose for the probe shape */
};

void cpu_bf16_cache_free(struct cpu_bf16_cache *c) {
    if (!c) return;
    for (int i = 0; i < c->count; i++) dnnl_primitive_destroy(c->items[i].prim);
    free(c->items);
    if (c->stream) dnnl_stream_destroy(c->stream);
    if (c->engine) dnnl_engine_destroy(c->engine);
    free(c);
}

/* NULL with *status set when oneDNN has no bf16 matmul for this processor. */
static struct bf16_matmul *bf16_matmul_for(struct cpu_bf16_cache *c, bool ta, bool tb, int m, int n, int k, int ldc,
                                           bool accumulate, dnnl_status_t *status) {
    for (int i = 0; i < c->count; i++) {
        struct bf16_matmul *it = &c->items[i];
        if (it->ta == ta && it->tb == tb && it->accumulate == accumulate && it->m == m && it->n == n &&
            it->k == k && it->ldc == ldc)
            return it;
    }
    if ((*status = c->engine ? dnnl_success : dnnl_engine_create(&c->engine, dnnl_cpu, 0)) != dnnl_success)
        return NULL;
    if (!c->stream &&
        (*status = dnnl_stream_create(&c->stream, c->engine, dnnl_stream_default_flags)) != dnnl_success)
        return NULL;
    if (c->count == c->cap) {
        int cap = c->cap ? 2 * c->cap : 32;
        struct bf16_matmul *items = realloc(c->items, sizeof *items * (size_t)cap);
        if (!items) {
            *status = dnnl_out_of_memory;
            return NULL;
        }
        c->items = items;
        c->cap = cap;
    }
    struct bf16_matmul it = {.ta = ta, .tb = tb, .accumulate = accumulate, .m = m, .n = n, .k = k, .ldc = ldc};
    /* the packed operands keep their stored layout; a transpose is a stride swap */
    const dnnl_dims_t a_dims = {m, k}, a_strides = {ta ? 1 : k, ta ? m : 1};
    const dnnl_dims_t b_dims = {k, n}, b_strides = {tb ? 1 : n, tb ? k : 1};
    const dnnl_dims_t c_dims = {m, n}, c_strides = {ldc, 1};
    dnnl_matmul_desc_t desc;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t post_ops = NULL;
    dnnl_primitive_desc_t pd = NULL;
    if ((*status = dnnl_memory_desc_init_by_strides(&it.a_md, 2, a_dims, dnnl_bf16, a_strides)) ||
        (*status = dnnl_memory_desc_init_by_strides(&it.b_md, 2, b_dims, dnnl_bf16, b_strides)) ||
        (*status = dnnl_memory_desc_init_by_strides(&it.c_md, 2, c_dims, dnnl_f32, c_strides)) ||
        (*status = dnnl_matmul_desc_init(&desc, &it.a_md, &it.b_md, NULL, &it.c_md)) ||
        (*status = dnnl_primitive_attr_create(&attr)))
        return NULL;
    if (accumulate) { /* C += product: the sum post-op adds the C already there */
        if ((*status = dnnl_post_ops_create(&post_ops)) == dnnl_success &&
            (*status = dnnl_post_ops_append_sum(post_ops, 1.0f)) == dnnl_success)
            *status = dnnl_primitive_attr_set_post_ops(attr, post_ops);
    }
    if (*status == dnnl_success) *status = dnnl_primitive_desc_create(&pd, &desc, attr, c->engine, NULL);
    if (*status == dnnl_success) *status = dnnl_primitive_create(&it.prim, pd);
    if (*status == dnnl_success && !c->impl[0]) {
        const char *impl = NULL;
        if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl)
            snprintf(c->impl, sizeof c->impl, "%s", impl);
    }
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (post_ops) dnnl_post_ops_destroy(post_ops);
    dnnl_primitive_attr_destroy(attr);
    if (*status != dnnl_success) return NULL;
    c->items[c->count] = it;
    return &c->items[c->count++];
}

/* alpha is folded into A before its rounding; beta other than 0 and 1 scales C first. */
int cpu_gemm_onednn_bf16(OLMO_BE, bool ta, bool tb, int m, int n, int k, float alpha, const void *a,
                         enum olmo_float_type a_type, int lda, const void *b, enum olmo_float_type b_type, int ldb, float beta,
                         float *c, int ldc) {
    struct cpu_state *st = CPU_STATE(be);
    if (m <= 0 || n <= 0) return 0;
    if (beta != 0.0f && beta != 1.0f)
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) c[(size_t)i * ldc + j] *= beta;
    if (k <= 0) { /* an empty product: C = beta C */
        if (beta == 0.0f)
            for (int i = 0; i < m; i++) memset(c + (size_t)i * ldc, 0, sizeof(float) * (size_t)n);
        return 0;
    }
    const uint16_t *pa = bf16_operand(st, SLOT_BF16_A, a, a_type, ta ? k : m, ta ? m : k, lda, alpha);
    const uint16_t *pb = bf16_operand(st, SLOT_BF16_B, b, b_type, tb ? n : k, tb ? k : n, ldb, 1.0f);
    if (!pa || !pb) return -1;
    dnnl_status_t status = dnnl_success;
    struct cpu_bf16_cache *cache = st->bf16;
    struct bf16_matmul *mm = bf16_matmul_for(cache, ta, tb, m, n, k, ldc, beta != 0.0f, &status);
    dnnl_memory_t mem_a = NULL, mem_b = NULL, mem_c = NULL;
    if (mm && !(status = dnnl_memory_create(&mem_a, &mm->a_md, cache->engine, (void *)pa)) &&
        !(status = dnnl_memory_create(&mem_b, &mm->b_md, cache->engine, (void *)pb)) &&
        !(status = dnnl_memory_create(&mem_c, &mm->c_md, cache->engine, c))) {
        const dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, mem_a}, {DNNL_ARG_WEIGHTS, mem_b}, {DNNL_ARG_DST, mem_c}};
        if (!(status = dnnl_primitive_execute(mm->prim, cache->stream, 3, args)))
            status = dnnl_stream_wait(cache->stream);
    }
    if (mem_a) dnnl_memory_destroy(mem_a);
    if (mem_b) dnnl_memory_destroy(mem_b);
    if (mem_c) dnnl_memory_destroy(mem_c);
    if (status != dnnl_success)
        return olmo_error("oneDNN bf16 matmul (%c%c, m %d n %d k %d, ldc %d) failed with status %d", ta ? 'T' : 'N',
                          tb ? 'T' : 'N', m, n, k, ldc, (int)status);
    return 0;
}

/* Whether oneDNN has a bf16 matmul here (not on processors without AVX-512):
 * makes st's primitive cache and probes one shape; error set when not. */
bool cpu_bf16_available(struct cpu_state *st) {
    if (!st->bf16 && !(st->bf16 = olmo_calloc(1, sizeof *st->bf16, "oneDNN matmul cache"))) return false;
    dnnl_status_t status = dnnl_success;
    const bool ok = bf16_matmul_for(st->bf16, false, true, 64, 64, 64, 64, false, &status) != NULL;
    if (!ok)
        olmo_error("backend 'cpu-bf16': oneDNN has no bf16 matmul on this processor (status %d); use cpu",
                   (int)status);
    return ok;
}

const char *cpu_describe_onednn_bf16(OLMO_BE) {
    struct cpu_state *st = CPU_STATE(be);
    const dnnl_version_t *v = dnnl_version();
    const char *attention = cpu_attention_line(st);
    snprintf(st->text, sizeof st->text, "GEMMs: oneDNN %d.%d.%d matmul, bf16 operands, fp32 accumulation, %s; %s",
             v->major, v->minor, v->patch,
             st->bf16 && st->bf16->impl[0] ? st->bf16->impl : "kernels chosen on first use", attention);
    return st->text;
}
#endif /* OLMOC_CPU_BF16 */

/* ---- bf16 operands through an fp32 GEMM (cpu-bf16 anywhere) ---------------
 * The operands are rounded to bf16 (to nearest even, alpha folded into A
 * first, as the matmul path does) and widened back to fp32, which is exact;
 * then the fp32 GEMM of the build (oneDNN sgemm, else OpenBLAS).  A product of
 * two bf16 values is exact in fp32 (8 x 8 significant bits) and the sums are
 * fp32, so these are the numerics of a bf16 matmul with fp32 accumulation up
 * to summation order: cpu-bf16 on processors where oneDNN has no bf16 matmul
 * (AVX2), or anywhere with OLMOC_CPU_BF16=convert. */

/* rows x cols of src (leading dimension ld), times scale, rounded to bf16, into dst[rows][cols] as fp32. */
static void round_to_bf16(float *dst, const void *src, enum olmo_float_type type, int rows, int cols, int ld,
                          float scale) {
#pragma omp parallel for schedule(static) if ((size_t)rows * cols >= PAR_MIN)
    for (int r = 0; r < rows; r++) {
        float *out = dst + (size_t)r * cols;
        if (type == OLMO_F32) {
            const float *in = (const float *)src + (size_t)r * ld;
            for (int c = 0; c < cols; c++) out[c] = from_bf16(to_bf16(in[c] * scale));
        } else {
            const uint16_t *in = (const uint16_t *)src + (size_t)r * ld;
            for (int c = 0; c < cols; c++) out[c] = from_bf16(scale == 1.0f ? in[c] : to_bf16(from_bf16(in[c]) * scale));
        }
    }
}

#ifdef OLMOC_HAVE_ONEDNN
#define FP32_GEMM cpu_gemm_onednn
#else
#define FP32_GEMM cpu_gemm_openblas
#endif

int cpu_gemm_bf16_convert(OLMO_BE, bool ta, bool tb, int m, int n, int k, float alpha, const void *a,
                          enum olmo_float_type a_type, int lda, const void *b, enum olmo_float_type b_type, int ldb, float beta,
                          float *c, int ldc) {
    struct cpu_state *st = CPU_STATE(be);
    if (m <= 0 || n <= 0) return 0;
    if (k <= 0) { /* an empty product: C = beta C */
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) c[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[(size_t)i * ldc + j];
        return 0;
    }
    float *ra = cpu_cached_scratch(st, SLOT_BF16_A, sizeof(float) * (size_t)m * k);
    float *rb = cpu_cached_scratch(st, SLOT_BF16_B, sizeof(float) * (size_t)k * n);
    if (!ra || !rb) return -1;
    round_to_bf16(ra, a, a_type, ta ? k : m, ta ? m : k, lda, alpha);
    round_to_bf16(rb, b, b_type, tb ? n : k, tb ? k : n, ldb, 1.0f);
    return FP32_GEMM(be, ta, tb, m, n, k, 1.0f, ra, OLMO_F32, ta ? m : k, rb, OLMO_F32, tb ? k : n, beta, c, ldc);
}

const char *cpu_describe_bf16_convert(OLMO_BE) {
    struct cpu_state *st = CPU_STATE(be);
    const char *attention = cpu_attention_line(st);
    char fp32[160];
#ifdef OLMOC_HAVE_ONEDNN
    onednn_line(fp32, sizeof fp32);
#else
    openblas_line(fp32, sizeof fp32);
#endif
    snprintf(st->text, sizeof st->text, "GEMMs: bf16 operands rounded, then %s in fp32 (%s); fp32 accumulation; %s",
             fp32 + strlen("GEMMs: "), st->why, attention);
    return st->text;
}
