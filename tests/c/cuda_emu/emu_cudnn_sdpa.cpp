/* cudnn_sdpa.h on the emulated device: a stand-in for cuDNN's fused SDPA,
 * written from cuDNN's documented semantics, not from olmoc's kernels, so the
 * glue around it (strides, the window's left bound, the statistics' layout
 * and base, GQA, the workspace) is checked on every machine.
 *   - Q, K, V, O, dO, dQ, dK, dV: bf16 [batch, heads, seq, head_dim] read and
 *     written through the given strides (dim stride 1), 16-byte aligned;
 *   - causal top-left diagonal and the band's left bound: key j of query t is
 *     kept when j <= t and j + window > t (cuDNN keeps column + left_bound > row);
 *   - S = scale * Q K^T, Stats = max + log(sum exp(S - max)) (natural log),
 *     fp32 [batch, heads, seq]; O = softmax(S) V rounded once to bf16;
 *   - backward from the saved Stats (P = exp(S - Stats)), with rowsum(dO * O)
 *     in the workspace (4 bytes per row, as cuDNN's backward keeps it);
 *     gradients summed in double, rounded once to bf16; GQA's dK, dV summed
 *     over the query heads of a group.
 * It refuses what cuDNN documents it does not run (head_dim not a multiple of 8
 * or above 256), and a shape whose first prepare meets an injected
 * CUDA_EMU_FAIL_CUDNN (cuda_emu_inject.h), as the real one caches a refused
 * graph: that shape stays refused.  Availability follows OLMOC_CUDNN_LIB as the real one does: a
 * path that does not exist is "not loaded". */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tuple>
#include <set>
#include <vector>

#include "cuda_emu.h"

extern "C" {
#include "backend/cuda/cudnn_sdpa.h"
#include "util/error.h"
}

struct olmo_sdpa {
    int live;
    std::set<std::tuple<int, int, int, int, int, int, int>> refused; /* batch, seq, heads, kv, dim, window, bwd */
};

extern "C" struct olmo_sdpa *olmo_sdpa_create(void) {
    const char *path = getenv("OLMOC_CUDNN_LIB");
    if (path && *path && access(path, R_OK) != 0) {
        olmo_error("cuDNN not loaded: %s: cannot open shared object file: No such file or directory", path);
        return NULL;
    }
    struct olmo_sdpa *sd = new olmo_sdpa();
    sd->live = 1;
    return sd;
}
extern "C" void olmo_sdpa_destroy(struct olmo_sdpa *sd) { delete sd; }
extern "C" long olmo_sdpa_version(const struct olmo_sdpa *sd) { return sd ? 90000 : 0; }
extern "C" const char *olmo_sdpa_library(const struct olmo_sdpa *sd) {
    return sd ? "emulated stand-in, tests/c/cuda_emu" : "";
}

static int check(const struct olmo_sdpa *sd, const struct olmo_sdpa_shape *s) {
    if (!sd || sd->live != 1) return olmo_error("emulated cuDNN: no handle");
    if (s->batch <= 0 || s->seq <= 0 || s->n_heads <= 0 || s->n_kv_heads <= 0 || s->n_heads % s->n_kv_heads ||
        s->window < 0)
        return olmo_error("emulated cuDNN: invalid shape");
    if (s->head_dim <= 0 || s->head_dim % 8 || s->head_dim > 256)
        return olmo_error("cuDNN SDPA: check_support: head_dim %d is not a multiple of 8 up to 256", s->head_dim);
    return 0;
}

extern "C" int olmo_sdpa_prepare(struct olmo_sdpa *sd, const struct olmo_sdpa_shape *s, int backward,
                                 size_t *workspace) {
    if (check(sd, s)) return -1;
    const auto key = std::make_tuple(s->batch, s->seq, s->n_heads, s->n_kv_heads, s->head_dim, s->window, backward);
    if (sd->refused.count(key) || (cuda_emu_injected(CUDA_EMU_FAIL_CUDNN) && sd->refused.insert(key).second))
        return olmo_error("cuDNN SDPA: check_support: no engine for this graph (injected refusal)");
    *workspace = backward ? sizeof(float) * (size_t)s->batch * s->n_heads * s->seq : 0;
    return 0;
}

namespace {

typedef __nv_bfloat16 bf16;

struct view { /* one bf16 tensor through its strides */
    const bf16 *p;
    const int64_t *st;
    const bf16 *row(int b, int h, int t) const { return p + b * st[0] + h * st[1] + t * st[2]; }
};

void aligned(const void *p, const char *what) {
    if ((uintptr_t)p % 16) {
        fprintf(stderr, "emulated cuDNN: %s is not 16-byte aligned (%p)\n", what, p);
        abort();
    }
}

bool kept(int t, int j, int window) { return j <= t && (window == 0 || j + window > t); }

double dot(const bf16 *a, const bf16 *b, int D) {
    double acc = 0;
    for (int d = 0; d < D; d++) acc += (double)__bfloat162float(a[d]) * __bfloat162float(b[d]);
    return acc;
}

} // namespace

extern "C" int olmo_sdpa_fwd(struct olmo_sdpa *sd, const struct olmo_sdpa_shape *s, void *o, float *stats,
                             const void *q, const void *k, const void *v, void *workspace, void *stream) {
    if (check(sd, s)) return -1;
    (void)workspace;
    for (const void *p : {(const void *)q, k, v, (const void *)o}) aligned(p, "a tensor");
    const struct olmo_sdpa_shape sh = *s;
    emu_stream_submit((cudaStream_t)stream, [sh, o, stats, q, k, v]() {
        const view Q{(const bf16 *)q, sh.q_stride}, K{(const bf16 *)k, sh.k_stride}, V{(const bf16 *)v, sh.v_stride};
        const int D = sh.head_dim, group = sh.n_heads / sh.n_kv_heads;
        std::vector<double> sc(sh.seq), acc(D);
        for (int b = 0; b < sh.batch; b++)
            for (int h = 0; h < sh.n_heads; h++)
                for (int t = 0; t < sh.seq; t++) {
                    double m = -INFINITY;
                    for (int j = 0; j < sh.seq; j++) {
                        sc[j] = kept(t, j, sh.window) ? sh.scale * dot(Q.row(b, h, t), K.row(b, h / group, j), D)
                                                      : -INFINITY;
                        if (sc[j] > m) m = sc[j];
                    }
                    double l = 0;
                    for (double &a : acc) a = 0;
                    for (int j = 0; j < sh.seq; j++) {
                        if (sc[j] == -INFINITY) continue;
                        const double p = exp(sc[j] - m);
                        l += p;
                        const bf16 *vr = V.row(b, h / group, j);
                        for (int d = 0; d < D; d++) acc[d] += p * __bfloat162float(vr[d]);
                    }
                    bf16 *orow = (bf16 *)o + b * sh.o_stride[0] + h * sh.o_stride[1] + t * sh.o_stride[2];
                    for (int d = 0; d < D; d++) orow[d] = __float2bfloat16((float)(acc[d] / l));
                    stats[((size_t)b * sh.n_heads + h) * sh.seq + t] = (float)(m + log(l));
                }
    });
    return 0;
}

extern "C" int olmo_sdpa_bwd(struct olmo_sdpa *sd, const struct olmo_sdpa_shape *s, void *dq, void *dk, void *dv,
                             const void *dout, const void *o, const float *stats, const void *q, const void *k,
                             const void *v, void *workspace, void *stream) {
    if (check(sd, s)) return -1;
    if (!workspace) return olmo_error("emulated cuDNN: the backward needs its workspace");
    for (const void *p : {(const void *)dq, (const void *)dk, (const void *)dv, dout, o, q, k, v}) aligned(p, "a tensor");
    const struct olmo_sdpa_shape sh = *s;
    emu_stream_submit((cudaStream_t)stream, [sh, dq, dk, dv, dout, o, stats, q, k, v, workspace]() {
        const view Q{(const bf16 *)q, sh.q_stride}, K{(const bf16 *)k, sh.k_stride}, V{(const bf16 *)v, sh.v_stride},
            O{(const bf16 *)o, sh.o_stride}, dO{(const bf16 *)dout, sh.o_stride};
        const int D = sh.head_dim, group = sh.n_heads / sh.n_kv_heads, T = sh.seq;
        float *rowsum = (float *)workspace; /* rowsum(dO * O) per (batch, head, query) */
        for (int b = 0; b < sh.batch; b++)
            for (int h = 0; h < sh.n_heads; h++)
                for (int t = 0; t < T; t++)
                    rowsum[((size_t)b * sh.n_heads + h) * T + t] = (float)dot(dO.row(b, h, t), O.row(b, h, t), D);
        std::vector<double> gq((size_t)T * D), gk((size_t)T * D), gv((size_t)T * D);
        for (int b = 0; b < sh.batch; b++)
            for (int kh = 0; kh < sh.n_kv_heads; kh++) {
                std::fill(gk.begin(), gk.end(), 0.0);
                std::fill(gv.begin(), gv.end(), 0.0);
                for (int h = kh * group; h < (kh + 1) * group; h++) {
                    std::fill(gq.begin(), gq.end(), 0.0);
                    for (int t = 0; t < T; t++) {
                        const size_t row = ((size_t)b * sh.n_heads + h) * T + t;
                        for (int j = 0; j <= t; j++) {
                            if (!kept(t, j, sh.window)) continue;
                            const double p = exp(sh.scale * dot(Q.row(b, h, t), K.row(b, kh, j), D) - stats[row]);
                            const double ds = p * (dot(dO.row(b, h, t), V.row(b, kh, j), D) - rowsum[row]);
                            const bf16 *qr = Q.row(b, h, t), *kr = K.row(b, kh, j), *gr = dO.row(b, h, t);
                            for (int d = 0; d < D; d++) {
                                gq[(size_t)t * D + d] += sh.scale * ds * __bfloat162float(kr[d]);
                                gk[(size_t)j * D + d] += sh.scale * ds * __bfloat162float(qr[d]);
                                gv[(size_t)j * D + d] += p * __bfloat162float(gr[d]);
                            }
                        }
                    }
                    for (int t = 0; t < T; t++) {
                        bf16 *r = (bf16 *)dq + b * sh.q_stride[0] + h * sh.q_stride[1] + t * sh.q_stride[2];
                        for (int d = 0; d < D; d++) r[d] = __float2bfloat16((float)gq[(size_t)t * D + d]);
                    }
                }
                for (int j = 0; j < T; j++) {
                    bf16 *rk = (bf16 *)dk + b * sh.k_stride[0] + kh * sh.k_stride[1] + j * sh.k_stride[2];
                    bf16 *rv = (bf16 *)dv + b * sh.v_stride[0] + kh * sh.v_stride[1] + j * sh.v_stride[2];
                    for (int d = 0; d < D; d++) {
                        rk[d] = __float2bfloat16((float)gk[(size_t)j * D + d]);
                        rv[d] = __float2bfloat16((float)gv[(size_t)j * D + d]);
                    }
                }
            }
    });
    return 0;
}
