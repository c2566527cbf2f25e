#include "model/generate.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/sample.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/rng.h"

int olmo_gen_create(struct olmo_gen *g, struct olmo_model *m, int max_len, int chunk) {
    memset(g, 0, sizeof *g);
    if (!m->weights || m->sharded)
        return olmo_error("generation needs a whole model: this one is sharded (its weights live in the trainer's "
                          "shards)");
    const struct olmo_backend *be = m->be;
    const struct olmo_model_config *c = &m->cfg;
    if (!be->attention_cached) return olmo_error("backend '%s' has no cached attention for generation", be->name);
    if (max_len <= 0 || chunk <= 0) return olmo_error("generation needs a positive length and chunk");
    if (chunk > max_len) chunk = max_len;
    g->m = m;
    g->max_len = max_len;
    g->chunk = chunk;
    const size_t C = (size_t)chunk, D = (size_t)c->d_model, Q = (size_t)m->q_dim, K = (size_t)m->kv_dim,
                 F = (size_t)c->mlp_hidden, V = (size_t)c->vocab_size, half = (size_t)m->head_dim / 2;
    g->cap = olmo_calloc((size_t)c->n_layers, sizeof(int), "cache sizes");
    g->k_cache = olmo_calloc((size_t)c->n_layers, sizeof(float *), "key cache");
    g->v_cache = olmo_calloc((size_t)c->n_layers, sizeof(float *), "value cache");
    if (!g->cap || !g->k_cache || !g->v_cache) goto fail;
    for (int l = 0; l < c->n_layers; l++) {
        int cap = max_len;
        if (!olmo_layer_is_full_attention(c, l) && c->sliding_window > 0 && c->sliding_window + chunk - 1 < max_len)
            cap = c->sliding_window + chunk - 1;
        g->cap[l] = cap;
        if (!(g->k_cache[l] = be->alloc(be, (size_t)cap * K * sizeof(float)))) goto fail;
        if (!(g->v_cache[l] = be->alloc(be, (size_t)cap * K * sizeof(float)))) goto fail;
    }
#define ALLOC(p, count) \
    if (!((p) = be->alloc(be, (count) * sizeof(float)))) goto fail
    const size_t table = (size_t)max_len * half * (size_t)olmo_rope_n_tables(c);
    ALLOC(g->rope_cos, table);
    ALLOC(g->rope_sin, table);
    ALLOC(g->x, C * D);
    ALLOC(g->q, C * Q);
    ALLOC(g->k, C * K);
    ALLOC(g->v, C * K);
    ALLOC(g->rstd, C);
    ALLOC(g->att, C * Q);
    ALLOC(g->o, C * D);
    ALLOC(g->tmp, C * D);
    ALLOC(g->h, C * D);
    ALLOC(g->g, C * F);
    ALLOC(g->u, C * F);
    ALLOC(g->s, C * F);
    ALLOC(g->mo, C * D);
    ALLOC(g->xn, D);
    ALLOC(g->logits, V);
#undef ALLOC
    if (!(g->tokens = be->alloc(be, C * sizeof(int32_t)))) goto fail;
    float *cos_t = malloc(sizeof(float) * table), *sin_t = malloc(sizeof(float) * table);
    if (!cos_t || !sin_t) {
        free(cos_t);
        free(sin_t);
        olmo_error("out of memory for RoPE tables");
        goto fail;
    }
    olmo_rope_tables(cos_t, sin_t, max_len, m->head_dim, c);
    const int rc = be->to_device(be, g->rope_cos, cos_t, sizeof(float) * table) ||
                   be->to_device(be, g->rope_sin, sin_t, sizeof(float) * table);
    free(cos_t);
    free(sin_t);
    if (rc) goto fail;
    return 0;
fail:
    olmo_gen_destroy(g);
    return olmo_error_context("KV cache for %d positions", max_len);
}

void olmo_gen_destroy(struct olmo_gen *g) {
    if (!g->m) {
        free(g->cap);
        free(g->k_cache);
        free(g->v_cache);
        memset(g, 0, sizeof *g);
        return;
    }
    const struct olmo_backend *be = g->m->be;
    for (int l = 0; l < g->m->cfg.n_layers; l++) {
        if (g->k_cache) be->free(be, g->k_cache[l]);
        if (g->v_cache) be->free(be, g->v_cache[l]);
    }
    float *bufs[] = {g->rope_cos, g->rope_sin, g->x, g->q, g->k, g->v, g->rstd, g->att, g->o,
                     g->tmp,      g->h,        g->g, g->u, g->s, g->mo, g->xn, g->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->free(be, bufs[i]);
    be->free(be, g->xn_all);
    be->free(be, g->logits_all);
    be->free(be, g->tokens);
    free(g->cap);
    free(g->k_cache);
    free(g->v_cache);
    memset(g, 0, sizeof *g);
}

void olmo_gen_reset(struct olmo_gen *g) { g->len = 0; }

/* Runs the layers over n tokens at positions len..len+n-1, leaving the hidden states in g->x. */
static int gen_layers(struct olmo_gen *g, const int32_t *tokens, int n) {
    struct olmo_model *m = g->m;
    const struct olmo_backend *be = m->be;
    const struct olmo_model_config *c = &m->cfg;
    const int D = c->d_model, V = c->vocab_size;
    const int half = m->head_dim / 2, p0 = g->len;
    if (n <= 0 || n > g->chunk) return olmo_error("feed of %d tokens (1..%d allowed)", n, g->chunk);
    if (p0 + n > g->max_len)
        return olmo_error("the sequence would reach %d tokens, more than the %d the cache holds", p0 + n, g->max_len);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V) return olmo_error("token id %d is outside the vocabulary [0, %d)", tokens[i], V);
    if (be->to_device(be, g->tokens, tokens, sizeof(int32_t) * (size_t)n) ||
        be->embedding_fwd(be, g->x, m->embed, g->tokens, n, D))
        return -1;
    /* one buffer set for every layer (olmo_layer_forward says which may alias) */
    const struct olmo_layer_acts bufs = {
        .x = g->x, .q_raw = g->att, .k_raw = g->o, .q = g->q, .k = g->k, .v = g->v, .rstd_q = g->rstd,
        .rstd_k = g->rstd, .att = g->att, .o = g->o, .rstd_o = g->rstd, .h = g->h, .g = g->g, .u = g->u,
        .s = g->s, .m = g->mo, .rstd_m = g->rstd};
    for (int l = 0; l < c->n_layers; l++) {
        struct olmo_attn_shape shape;
        olmo_model_attn_shape(m, l, 1, n, &shape);
        const struct olmo_kv_cache_layer cache = {g->k_cache[l], g->v_cache[l], p0, g->cap[l]};
        const size_t at = (size_t)p0 * half + olmo_rope_table_offset(c, l, g->max_len, m->head_dim);
        if (olmo_layer_forward(m, l, &bufs, g->x, g->tmp, g->rope_cos + at, g->rope_sin + at, &shape, NULL, &cache))
            return -1;
    }
    g->len += n;
    return 0;
}

int olmo_gen_feed(struct olmo_gen *g, const int32_t *tokens, int n, float *logits_out) {
    if (gen_layers(g, tokens, n)) return -1;
    struct olmo_model *m = g->m;
    const struct olmo_backend *be = m->be;
    const struct olmo_model_config *c = &m->cfg;
    const int D = c->d_model, V = c->vocab_size;
    const float eps = (float)c->rms_norm_eps;
    /* Only the last position's logits are needed. */
    const float *last = g->x + (size_t)(n - 1) * D;
    if (be->rmsnorm_fwd(be, g->xn, g->rstd, last, m->final_norm, 1, D, eps) ||
        be->gemm(be, false, true, 1, V, D, 1.0f, g->xn, OLMO_F32, D, olmo_model_weight(m, m->lm_head), olmo_model_weight_type(m), D, 0.0f, g->logits, V) ||
        be->to_host(be, logits_out, g->logits, sizeof(float) * (size_t)V))
        return -1;
    return 0;
}

int olmo_gen_feed_all(struct olmo_gen *g, const int32_t *tokens, int n, float *logits_out) {
    struct olmo_model *m = g->m;
    const struct olmo_backend *be = m->be;
    const struct olmo_model_config *c = &m->cfg;
    const int D = c->d_model, V = c->vocab_size;
    const int cap = g->chunk < OLMO_GEN_FEED_ALL_MAX ? g->chunk : OLMO_GEN_FEED_ALL_MAX;
    if (n <= 0 || n > cap) return olmo_error("feed of %d tokens with all logits (1..%d allowed)", n, cap);
    if (!g->xn_all && !(g->xn_all = be->alloc(be, (size_t)cap * D * sizeof(float))))
        return olmo_error_context("logits of %d positions", cap);
    if (!g->logits_all && !(g->logits_all = be->alloc(be, (size_t)cap * V * sizeof(float))))
        return olmo_error_context("logits of %d positions", cap);
    if (gen_layers(g, tokens, n)) return -1;
    if (be->rmsnorm_fwd(be, g->xn_all, g->rstd, g->x, m->final_norm, n, D, (float)c->rms_norm_eps) ||
        be->gemm(be, false, true, n, V, D, 1.0f, g->xn_all, OLMO_F32, D, olmo_model_weight(m, m->lm_head),
                 olmo_model_weight_type(m), D, 0.0f, g->logits_all, V) ||
        be->to_host(be, logits_out, g->logits_all, sizeof(float) * (size_t)n * V))
        return -1;
    return 0;
}

int olmo_gen_rewind(struct olmo_gen *g, int len) {
    if (len < 0 || len > g->len) return olmo_error("cannot rewind %d positions to %d", g->len, len);
    g->len = len;
    return 0;
}

int olmo_generate_tokens(struct olmo_model *m, int32_t *ids, int n_prompt, const struct olmo_sample_options *o,
                         struct olmo_sample_result *r) {
    r->n_new = 0;
    r->prefill_s = r->decode_s = 0;
    const int total = n_prompt + o->max_new_tokens, vocab = m->cfg.vocab_size;
    struct olmo_gen gen = {0};
    float *logits = olmo_malloc(sizeof(float) * (size_t)vocab, "logits");
    if (!logits || olmo_gen_create(&gen, m, total, 64)) goto fail;
    struct olmo_rng rng;
    olmo_rng_seed(&rng, o->seed);
    const double t0 = olmo_now_seconds();
    for (int p = 0; p < n_prompt; p += gen.chunk) { /* prefill */
        int n = n_prompt - p < gen.chunk ? n_prompt - p : gen.chunk;
        if (olmo_gen_feed(&gen, ids + p, n, logits)) goto fail;
    }
    const double t1 = olmo_now_seconds();
    int len = n_prompt;
    while (len < total) {
        int32_t next = olmo_sample_token(logits, vocab, o->temperature, o->top_p, &rng);
        ids[len++] = next;
        if (o->on_token && o->on_token(o->user, next)) goto fail;
        if (!o->ignore_eos && next == o->eos_id) break;
        if (len < total && olmo_gen_feed(&gen, &next, 1, logits)) goto fail;
    }
    r->n_new = len - n_prompt;
    r->prefill_s = t1 - t0;
    r->decode_s = olmo_now_seconds() - t1;
    olmo_gen_destroy(&gen);
    free(logits);
    return 0;
fail:
    olmo_gen_destroy(&gen);
    free(logits);
    return -1;
}

void olmo_text_stream_init(struct olmo_text_stream *s, const struct olmo_tokenizer *tok, FILE *out, bool skip_special) {
    memset(s, 0, sizeof *s);
    s->tok = tok;
    s->out = out;
    s->skip_special = skip_special;
}

/* Repairs pending + bytes[0, n) and writes it, keeping an incomplete final character unless final. */
static int stream_write(struct olmo_text_stream *s, const uint8_t *bytes, size_t n, bool final) {
    const size_t len = s->n_pending + n;
    uint8_t *in = olmo_malloc(len + 1, "decoded text"), *fixed = olmo_malloc(3 * len + 1, "decoded text");
    if (!in || !fixed) {
        free(in);
        free(fixed);
        return -1;
    }
    memcpy(in, s->pending, s->n_pending);
    if (n) memcpy(in + s->n_pending, bytes, n);
    size_t used = len;
    const size_t m = olmo_utf8_sanitize(in, len, fixed, final, &used, NULL);
    if (final) used = len;
    /* not final: what is left is a so-far valid start of one character (at most 3 bytes) */
    s->n_pending = len - used;
    memcpy(s->pending, in + used, s->n_pending);
    int rc = 0;
    if (m && fwrite(fixed, 1, m, s->out) != m) rc = olmo_error("writing the text failed: %s", strerror(errno));
    if (!rc && fflush(s->out)) rc = olmo_error("writing the text failed: %s", strerror(errno));
    free(in);
    free(fixed);
    return rc;
}

int olmo_text_stream_push(struct olmo_text_stream *s, uint32_t id) {
    size_t n;
    const uint8_t *b = olmo_tokenizer_token_bytes(s->tok, id, &n);
    if (!b || (s->skip_special && olmo_tokenizer_is_special(s->tok, id))) return 0;
    return stream_write(s, b, n, false);
}

int olmo_text_stream_finish(struct olmo_text_stream *s) { return s->n_pending ? stream_write(s, NULL, 0, true) : 0; }
