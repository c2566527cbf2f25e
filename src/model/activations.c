/* The activation table (model/activations.h) and the model's activation
 * buffers allocated from it (olmo_model_reserve's storage, model/model.h). */
#include "model/activations.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "util/error.h"

/* name, columns (rows: the N tokens), part of the layer, how its type is chosen, where its fp32 values
 * live while the layer runs forward when it is kept as bf16 */
const struct olmo_act_layer_spec olmo_act_layer_specs[OLMO_ACT_LAYER_SLOTS] = {
    [OLMO_ACT_X] = {"x", OLMO_DIM_D, OLMO_ACT_INPUT, OLMO_ACT_OPERAND, OLMO_HOME_RESID},
    [OLMO_ACT_Q_RAW] = {"q_raw", OLMO_DIM_Q, OLMO_ACT_ATTN, OLMO_ACT_LARGE, OLMO_HOME_SHARED},
    [OLMO_ACT_K_RAW] = {"k_raw", OLMO_DIM_K, OLMO_ACT_ATTN, OLMO_ACT_LARGE, OLMO_HOME_SHARED},
    [OLMO_ACT_Q] = {"q", OLMO_DIM_Q, OLMO_ACT_ATTN, OLMO_ACT_LARGE, OLMO_HOME_SHARED},
    [OLMO_ACT_K] = {"k", OLMO_DIM_K, OLMO_ACT_ATTN, OLMO_ACT_LARGE, OLMO_HOME_SHARED},
    [OLMO_ACT_V] = {"v", OLMO_DIM_K, OLMO_ACT_ATTN, OLMO_ACT_LARGE, OLMO_HOME_SHARED},
    [OLMO_ACT_RSTD_Q] = {"rstd_q", OLMO_DIM_1, OLMO_ACT_ATTN, OLMO_ACT_STAT, OLMO_HOME_SHARED},
    [OLMO_ACT_RSTD_K] = {"rstd_k", OLMO_DIM_1, OLMO_ACT_ATTN, OLMO_ACT_STAT, OLMO_HOME_SHARED},
    [OLMO_ACT_ATT] = {"att", OLMO_DIM_Q, OLMO_ACT_ATTN, OLMO_ACT_LARGE, OLMO_HOME_SHARED},
    [OLMO_ACT_LSE] = {"lse", OLMO_DIM_H, OLMO_ACT_ATTN, OLMO_ACT_STAT, OLMO_HOME_SHARED},
    [OLMO_ACT_O] = {"o", OLMO_DIM_D, OLMO_ACT_ATTN, OLMO_ACT_LARGE, OLMO_HOME_SHARED},
    [OLMO_ACT_RSTD_O] = {"rstd_o", OLMO_DIM_1, OLMO_ACT_ATTN, OLMO_ACT_STAT, OLMO_HOME_SHARED},
    [OLMO_ACT_H] = {"h", OLMO_DIM_D, OLMO_ACT_ATTN, OLMO_ACT_OPERAND, OLMO_HOME_DH},
    [OLMO_ACT_G] = {"g", OLMO_DIM_F, OLMO_ACT_MLP, OLMO_ACT_LARGE, OLMO_HOME_SHARED},
    [OLMO_ACT_U] = {"u", OLMO_DIM_F, OLMO_ACT_MLP, OLMO_ACT_LARGE, OLMO_HOME_SHARED},
    [OLMO_ACT_S] = {"s", OLMO_DIM_F, OLMO_ACT_MLP, OLMO_ACT_OPERAND, OLMO_HOME_DS},
    [OLMO_ACT_M] = {"m", OLMO_DIM_D, OLMO_ACT_ATTN, OLMO_ACT_LARGE, OLMO_HOME_SHARED},
    [OLMO_ACT_RSTD_M] = {"rstd_m", OLMO_DIM_1, OLMO_ACT_ATTN, OLMO_ACT_STAT, OLMO_HOME_SHARED},
};

/* name, rows, columns, group */
const struct olmo_act_model_spec olmo_act_model_specs[OLMO_ACT_MODEL_SLOTS] = {
    [OLMO_ACT_RESID] = {"resid", OLMO_DIM_N, OLMO_DIM_D, OLMO_ACT_SAVED},
    [OLMO_ACT_X_FINAL] = {"x_final", OLMO_DIM_N, OLMO_DIM_D, OLMO_ACT_SAVED},
    [OLMO_ACT_XN_FINAL] = {"xn_final", OLMO_DIM_N, OLMO_DIM_D, OLMO_ACT_SAVED},
    [OLMO_ACT_RSTD_FINAL] = {"rstd_final", OLMO_DIM_N, OLMO_DIM_1, OLMO_ACT_SAVED},
    [OLMO_ACT_ROUND16] = {"round16", OLMO_DIM_N, OLMO_DIM_MAX_DQF, OLMO_ACT_WORK},
    [OLMO_ACT_LOGITS] = {"logits", OLMO_DIM_LOGIT_ROWS, OLMO_DIM_V, OLMO_ACT_OUTPUT},
    [OLMO_ACT_DLOGITS] = {"dlogits", OLMO_DIM_N, OLMO_DIM_V, OLMO_ACT_OUTPUT},
    [OLMO_ACT_ROPE_COS] = {"rope_cos", OLMO_DIM_ROPE_T, OLMO_DIM_HALF_HD, OLMO_ACT_WORK},
    [OLMO_ACT_ROPE_SIN] = {"rope_sin", OLMO_DIM_ROPE_T, OLMO_DIM_HALF_HD, OLMO_ACT_WORK},
    [OLMO_ACT_DX] = {"dx", OLMO_DIM_N, OLMO_DIM_D, OLMO_ACT_WORK},
    [OLMO_ACT_DH] = {"dh", OLMO_DIM_N, OLMO_DIM_D, OLMO_ACT_WORK},
    [OLMO_ACT_DTMP] = {"dtmp", OLMO_DIM_N, OLMO_DIM_D, OLMO_ACT_WORK},
    [OLMO_ACT_DQ] = {"dq", OLMO_DIM_N, OLMO_DIM_Q, OLMO_ACT_WORK},
    [OLMO_ACT_DK] = {"dk", OLMO_DIM_N, OLMO_DIM_K, OLMO_ACT_WORK},
    [OLMO_ACT_DV] = {"dv", OLMO_DIM_N, OLMO_DIM_K, OLMO_ACT_WORK},
    [OLMO_ACT_DATT] = {"datt", OLMO_DIM_N, OLMO_DIM_Q, OLMO_ACT_WORK},
    [OLMO_ACT_DG] = {"dg", OLMO_DIM_N, OLMO_DIM_F, OLMO_ACT_WORK},
    [OLMO_ACT_DU] = {"du", OLMO_DIM_N, OLMO_DIM_F, OLMO_ACT_WORK},
    [OLMO_ACT_DS] = {"ds", OLMO_DIM_N, OLMO_DIM_F, OLMO_ACT_WORK},
    [OLMO_ACT_TOKENS] = {"tokens", OLMO_DIM_N, OLMO_DIM_1, OLMO_ACT_WORK},
    [OLMO_ACT_TARGETS] = {"targets", OLMO_DIM_N, OLMO_DIM_1, OLMO_ACT_WORK},
    [OLMO_ACT_DOC_IDS] = {"doc_ids", OLMO_DIM_N, OLMO_DIM_1, OLMO_ACT_WORK},
};

/* struct olmo_layer_acts's named fields are its slot array, in the table's order */
#define SLOT_AT(field, slot) \
    _Static_assert(offsetof(struct olmo_layer_acts, field) == (slot) * sizeof(float *), #field " out of order");
SLOT_AT(x, OLMO_ACT_X)
SLOT_AT(q_raw, OLMO_ACT_Q_RAW)
SLOT_AT(k_raw, OLMO_ACT_K_RAW)
SLOT_AT(q, OLMO_ACT_Q)
SLOT_AT(k, OLMO_ACT_K)
SLOT_AT(v, OLMO_ACT_V)
SLOT_AT(rstd_q, OLMO_ACT_RSTD_Q)
SLOT_AT(rstd_k, OLMO_ACT_RSTD_K)
SLOT_AT(att, OLMO_ACT_ATT)
SLOT_AT(lse, OLMO_ACT_LSE)
SLOT_AT(o, OLMO_ACT_O)
SLOT_AT(rstd_o, OLMO_ACT_RSTD_O)
SLOT_AT(h, OLMO_ACT_H)
SLOT_AT(g, OLMO_ACT_G)
SLOT_AT(u, OLMO_ACT_U)
SLOT_AT(s, OLMO_ACT_S)
SLOT_AT(m, OLMO_ACT_M)
SLOT_AT(rstd_m, OLMO_ACT_RSTD_M)
#undef SLOT_AT

bool olmo_act_checkpointed(const struct olmo_act_layout *lo, int l) {
    return l >= 0 && lo->mode != OLMO_ACT_CKPT_NONE && lo->every > 0 && l % lo->every == 0;
}

int olmo_act_logits_chunk(int vocab, int batch, int seq_len) {
    const double n = (double)batch * seq_len, row = 4.0 * (vocab > 0 ? vocab : 1);
    double rows = floor(OLMO_LOGITS_CHUNK_BYTES / row / 64) * 64;
    if (rows < 64) rows = 64;
    return 2 * rows <= n ? (int)rows : 0;
}

void olmo_act_layout_init(struct olmo_act_layout *lo, const struct olmo_model_config *cfg, int batch, int seq_len,
                          enum olmo_act_ckpt mode, int every, bool bf16, bool all16, int logits_chunk) {
    memset(lo, 0, sizeof *lo);
    const size_t hd = (size_t)(cfg->d_model / cfg->n_heads), D = (size_t)cfg->d_model, Q = (size_t)cfg->n_heads * hd,
                 F = (size_t)cfg->mlp_hidden;
    size_t *d = lo->dim;
    d[OLMO_DIM_1] = 1;
    d[OLMO_DIM_N] = (size_t)batch * (size_t)seq_len;
    d[OLMO_DIM_T] = (size_t)seq_len;
    d[OLMO_DIM_ROPE_T] = (size_t)seq_len * (size_t)olmo_rope_n_tables(cfg);
    d[OLMO_DIM_D] = D;
    d[OLMO_DIM_Q] = Q;
    d[OLMO_DIM_K] = (size_t)cfg->n_kv_heads * hd;
    d[OLMO_DIM_F] = F;
    d[OLMO_DIM_V] = (size_t)cfg->vocab_size;
    d[OLMO_DIM_H] = (size_t)cfg->n_heads;
    d[OLMO_DIM_HALF_HD] = hd / 2;
    d[OLMO_DIM_MAX_DQF] = F > Q ? (F > D ? F : D) : (Q > D ? Q : D);
    lo->logits_chunk = logits_chunk > 0 ? logits_chunk : 0;
    d[OLMO_DIM_LOGIT_ROWS] = lo->logits_chunk ? (size_t)lo->logits_chunk : d[OLMO_DIM_N];
    lo->n_layers = cfg->n_layers;
    lo->mode = mode;
    lo->every = every < 1 ? 1 : every;
    lo->all16 = all16;
    lo->bf16 = bf16 || all16;
    for (int l = 0; l < lo->n_layers; l++) {
        lo->any_checkpointed |= olmo_act_checkpointed(lo, l);
        lo->any_x16 |= olmo_act_layer(lo, l, OLMO_ACT_X).dtype == OLMO_BF16;
    }
}

struct olmo_act_alloc olmo_act_layer(const struct olmo_act_layout *lo, int l, enum olmo_act_slot slot) {
    const struct olmo_act_layer_spec *s = &olmo_act_layer_specs[slot];
    struct olmo_act_alloc a = {.dtype = OLMO_F32, .numel = lo->dim[OLMO_DIM_N] * lo->dim[s->cols]};
    const bool block = lo->mode == OLMO_ACT_CKPT_BLOCK;
    if (l == OLMO_ACT_SHARED) { /* fp32 working buffers, made only where some layer uses them */
        if (lo->any_checkpointed || lo->all16)
            a.keep = s->part == OLMO_ACT_MLP || (s->part == OLMO_ACT_ATTN && (block || lo->all16));
        return a;
    }
    const bool ck = olmo_act_checkpointed(lo, l);
    a.keep = s->part == OLMO_ACT_INPUT || (s->part == OLMO_ACT_ATTN ? !(ck && block) : !ck);
    /* a block-checkpointed layer reruns its forward from its input: fp32 there */
    if ((s->kind == OLMO_ACT_OPERAND && lo->bf16 && !(ck && block)) || (s->kind == OLMO_ACT_LARGE && lo->all16))
        a.dtype = OLMO_BF16;
    return a;
}

struct olmo_act_alloc olmo_act_model(const struct olmo_act_layout *lo, enum olmo_act_model_slot slot) {
    const struct olmo_act_model_spec *s = &olmo_act_model_specs[slot];
    struct olmo_act_alloc a = {.keep = true, .dtype = OLMO_F32, .numel = lo->dim[s->rows] * lo->dim[s->cols]};
    switch (slot) {
    case OLMO_ACT_RESID: a.keep = lo->any_x16; break;
    case OLMO_ACT_XN_FINAL: a.dtype = lo->bf16 ? OLMO_BF16 : OLMO_F32; break;
    case OLMO_ACT_DG:
    case OLMO_ACT_DU: a.dtype = lo->grads16 ? OLMO_BF16 : OLMO_F32; break;
    case OLMO_ACT_DLOGITS:
        a.keep = lo->logits_chunk > 0;
        a.dtype = OLMO_BF16;
        break;
    case OLMO_ACT_ROUND16:
        a.keep = lo->all16 && lo->any_checkpointed;
        a.dtype = OLMO_BF16;
        break;
    case OLMO_ACT_TOKENS:
    case OLMO_ACT_TARGETS:
    case OLMO_ACT_DOC_IDS: a.dtype = OLMO_I32; break;
    default: break;
    }
    return a;
}

double olmo_act_group_bytes(const struct olmo_act_layout *lo, enum olmo_act_group group,
                            double (*round)(const void *ctx, double bytes), const void *ctx) {
    double total = 0;
#define ADD(a)                                                                                      \
    do {                                                                                            \
        const struct olmo_act_alloc a_ = (a);                                                       \
        const double bytes_ = (double)a_.numel * (double)olmo_float_type_size(a_.dtype);            \
        if (a_.keep) total += round ? round(ctx, bytes_) : bytes_;                                  \
    } while (0)
    if (group == OLMO_ACT_SAVED)
        for (int l = OLMO_ACT_SHARED; l < lo->n_layers; l++)
            for (int i = 0; i < OLMO_ACT_LAYER_SLOTS; i++) ADD(olmo_act_layer(lo, l, (enum olmo_act_slot)i));
    for (int i = 0; i < OLMO_ACT_MODEL_SLOTS; i++)
        if (olmo_act_model_specs[i].group == group) ADD(olmo_act_model(lo, (enum olmo_act_model_slot)i));
#undef ADD
    return total;
}

/* ---- the model's buffers ---- */

/* The model's pointer for each model-level tensor (a view of m->bufs, set by bind_model_views). */
static void **model_view(struct olmo_model *m, enum olmo_act_model_slot slot) {
    switch (slot) {
    case OLMO_ACT_RESID: return (void **)&m->resid;
    case OLMO_ACT_X_FINAL: return (void **)&m->x_final;
    case OLMO_ACT_XN_FINAL: return NULL; /* typed: m->bufs[OLMO_ACT_XN_FINAL] */
    case OLMO_ACT_RSTD_FINAL: return (void **)&m->rstd_final;
    case OLMO_ACT_ROUND16: return &m->round16;
    case OLMO_ACT_LOGITS: return (void **)&m->logits;
    case OLMO_ACT_DLOGITS: return &m->dlogits;
    case OLMO_ACT_ROPE_COS: return (void **)&m->rope_cos;
    case OLMO_ACT_ROPE_SIN: return (void **)&m->rope_sin;
    case OLMO_ACT_DX: return (void **)&m->dx;
    case OLMO_ACT_DH: return (void **)&m->dh;
    case OLMO_ACT_DTMP: return (void **)&m->dtmp;
    case OLMO_ACT_DQ: return (void **)&m->dq;
    case OLMO_ACT_DK: return (void **)&m->dk;
    case OLMO_ACT_DV: return (void **)&m->dv;
    case OLMO_ACT_DATT: return (void **)&m->datt;
    case OLMO_ACT_DG: return (void **)&m->dg;
    case OLMO_ACT_DU: return (void **)&m->du;
    case OLMO_ACT_DS: return (void **)&m->ds;
    case OLMO_ACT_TOKENS: return (void **)&m->tokens;
    case OLMO_ACT_TARGETS: return (void **)&m->targets;
    case OLMO_ACT_DOC_IDS: return (void **)&m->doc_ids;
    default: return NULL;
    }
}

void olmo_model_free_acts(struct olmo_model *m) {
    const struct olmo_backend *be = m->be;
    if (m->saved) {
        for (int l = 0; l < m->cfg.n_layers; l++)
            for (int i = 0; i < OLMO_ACT_LAYER_SLOTS; i++) olmo_buf_free(be, &m->saved[l][i]);
        free(m->saved);
        m->saved = NULL;
    }
    for (int i = 0; i < OLMO_ACT_LAYER_SLOTS; i++) olmo_buf_free(be, &m->shared[i]);
    for (int i = 0; i < OLMO_ACT_MODEL_SLOTS; i++) {
        olmo_buf_free(be, &m->bufs[i]);
        void **view = model_view(m, (enum olmo_act_model_slot)i);
        if (view) *view = NULL;
    }
    m->batch = m->seq_len = 0;
    m->logits_chunk = 0;
    m->logits_row0 = -1;
    m->act_bytes = 0;
}

static int alloc_one(const struct olmo_backend *be, struct olmo_buf *b, struct olmo_act_alloc a,
                     enum olmo_buf_role role) {
    return a.keep ? olmo_buf_alloc(be, b, a.numel, a.dtype, role) : 0;
}

int olmo_model_alloc_acts(struct olmo_model *m, const struct olmo_act_layout *lo) {
    const struct olmo_backend *be = m->be;
    if (!(m->saved = olmo_calloc((size_t)m->cfg.n_layers, sizeof *m->saved, "activation table"))) return -1;
    for (int l = 0; l < m->cfg.n_layers; l++)
        for (int i = 0; i < OLMO_ACT_LAYER_SLOTS; i++)
            if (alloc_one(be, &m->saved[l][i], olmo_act_layer(lo, l, (enum olmo_act_slot)i), OLMO_BUF_ACTIVATION))
                return -1;
    for (int i = 0; i < OLMO_ACT_LAYER_SLOTS; i++)
        if (alloc_one(be, &m->shared[i], olmo_act_layer(lo, OLMO_ACT_SHARED, (enum olmo_act_slot)i), OLMO_BUF_SCRATCH))
            return -1;
    for (int i = 0; i < OLMO_ACT_MODEL_SLOTS; i++) {
        const enum olmo_act_model_slot slot = (enum olmo_act_model_slot)i;
        const enum olmo_buf_role role =
            olmo_act_model_specs[i].group == OLMO_ACT_SAVED ? OLMO_BUF_ACTIVATION : OLMO_BUF_SCRATCH;
        if (alloc_one(be, &m->bufs[i], olmo_act_model(lo, slot), role)) return -1;
        void **view = model_view(m, slot);
        if (view) *view = m->bufs[i].data;
    }
    return 0;
}

struct olmo_layer_acts olmo_model_layer_acts(const struct olmo_model *m, int l) {
    struct olmo_layer_acts a = {.saved = m->saved[l]};
    for (int i = 0; i < OLMO_ACT_LAYER_SLOTS; i++) {
        const struct olmo_buf *b = &m->saved[l][i];
        if (!b->data) { /* not kept: the recompute set */
            a.slot[i] = m->shared[i].data;
        } else if (b->dtype == OLMO_F32) {
            a.slot[i] = b->data;
        } else { /* kept as bf16: computed in an fp32 working buffer */
            switch (olmo_act_layer_specs[i].home) {
            case OLMO_HOME_RESID: a.slot[i] = m->resid; break;
            case OLMO_HOME_DH: a.slot[i] = m->dh; break;     /* free during the forward pass */
            case OLMO_HOME_DS: a.slot[i] = m->ds; break;     /* likewise */
            case OLMO_HOME_SHARED: a.slot[i] = m->shared[i].data; break;
            }
        }
    }
    return a;
}
