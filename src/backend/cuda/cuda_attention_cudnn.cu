/* cuda-bf16's attention through cuDNN's fused SDPA (cudnn_sdpa.h), and what
 * runs instead when it cannot:
 *   - no cuDNN at run time (libcudnn not found, older than 9, cudnnCreate
 *     failed), or OLMOC_CUDNN=0: the tensor-core kernels (cuda_attention_tc.cu),
 *     said once per process on stderr and in describe();
 *   - intra-document masking (the graphs here have no document mask), a
 *     shape cuDNN refuses, and a head_dim outside cuda-bf16's bf16 attention
 *     (a multiple of 16 up to 128; the fp32 kernels, as before): the kernels
 *     for that call, said once per instance.
 * The backend interface's q, k, v, out and gradients are fp32 rows; they are
 * rounded to bf16 copies in scratch (the rounding the tensor-core kernels also
 * apply to their operands), cuDNN's bf16 O and dQ, dK, dV are widened back.
 * lse is written by cuDNN in place: its Stats are olmoc's [batch, heads, seq]
 * natural-log log-sum-exp of the scaled scores, so either path's forward
 * feeds either path's backward. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cudnn_sdpa.h"

void olmo_cuda_cudnn_init(OLMO_BE) {
    struct olmo_cuda_state *st = CUDA_STATE(be);
    static char said[sizeof st->attn_line]; /* one line per process, unless an instance's path differs */
#ifdef OLMOC_NO_CUDNN /* configured with -DOLMOC_CUDNN=OFF */
    snprintf(st->attn_line, sizeof st->attn_line, "attention: tensor-core kernels (built without cuDNN)");
#else
    const char *env = getenv("OLMOC_CUDNN");
    if (env && !strcmp(env, "0")) {
        snprintf(st->attn_line, sizeof st->attn_line,
                 "attention: tensor-core kernels (cuDNN SDPA off: OLMOC_CUDNN=0)");
    } else if ((st->sdpa = olmo_sdpa_create())) {
        const long v = olmo_sdpa_version(st->sdpa);
        snprintf(st->attn_line, sizeof st->attn_line, "attention: cuDNN %ld.%ld.%ld fused SDPA (%s)", v / 10000,
                 v / 100 % 100, v % 100, olmo_sdpa_library(st->sdpa));
    } else {
        snprintf(st->attn_line, sizeof st->attn_line, "attention: tensor-core kernels (%s)", olmo_last_error());
    }
#endif
    if (strcmp(said, st->attn_line)) fprintf(stderr, "olmoc: %s: %s\n", be->name, st->attn_line);
    memcpy(said, st->attn_line, sizeof said);
}

#ifdef OLMOC_NO_CUDNN /* nothing is ever loaded: st->sdpa stays NULL and the calls below are never made */
struct olmo_sdpa *olmo_sdpa_create(void) { return NULL; }
void olmo_sdpa_destroy(struct olmo_sdpa *) {}
long olmo_sdpa_version(const struct olmo_sdpa *) { return 0; }
const char *olmo_sdpa_library(const struct olmo_sdpa *) { return ""; }
int olmo_sdpa_prepare(struct olmo_sdpa *, const struct olmo_sdpa_shape *, int, size_t *) {
    return olmo_error("built without cuDNN");
}
int olmo_sdpa_fwd(struct olmo_sdpa *, const struct olmo_sdpa_shape *, void *, float *, const void *, const void *,
                  const void *, void *, void *) {
    return olmo_error("built without cuDNN");
}
int olmo_sdpa_bwd(struct olmo_sdpa *, const struct olmo_sdpa_shape *, void *, void *, void *, const void *,
                  const void *, const float *, const void *, const void *, const void *, void *, void *) {
    return olmo_error("built without cuDNN");
}
#endif

void olmo_cuda_cudnn_destroy(OLMO_BE) {
    struct olmo_cuda_state *st = CUDA_STATE(be);
    olmo_sdpa_destroy(st->sdpa);
    st->sdpa = NULL;
}

const char *olmo_cuda_describe(OLMO_BE) { return CUDA_STATE(be)->attn_line; }

/* Appends a fallback to the describe() line and prints it once per instance. */
static void note(OLMO_BE, bool *noted, const char *fmt, const char *detail) {
    if (*noted) return;
    *noted = true;
    struct olmo_cuda_state *st = CUDA_STATE(be);
    char line[320];
    snprintf(line, sizeof line, fmt, detail);
    const size_t used = strlen(st->attn_line);
    snprintf(st->attn_line + used, sizeof st->attn_line - used, "; %s", line);
    fprintf(stderr, "olmoc: %s attention: %s\n", be->name, line);
}

/* cuDNN's view of the bf16 copies: separate [batch*seq, heads*head_dim] rows (BSHD). */
static struct olmo_sdpa_shape sdpa_shape(const struct olmo_attn_shape *s) {
    struct olmo_sdpa_shape d;
    memset(&d, 0, sizeof d);
    d.batch = s->batch, d.seq = s->seq_len, d.n_heads = s->n_heads, d.n_kv_heads = s->n_kv_heads;
    d.head_dim = s->head_dim, d.window = s->window > 0 ? s->window : 0, d.scale = s->scale;
    const int64_t T = s->seq_len, D = s->head_dim, qrow = (int64_t)s->n_heads * D, krow = (int64_t)s->n_kv_heads * D;
    const int64_t q[3] = {T * qrow, D, qrow}, k[3] = {T * krow, D, krow};
    memcpy(d.q_stride, q, sizeof q), memcpy(d.o_stride, q, sizeof q);
    memcpy(d.k_stride, k, sizeof k), memcpy(d.v_stride, k, sizeof k);
    return d;
}

/* 1 when the kernels must run this call (said once), 0 when cuDNN takes it (*work: its workspace). */
static int cudnn_takes(OLMO_BE, const struct olmo_attn_shape *s, const int32_t *doc_ids,
                       const struct olmo_sdpa_shape *d, int backward, void **work) {
    struct olmo_cuda_state *st = CUDA_STATE(be);
    if (!st->sdpa) return 1;
    if (!olmo_cuda_attention_tc_supported(s)) { /* and a shape the kernels refuse is refused there */
        char dim[16];
        snprintf(dim, sizeof dim, "%d", s->head_dim);
        note(be, &st->noted_dim,
             "head_dim %s: the fp32 kernels run (cuda-bf16's attention is bf16 for head_dim a multiple of 16 up to "
             "128)",
             dim);
        return 1;
    }
    if (doc_ids) {
        note(be, &st->noted_doc, "intra-document masking: the tensor-core kernels run%s",
             " (the cuDNN graphs have no document mask)");
        return 1;
    }
    size_t bytes = 0;
    if (olmo_sdpa_prepare(st->sdpa, d, backward, &bytes)) {
        note(be, &st->noted_refused, "cuDNN refused a shape, the kernels run it: %s", olmo_last_error());
        return 1;
    }
    *work = NULL;
    if (bytes && !(*work = olmo_cuda_scratch(be, SCRATCH_ATTN_WORK, bytes))) return -1;
    return 0;
}

int olmo_cuda_cudnn_fwd(OLMO_BE, float *out, float *lse, const float *q, const float *k, const float *v,
                        const int32_t *doc_ids, const struct olmo_attn_shape *s) {
    if (s->batch <= 0 || s->seq_len <= 0) return 1;
    const struct olmo_sdpa_shape d = sdpa_shape(s);
    void *work;
    const int r = cudnn_takes(be, s, doc_ids, &d, 0, &work);
    if (r) return r;
    const size_t N = (size_t)s->batch * s->seq_len, nq = N * s->n_heads * s->head_dim,
                 nk = N * s->n_kv_heads * s->head_dim;
    __nv_bfloat16 *qb = (__nv_bfloat16 *)olmo_cuda_scratch(be, SCRATCH_ATTN_BF16, 2 * (2 * nq + 2 * nk));
    if (!qb) return -1;
    __nv_bfloat16 *kb = qb + nq, *vb = kb + nk, *ob = vb + nk;
    if (be->convert(be, qb, OLMO_BF16, q, OLMO_F32, nq) || be->convert(be, kb, OLMO_BF16, k, OLMO_F32, nk) ||
        be->convert(be, vb, OLMO_BF16, v, OLMO_F32, nk))
        return -1;
    if (olmo_sdpa_fwd(CUDA_STATE(be)->sdpa, &d, ob, lse, qb, kb, vb, work, NULL)) return -1;
    return be->convert(be, out, OLMO_F32, ob, OLMO_BF16, nq);
}

int olmo_cuda_cudnn_bwd(OLMO_BE, float *dq, float *dk, float *dv, const float *dout, const float *out,
                        const float *lse, const float *q, const float *k, const float *v, const int32_t *doc_ids,
                        const struct olmo_attn_shape *s) {
    if (s->batch <= 0 || s->seq_len <= 0) return 1;
    const struct olmo_sdpa_shape d = sdpa_shape(s);
    void *work;
    const int r = cudnn_takes(be, s, doc_ids, &d, 1, &work);
    if (r) return r;
    const size_t N = (size_t)s->batch * s->seq_len, nq = N * s->n_heads * s->head_dim,
                 nk = N * s->n_kv_heads * s->head_dim;
    __nv_bfloat16 *qb = (__nv_bfloat16 *)olmo_cuda_scratch(be, SCRATCH_ATTN_BF16, 2 * (4 * nq + 4 * nk));
    if (!qb) return -1;
    __nv_bfloat16 *kb = qb + nq, *vb = kb + nk, *ob = vb + nk, *dob = ob + nq, *dqb = dob + nq, *dkb = dqb + nq,
                  *dvb = dkb + nk;
    /* out came from cuDNN's bf16 O when the forward ran here: rounding it again is exact */
    if (be->convert(be, qb, OLMO_BF16, q, OLMO_F32, nq) || be->convert(be, kb, OLMO_BF16, k, OLMO_F32, nk) ||
        be->convert(be, vb, OLMO_BF16, v, OLMO_F32, nk) || be->convert(be, ob, OLMO_BF16, out, OLMO_F32, nq) ||
        be->convert(be, dob, OLMO_BF16, dout, OLMO_F32, nq))
        return -1;
    if (olmo_sdpa_bwd(CUDA_STATE(be)->sdpa, &d, dqb, dkb, dvb, dob, ob, lse, qb, kb, vb, work, NULL)) return -1;
    if (be->convert(be, dq, OLMO_F32, dqb, OLMO_BF16, nq) || be->convert(be, dk, OLMO_F32, dkb, OLMO_BF16, nk) ||
        be->convert(be, dv, OLMO_F32, dvb, OLMO_BF16, nk))
        return -1;
    return 0;
}
