/* Config checks: shapes, limits, the schedule, the cross-field rules. */
#include <stddef.h>
#include <string.h>

#include "config/config.h"
#include "util/error.h"

bool olmo_layer_is_full_attention(const struct olmo_model_config *m, int layer) {
    if (m->full_attention_last && layer == m->n_layers - 1) return true;
    return m->full_attention_every > 0 && (layer + 1) % m->full_attention_every == 0;
}

int olmo_config_check_limits(const struct olmo_config *cfg) {
    const struct olmo_model_config *m = &cfg->model;
    const struct olmo_train_config *t = &cfg->train;
    const struct {
        const char *key;
        long long value, max;
    } limits[] = {
        /* the products first: they are what overflows */
        {"train.micro_batch x train.seq_len", (long long)t->micro_batch * t->seq_len, OLMO_MAX_BATCH_TOKENS},
        {"train.micro_batch x train.grad_accum", (long long)t->micro_batch * t->grad_accum, OLMO_MAX_BATCH_INSTANCES},
        {"model.vocab_size", m->vocab_size, OLMO_MAX_VOCAB_SIZE},
        {"model.d_model", m->d_model, OLMO_MAX_D_MODEL},
        {"model.n_layers", m->n_layers, OLMO_MAX_N_LAYERS},
        {"model.n_heads", m->n_heads, OLMO_MAX_N_HEADS},
        {"model.n_kv_heads", m->n_kv_heads, OLMO_MAX_N_HEADS},
        {"model.mlp_hidden", m->mlp_hidden, OLMO_MAX_MLP_HIDDEN},
        {"train.seq_len", t->seq_len, OLMO_MAX_SEQ_LEN},
        {"train.micro_batch", t->micro_batch, OLMO_MAX_MICRO_BATCH},
        {"train.grad_accum", t->grad_accum, OLMO_MAX_BATCH_INSTANCES},
    };
    for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++)
        if (limits[i].value > limits[i].max)
            return olmo_error("%s is %lld, above olmoc's limit of %lld", limits[i].key, limits[i].value,
                              limits[i].max);
    return 0;
}

int olmo_schedule_validate(const struct olmo_train_config *t) {
    if (t->schedule == OLMO_SCHED_NONE) return olmo_error("train.schedule cannot be none (train.schedule2 can)");
    if (t->schedule_steps < 0 || t->schedule_tokens < 0 || t->schedule2_steps < 0 || t->schedule2_tokens < 0 ||
        t->schedule2_after < 0 || t->schedule2_warmup_steps < 0 || t->decay_steps < 0)
        return olmo_error("train.schedule_steps/_tokens, train.schedule2_* and train.decay_steps must be >= 0");
    if (t->schedule_steps > 0 && t->schedule_tokens > 0)
        return olmo_error("set train.schedule_steps or train.schedule_tokens, not both");
    if (t->schedule2_steps > 0 && t->schedule2_tokens > 0)
        return olmo_error("set train.schedule2_steps or train.schedule2_tokens, not both");
    if (!(t->decay_fraction >= 0 && t->decay_fraction <= 1))
        return olmo_error("train.decay_fraction must be in [0, 1] (OLMo-core WSD)");
    return 0;
}

int olmo_config_validate(const struct olmo_config *cfg) {
    const struct olmo_model_config *m = &cfg->model;
    const struct olmo_train_config *t = &cfg->train;
#define POSITIVE(v, name) \
    if ((v) <= 0) return olmo_error("%s must be positive (got %g)", name, (double)(v))
    POSITIVE(m->vocab_size, "model.vocab_size");
    POSITIVE(m->d_model, "model.d_model");
    POSITIVE(m->n_layers, "model.n_layers");
    POSITIVE(m->n_heads, "model.n_heads");
    POSITIVE(m->n_kv_heads, "model.n_kv_heads");
    POSITIVE(m->mlp_hidden, "model.mlp_hidden");
    POSITIVE(m->rope_theta, "model.rope_theta");
    POSITIVE(m->rms_norm_eps, "model.rms_norm_eps");
    POSITIVE(m->init_std, "model.init_std");
    POSITIVE(t->seq_len, "train.seq_len");
    POSITIVE(t->micro_batch, "train.micro_batch");
    POSITIVE(t->grad_accum, "train.grad_accum");
    POSITIVE(t->log_every, "train.log_every");
    POSITIVE(t->lr, "train.lr");
#undef POSITIVE
    if (olmo_config_check_limits(cfg)) return -1;
    if (m->d_model % m->n_heads)
        return olmo_error("model.d_model (%d) must be divisible by model.n_heads (%d)", m->d_model, m->n_heads);
    if ((m->d_model / m->n_heads) % 2)
        return olmo_error("head dim d_model/n_heads = %d must be even for RoPE", m->d_model / m->n_heads);
    if (m->n_heads % m->n_kv_heads)
        return olmo_error("model.n_heads (%d) must be a multiple of model.n_kv_heads (%d)", m->n_heads,
                          m->n_kv_heads);
    if (m->rope_scaling == OLMO_ROPE_YARN &&
        (!(m->rope_theta > 1) || !m->rope_factor || !m->rope_original_max_position_embeddings || !m->rope_beta_fast ||
         !m->rope_beta_slow))
        return olmo_error("model.rope_scaling: yarn needs model.rope_theta > 1 (got %g) and model.rope_factor, "
                          "rope_original_max_position_embeddings, rope_beta_fast and rope_beta_slow set",
                          m->rope_theta);
    if (m->sliding_window < 0) return olmo_error("model.sliding_window must be >= 0 (0 = full attention)");
    if (m->full_attention_every < 0) return olmo_error("model.full_attention_every must be >= 0");
    if (m->eos_token_id < 0 || m->eos_token_id >= m->vocab_size)
        return olmo_error("model.eos_token_id %d is outside the vocabulary [0, %d)", m->eos_token_id,
                          m->vocab_size);
    if (t->steps < 0 || t->warmup_steps < 0 || t->schedule_steps < 0)
        return olmo_error("train.steps, train.warmup_steps and train.schedule_steps must be >= 0");
    if (olmo_schedule_validate(t)) return -1;
    if (t->beta1 < 0 || t->beta1 >= 1 || t->beta2 < 0 || t->beta2 >= 1)
        return olmo_error("train.beta1 and train.beta2 must be in [0, 1)");
    if (t->eps <= 0) return olmo_error("train.eps must be positive");
    if (t->alpha_f < 0 || t->alpha_f > 1) return olmo_error("train.alpha_f must be in [0, 1]");
    if (t->z_loss < 0 || t->weight_decay < 0 || t->embedding_weight_decay < 0)
        return olmo_error("train.z_loss and weight decays must be >= 0");
    if (t->rolling_interval_length < 0 || t->rolling_interval_length > 1000000)
        return olmo_error("train.rolling_interval_length must be in [0, 1000000] (got %d)", t->rolling_interval_length);
    if (!(t->sigma_factor >= 0)) return olmo_error("train.sigma_factor must be >= 0");
    if (t->save_every < 0) return olmo_error("train.save_every must be >= 0 (0 = no checkpoints)");
    if (t->keep_last < 0) return olmo_error("train.keep_last must be >= 0 (0 = keep every checkpoint)");
    if (t->eval_every < 0) return olmo_error("train.eval_every must be >= 0 (0 = no evaluation)");
    if (t->eval_batches <= 0) return olmo_error("train.eval_batches must be positive");
    if (t->peak_flops < 0) return olmo_error("train.peak_flops must be >= 0 (0 = measure at startup)");
    if (t->block_every < 1) return olmo_error("train.block_every must be >= 1 (1 = every block)");
    if (t->shard_degree < 0) return olmo_error("train.shard_degree must be >= 0 (0 = all ranks in one group)");
    if (t->sharding == OLMO_SHARDING_ZERO1 && t->shard_degree)
        return olmo_error("train.shard_degree applies to train.sharding: fsdp (HSDP groups), not zero1");
    if (strcmp(cfg->data.dtype, "auto") && strcmp(cfg->data.dtype, "uint16") && strcmp(cfg->data.dtype, "uint32"))
        return olmo_error("data.dtype must be auto, uint16 or uint32; got '%s'", cfg->data.dtype);
    if (strcmp(cfg->data.order, "olmo_core") && strcmp(cfg->data.order, "olmoc"))
        return olmo_error("data.order must be olmo_core or olmoc; got '%s'", cfg->data.order);
    if (!!cfg->data.mix[0] + !!cfg->data.train_path[0] + !!cfg->data.mix_file[0] > 1)
        return olmo_error("set one of data.train_path, data.mix and data.mix_file");
    if (olmo_config_check_ranges(cfg)) return -1;
    size_t chunk;
    return olmo_config_chunk_instances(cfg, &chunk);
}

int olmo_config_chunk_instances(const struct olmo_config *cfg, size_t *chunk) {
    const int mt = cfg->data.max_target_sequence_length, T = cfg->train.seq_len;
    *chunk = 1;
    if (mt < 0 || (mt && (T <= 0 || mt < T || mt % T)))
        return olmo_error("data.max_target_sequence_length (%d) must be a multiple of train.seq_len (%d), or 0 (= "
                          "seq_len)",
                          mt, T);
    if (mt > T && strcmp(cfg->data.order, "olmo_core"))
        return olmo_error("data.max_target_sequence_length is an option of the olmo_core data order, not of '%s'",
                          cfg->data.order);
    if (mt) *chunk = (size_t)(mt / T);
    return 0;
}
