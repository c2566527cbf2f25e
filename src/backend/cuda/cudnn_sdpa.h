/* Causal scaled-dot-product attention through cuDNN's fused SDPA graphs
 * (cudnn-frontend), behind a C interface.  cudnn_sdpa.cpp implements it on
 * a GPU, loading libcudnn at run time; tests/c/cuda_emu/emu_cudnn_sdpa.cpp
 * implements the same interface on the emulated device from cuDNN's
 * documented semantics, so the glue (layouts, window, statistics) is tested
 * on every machine.
 *
 * Tensors are addressed through strides (in elements), so any row layout
 * plugs in: olmoc's q rows [batch*seq, n_heads*head_dim] are BSHD with
 * stride batch = seq*ld, head = head_dim, seq = ld (ld = the row length:
 * n_heads*head_dim for a buffer of its own, the fused row of a q|k|v
 * buffer), dim stride 1.  Q, K, V, O, dO, dQ, dK, dV are bf16; dQ, dK, dV
 * and dO use the strides of Q, K, V and O.
 *
 * Semantics (cuDNN's): S = scale * Q K^T per (batch, head), head h reading
 * K/V head h / (n_heads / n_kv_heads) (GQA); query t sees key j when
 * j <= t (causal, top-left diagonal) and, with window > 0, j > t - window
 * (the diagonal band's left bound: cuDNN keeps column + left_bound > row);
 * O = softmax(S) V.  stats: fp32 [batch, n_heads, seq], the natural-log
 * log-sum-exp of each row of S (max + log(sum exp(S - max))): olmoc's lse.
 * The backward is cuDNN's deterministic algorithm. */
#ifndef OLMOC_CUDNN_SDPA_H
#define OLMOC_CUDNN_SDPA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct olmo_sdpa; /* a cuDNN handle and its graphs, cached per shape */

struct olmo_sdpa_shape {
    int batch, seq, n_heads, n_kv_heads, head_dim;
    int window;  /* 0: full causal; else query t sees keys t-window+1 .. t */
    float scale; /* the softmax scale */
    /* strides of batch, head, seq (the dim's is 1) */
    int64_t q_stride[3], k_stride[3], v_stride[3], o_stride[3];
};

/* Loads cuDNN (OLMOC_CUDNN_LIB: a path to libcudnn.so.9, else the loader's search for
 * libcudnn.so.9) and creates a handle; NULL with the error set, saying why, when it cannot. */
struct olmo_sdpa *olmo_sdpa_create(void);
void olmo_sdpa_destroy(struct olmo_sdpa *sdpa);
/* cuDNN's version at run time (cudnnGetVersion, e.g. 91900) and the library it came from. */
long olmo_sdpa_version(const struct olmo_sdpa *sdpa);
const char *olmo_sdpa_library(const struct olmo_sdpa *sdpa);

/* Builds (or finds in the cache) the forward or backward graph of this shape and gives its
 * workspace size in bytes; -1 with the error set when cuDNN refuses the shape. */
int olmo_sdpa_prepare(struct olmo_sdpa *sdpa, const struct olmo_sdpa_shape *shape, int backward, size_t *workspace);

/* Enqueue on `stream` (a cudaStream_t; NULL: the legacy default stream).  `workspace` holds at
 * least prepare's size.  0, or -1 with the error set. */
int olmo_sdpa_fwd(struct olmo_sdpa *sdpa, const struct olmo_sdpa_shape *shape, void *o, float *stats, const void *q,
                  const void *k, const void *v, void *workspace, void *stream);
int olmo_sdpa_bwd(struct olmo_sdpa *sdpa, const struct olmo_sdpa_shape *shape, void *dq, void *dk, void *dv,
                  const void *dout, const void *o, const float *stats, const void *q, const void *k, const void *v,
                  void *workspace, void *stream);

#ifdef __cplusplus
}
#endif

#endif
