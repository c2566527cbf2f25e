/* The Olmo 3 decoder (reordered-norm blocks, QK-norm, RoPE, SwiGLU, 3:1
 * sliding/full attention, untied LM head), forward and backward, on any
 * backend.  Parameter names and shapes are those of Hugging Face
 * transformers' Olmo3ForCausalLM, so checkpoints map one to one. */
#ifndef OLMOC_MODEL_H
#define OLMOC_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "config/config.h"
#include "model/activations.h"

struct olmo_param {
    char name[96];
    int rows, cols;    /* cols = 1 for vectors */
    size_t offset;     /* in floats, into the flat parameter buffer */
    size_t numel;
    bool is_embedding; /* OLMo-core exempts only embeddings.weight from weight decay */
};

struct olmo_layer_tensors {
    float *wq, *wk, *wv, *wo, *q_norm, *k_norm, *gate, *up, *down, *attn_norm, *ff_norm;
};

/* A layer's activations as the ops see them: fp32 buffers, named or by slot (model/activations.h's
 * table, in its order).  olmo_model_layer_acts resolves them for layer l: its own buffers where it keeps
 * a tensor in fp32, the fp32 working buffer where it keeps one in bf16 (the table's `home`), the shared
 * recompute set where it keeps none.  `saved`: the layer's kept tensors, typed (bf16 ones are GEMM
 * operands in the backward pass as they are, or converted back before it); NULL where nothing is saved
 * (KV-cache generation). */
struct olmo_layer_acts {
    union {
        struct {
            float *x;               /* layer input (residual stream) [N, D] */
            float *q_raw, *k_raw;   /* projections before QK-norm */
            float *q, *k, *v;       /* normed + rotated q, k; v */
            float *rstd_q, *rstd_k; /* [N] */
            float *att, *lse;       /* attention output [N, Q], log-sum-exp [B, H, T] */
            float *o, *rstd_o;      /* o_proj output and its norm statistics */
            float *h;               /* x + norm(o) */
            float *g, *u, *s;       /* gate, up, silu(gate)*up [N, F] */
            float *m, *rstd_m;      /* down_proj output and its norm statistics */
        };
        float *slot[OLMO_ACT_LAYER_SLOTS];
    };
    const struct olmo_buf *saved;
};

/* Residency hooks (fully sharded training, train/fsdp.c): the forward and
 * backward passes call acquire before they use a unit's weights (or, in
 * backward, its gradients) and release after; a unit is a block (0 ..
 * n_layers-1) or OLMO_UNIT_ROOT (embeddings, final norm, LM head).  The
 * forward pass acquires the root at its start and releases each block after
 * it; the backward pass acquires the root (backward = true: its gradients
 * start from zero) at its start, each block before its backward and releases
 * it after (its gradients are complete), and releases the root at its end.
 * acquire points m->lw / m->lg (or m->embed ... m->d_lm_head) at the unit's
 * buffers and sets the weight windows (olmo_model_weight).  0, or -1 with the
 * error set. */
#define OLMO_UNIT_ROOT (-1)
struct olmo_model;
struct olmo_unit_hooks {
    void *ctx;
    int (*acquire)(void *ctx, struct olmo_model *m, int unit, bool backward);
    int (*release)(void *ctx, struct olmo_model *m, int unit, bool backward);
};

/* Where a sharded model's resident weights are: fp32 [w, w + n) has its compute copy at `compute`
 * (same element index; NULL where the backend computes in fp32). */
struct olmo_weight_window {
    const float *w;
    size_t n;
    const void *compute;
};
enum { OLMO_MAX_WEIGHT_WINDOWS = 4 };

struct olmo_model {
    struct olmo_model_config cfg;
    const struct olmo_backend *be;
    int head_dim, q_dim, kv_dim;

    int n_tensors;
    struct olmo_param *params;
    size_t n_floats;
    float *weights, *grads; /* flat backend buffers, same layout: fp32 master weights and gradients */
    /* The weights in the backend's compute_dtype (bf16 on cpu-bf16 and cuda-bf16), same layout, which the
     * GEMMs read instead of `weights`; numel 0 where the backend computes in fp32.  Whoever changes
     * `weights` calls olmo_model_sync_weights (loading, init, the optimizer step and its all-gather). */
    struct olmo_buf compute;
    struct olmo_layer_tensors *lw, *lg;
    float *embed, *final_norm, *lm_head;
    float *d_embed, *d_final_norm, *d_lm_head;

    /* Activation checkpointing (olmo_model_set_checkpointing; train.activation_checkpointing): layer l
     * is checkpointed when ckpt_mode != OLMO_ACT_CKPT_NONE and l % ckpt_every == 0 (OLMo-core's block_interval).
     *   feed_forward: a checkpointed layer keeps no g, u, s (the MLP's inner activations); its backward
     *                 recomputes them from h.
     *   block:        a checkpointed layer keeps only its input x; its backward reruns the whole layer
     *                 forward from x, then its backward.
     * What a checkpointed layer does not keep lives in `shared`, one set for all layers. */
    enum olmo_act_ckpt ckpt_mode;
    int ckpt_every;
    /* Type of the saved activations that are only GEMM operands in the backward pass (x, h, s of the
     * layers that keep them, and the final norm's output): bf16 by default where the backend's
     * compute_dtype is bf16, so the results do not change; fp32 otherwise. */
    enum olmo_float_type saved_type;
    /* Every large saved activation in bf16 (train.saved_activations: bf16; needs saved_type bf16).  The
     * backward then sees every saved activation rounded to bf16, recomputed ones too (the checkpointing
     * modes stay bit-identical to none); round16 is the scratch that rounds recomputed ones. */
    bool saved_all_bf16;

    /* Activations for one micro-batch shape, allocated by olmo_model_reserve from the table in
     * model/activations.h: saved[l] holds what layer l keeps (typed; numel 0 where it keeps nothing),
     * shared the fp32 recompute set, bufs the model-level tensors, of which the pointers below are
     * views (fp32 or int32; the final norm's output is bufs[OLMO_ACT_XN_FINAL], typed). */
    int batch, seq_len;
    struct olmo_buf (*saved)[OLMO_ACT_LAYER_SLOTS];
    struct olmo_buf shared[OLMO_ACT_LAYER_SLOTS];
    struct olmo_buf bufs[OLMO_ACT_MODEL_SLOTS];
    /* Bytes of the saved activations (the table's OLMO_ACT_SAVED group): every layer's, the recompute set,
     * resid, x_final, the final norm's output and rstd_final (not the logits, ids or backward scratch). */
    size_t act_bytes;
    float *resid; /* the fp32 input of the layers that save x as bf16 (NULL when none does) */
    float *x_final, *rstd_final, *logits;
    /* The chunked loss (a backend with cross_entropy_bf16; model/activations.h: olmo_act_logits_chunk):
     * logits_chunk > 0 rows of fp32 logits at a time in `logits` ([logits_chunk, V]), their gradient as
     * bf16 in `dlogits` ([N, V]); the forward pass stops at the final norm and olmo_model_loss computes
     * the logits chunk by chunk.  0: the forward pass computes all N rows into `logits` ([N, V]).
     * logits_chunk_rows: the chunk asked for by olmo_model_set_logits_chunk (0: the automatic one). */
    int logits_chunk, logits_chunk_rows;
    void *dlogits;
    /* The rows whose logits `logits` holds: [logits_row0, logits_row0 + rows), -1 when none (the loss
     * overwrites them); olmo_model_logits_rows reads and, chunked, fills it. */
    int logits_row0;
    /* olmo_model_loss left the logits' gradient as bf16 in the first half of each logits row (the
     * backend's cross_entropy_bf16; bf16 leading dimension 2 * vocab), not as fp32 over the row */
    bool dlogits_bf16;
    void *round16;
    float *rope_cos, *rope_sin;
    int32_t *tokens, *targets, *doc_ids;
    bool use_doc_ids;
    /* a host copy of the forward pass's ids, for a backend with embedding_bwd_ids (no copy back) */
    int32_t *host_tokens;
    size_t host_tokens_cap;
    /* backward scratch */
    float *dx, *dh, *dtmp, *dq, *dk, *dv, *datt, *dg, *du, *ds;

    /* Set by the caller before olmo_model_backward, instead of zeroing m->grads (the trainer's first
     * micro-batch of a step): that pass writes the gradients instead of adding to them (the weight
     * GEMMs with beta 0; the embedding's and the norms' gradients, sums of parts, are zeroed first),
     * with the same bits, and clears it.  One memset of every gradient less a step, and the GEMMs do
     * not read C (20m config, T=512, forced AVX2: the larger weight-gradient GEMMs 183-186 -> 190-191 GFLOP/s). */
    bool overwrite_grads;
    /* Sharded (olmo_model_create_sharded): weights, grads and compute are not allocated; the hooks
     * make each unit resident when it is used, and olmo_model_weight looks pointers up in win. */
    bool sharded;
    const struct olmo_unit_hooks *hooks;
    struct olmo_weight_window win[OLMO_MAX_WEIGHT_WINDOWS];
    int n_win;
};

int olmo_model_create(struct olmo_model *m, const struct olmo_model_config *cfg, const struct olmo_backend *be);
/* The same model without its full-size weights, gradients and compute copy (m->weights, m->grads
 * NULL): fully sharded training keeps them as shards and sets m->hooks (train/fsdp.h). */
int olmo_model_create_sharded(struct olmo_model *m, const struct olmo_model_config *cfg, const struct olmo_backend *be);
/* Flat parameters [*offset, *offset + *numel) of block l (contiguous: its tensors in declaration order). */
void olmo_model_layer_span(const struct olmo_model *m, int l, size_t *offset, size_t *numel);
/* Points m->lw[l] and m->lg[l] at buffers holding block l's weights and gradients in flat layout
 * (element 0 = the block's first parameter). */
void olmo_model_bind_layer(struct olmo_model *m, int l, float *w, float *g);
void olmo_model_destroy(struct olmo_model *m);
/* OLMo-core init: every matrix ~ truncated normal(0, init_std, +-3 std), norm weights = 1. */
int olmo_model_init_weights(struct olmo_model *m, uint64_t seed);
/* The same initial weights one tensor at a time (a sharded model keeps only its pieces): each is generated into scratch
 * (room for the largest tensor) and handed to put (0, or -1 to stop with the error set). */
int olmo_model_init_each(const struct olmo_model *m, uint64_t seed, float *scratch,
                         int (*put)(void *ctx, const struct olmo_param *p, const float *w), void *ctx);
/* Refreshes the compute copy from the master weights (no-op without one). */
int olmo_model_sync_weights(struct olmo_model *m);
/* Weight w (a pointer into m->weights) as a GEMM operand: its compute copy where there is one, and that type. */
const void *olmo_model_weight(const struct olmo_model *m, const float *w);
enum olmo_float_type olmo_model_weight_type(const struct olmo_model *m);
/* Allocates activations for micro-batches of batch x seq_len (idempotent for the same shape), only
 * those the checkpointing mode keeps. */
int olmo_model_reserve(struct olmo_model *m, int batch, int seq_len);
/* Sets the checkpointing mode (default none) and interval (>= 1); call before olmo_model_reserve
 * (a change frees reserved activations, so the next reserve sizes them for the new mode). */
int olmo_model_set_checkpointing(struct olmo_model *m, enum olmo_act_ckpt mode, int every);
/* The type of the GEMM-operand activations it saves (see saved_type): OLMO_BF16 only on a backend whose
 * compute_dtype is bf16.  Call before olmo_model_reserve (a change frees reserved activations). */
int olmo_model_set_saved_type(struct olmo_model *m, enum olmo_float_type type);
/* Every large saved activation in bf16 (see saved_all_bf16): only on a backend whose compute_dtype is
 * bf16.  Call before olmo_model_reserve (a change frees reserved activations). */
int olmo_model_set_saved_all_bf16(struct olmo_model *m, bool on);
/* Whether layer l's activations are recomputed in the backward pass. */
bool olmo_model_layer_checkpointed(const struct olmo_model *m, int l);
/* Layer l's activation buffers: its own, and the shared recompute buffers for what it does not keep. */
struct olmo_layer_acts olmo_model_layer_acts(const struct olmo_model *m, int l);
/* The activation table resolved for the model's checkpointing mode and saved types (model/activations.h). */
void olmo_model_act_layout(const struct olmo_model *m, int batch, int seq_len, struct olmo_act_layout *lo);
/* Allocates the activations of layout lo (-1 with the error set: the caller frees what was made) and
 * frees them (model/activations.c). */
int olmo_model_alloc_acts(struct olmo_model *m, const struct olmo_act_layout *lo);
void olmo_model_free_acts(struct olmo_model *m);
/* One layer's forward (training) and backward pass, the per-block steps of olmo_model_forward and
 * olmo_model_backward (backward: m->dx holds the gradient w.r.t. the layer's output on entry and
 * w.r.t. its input on return; a checkpointed layer first recomputes what it did not keep, with the
 * same weights, so its result is bit-identical to a run without checkpointing). */
int olmo_model_block_forward(struct olmo_model *m, int l);
int olmo_model_block_backward(struct olmo_model *m, int l);
const struct olmo_param *olmo_model_find_param(const struct olmo_model *m, const char *name);

/* Forward pass over tokens [batch*seq_len] (host memory), through the final norm and, unless the loss
 * is chunked (m->logits_chunk), the logits of every row into m->logits; olmo_model_logits_rows reads
 * them either way.  doc_masking: attention does not cross EOS boundaries (the EOS closes its document). */
int olmo_model_forward(struct olmo_model *m, const int32_t *tokens, bool doc_masking);
/* Rows [row, row + n) of the last forward pass's logits, fp32 [n, V], copied to host memory (before
 * olmo_model_loss, which overwrites them): from m->logits, or, with a chunked loss, computed into it a
 * chunk at a time (the chunk of the loss's GEMM, the same values). */
int olmo_model_logits_rows(struct olmo_model *m, int row, int n, float *host);
/* The rows of the chunked loss's fp32 logits (tests: any chunk, to check that it changes nothing); 0:
 * the automatic choice.  Only where the backend has cross_entropy_bf16; re-reserves the activations. */
int olmo_model_set_logits_chunk(struct olmo_model *m, int rows);
/* Cross-entropy (+ z-loss) against targets [batch*seq_len] (host; <0 ignored).
 * Leaves the gradient of grad_scale * sum(ce + z_mult * lse^2) for olmo_model_backward: over m->logits
 * in fp32, or as bf16 in place (m->dlogits_bf16) where the backend has cross_entropy_bf16, or, chunked
 * (m->logits_chunk), as bf16 in m->dlogits, the logits computed and consumed a chunk of rows at a time
 * (the loss's sums and the gradient have the same bits as in one pass).
 * ce_sum and z_sum NULL (only where the backend has loss_sums): the sums stay in the backend's
 * accumulator, read once for all micro-batches with be->loss_sums. */
int olmo_model_loss(struct olmo_model *m, const int32_t *targets, float grad_scale, float z_mult,
                    double *ce_sum, double *z_sum);
/* Backpropagates from the gradient left in m->logits; accumulates into m->grads (or sets them: see
 * overwrite_grads).
 * These and the forward pass return 0, or -1 with the backend's error set. */
int olmo_model_backward(struct olmo_model *m);
/* The LM head's parts of the passes (model/head.c): forward from the final norm's input m->x_final,
 * backward (gb: the LM head gradient GEMM's beta) into m->dx. */
int olmo_model_head_forward(struct olmo_model *m);
int olmo_model_head_backward(struct olmo_model *m, float gb);

/* Layer `layer`'s attention shape for micro-batches of batch x seq_len. */
void olmo_model_attn_shape(const struct olmo_model *m, int layer, int batch, int seq_len, struct olmo_attn_shape *s);

/* One layer's forward pass, shared by training (olmo_model_forward) and KV-cache
 * generation (generate.c): shape->batch * shape->seq_len rows of a->x go to
 * `out` (which may alias a->x), through the other buffers of `a` (the backward
 * pass reads them in training; generation may alias them as long as each is
 * dead when it is next written: q_raw with att, k_raw with o, the rstd's with
 * each other; lse is unused there).  tmp: [rows, d_model] scratch.  RoPE:
 * row r is at table row r % shape->seq_len of rope_cos/rope_sin.
 *   cache NULL: causal attention over the rows themselves (doc_ids or NULL);
 *   cache set: the rotated keys and values go into the cache ring at
 *     positions pos0.., and the rows attend over it (batch 1). */
struct olmo_kv_cache_layer {
    float *k, *v;  /* [cap, kv_dim], position p at row p % cap */
    int pos0, cap; /* position of the first row; rows in the ring */
};
int olmo_layer_forward(const struct olmo_model *m, int layer, const struct olmo_layer_acts *a, float *out,
                        float *tmp, const float *rope_cos, const float *rope_sin, const struct olmo_attn_shape *shape,
                        const int32_t *doc_ids, const struct olmo_kv_cache_layer *cache);

/* RoPE cos/sin tables (host memory) as the forward pass uses them: [n_positions, head_dim/2] unscaled,
 * followed, with model.rope_scaling, by the same for the scaled (full-attention) layers:
 * olmo_rope_n_tables(c) tables in all. */
void olmo_rope_tables(float *cos_t, float *sin_t, int n_positions, int head_dim, const struct olmo_model_config *c);
int olmo_rope_n_tables(const struct olmo_model_config *c);
/* Where layer l's table starts in olmo_rope_tables' output of n_positions (in elements): the scaled one
 * for the full-attention layers with model.rope_scaling (YaRN applies to them), else the unscaled one. */
size_t olmo_rope_table_offset(const struct olmo_model_config *c, int layer, int n_positions, int head_dim);
/* YaRN's factor on cos and sin (1 without scaling). */
double olmo_rope_attention_factor(const struct olmo_model_config *c);

size_t olmo_model_count_params(const struct olmo_model_config *cfg, bool include_embeddings);
/* Training FLOPs per token (6 * matmul params + attention), for MFU. */
double olmo_model_flops_per_token(const struct olmo_model_config *cfg, int seq_len);

#endif
