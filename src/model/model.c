#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"
#include "util/sysmem.h"
#include "util/rng.h"

/* A weight as a GEMM operand: two arguments, the pointer and its type (olmo_model_weight). */
#define WEIGHT(ptr) olmo_model_weight(m, (ptr)), olmo_model_weight_type(m)

/* A backend op's status: return -1 (its error stays set) when it failed. */
#define TRY(call)                        \
    do {                                 \
        if ((call) != 0) return -1;      \
    } while (0)

static void add_param(struct olmo_model *m, const char *name, int rows, int cols, bool is_embedding) {
    struct olmo_param *p = &m->params[m->n_tensors++];
    snprintf(p->name, sizeof p->name, "%s", name);
    p->rows = rows;
    p->cols = cols;
    p->numel = (size_t)rows * cols;
    p->offset = m->n_floats;
    p->is_embedding = is_embedding;
    m->n_floats += p->numel;
}

/* Declares every tensor in Hugging Face order; returns the per-layer tensor count. */
static void declare_params(struct olmo_model *m) {
    const struct olmo_model_config *c = &m->cfg;
    char name[96];
    add_param(m, "model.embed_tokens.weight", c->vocab_size, c->d_model, true);
    for (int l = 0; l < c->n_layers; l++) {
#define LAYER(suffix, r, cl)                                        \
    snprintf(name, sizeof name, "model.layers.%d.%s", l, suffix); \
    add_param(m, name, r, cl, false)
        LAYER("self_attn.q_proj.weight", m->q_dim, c->d_model);
        LAYER("self_attn.k_proj.weight", m->kv_dim, c->d_model);
        LAYER("self_attn.v_proj.weight", m->kv_dim, c->d_model);
        LAYER("self_attn.o_proj.weight", c->d_model, m->q_dim);
        LAYER("self_attn.q_norm.weight", m->q_dim, 1);
        LAYER("self_attn.k_norm.weight", m->kv_dim, 1);
        LAYER("mlp.gate_proj.weight", c->mlp_hidden, c->d_model);
        LAYER("mlp.up_proj.weight", c->mlp_hidden, c->d_model);
        LAYER("mlp.down_proj.weight", c->d_model, c->mlp_hidden);
        LAYER("post_attention_layernorm.weight", c->d_model, 1);
        LAYER("post_feedforward_layernorm.weight", c->d_model, 1);
#undef LAYER
    }
    add_param(m, "model.norm.weight", c->d_model, 1, false);
    add_param(m, "lm_head.weight", c->vocab_size, c->d_model, false);
}

enum { TENSORS_PER_LAYER = 11 };

static void bind_tensors(struct olmo_model *m, float *base, struct olmo_layer_tensors *lt, float **embed,
                         float **final_norm, float **lm_head) {
    const struct olmo_param *p = m->params;
    *embed = base + p[0].offset;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const struct olmo_param *q = p + 1 + (size_t)l * TENSORS_PER_LAYER;
        struct olmo_layer_tensors *t = &lt[l];
        t->wq = base + q[0].offset;
        t->wk = base + q[1].offset;
        t->wv = base + q[2].offset;
        t->wo = base + q[3].offset;
        t->q_norm = base + q[4].offset;
        t->k_norm = base + q[5].offset;
        t->gate = base + q[6].offset;
        t->up = base + q[7].offset;
        t->down = base + q[8].offset;
        t->attn_norm = base + q[9].offset;
        t->ff_norm = base + q[10].offset;
    }
    *final_norm = base + p[m->n_tensors - 2].offset;
    *lm_head = base + p[m->n_tensors - 1].offset;
}

void olmo_model_attn_shape(const struct olmo_model *m, int layer, int batch, int seq_len, struct olmo_attn_shape *s) {
    s->batch = batch;
    s->seq_len = seq_len;
    s->n_heads = m->cfg.n_heads;
    s->n_kv_heads = m->cfg.n_kv_heads;
    s->head_dim = m->head_dim;
    s->window = olmo_layer_is_full_attention(&m->cfg, layer) ? 0 : m->cfg.sliding_window;
    s->scale = 1.0f / sqrtf((float)m->head_dim);
}

static void attn_shape(const struct olmo_model *m, int layer, struct olmo_attn_shape *s) {
    olmo_model_attn_shape(m, layer, m->batch, m->seq_len, s);
}

/* Every layer's attention on the backend (capability query): batch and seq_len 0 at creation. */
static int check_attention(const struct olmo_model *m) {
    for (int l = 0; l < m->cfg.n_layers; l++) {
        struct olmo_attn_shape shape;
        attn_shape(m, l, &shape);
        if (olmo_backend_check_attention(m->be, &shape)) return olmo_error_context("layer %d", l);
    }
    return 0;
}

static int create(struct olmo_model *m, const struct olmo_model_config *cfg, const struct olmo_backend *be,
                  bool sharded) {
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    m->be = be;
    m->ckpt_every = 1;
    m->logits_row0 = -1;
    m->saved_type = be->compute_dtype == OLMO_BF16 ? OLMO_BF16 : OLMO_F32;
    m->head_dim = cfg->d_model / cfg->n_heads;
    m->q_dim = cfg->n_heads * m->head_dim;
    m->kv_dim = cfg->n_kv_heads * m->head_dim;
    if (check_attention(m)) {
        memset(m, 0, sizeof *m);
        return -1;
    }
    int max_tensors = 3 + TENSORS_PER_LAYER * cfg->n_layers;
    m->params = olmo_calloc((size_t)max_tensors, sizeof *m->params, "parameter table");
    m->lw = olmo_calloc((size_t)cfg->n_layers, sizeof *m->lw, "layer table");
    m->lg = olmo_calloc((size_t)cfg->n_layers, sizeof *m->lg, "layer table");
    if (!m->params || !m->lw || !m->lg) return -1;
    declare_params(m);
    if (sharded) {
        m->sharded = true;
        return 0;
    }
    if (be->host_memory) { /* refuse what cannot fit before allocating (see util/sysmem.h) */
        const double need = (double)m->n_floats * (2 * sizeof(float) + olmo_float_type_size(be->compute_dtype) *
                                                                          (be->compute_dtype != OLMO_F32));
        const size_t limit = olmo_memory_limit();
        char a[32], b[32];
        if (need > (double)limit)
            return olmo_error("the model's %zu parameters need %s for fp32 weights and gradients alone, more than "
                              "this process may use (%s: physical memory or ulimit); reduce model.n_layers, "
                              "model.d_model, model.mlp_hidden or model.vocab_size",
                              m->n_floats, olmo_format_gib(a, sizeof a, need), olmo_format_gib(b, sizeof b, (double)limit));
    }
    m->weights = be->alloc(be, m->n_floats * sizeof(float));
    m->grads = be->alloc(be, m->n_floats * sizeof(float));
    if (!m->weights || !m->grads) return olmo_error_context("model parameters (%zu floats)", m->n_floats);
    /* a backend that multiplies in bf16 gets a bf16 compute copy of the weights (olmo_model_sync_weights) */
    if (be->compute_dtype != OLMO_F32 &&
        olmo_buf_alloc(be, &m->compute, m->n_floats, be->compute_dtype, OLMO_BUF_COMPUTE_COPY))
        return olmo_error_context("compute copy of the weights (%zu elements)", m->n_floats);
    bind_tensors(m, m->weights, m->lw, &m->embed, &m->final_norm, &m->lm_head);
    bind_tensors(m, m->grads, m->lg, &m->d_embed, &m->d_final_norm, &m->d_lm_head);
    return 0;
}

int olmo_model_create(struct olmo_model *m, const struct olmo_model_config *cfg, const struct olmo_backend *be) {
    if (create(m, cfg, be, false) == 0) return 0;
    olmo_model_destroy(m); /* whatever a refused or failed creation had allocated */
    return -1;
}

int olmo_model_create_sharded(struct olmo_model *m, const struct olmo_model_config *cfg,
                              const struct olmo_backend *be) {
    if (create(m, cfg, be, true) == 0) return 0;
    olmo_model_destroy(m);
    return -1;
}

void olmo_model_layer_span(const struct olmo_model *m, int l, size_t *offset, size_t *numel) {
    const struct olmo_param *q = m->params + 1 + (size_t)l * TENSORS_PER_LAYER;
    *offset = q[0].offset;
    *numel = q[TENSORS_PER_LAYER - 1].offset + q[TENSORS_PER_LAYER - 1].numel - q[0].offset;
}

void olmo_model_bind_layer(struct olmo_model *m, int l, float *w, float *g) {
    const struct olmo_param *q = m->params + 1 + (size_t)l * TENSORS_PER_LAYER;
    float **wt[TENSORS_PER_LAYER] = {&m->lw[l].wq,     &m->lw[l].wk,     &m->lw[l].wv,   &m->lw[l].wo,
                                     &m->lw[l].q_norm, &m->lw[l].k_norm, &m->lw[l].gate, &m->lw[l].up,
                                     &m->lw[l].down,   &m->lw[l].attn_norm, &m->lw[l].ff_norm};
    float **gt[TENSORS_PER_LAYER] = {&m->lg[l].wq,     &m->lg[l].wk,     &m->lg[l].wv,   &m->lg[l].wo,
                                     &m->lg[l].q_norm, &m->lg[l].k_norm, &m->lg[l].gate, &m->lg[l].up,
                                     &m->lg[l].down,   &m->lg[l].attn_norm, &m->lg[l].ff_norm};
    for (int i = 0; i < TENSORS_PER_LAYER; i++) {
        *wt[i] = w ? w + (q[i].offset - q[0].offset) : NULL;
        *gt[i] = g ? g + (q[i].offset - q[0].offset) : NULL;
    }
}

int olmo_model_set_checkpointing(struct olmo_model *m, enum olmo_act_ckpt mode, int every) {
    if (mode != OLMO_ACT_CKPT_NONE && mode != OLMO_ACT_CKPT_FEED_FORWARD && mode != OLMO_ACT_CKPT_BLOCK)
        return olmo_error("activation checkpointing mode %d is not none, feed_forward or block", (int)mode);
    if (every < 1) return olmo_error("activation checkpointing: block_every must be >= 1, got %d", every);
    if (mode == m->ckpt_mode && every == m->ckpt_every) return 0;
    olmo_model_free_acts(m); /* sized for the old mode: the next olmo_model_reserve allocates for the new one */
    m->ckpt_mode = mode;
    m->ckpt_every = every;
    return 0;
}

int olmo_model_set_saved_type(struct olmo_model *m, enum olmo_float_type type) {
    if (type != OLMO_F32 && type != OLMO_BF16) return olmo_error("saved activations: unknown type %d", (int)type);
    if (type == OLMO_BF16 && m->be->compute_dtype != OLMO_BF16)
        return olmo_error("saved activations in bf16 need a backend that multiplies in bf16 (cpu-bf16, cuda-bf16); "
                          "backend '%s' computes in fp32", m->be->name);
    if (type == m->saved_type) return 0;
    olmo_model_free_acts(m); /* the next olmo_model_reserve allocates them in the new type */
    m->saved_type = type;
    m->saved_all_bf16 = false; /* every saved activation in bf16 implies the GEMM operands in bf16 */
    return 0;
}

int olmo_model_set_saved_all_bf16(struct olmo_model *m, bool on) {
    if (on && m->be->compute_dtype != OLMO_BF16)
        return olmo_error("train.saved_activations: bf16 needs a backend that multiplies in bf16 (cpu-bf16, "
                          "cuda-bf16); backend '%s' computes in fp32",
                          m->be->name);
    if (on == m->saved_all_bf16) return 0;
    olmo_model_free_acts(m);
    m->saved_all_bf16 = on;
    if (on) m->saved_type = OLMO_BF16;
    return 0;
}

bool olmo_model_layer_checkpointed(const struct olmo_model *m, int l) {
    return m->ckpt_mode != OLMO_ACT_CKPT_NONE && m->ckpt_every > 0 && l % m->ckpt_every == 0;
}

void olmo_model_destroy(struct olmo_model *m) {
    if (!m->be) return;
    olmo_model_free_acts(m);
    olmo_buf_free(m->be, &m->compute);
    m->be->free(m->be, m->weights);
    m->be->free(m->be, m->grads);
    free(m->host_tokens);
    free(m->params);
    free(m->lw);
    free(m->lg);
    memset(m, 0, sizeof *m);
}

static void init_tensor(const struct olmo_model *m, struct olmo_rng *rng, const struct olmo_param *p, float *w) {
    if (p->cols == 1) {
        for (size_t j = 0; j < p->numel; j++) w[j] = 1.0f;
    } else {
        for (size_t j = 0; j < p->numel; j++) w[j] = (float)olmo_rng_trunc_normal(rng, m->cfg.init_std, 3.0);
    }
}

static int put_weights(void *ctx, const struct olmo_param *p, const float *w) {
    struct olmo_model *m = ctx;
    return m->be->to_device(m->be, m->weights + p->offset, w, p->numel * sizeof(float));
}

int olmo_model_init_weights(struct olmo_model *m, uint64_t seed) {
    if (m->sharded) return olmo_error("a sharded model is initialised through its shards (train/fsdp.h)");
    size_t largest = 1; /* one tensor at a time: no full-size host copy */
    for (int i = 0; i < m->n_tensors; i++)
        if (m->params[i].numel > largest) largest = m->params[i].numel;
    float *scratch = olmo_malloc(largest * sizeof(float), "initial weights (one tensor)");
    if (!scratch) return -1;
    const int rc = olmo_model_init_each(m, seed, scratch, put_weights, m);
    free(scratch);
    return rc ? rc : olmo_model_sync_weights(m);
}

int olmo_model_init_each(const struct olmo_model *m, uint64_t seed, float *scratch,
                         int (*put)(void *ctx, const struct olmo_param *p, const float *w), void *ctx) {
    struct olmo_rng rng;
    olmo_rng_seed(&rng, seed);
    for (int i = 0; i < m->n_tensors; i++) {
        init_tensor(m, &rng, &m->params[i], scratch);
        if (put(ctx, &m->params[i], scratch)) return -1;
    }
    return 0;
}

int olmo_model_sync_weights(struct olmo_model *m) {
    if (!m->compute.numel) return 0; /* also a sharded model: its units are converted as they are gathered */
    return m->be->convert(m->be, m->compute.data, m->compute.dtype, m->weights, OLMO_F32, m->n_floats);
}

const void *olmo_model_weight(const struct olmo_model *m, const float *w) {
    for (int i = 0; i < m->n_win; i++)
        if (w >= m->win[i].w && w < m->win[i].w + m->win[i].n)
            return m->win[i].compute ? (const void *)((const char *)m->win[i].compute +
                                                      (size_t)(w - m->win[i].w) *
                                                          olmo_float_type_size(m->be->compute_dtype))
                                     : (const void *)w;
    if (!m->compute.numel) return w;
    return (const char *)m->compute.data + (size_t)(w - m->weights) * olmo_float_type_size(m->compute.dtype);
}

enum olmo_float_type olmo_model_weight_type(const struct olmo_model *m) {
    if (m->sharded) return m->be->compute_dtype;
    return m->compute.numel ? m->compute.dtype : OLMO_F32;
}

const struct olmo_param *olmo_model_find_param(const struct olmo_model *m, const char *name) {
    for (int i = 0; i < m->n_tensors; i++)
        if (!strcmp(m->params[i].name, name)) return &m->params[i];
    return NULL;
}

/* RoPE's inverse frequencies in float32 as transformers computes them: the default
 * 1 / theta^(2i/d), or with YaRN (modeling_rope_utils._compute_yarn_parameters) a blend of those
 * (extrapolation) and the same divided by the factor (interpolation), ramping linearly over the
 * dimensions between the beta_fast and beta_slow rotation counts at the original context length. */
static float rope_inv_freq(int i, int head_dim, const struct olmo_model_config *c, bool scaled) {
    const double theta = c->rope_theta;
    double low = 0, high = 0;
    if (scaled) {
        /* find_correction_range with truncate (floor, ceil), clamped to [0, head_dim - 1] */
        const double d = head_dim, orig = c->rope_original_max_position_embeddings, pi = 3.14159265358979323846;
        low = floor(d * log(orig / (c->rope_beta_fast * 2 * pi)) / (2 * log(theta)));
        high = ceil(d * log(orig / (c->rope_beta_slow * 2 * pi)) / (2 * log(theta)));
        if (low < 0) low = 0;
        if (high > d - 1) high = d - 1;
        if (low == high) high += 0.001; /* linear_ramp_factor's guard against a zero span */
    }
    const float pos_freq = powf((float)theta, (float)(2 * i) / (float)head_dim);
    if (!scaled) return 1.0f / pos_freq;
    const float extrapolation = 1.0f / pos_freq, interpolation = 1.0f / ((float)c->rope_factor * pos_freq);
    float ramp = ((float)i - (float)low) / (float)(high - low);
    ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
    const float extrapolation_factor = 1.0f - ramp;
    return interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
}

double olmo_rope_attention_factor(const struct olmo_model_config *c) {
    if (c->rope_scaling != OLMO_ROPE_YARN) return 1.0;
    if (c->rope_attention_factor > 0) return c->rope_attention_factor;
    return c->rope_factor <= 1 ? 1.0 : 0.1 * log(c->rope_factor) + 1.0; /* get_mscale(factor) */
}

size_t olmo_rope_table_offset(const struct olmo_model_config *c, int layer, int n_positions, int head_dim) {
    const bool scaled = c->rope_scaling != OLMO_ROPE_NONE && olmo_layer_is_full_attention(c, layer);
    return scaled ? (size_t)n_positions * (size_t)(head_dim / 2) : 0;
}

int olmo_rope_n_tables(const struct olmo_model_config *c) { return c->rope_scaling != OLMO_ROPE_NONE ? 2 : 1; }

/* RoPE tables computed in float32 exactly as transformers/OLMo-core do (cos and sin of position x
 * inverse frequency, times YaRN's attention factor), so rotated values agree up to libm rounding. */
static void rope_table(float *cos_t, float *sin_t, int seq_len, int head_dim, const struct olmo_model_config *c,
                       bool scaled) {
    const int half = head_dim / 2;
    const float factor = scaled ? (float)olmo_rope_attention_factor(c) : 1.0f;
    for (int i = 0; i < half; i++) {
        const float inv_freq = rope_inv_freq(i, head_dim, c, scaled);
        for (int t = 0; t < seq_len; t++) {
            float angle = (float)t * inv_freq;
            cos_t[(size_t)t * half + i] = scaled ? cosf(angle) * factor : cosf(angle);
            sin_t[(size_t)t * half + i] = scaled ? sinf(angle) * factor : sinf(angle);
        }
    }
}

void olmo_rope_tables(float *cos_t, float *sin_t, int n_positions, int head_dim, const struct olmo_model_config *c) {
    const size_t table = (size_t)n_positions * (size_t)(head_dim / 2);
    for (int k = 0; k < olmo_rope_n_tables(c); k++)
        rope_table(cos_t + k * table, sin_t + k * table, n_positions, head_dim, c, k == 1);
}

/* Layer l's RoPE table within m->rope_cos / m->rope_sin. */
static size_t rope_offset(const struct olmo_model *m, int l) {
    return olmo_rope_table_offset(&m->cfg, l, m->seq_len, m->head_dim);
}

void olmo_model_act_layout(const struct olmo_model *m, int batch, int seq_len, struct olmo_act_layout *lo) {
    /* the chunked loss where the backend writes the logits' gradient as bf16 (model/head.c) */
    const int N = batch * seq_len, asked = m->logits_chunk_rows;
    const int chunk = !m->be->cross_entropy_bf16 ? 0
                      : asked > 0              ? (asked < N ? asked : N)
                                               : olmo_act_logits_chunk(m->cfg.vocab_size, batch, seq_len);
    olmo_act_layout_init(lo, &m->cfg, batch, seq_len, m->ckpt_mode, m->ckpt_every, m->saved_type == OLMO_BF16,
                         m->saved_all_bf16, chunk);
    lo->grads16 = m->be->compute_dtype == OLMO_BF16 && m->be->swiglu_bwd_bf16;
}

int olmo_model_reserve(struct olmo_model *m, int batch, int seq_len) {
    if (m->batch == batch && m->seq_len == seq_len) return 0;
    olmo_model_free_acts(m);
    m->batch = batch;
    m->seq_len = seq_len;
    if (check_attention(m)) {
        m->batch = m->seq_len = 0;
        return -1;
    }
    const struct olmo_backend *be = m->be;
    struct olmo_act_layout lo;
    olmo_model_act_layout(m, batch, seq_len, &lo);
    const double need = olmo_act_group_bytes(&lo, OLMO_ACT_SAVED, NULL, NULL) +
                        olmo_act_group_bytes(&lo, OLMO_ACT_OUTPUT, NULL, NULL) +
                        olmo_act_group_bytes(&lo, OLMO_ACT_WORK, NULL, NULL);
    const size_t limit = olmo_memory_limit();
    if (be->host_memory && need > (double)limit) { /* refuse what cannot fit before allocating */
        char a[32], b[32];
        m->batch = m->seq_len = 0;
        return olmo_error("activations for train.micro_batch %d x train.seq_len %d need %s, more than this "
                          "process may use (%s: physical memory or ulimit); reduce train.micro_batch or "
                          "train.seq_len (train.grad_accum keeps the batch)",
                          batch, seq_len, olmo_format_gib(a, sizeof a, need), olmo_format_gib(b, sizeof b, (double)limit));
    }
    if (olmo_model_alloc_acts(m, &lo)) {
        olmo_model_free_acts(m);
        return olmo_error_context("activations for batch %d x seq_len %d", batch, seq_len);
    }
    m->batch = batch;
    m->seq_len = seq_len;
    m->logits_chunk = lo.logits_chunk;
    m->act_bytes = (size_t)olmo_act_group_bytes(&lo, OLMO_ACT_SAVED, NULL, NULL);
    const size_t table = sizeof(float) * (size_t)seq_len * (size_t)(m->head_dim / 2) * olmo_rope_n_tables(&m->cfg);
    float *cos_t = malloc(table), *sin_t = malloc(table);
    if (!cos_t || !sin_t) {
        free(cos_t);
        free(sin_t);
        olmo_model_free_acts(m);
        return olmo_error("out of memory for RoPE tables");
    }
    olmo_rope_tables(cos_t, sin_t, seq_len, m->head_dim, &m->cfg);
    const int rc = be->to_device(be, m->rope_cos, cos_t, table) || be->to_device(be, m->rope_sin, sin_t, table);
    free(cos_t);
    free(sin_t);
    return rc ? -1 : 0;
}

/* The residency hooks (sharded training); nothing without them. */
#define HOOK(which, unit, backward) \
    TRY(m->hooks ? m->hooks->which(m->hooks->ctx, m, (unit), (backward)) : 0)

/* Layer l's fp32 input: its saved x, or resid where it saves x as bf16. */
static float *layer_input(struct olmo_model *m, int l) {
    const struct olmo_buf *x = &m->saved[l][OLMO_ACT_X];
    return x->dtype == OLMO_BF16 ? m->resid : x->data;
}

/* Where layer l writes its output: the next layer's input, or the final norm's. */
static float *layer_output(struct olmo_model *m, int l) {
    return l == m->cfg.n_layers - 1 ? m->x_final : layer_input(m, l + 1);
}

/* Whether a layer keeps slot `slot` as bf16 (its saved buffer, typed). */
static bool kept_bf16(const struct olmo_layer_acts *a, enum olmo_act_slot slot) {
    return a->saved && a->saved[slot].data && a->saved[slot].dtype == OLMO_BF16;
}

/* A saved activation as a GEMM operand (two arguments, pointer and type): its bf16 copy where it has one. */
#define SAVED(a, slot, f)                                                                          \
    (kept_bf16((a), (slot)) ? (const void *)(a)->saved[slot].data : (const void *)(a)->f),          \
        (kept_bf16((a), (slot)) ? OLMO_BF16 : OLMO_F32)

/* Copies n rows of a [n, width] buffer into a ring of cap rows starting at position p0. */
static int cache_store(const struct olmo_backend *be, float *cache, const float *rows, int n, int p0, int cap,
                        int width) {
    for (int i = 0; i < n;) {
        int slot = (p0 + i) % cap, run = cap - slot < n - i ? cap - slot : n - i;
        TRY(be->copy(be, cache + (size_t)slot * width, rows + (size_t)i * width, sizeof(float) * (size_t)run * width));
        i += run;
    }
    return 0;
}

/* Whether s goes straight into its saved bf16 copy (the backend's swiglu_fwd_bf16: the value the down
 * projection's GEMM and convert_kept would round it to), with no fp32 s in memory. */
static bool s_direct16(const struct olmo_model *m, const struct olmo_layer_acts *a) {
    return m->be->swiglu_fwd_bf16 && kept_bf16(a, OLMO_ACT_S);
}

/* The MLP's inner activations from its input h: g = gate(h), u = up(h), s = silu(g) * u (the forward
 * pass and the feed_forward recompute run this same code, so the recomputed values are bit-identical). */
static int ffn_inner_forward(const struct olmo_model *m, const struct olmo_layer_tensors *w,
                             const struct olmo_layer_acts *a, const void *h, enum olmo_float_type h_type, int N) {
    const struct olmo_backend *be = m->be;
    const int D = m->cfg.d_model, F = m->cfg.mlp_hidden;
    TRY(be->gemm(be, false, true, N, F, D, 1.0f, h, h_type, D, WEIGHT(w->gate), D, 0.0f, a->g, F));
    TRY(be->gemm(be, false, true, N, F, D, 1.0f, h, h_type, D, WEIGHT(w->up), D, 0.0f, a->u, F));
    if (s_direct16(m, a)) TRY(be->swiglu_fwd_bf16(be, a->saved[OLMO_ACT_S].data, a->g, a->u, (size_t)N * F));
    else TRY(be->swiglu_fwd(be, a->s, a->g, a->u, (size_t)N * F));
    return 0;
}

/* y = resid + rmsnorm(x) (rstd kept): one fused op where the backend has it, else the norm into tmp
 * and the add, with the same values. */
static int norm_add(const struct olmo_backend *be, float *y, float *rstd, const float *resid, const float *x,
                    const float *w, float *tmp, int N, int D, float eps) {
    if (be->rmsnorm_add_fwd) return be->rmsnorm_add_fwd(be, y, rstd, resid, x, w, N, D, eps);
    TRY(be->rmsnorm_fwd(be, tmp, rstd, x, w, N, D, eps));
    return be->add(be, y, resid, tmp, (size_t)N * D);
}

int olmo_layer_forward(const struct olmo_model *m, int layer, const struct olmo_layer_acts *a, float *out,
                        float *tmp, const float *rope_cos, const float *rope_sin, const struct olmo_attn_shape *shape,
                        const int32_t *doc_ids, const struct olmo_kv_cache_layer *cache) {
    const struct olmo_backend *be = m->be;
    const struct olmo_model_config *c = &m->cfg;
    const struct olmo_layer_tensors *w = &m->lw[layer];
    const int N = shape->batch * shape->seq_len, D = c->d_model, Q = m->q_dim, K = m->kv_dim, F = c->mlp_hidden;
    const float eps = (float)c->rms_norm_eps;
    /* attention block: h = x + norm(o_proj(attn(rope(qnorm(q)), rope(knorm(k)), v))); x and h are read
     * from their bf16 copies where the layer keeps them (rounded once, the value a bf16 GEMM rounds to) */
    TRY(be->gemm(be, false, true, N, Q, D, 1.0f, SAVED(a, OLMO_ACT_X, x), D, WEIGHT(w->wq), D, 0.0f, a->q_raw, Q));
    TRY(be->gemm(be, false, true, N, K, D, 1.0f, SAVED(a, OLMO_ACT_X, x), D, WEIGHT(w->wk), D, 0.0f, a->k_raw, K));
    TRY(be->gemm(be, false, true, N, K, D, 1.0f, SAVED(a, OLMO_ACT_X, x), D, WEIGHT(w->wv), D, 0.0f, a->v, K));
    TRY(be->rmsnorm_fwd(be, a->q, a->rstd_q, a->q_raw, w->q_norm, N, Q, eps));
    TRY(be->rmsnorm_fwd(be, a->k, a->rstd_k, a->k_raw, w->k_norm, N, K, eps));
    TRY(be->rope_fwd(be, a->q, rope_cos, rope_sin, N, shape->seq_len, c->n_heads, m->head_dim));
    TRY(be->rope_fwd(be, a->k, rope_cos, rope_sin, N, shape->seq_len, c->n_kv_heads, m->head_dim));
    if (cache) {
        TRY(cache_store(be, cache->k, a->k, N, cache->pos0, cache->cap, K));
        TRY(cache_store(be, cache->v, a->v, N, cache->pos0, cache->cap, K));
        TRY(be->attention_cached(be, a->att, a->q, cache->k, cache->v, N, cache->pos0, cache->cap, shape));
    } else {
        TRY(be->attention_fwd(be, a->att, a->lse, a->q, a->k, a->v, doc_ids, shape));
    }
    TRY(be->gemm(be, false, true, N, D, Q, 1.0f, a->att, OLMO_F32, Q, WEIGHT(w->wo), Q, 0.0f, a->o, D));
    TRY(norm_add(be, a->h, a->rstd_o, a->x, a->o, w->attn_norm, tmp, N, D, eps));
    /* MLP block: out = h + norm(down(silu(gate(h)) * up(h))) */
    if (kept_bf16(a, OLMO_ACT_H)) /* here rather than in convert_kept: gate and up read it */
        TRY(be->convert(be, a->saved[OLMO_ACT_H].data, OLMO_BF16, a->h, OLMO_F32, a->saved[OLMO_ACT_H].numel));
    TRY(ffn_inner_forward(m, w, a, SAVED(a, OLMO_ACT_H, h), N));
    const bool s16 = s_direct16(m, a);
    TRY(be->gemm(be, false, true, N, D, F, 1.0f, s16 ? a->saved[OLMO_ACT_S].data : (const void *)a->s,
                 s16 ? OLMO_BF16 : OLMO_F32, F, WEIGHT(w->down), F, 0.0f, a->m, D));
    TRY(norm_add(be, out, a->rstd_m, a->h, a->m, w->ff_norm, tmp, N, D, eps));
    return 0;
}

/* Converts between each kept bf16 tensor of a layer and its fp32 working buffer: fp32 -> bf16 after the
 * forward (every one but the input, converted before it), bf16 -> fp32 before the backward (the LARGE
 * ones: saved_all_bf16; the OPERAND ones are read as bf16 GEMM operands). */
static int convert_kept(const struct olmo_model *m, const struct olmo_layer_acts *a, bool save) {
    const struct olmo_backend *be = m->be;
    for (int i = 0; i < OLMO_ACT_LAYER_SLOTS; i++) {
        if (i == OLMO_ACT_X || !kept_bf16(a, (enum olmo_act_slot)i)) continue;
        /* written as bf16 by the forward: h before the MLP, s by swiglu_fwd_bf16 */
        if (i == OLMO_ACT_H || (i == OLMO_ACT_S && s_direct16(m, a))) continue;
        const struct olmo_buf *b = &a->saved[i];
        if (save) TRY(be->convert(be, b->data, OLMO_BF16, a->slot[i], OLMO_F32, b->numel));
        else if (olmo_act_layer_specs[i].kind == OLMO_ACT_LARGE)
            TRY(be->convert(be, a->slot[i], OLMO_F32, b->data, OLMO_BF16, b->numel));
    }
    return 0;
}

/* saved_all_bf16: what a checkpointed layer recomputed (fp32), rounded to bf16 in place as the kept
 * layers' activations are, so that checkpointing stays bit-identical to none.  Feed-forward
 * checkpointing recomputes g and u (and s: a GEMM operand, rounded by the GEMM), block checkpointing
 * every LARGE tensor. */
static int all16_round_recomputed(const struct olmo_model *m, int l, const struct olmo_layer_acts *a) {
    if (!m->saved_all_bf16 || !olmo_model_layer_checkpointed(m, l)) return 0;
    const struct olmo_backend *be = m->be;
    const bool block = m->ckpt_mode == OLMO_ACT_CKPT_BLOCK;
    for (int i = 0; i < OLMO_ACT_LAYER_SLOTS; i++) {
        const struct olmo_act_layer_spec *s = &olmo_act_layer_specs[i];
        if (s->kind != OLMO_ACT_LARGE || !(block || s->part == OLMO_ACT_MLP)) continue;
        const size_t n = m->shared[i].numel;
        TRY(be->convert(be, m->round16, OLMO_BF16, a->slot[i], OLMO_F32, n));
        TRY(be->convert(be, a->slot[i], OLMO_F32, m->round16, OLMO_BF16, n));
    }
    return 0;
}

int olmo_model_block_forward(struct olmo_model *m, int l) {
    struct olmo_attn_shape shape;
    attn_shape(m, l, &shape);
    const struct olmo_backend *be = m->be;
    const struct olmo_layer_acts a = olmo_model_layer_acts(m, l);
    /* the bf16 copy of x first: the layer's output may overwrite its input (both in resid) */
    if (kept_bf16(&a, OLMO_ACT_X))
        TRY(be->convert(be, a.saved[OLMO_ACT_X].data, OLMO_BF16, a.x, OLMO_F32, a.saved[OLMO_ACT_X].numel));
    /* m->dtmp is free during the forward pass */
    TRY(olmo_layer_forward(m, l, &a, layer_output(m, l), m->dtmp, m->rope_cos + rope_offset(m, l),
                           m->rope_sin + rope_offset(m, l), &shape,
                           m->use_doc_ids ? m->doc_ids : NULL, NULL));
    return convert_kept(m, &a, true);
}

int olmo_model_forward(struct olmo_model *m, const int32_t *tokens, bool doc_masking) {
    const struct olmo_backend *be = m->be;
    const struct olmo_model_config *c = &m->cfg;
    const int N = m->batch * m->seq_len, D = c->d_model, V = c->vocab_size;
    for (int i = 0; i < N; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return olmo_error("token id %d at position %d is outside the vocabulary [0, %d)", tokens[i], i, V);
    TRY(be->to_device(be, m->tokens, tokens, sizeof(int32_t) * (size_t)N));
    if (be->embedding_bwd_ids) { /* the backward pass sorts the ids on the host: keep them there */
        if (m->host_tokens_cap < (size_t)N) {
            free(m->host_tokens);
            m->host_tokens_cap = 0;
            if (!(m->host_tokens = olmo_malloc(sizeof(int32_t) * (size_t)N, "host copy of the token ids"))) return -1;
            m->host_tokens_cap = (size_t)N;
        }
        memcpy(m->host_tokens, tokens, sizeof(int32_t) * (size_t)N);
    }
    m->use_doc_ids = doc_masking;
    if (doc_masking) {
        int32_t *docs = malloc(sizeof(int32_t) * (size_t)N);
        if (!docs) return olmo_error("out of memory for document ids");
        for (int b = 0; b < m->batch; b++) {
            int32_t doc = 0;
            for (int t = 0; t < m->seq_len; t++) {
                int i = b * m->seq_len + t;
                docs[i] = doc;
                if (tokens[i] == c->eos_token_id) doc++; /* the EOS closes its own document */
            }
        }
        TRY(be->to_device(be, m->doc_ids, docs, sizeof(int32_t) * (size_t)N));
        free(docs);
    }
    HOOK(acquire, OLMO_UNIT_ROOT, false);
    TRY(be->embedding_fwd(be, layer_input(m, 0), m->embed, m->tokens, N, D));
    for (int l = 0; l < c->n_layers; l++) {
        HOOK(acquire, l, false);
        TRY(olmo_model_block_forward(m, l));
        HOOK(release, l, false);
    }
    return olmo_model_head_forward(m); /* the final norm and the logits (model/head.c) */
}

/* What a checkpointed layer did not keep, recomputed from what it kept with the same ops and weights. */
static int block_recompute(struct olmo_model *m, int l, const struct olmo_layer_acts *a) {
    if (!olmo_model_layer_checkpointed(m, l)) return 0;
    if (m->ckpt_mode == OLMO_ACT_CKPT_FEED_FORWARD) /* from h (its bf16 copy: the GEMM rounds h to bf16 anyway) */
        return ffn_inner_forward(m, &m->lw[l], a, SAVED(a, OLMO_ACT_H, h), m->batch * m->seq_len);
    /* block: the whole layer from its input; its output (already the next layer's input) goes to m->dh,
     * which nothing reads (the backward accumulates in m->dx), and m->dtmp is the forward's scratch */
    struct olmo_attn_shape shape;
    attn_shape(m, l, &shape);
    return olmo_layer_forward(m, l, a, m->dh, m->dtmp, m->rope_cos + rope_offset(m, l),
                              m->rope_sin + rope_offset(m, l), &shape, m->use_doc_ids ? m->doc_ids : NULL, NULL);
}

/* rmsnorm_bwd, or with bf16 its fused variant writing dx as bf16 (dx16 then does not overlap dy). */
static int norm_bwd(const struct olmo_backend *be, bool bf16, void *dx, float *dw, const float *dy, const float *x,
                    const float *w, const float *rstd, int n, int dim) {
    if (bf16) return be->rmsnorm_bwd_bf16(be, dx, dw, dy, x, w, rstd, n, dim);
    return be->rmsnorm_bwd(be, (float *)dx, dw, dy, x, w, rstd, n, dim);
}

int olmo_model_block_backward(struct olmo_model *m, int l) {
    const struct olmo_backend *be = m->be;
    const struct olmo_model_config *c = &m->cfg;
    const int N = m->batch * m->seq_len, D = c->d_model, Q = m->q_dim, K = m->kv_dim, F = c->mlp_hidden;
    const struct olmo_layer_acts acts = olmo_model_layer_acts(m, l), *a = &acts;
    const struct olmo_layer_tensors *w = &m->lw[l];
    struct olmo_layer_tensors *g = &m->lg[l];
    struct olmo_attn_shape shape;
    attn_shape(m, l, &shape);
    /* overwrite_grads: the weight GEMMs set their gradients (beta 0); the norms' are zeroed, then added to */
    const float gb = m->overwrite_grads ? 0.0f : 1.0f;
    if (m->overwrite_grads) {
        TRY(be->zero(be, g->ff_norm, sizeof(float) * (size_t)D));
        TRY(be->zero(be, g->attn_norm, sizeof(float) * (size_t)D));
        TRY(be->zero(be, g->q_norm, sizeof(float) * (size_t)Q));
        TRY(be->zero(be, g->k_norm, sizeof(float) * (size_t)K));
    }
    TRY(convert_kept(m, a, false));
    TRY(block_recompute(m, l, a));
    TRY(all16_round_recomputed(m, l, a));
    /* m->dx holds the gradient of the layer's output; the input-gradient GEMMs add into it in place, so that
     * it becomes that of h (the residual's term plus the MLP's), then that of the layer's input (a copy to
     * m->dh and back before each block's GEMMs gave the same values: the copies were exact) */
    /* On a backend whose GEMMs multiply in bf16 and that has the fused backward ops (backend.h), each
     * activation gradient that only GEMMs read is rounded to bf16 once, where it is made, instead of by
     * each of the two GEMMs that read it: the norms' dx (dtmp; dq and dk, written into datt, which
     * attention_bwd has read), dg and du (typed bf16 in the table), and dv converted once into dtmp
     * (which the o_proj GEMMs have read).  The GEMMs would round the same fp32 values to the same bf16. */
    const bool n16 = be->compute_dtype == OLMO_BF16 && be->rmsnorm_bwd_bf16;
    const enum olmo_float_type nt = n16 ? OLMO_BF16 : OLMO_F32;
    const struct olmo_buf *dg = &m->bufs[OLMO_ACT_DG], *du = &m->bufs[OLMO_ACT_DU];
    /* MLP block */
    TRY(norm_bwd(be, n16, m->dtmp, g->ff_norm, m->dx, a->m, w->ff_norm, a->rstd_m, N, D));
    TRY(be->gemm(be, false, false, N, F, D, 1.0f, m->dtmp, nt, D, WEIGHT(w->down), F, 0.0f, m->ds, F));
    TRY(be->gemm(be, true, false, D, F, N, 1.0f, m->dtmp, nt, D, SAVED(a, OLMO_ACT_S, s), F, gb, g->down, F));
    if (dg->dtype == OLMO_BF16) TRY(be->swiglu_bwd_bf16(be, dg->data, du->data, m->ds, a->g, a->u, (size_t)N * F));
    else TRY(be->swiglu_bwd(be, m->dg, m->du, m->ds, a->g, a->u, (size_t)N * F));
    TRY(be->gemm(be, false, false, N, D, F, 1.0f, dg->data, dg->dtype, F, WEIGHT(w->gate), D, 1.0f, m->dx, D));
    TRY(be->gemm(be, false, false, N, D, F, 1.0f, du->data, du->dtype, F, WEIGHT(w->up), D, 1.0f, m->dx, D));
    TRY(be->gemm(be, true, false, F, D, N, 1.0f, dg->data, dg->dtype, F, SAVED(a, OLMO_ACT_H, h), D, gb, g->gate, D));
    TRY(be->gemm(be, true, false, F, D, N, 1.0f, du->data, du->dtype, F, SAVED(a, OLMO_ACT_H, h), D, gb, g->up, D));
    /* attention block */
    TRY(norm_bwd(be, n16, m->dtmp, g->attn_norm, m->dx, a->o, w->attn_norm, a->rstd_o, N, D));
    TRY(be->gemm(be, false, false, N, Q, D, 1.0f, m->dtmp, nt, D, WEIGHT(w->wo), Q, 0.0f, m->datt, Q));
    TRY(be->gemm(be, true, false, D, Q, N, 1.0f, m->dtmp, nt, D, a->att, OLMO_F32, Q, gb, g->wo, Q));
    TRY(be->attention_bwd(be, m->dq, m->dk, m->dv, m->datt, a->att, a->lse, a->q, a->k, a->v,
                      m->use_doc_ids ? m->doc_ids : NULL, &shape));
    const float *rope_cos = m->rope_cos + rope_offset(m, l), *rope_sin = m->rope_sin + rope_offset(m, l);
    TRY(be->rope_bwd(be, m->dq, rope_cos, rope_sin, N, m->seq_len, c->n_heads, m->head_dim));
    TRY(be->rope_bwd(be, m->dk, rope_cos, rope_sin, N, m->seq_len, c->n_kv_heads, m->head_dim));
    /* bf16: dq and dk in datt ([N, Q] fp32 holds [N, Q + K] bf16, K <= Q), dv in dtmp ([N, D] fp32) */
    void *dq = n16 ? (void *)m->datt : m->dq, *dk = n16 ? (void *)((uint16_t *)m->datt + (size_t)N * Q) : m->dk;
    void *dv = n16 ? (void *)m->dtmp : m->dv;
    TRY(norm_bwd(be, n16, dq, g->q_norm, m->dq, a->q_raw, w->q_norm, a->rstd_q, N, Q));
    TRY(norm_bwd(be, n16, dk, g->k_norm, m->dk, a->k_raw, w->k_norm, a->rstd_k, N, K));
    if (n16) TRY(be->convert(be, dv, OLMO_BF16, m->dv, OLMO_F32, (size_t)N * K));
    TRY(be->gemm(be, false, false, N, D, Q, 1.0f, dq, nt, Q, WEIGHT(w->wq), D, 1.0f, m->dx, D));
    TRY(be->gemm(be, false, false, N, D, K, 1.0f, dk, nt, K, WEIGHT(w->wk), D, 1.0f, m->dx, D));
    TRY(be->gemm(be, false, false, N, D, K, 1.0f, dv, nt, K, WEIGHT(w->wv), D, 1.0f, m->dx, D));
    TRY(be->gemm(be, true, false, Q, D, N, 1.0f, dq, nt, Q, SAVED(a, OLMO_ACT_X, x), D, gb, g->wq, D));
    TRY(be->gemm(be, true, false, K, D, N, 1.0f, dk, nt, K, SAVED(a, OLMO_ACT_X, x), D, gb, g->wk, D));
    TRY(be->gemm(be, true, false, K, D, N, 1.0f, dv, nt, K, SAVED(a, OLMO_ACT_X, x), D, gb, g->wv, D));
    return 0;
}

int olmo_model_backward(struct olmo_model *m) {
    const struct olmo_backend *be = m->be;
    const struct olmo_model_config *c = &m->cfg;
    const int N = m->batch * m->seq_len, D = c->d_model, V = c->vocab_size;
    HOOK(acquire, OLMO_UNIT_ROOT, true);
    /* overwrite_grads: the LM head's GEMM sets its gradient (beta 0); the embedding's and the final norm's
     * are sums of parts: zeroed, then added to */
    const float gb = m->overwrite_grads ? 0.0f : 1.0f;
    if (m->overwrite_grads) {
        TRY(be->zero(be, m->d_embed, sizeof(float) * (size_t)V * D));
        TRY(be->zero(be, m->d_final_norm, sizeof(float) * (size_t)D));
    }
    TRY(olmo_model_head_backward(m, gb)); /* LM head and final norm, from the loss's gradient (model/head.c) */
    /* m->dx: gradient w.r.t. the current layer's output. */
    for (int l = c->n_layers - 1; l >= 0; l--) {
        HOOK(acquire, l, true); /* a checkpointed block recomputes with these weights */
        TRY(olmo_model_block_backward(m, l));
        HOOK(release, l, true);
    }
    if (be->embedding_bwd_ids && m->host_tokens)
        TRY(be->embedding_bwd_ids(be, m->d_embed, m->dx, m->host_tokens, N, D));
    else
        TRY(be->embedding_bwd(be, m->d_embed, m->dx, m->tokens, N, D));
    HOOK(release, OLMO_UNIT_ROOT, true);
    m->overwrite_grads = false;
    return 0;
}

size_t olmo_model_count_params(const struct olmo_model_config *c, bool include_embeddings) {
    size_t hd = (size_t)(c->d_model / c->n_heads), D = (size_t)c->d_model;
    size_t q = c->n_heads * hd, kv = c->n_kv_heads * hd, F = (size_t)c->mlp_hidden;
    size_t per_layer = q * D + 2 * kv * D + D * q + q + kv + 3 * F * D + 2 * D;
    size_t total = per_layer * c->n_layers + D + (size_t)c->vocab_size * D; /* lm_head counts as compute */
    if (include_embeddings) total += (size_t)c->vocab_size * D;
    return total;
}

double olmo_model_flops_per_token(const struct olmo_model_config *c, int seq_len) {
    /* 6 FLOPs per matmul weight per token (fwd + bwd), plus attention scores and
     * values: 12 * layers * d_model * (visible keys), visible keys averaged over positions. */
    double matmul = 6.0 * (double)olmo_model_count_params(c, false);
    double attn = 0.0;
    for (int l = 0; l < c->n_layers; l++) {
        int w = olmo_layer_is_full_attention(c, l) || c->sliding_window == 0 ? seq_len : c->sliding_window;
        if (w > seq_len) w = seq_len;
        /* average number of visible keys over positions 0..T-1 */
        double avg = w >= seq_len ? (seq_len + 1) / 2.0
                                  : ((double)w * (w + 1) / 2.0 + (double)(seq_len - w) * w) / seq_len;
        attn += 12.0 * c->d_model * avg;
    }
    return matmul + attn;
}
