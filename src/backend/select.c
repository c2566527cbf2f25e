/* Backend instances by name (command lines, tests, benchmarks). */
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "util/error.h"

struct olmo_backend *olmo_backend_create(const char *name) {
    if (!strcmp(name, "cpu")) return olmo_backend_cpu_create(OLMO_CPU_GEMM_BEST);
    if (!strcmp(name, "cpu-openblas")) return olmo_backend_cpu_create(OLMO_CPU_GEMM_OPENBLAS);
    if (!strcmp(name, "cpu-onednn")) return olmo_backend_cpu_create(OLMO_CPU_GEMM_ONEDNN);
    if (!strcmp(name, "cpu-bf16")) return olmo_backend_cpu_create(OLMO_CPU_GEMM_BF16);
#ifdef OLMOC_HAVE_CUDA
    if (!strcmp(name, "cuda") || !strcmp(name, "cuda-fp32")) return olmo_backend_cuda_create(OLMO_CUDA_FP32);
    if (!strcmp(name, "cuda-tf32")) return olmo_backend_cuda_create(OLMO_CUDA_TF32);
    if (!strcmp(name, "cuda-bf16")) return olmo_backend_cuda_create(OLMO_CUDA_BF16);
    if (!strcmp(name, "cuda-bf16-cublas")) return olmo_backend_cuda_create(OLMO_CUDA_BF16_CUBLAS);
    olmo_error("unknown backend '%s' (available: cpu, cpu-openblas, cpu-onednn, cpu-bf16, cuda, cuda-tf32, cuda-bf16, "
               "cuda-bf16-cublas)",
               name);
#else
    if (!strncmp(name, "cuda", 4))
        olmo_error("backend '%s': this build has no CUDA backend (configure with -DOLMOC_CUDA=ON)", name);
    else
        olmo_error("unknown backend '%s' (available: cpu, cpu-openblas, cpu-onednn, cpu-bf16)", name);
#endif
    return NULL;
}

void olmo_backend_destroy(struct olmo_backend *be) {
    if (!be) return;
    if (be->destroy) be->destroy(be);
    free(be);
}

int olmo_backend_check_attention(const struct olmo_backend *be, const struct olmo_attn_shape *s) {
    if (s->head_dim < 1 || s->n_heads < 1 || s->n_kv_heads < 1 || s->n_heads % s->n_kv_heads || s->window < 0 ||
        s->batch < 0 || s->seq_len < 0)
        return olmo_error("backend '%s': invalid attention shape (head_dim %d, %d heads, %d kv heads, window %d, "
                          "batch %d, seq_len %d)",
                          be->name, s->head_dim, s->n_heads, s->n_kv_heads, s->window, s->batch, s->seq_len);
    if (be->check_attention && be->check_attention(be, s))
        return olmo_error_context("backend '%s' cannot run this model's attention", be->name);
    return 0;
}

size_t olmo_float_type_size(enum olmo_float_type dtype) { return dtype == OLMO_BF16 ? 2 : 4; }

int olmo_buf_alloc(const struct olmo_backend *be, struct olmo_buf *buf, size_t numel, enum olmo_float_type dtype,
                   enum olmo_buf_role role) {
    *buf = (struct olmo_buf){.numel = numel, .dtype = dtype, .role = role};
    if (!(buf->data = be->alloc(be, numel * olmo_float_type_size(dtype)))) {
        buf->numel = 0;
        return -1;
    }
    return 0;
}

void olmo_buf_free(const struct olmo_backend *be, struct olmo_buf *buf) {
    if (buf->data) be->free(be, buf->data);
    *buf = (struct olmo_buf){0};
}

void *olmo_host_alloc(const struct olmo_backend *be, size_t bytes) {
    if (be->host_alloc) return be->host_alloc(be, bytes);
    void *p = malloc(bytes ? bytes : 1);
    if (!p) olmo_error("out of memory: cannot allocate %zu bytes of host memory", bytes);
    return p;
}

void olmo_host_free(const struct olmo_backend *be, void *p) {
    if (!p) return;
    if (be->host_free) be->host_free(be, p);
    else free(p);
}

int olmo_backend_mem_stats(const struct olmo_backend *be, struct olmo_mem_stats *out) {
    *out = (struct olmo_mem_stats){0};
    if (!be->mem_stats) return olmo_error("backend '%s' does not count its memory", be->name);
    be->mem_stats(be, out);
    return 0;
}

void olmo_backend_report_mem_stats(const struct olmo_backend *be, int rank, int world, FILE *out) {
    const char *env = getenv("OLMOC_MEMSTATS");
    struct olmo_mem_stats mem;
    if (!env || !*env || !strcmp(env, "0") || !be->mem_stats) return;
    olmo_backend_mem_stats(be, &mem);
    fprintf(out, "olmoc memstats: rank %d of %d | backend %s | peak %zu bytes | scratch %zu bytes | live at exit %zu "
                 "bytes in %zu buffers\n",
            rank, world > 0 ? world : 1, be->name, mem.peak, mem.scratch, mem.live, mem.n_live);
}
