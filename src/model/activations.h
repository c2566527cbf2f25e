/* Every activation the model keeps or works in, described once (as llm.c's
 * TensorSpec): each tensor's shape, element type and which checkpointing
 * modes keep it.  olmo_model_reserve allocates from this table and the memory
 * plan (train/memplan.c) sums it, so the two agree by construction; the
 * allocated buffers are typed (struct olmo_buf), so a backend keeps an
 * activation in bf16 without a second set of pointers. */
#ifndef OLMOC_ACTIVATIONS_H
#define OLMOC_ACTIVATIONS_H

#include <stdbool.h>
#include <stddef.h>

#include "backend/backend.h"
#include "config/config.h"

/* A layer's tensors, in the order of struct olmo_layer_acts's fields (model.h). */
enum olmo_act_slot {
    OLMO_ACT_X,      /* the layer's input (residual stream) [N, D] */
    OLMO_ACT_Q_RAW,  /* q projection before QK-norm [N, Q] */
    OLMO_ACT_K_RAW,  /* k projection before QK-norm [N, K] */
    OLMO_ACT_Q,      /* normed and rotated q [N, Q] */
    OLMO_ACT_K,      /* normed and rotated k [N, K] */
    OLMO_ACT_V,      /* v [N, K] */
    OLMO_ACT_RSTD_Q, /* q norm statistics [N] */
    OLMO_ACT_RSTD_K, /* k norm statistics [N] */
    OLMO_ACT_ATT,    /* attention output [N, Q] */
    OLMO_ACT_LSE,    /* attention log-sum-exp [B, H, T] */
    OLMO_ACT_O,      /* o_proj output [N, D] */
    OLMO_ACT_RSTD_O, /* its norm statistics [N] */
    OLMO_ACT_H,      /* x + norm(o) [N, D] */
    OLMO_ACT_G,      /* gate [N, F] */
    OLMO_ACT_U,      /* up [N, F] */
    OLMO_ACT_S,      /* silu(gate) * up [N, F] */
    OLMO_ACT_M,      /* down_proj output [N, D] */
    OLMO_ACT_RSTD_M, /* its norm statistics [N] */
    OLMO_ACT_LAYER_SLOTS
};

/* The model's tensors outside the layers, in struct olmo_model's order. */
enum olmo_act_model_slot {
    OLMO_ACT_RESID,      /* the fp32 input of the layers that save x as bf16 [N, D] */
    OLMO_ACT_X_FINAL,    /* the final norm's input [N, D] */
    OLMO_ACT_XN_FINAL,   /* the final norm's output [N, D] (the LM head's weight-gradient operand) */
    OLMO_ACT_RSTD_FINAL, /* its statistics [N] */
    OLMO_ACT_ROUND16,    /* bf16 rounding of what the backward recomputes [N, max(D, Q, F)] */
    OLMO_ACT_LOGITS,     /* fp32 [N, V], overwritten by their gradient; a chunk of them [C, V] with a chunked loss */
    OLMO_ACT_DLOGITS,    /* a chunked loss's gradient of the logits, bf16 [N, V] (logits_chunk > 0 only) */
    OLMO_ACT_ROPE_COS,   /* [T, head_dim / 2] */
    OLMO_ACT_ROPE_SIN,
    OLMO_ACT_DX,         /* the backward's activation gradients and scratch */
    OLMO_ACT_DH,
    OLMO_ACT_DTMP,
    OLMO_ACT_DQ,
    OLMO_ACT_DK,
    OLMO_ACT_DV,
    OLMO_ACT_DATT,
    OLMO_ACT_DG,         /* bf16 where the layout says grads16 */
    OLMO_ACT_DU,
    OLMO_ACT_DS,
    OLMO_ACT_TOKENS,     /* int32 [N] */
    OLMO_ACT_TARGETS,
    OLMO_ACT_DOC_IDS,
    OLMO_ACT_MODEL_SLOTS
};

/* What a tensor's bytes count as (the memory plan's lines). */
enum olmo_act_group {
    OLMO_ACT_SAVED,  /* saved for the backward pass, and the recompute set */
    OLMO_ACT_OUTPUT, /* the logits (and a chunked loss's bf16 gradient of them) */
    OLMO_ACT_WORK    /* the backward's work buffers, RoPE tables, ids */
};

/* How a layer tensor's element type is chosen. */
enum olmo_act_kind {
    OLMO_ACT_OPERAND, /* read by the backward only as a GEMM operand: bf16 where the GEMMs multiply in bf16 */
    OLMO_ACT_LARGE,   /* bf16 with train.saved_activations: bf16, fp32 otherwise */
    OLMO_ACT_STAT     /* norm statistics, log-sum-exp: always fp32 */
};

/* Which part of the layer computes it: what each checkpointing mode drops. */
enum olmo_act_part {
    OLMO_ACT_INPUT, /* kept by every layer */
    OLMO_ACT_ATTN,  /* dropped by a block-checkpointed layer */
    OLMO_ACT_MLP    /* dropped by any checkpointed layer */
};

/* Where an activation kept as bf16 is computed in fp32 while its layer runs forward. */
enum olmo_act_home { OLMO_HOME_SHARED, OLMO_HOME_RESID, OLMO_HOME_DH, OLMO_HOME_DS };

/* The sizes a shape is built from. */
enum olmo_act_dim {
    OLMO_DIM_1,
    OLMO_DIM_N,       /* tokens of the micro-batch (batch x seq_len) */
    OLMO_DIM_T,       /* seq_len */
    OLMO_DIM_ROPE_T,  /* seq_len x the RoPE tables (2 with model.rope_scaling: unscaled and scaled) */
    OLMO_DIM_D,       /* d_model */
    OLMO_DIM_Q,       /* n_heads x head_dim */
    OLMO_DIM_K,       /* n_kv_heads x head_dim */
    OLMO_DIM_F,       /* mlp_hidden */
    OLMO_DIM_V,       /* vocab_size */
    OLMO_DIM_H,       /* n_heads */
    OLMO_DIM_HALF_HD, /* head_dim / 2 */
    OLMO_DIM_MAX_DQF, /* max(D, Q, F) */
    OLMO_DIM_LOGIT_ROWS, /* rows of the fp32 logits: N, or a chunked loss's chunk */
    OLMO_DIM_COUNT
};

struct olmo_act_layer_spec {
    const char *name;
    enum olmo_act_dim cols; /* rows are the micro-batch's N tokens */
    enum olmo_act_part part;
    enum olmo_act_kind kind;
    enum olmo_act_home home;
};
extern const struct olmo_act_layer_spec olmo_act_layer_specs[OLMO_ACT_LAYER_SLOTS];

struct olmo_act_model_spec {
    const char *name;
    enum olmo_act_dim rows, cols;
    enum olmo_act_group group;
};
extern const struct olmo_act_model_spec olmo_act_model_specs[OLMO_ACT_MODEL_SLOTS];

/* The table resolved for one model, micro-batch shape and policy. */
struct olmo_act_layout {
    size_t dim[OLMO_DIM_COUNT];
    int n_layers;
    enum olmo_act_ckpt mode;
    int every;
    bool bf16;  /* OPERAND tensors (and the final norm's output) in bf16 */
    bool all16; /* LARGE tensors in bf16 too (implies bf16) */
    /* dg and du in bf16: the backend writes them so (swiglu_bwd_bf16), as its GEMMs read them; set by
     * the caller after olmo_act_layout_init (false there) */
    bool grads16;
    bool any_checkpointed, any_x16;
    int logits_chunk; /* rows of a chunked loss's fp32 logits; 0: the logits of all N rows */
};

/* One tensor of the layout: kept (allocated) or not, its element type and element count. */
struct olmo_act_alloc {
    bool keep;
    enum olmo_float_type dtype;
    size_t numel;
};

/* The layer index of the recompute set: one set, shared by the checkpointed layers, holding what they
 * do not keep (and, with all16, the fp32 working copies of what the layers keep in bf16). */
#define OLMO_ACT_SHARED (-1)

void olmo_act_layout_init(struct olmo_act_layout *lo, const struct olmo_model_config *cfg, int batch, int seq_len,
                          enum olmo_act_ckpt mode, int every, bool bf16, bool all16, int logits_chunk);

/* The chunked loss (a backend with cross_entropy_bf16, model.h: olmo_model_loss): the logits of
 * logits_chunk rows at a time in fp32, their bf16 gradient for all N rows.  The fp32 chunk stays within
 * OLMO_LOGITS_CHUNK_BYTES: the largest multiple of 64 rows (the GEMM's row tiles) that fits, at least 64;
 * 0 (all N rows' fp32 logits, the gradient in place as bf16) where that holds less, i.e. unless two chunks
 * fit in the micro-batch (4 C V + 2 N V bytes against 4 N V). */
#define OLMO_LOGITS_CHUNK_BYTES (256.0 * 1024 * 1024)
int olmo_act_logits_chunk(int vocab, int batch, int seq_len);
/* Whether layer l is checkpointed (recomputes in its backward what it did not keep). */
bool olmo_act_checkpointed(const struct olmo_act_layout *lo, int l);
/* Layer l's (or OLMO_ACT_SHARED's) tensor `slot`. */
struct olmo_act_alloc olmo_act_layer(const struct olmo_act_layout *lo, int l, enum olmo_act_slot slot);
struct olmo_act_alloc olmo_act_model(const struct olmo_act_layout *lo, enum olmo_act_model_slot slot);
/* The sum over every kept tensor of `group` of round(bytes) (round NULL: the bytes themselves). */
double olmo_act_group_bytes(const struct olmo_act_layout *lo, enum olmo_act_group group,
                            double (*round)(const void *ctx, double bytes), const void *ctx);

#endif
