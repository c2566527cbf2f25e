#include "train/trainer.h"

#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

static int world_size(const struct olmo_trainer *tr) { return tr->dist ? tr->dist->world : 1; }

/* ---- the data-parallel strategies */

/* one model, full-size weights and gradients (every strategy but fsdp) */
static int replicated_create_model(struct olmo_trainer *tr) {
    return olmo_model_create(&tr->model, &tr->cfg.model, tr->be);
}

/* ZeRO-1 on the backend's collectives: its communicator first */
static int device_create_model(struct olmo_trainer *tr) {
    const struct olmo_backend *be = tr->be;
    if (!be->comm_init)
        return olmo_error("backend '%s' keeps gradients in device memory and this build has no collective "
                          "library for it (NCCL): it cannot train with %d ranks",
                          be->name, world_size(tr));
    if (be->comm_init(be, tr->dist)) return -1;
    tr->device_comm = true;
    return replicated_create_model(tr);
}

/* each rank keeps the moments of its shard (one rank: all of them) */
static int replicated_create_optimizer(struct olmo_trainer *tr) {
    return olmo_optimizer_create(&tr->opt, &tr->model, tr->dist);
}

static void replicated_destroy(struct olmo_trainer *tr) { (void)tr; }

static void device_destroy(struct olmo_trainer *tr) {
    if (tr->device_comm) tr->be->comm_destroy(tr->be);
    tr->device_comm = false;
}

/* the first micro-batch's backward sets the gradients (no memset of them all first) */
static int replicated_zero_grads(struct olmo_trainer *tr) {
    tr->model.overwrite_grads = true;
    return 0;
}

static int none_sync_grads(struct olmo_trainer *tr, double sums[2]) {
    (void)tr, (void)sums;
    return 0;
}

static int zero1_sync_grads(struct olmo_trainer *tr, double sums[2]) {
    const struct olmo_model *m = &tr->model;
    return olmo_dist_allreduce_f32(tr->dist, m->grads, m->n_floats) || olmo_dist_allreduce_f64(tr->dist, sums, 2)
               ? -1
               : 0;
}

static int device_sync_grads(struct olmo_trainer *tr, double sums[2]) {
    const struct olmo_model *m = &tr->model;
    return m->be->comm_allreduce_sum(m->be, m->grads, m->n_floats) || olmo_dist_allreduce_f64(tr->dist, sums, 2)
               ? -1
               : 0;
}

static int replicated_grad_norm(struct olmo_trainer *tr, double *norm) { return olmo_grad_norm_of(&tr->model, norm); }

static int none_weights_updated(struct olmo_trainer *tr) { return olmo_model_sync_weights(&tr->model); }

/* one rank: the optimizer's pass writes the compute copy too (none_weights_updated's conversion) */
static int replicated_clip_step(struct olmo_trainer *tr, double norm, double lr) {
    const struct olmo_train_config *t = &tr->cfg.train;
    const bool one = tr->dp->weights_updated == none_weights_updated;
    bool synced;
    if (olmo_optimizer_clip_step(&tr->opt, &tr->model, t, lr, norm, one, &synced)) return -1;
    return synced ? 0 : tr->dp->weights_updated(tr);
}

/* every rank updated its own shard: share them (through MPI, or the backend's collectives) */
static int share_shards(struct olmo_trainer *tr, bool device) {
    size_t *offsets = olmo_malloc(sizeof(size_t) * (size_t)(tr->dist->world + 1), "shard offsets");
    if (!offsets) return -1;
    olmo_dist_shard_offsets(tr->dist, tr->model.n_floats, offsets);
    int rc = device ? tr->model.be->comm_allgather(tr->model.be, tr->model.weights, offsets)
                    : olmo_dist_allgather_f32(tr->dist, tr->model.weights, offsets);
    free(offsets);
    return rc ? rc : olmo_model_sync_weights(&tr->model);
}

static int zero1_weights_updated(struct olmo_trainer *tr) { return share_shards(tr, false); }

static int device_weights_updated(struct olmo_trainer *tr) { return share_shards(tr, true); }

static int replicated_init_weights(struct olmo_trainer *tr, uint64_t seed) {
    return olmo_model_init_weights(&tr->model, seed);
}

/* fsdp: its own communicators (train/fsdp.h) */
static int fsdp_create_model(struct olmo_trainer *tr) {
    return olmo_model_create_sharded(&tr->model, &tr->cfg.model, tr->be) ||
                   olmo_fsdp_create(&tr->fsdp, &tr->model, &tr->opt, tr->dist, tr->cfg.train.shard_degree)
               ? -1
               : 0;
}

/* olmo_fsdp_create made the optimizer's shards */
static int fsdp_create_optimizer(struct olmo_trainer *tr) {
    (void)tr;
    return 0;
}

static void fsdp_destroy(struct olmo_trainer *tr) { olmo_fsdp_destroy(&tr->fsdp, &tr->opt); }

static int fsdp_zero_grads(struct olmo_trainer *tr) {
    if (olmo_fsdp_zero_grads(&tr->fsdp)) return -1;
    tr->model.overwrite_grads = false;
    return 0;
}

/* the blocks' gradients were reduce-scattered as the backward pass went */
static int fsdp_sync_grads(struct olmo_trainer *tr, double sums[2]) {
    return olmo_fsdp_sync_replicas(&tr->fsdp) || (tr->dist && olmo_dist_allreduce_f64(tr->dist, sums, 2)) ? -1 : 0;
}

static int fsdp_grad_norm(struct olmo_trainer *tr, double *norm) { return olmo_fsdp_grad_norm(&tr->fsdp, norm); }

/* each rank updates its shard; the next forward pass gathers the blocks */
static int fsdp_clip_step(struct olmo_trainer *tr, double norm, double lr) {
    const struct olmo_train_config *t = &tr->cfg.train;
    return olmo_fsdp_clip_step(&tr->fsdp, &tr->opt, t, lr, norm);
}

static int fsdp_weights_updated(struct olmo_trainer *tr) { return olmo_fsdp_master_updated(&tr->fsdp); }

static int fsdp_init_weights(struct olmo_trainer *tr, uint64_t seed) { return olmo_fsdp_init_weights(&tr->fsdp, seed); }

#define REPLICATED(create, destroy_, sync, updated)                                                                  \
    .create_model = create, .create_optimizer = replicated_create_optimizer, .destroy = destroy_,                    \
    .zero_grads = replicated_zero_grads, .sync_grads = sync, .grad_norm = replicated_grad_norm,                      \
    .clip_step = replicated_clip_step, .weights_updated = updated,\
    .init_weights = replicated_init_weights
#define SHARDED                                                                                                       \
    .create_model = fsdp_create_model, .create_optimizer = fsdp_create_optimizer, .destroy = fsdp_destroy,           \
    .zero_grads = fsdp_zero_grads, .sync_grads = fsdp_sync_grads, .grad_norm = fsdp_grad_norm,                      \
    .clip_step = fsdp_clip_step, .weights_updated = fsdp_weights_updated,\
    .init_weights = fsdp_init_weights

static const struct olmo_dp_strategy DP_NONE = {
    .name = "none", REPLICATED(replicated_create_model, replicated_destroy, none_sync_grads, none_weights_updated)};
static const struct olmo_dp_strategy DP_ZERO1 = {
    .name = "zero1", REPLICATED(replicated_create_model, replicated_destroy, zero1_sync_grads, zero1_weights_updated)};
static const struct olmo_dp_strategy DP_ZERO1_DEVICE = {
    .name = "zero1-device", REPLICATED(device_create_model, device_destroy, device_sync_grads, device_weights_updated)};
static const struct olmo_dp_strategy DP_FSDP = {.name = "fsdp", SHARDED};
static const struct olmo_dp_strategy DP_HSDP = {.name = "hsdp", SHARDED};

static const struct olmo_dp_strategy *choose_strategy(const struct olmo_train_config *t, const struct olmo_backend *be,
                                                      int world) {
    if (t->sharding == OLMO_SHARDING_FSDP) return t->shard_degree && t->shard_degree < world ? &DP_HSDP : &DP_FSDP;
    if (world == 1) return &DP_NONE;
    return be->host_memory ? &DP_ZERO1 : &DP_ZERO1_DEVICE;
}

/* ---- the trainer */

int olmo_trainer_init(struct olmo_trainer *tr, const struct olmo_config *cfg, const struct olmo_backend *be) {
    return olmo_trainer_init_dist(tr, cfg, be, NULL);
}

static int trainer_create(struct olmo_trainer *tr) {
    const struct olmo_config *cfg = &tr->cfg;
    if (olmo_config_validate(cfg)) return -1;
    /* the model indexes a micro-batch's tokens with int */
    const long long micro_tokens = (long long)cfg->train.micro_batch * cfg->train.seq_len;
    if (micro_tokens > INT_MAX)
        return olmo_error("train.micro_batch x train.seq_len = %d x %d = %lld tokens: more than a micro-batch can "
                          "hold (%d)",
                          cfg->train.micro_batch, cfg->train.seq_len, micro_tokens, INT_MAX);
    tr->dp = choose_strategy(&cfg->train, tr->be, world_size(tr));
    tr->fully_sharded = cfg->train.sharding == OLMO_SHARDING_FSDP;
    if (tr->dp->create_model(tr)) return -1;
    if (olmo_model_set_checkpointing(&tr->model, cfg->train.activation_checkpointing, cfg->train.block_every) ||
        olmo_model_set_saved_all_bf16(&tr->model, cfg->train.saved_activations == OLMO_SAVED_ACTS_BF16))
        return -1;
    if (olmo_model_reserve(&tr->model, cfg->train.micro_batch, cfg->train.seq_len)) return -1;
    if (tr->dp->create_optimizer(tr)) return -1;
    if (olmo_optimizer_configure(&tr->opt, &cfg->train)) return -1;
    size_t n = (size_t)cfg->train.micro_batch * cfg->train.seq_len;
    tr->inputs = olmo_malloc(n * sizeof(int32_t), "input batch");
    tr->targets = olmo_malloc(n * sizeof(int32_t), "target batch");
    if (!tr->inputs || !tr->targets) return -1;
    return 0;
}

int olmo_trainer_init_dist(struct olmo_trainer *tr, const struct olmo_config *cfg, const struct olmo_backend *be,
                           const struct olmo_dist *dist) {
    memset(tr, 0, sizeof *tr);
    tr->cfg = *cfg;
    tr->dist = dist;
    tr->be = be;
    if (trainer_create(tr) == 0) return 0;
    olmo_trainer_destroy(tr); /* whatever a refused or failed creation had made */
    return -1;
}

void olmo_trainer_destroy(struct olmo_trainer *tr) {
    if (tr->dp) tr->dp->destroy(tr);
    if (tr->model.be) olmo_optimizer_destroy(&tr->opt, &tr->model);
    olmo_model_destroy(&tr->model);
    free(tr->inputs);
    free(tr->targets);
    memset(tr, 0, sizeof *tr);
}

/* Splits rows into model inputs and next-token targets (last position: -100). */
static long stage_micro_batch(struct olmo_trainer *tr, const int32_t *rows, int n_rows) {
    const int T = tr->cfg.train.seq_len;
    long labels = 0;
    memcpy(tr->inputs, rows, sizeof(int32_t) * (size_t)n_rows * T);
    for (int r = 0; r < n_rows; r++) {
        for (int t = 0; t < T - 1; t++) tr->targets[r * T + t] = rows[r * T + t + 1];
        tr->targets[r * T + T - 1] = -100;
        labels += T - 1;
    }
    return labels;
}

size_t olmo_trainer_batch_rows(const struct olmo_trainer *tr) {
    return (size_t)world_size(tr) * tr->cfg.train.grad_accum * tr->cfg.train.micro_batch;
}

int olmo_trainer_accumulate(struct olmo_trainer *tr, const int32_t *instances, struct olmo_step_result *res) {
    const struct olmo_train_config *t = &tr->cfg.train;
    struct olmo_model *m = &tr->model;
    const int micro = t->micro_batch, T = t->seq_len;
    const long total_labels = (long)olmo_trainer_batch_rows(tr) * (T - 1);
    if (total_labels <= 0) return olmo_error("train.seq_len must be at least 2 to have a next-token label");
    /* this rank's slice of the global batch */
    const int32_t *mine = instances + (size_t)(tr->dist ? tr->dist->rank : 0) * t->grad_accum * micro * T;
    double sums[2] = {0.0, 0.0}; /* cross-entropy, lse^2 */
    if (tr->dp->zero_grads(tr)) return -1;
    /* a device backend keeps the sums on the device until the last micro-batch: no copy back, and so no
     * wait for the device, inside a micro-batch (the accumulator adds as the loop below would) */
    const bool defer = m->be->loss_sums != NULL;
    if (defer && m->be->loss_sums(m->be, NULL, NULL)) return -1; /* cleared (an earlier step may have failed) */
    for (int a = 0; a < t->grad_accum; a++) {
        stage_micro_batch(tr, mine + (size_t)a * micro * T, micro);
        if (olmo_model_forward(m, tr->inputs, t->intra_doc_masking)) return -1;
        double ce_sum = 0.0, z_sum = 0.0;
        if (olmo_model_loss(m, tr->targets, (float)(1.0 / (double)total_labels), (float)t->z_loss,
                            defer ? NULL : &ce_sum, defer ? NULL : &z_sum) ||
            olmo_model_backward(m))
            return -1;
        sums[0] += ce_sum;
        sums[1] += z_sum;
    }
    if (defer && m->be->loss_sums(m->be, &sums[0], &sums[1])) return -1;
    if (tr->dp->sync_grads(tr, sums)) return -1;
    res->ce_loss = sums[0] / (double)total_labels;
    res->z_loss = t->z_loss * sums[1] / (double)total_labels;
    res->loss_tokens = total_labels;
    return tr->dp->grad_norm(tr, &res->grad_norm);
}

int olmo_trainer_update(struct olmo_trainer *tr, struct olmo_step_result *res) {
    /* the LR depends on neither the gradients nor their clipping */
    res->lr = olmo_trainer_next_lr(tr);
    res->skipped = false;
    return tr->dp->clip_step(tr, res->grad_norm, res->lr);
}

int olmo_trainer_master_updated(struct olmo_trainer *tr) { return tr->dp->weights_updated(tr); }

int olmo_trainer_init_weights(struct olmo_trainer *tr, uint64_t seed) { return tr->dp->init_weights(tr, seed); }

double olmo_trainer_next_lr(const struct olmo_trainer *tr) {
    /* skipped steps advance the schedule (as OLMo-core's trainer.global_step); the schedule's
     * length in tokens counts the global batch of every rank */
    const struct olmo_train_config *t = &tr->cfg.train;
    return olmo_lr_at_batch(t, (long)olmo_trainer_batch_rows(tr) * t->seq_len,
                            tr->opt.step - tr->adam_step_base + tr->skipped + 1);
}

void olmo_trainer_skip(struct olmo_trainer *tr, struct olmo_step_result *res) {
    res->lr = olmo_trainer_next_lr(tr);
    res->skipped = true;
    tr->skipped++;
}

enum olmo_step_verdict olmo_step_check(struct olmo_trainer *tr, const struct olmo_step_result *res, char *why,
                                       size_t n) {
    const struct olmo_train_config *t = &tr->cfg.train;
    const char *what = !isfinite(res->ce_loss) ? "loss"
                       : !isfinite(res->z_loss) ? "z-loss"
                       : !isfinite(res->grad_norm) ? "gradient norm"
                                                  : NULL;
    if (what) {
        /* train.nonfinite decides; the value stays out of the skip-step window (in OLMo-core a NaN there
         * would make every comparison false, and NaN gradients reach the moments even on a skipped step) */
        const double v = !isfinite(res->ce_loss) ? res->ce_loss : !isfinite(res->z_loss) ? res->z_loss : res->grad_norm;
        snprintf(why, n, "the %s is %s%s", what, isnan(v) ? "NaN" : v > 0 ? "+inf" : "-inf",
                 t->nonfinite == OLMO_NONFINITE_SKIP ? " (train.nonfinite: skip)" : "");
        return t->nonfinite == OLMO_NONFINITE_SKIP ? OLMO_STEP_SKIP : OLMO_STEP_STOP;
    }
    if (t->optimizer != OLMO_OPTIM_SKIP_STEP_ADAMW) return OLMO_STEP_APPLY;
    /* SkipStepAdamW: the step's values join the window first (skipped or not), then get_step_factor() */
    olmo_skip_window_push(&tr->opt.win, res->ce_loss, t->clip_grad_norm > 0, res->grad_norm);
    const int spikes = olmo_skip_window_spikes(&tr->opt.win, t->rolling_interval_length, t->sigma_factor);
    if (!spikes) return OLMO_STEP_APPLY;
    snprintf(why, n, "%s%s%s more than %g standard deviations above the mean of the last %d steps "
             "(train.optimizer: skip_step_adamw)",
             spikes & OLMO_SPIKE_LOSS ? "the loss" : "", spikes == (OLMO_SPIKE_LOSS | OLMO_SPIKE_GRAD_NORM) ? " and " : "",
             spikes & OLMO_SPIKE_GRAD_NORM ? "the gradient norm" : "", t->sigma_factor, tr->opt.win.n_loss - 1);
    return OLMO_STEP_SKIP;
}

int olmo_trainer_step(struct olmo_trainer *tr, const int32_t *instances, struct olmo_step_result *res) {
    if (olmo_trainer_accumulate(tr, instances, res)) return -1;
    char why[OLMO_STEP_WHY_MAX];
    switch (olmo_step_check(tr, res, why, sizeof why)) {
    case OLMO_STEP_APPLY: return olmo_trainer_update(tr, res);
    case OLMO_STEP_SKIP: olmo_trainer_skip(tr, res); return 0;
    case OLMO_STEP_STOP: break;
    }
    return olmo_error("%s (train.nonfinite: stop)", why);
}

