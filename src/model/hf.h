/* Hugging Face interop: Olmo3ForCausalLM checkpoints (config.json +
 * safetensors, single file or sharded with model.safetensors.index.json).
 * Parameter names are identical to olmoc's, so weights map one to one; the
 * config maps as
 *   hidden_size = model.d_model, intermediate_size = model.mlp_hidden,
 *   num_hidden_layers, num_attention_heads, num_key_value_heads = model.n_layers / n_heads / n_kv_heads,
 *   rope theta = model.rope_theta, sliding_window = model.sliding_window,
 *   YaRN (rope_scaling, or rope_parameters.full_attention: rope_type yarn) = model.rope_scaling: yarn with
 *   model.rope_factor, rope_original_max_position_embeddings, rope_beta_fast, rope_beta_slow and
 *   rope_attention_factor (resolved from mscale / mscale_all_dim when the file gives those),
 *   layer_types <-> model.full_attention_every / model.full_attention_last,
 *   rms_norm_eps, vocab_size, eos/pad_token_id, initializer_range = model.init_std.
 * Features olmoc does not implement are refused with a clear error: RoPE
 * scalings other than YaRN (linear, dynamic, llama3, longrope, ...: named), YaRN on the
 * sliding-window layers, tied embeddings, attention/MLP biases, another
 * activation than SiLU, attention dropout, a head_dim other than
 * hidden_size / num_attention_heads. */
#ifndef OLMOC_HF_H
#define OLMOC_HF_H

#include "config/config.h"
#include "io/safetensors.h"
#include "model/model.h"

/* Reads config.json into cfg's model section (the train/data sections keep
 * their defaults; train.seq_len = min(max_position_embeddings, 4096)). */
int olmo_hf_read_config(const char *config_json, struct olmo_config *cfg);
/* What the last olmo_hf_read_config (on this thread) assumed for values config.json leaves open,
 * as one line ("" when nothing): OLMo-core's exporter writes max_position_embeddings -1 (Olmo 3's
 * 8192 assumed) and null eos/pad_token_id (the dolma2 tokenizer's 100257 / 100277 assumed). */
const char *olmo_hf_config_assumed(void);
/* Writes an Olmo3Config config.json (max_position_embeddings = train.seq_len). */
int olmo_hf_write_config(const struct olmo_config *cfg, const char *path, const char *dtype_name);
/* Writes out_dir/tokenizer.json (a copy of tokenizer_path, which must load as a tokenizer) and
 * out_dir/tokenizer_config.json (PreTrainedTokenizerFast with the config's EOS and PAD tokens), so
 * transformers' AutoTokenizer loads the export. */
int olmo_hf_write_tokenizer(const struct olmo_config *cfg, const char *tokenizer_path, const char *out_dir);
/* Loads weights from dir/model.safetensors or the shards listed in
 * dir/model.safetensors.index.json (any float dtype, widened to fp32). */
int olmo_hf_load_weights(struct olmo_model *m, const char *dir);
/* Writes every parameter to one safetensors file in OLMO_ST_F32 or OLMO_ST_BF16
 * (round to nearest even), with {"format": "pt"} metadata as transformers writes. */
int olmo_hf_save_weights(const struct olmo_model *m, const char *path, enum olmo_st_dtype dtype);

#endif
