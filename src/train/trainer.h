/* One optimizer step of the Olmo 3 recipe: forward/backward over
 * grad_accum micro-batches, loss normalised by the batch's label count (as
 * OLMo-core does), gradient clipping, scheduled AdamW update. */
#ifndef OLMOC_TRAINER_H
#define OLMOC_TRAINER_H

#include "config/config.h"
#include "dist/dist.h"
#include "model/model.h"
#include "optim/optim.h"
#include "train/fsdp.h"

struct olmo_trainer;

/* The data-parallel strategy, chosen once at olmo_trainer_init_dist from
 * train.sharding, the number of ranks and the backend (as OLMo-core's
 * parallelize_model does): "none" (one rank), "zero1" (gradients all-reduced
 * through MPI on host memory, optimizer state sharded, updated shards
 * all-gathered), "zero1-device" (the same through the backend's collectives,
 * NCCL), "fsdp" (train/fsdp.h) and "hsdp" (fsdp in groups of
 * train.shard_degree < world ranks).  The step calls these; nothing else
 * asks which mode it is in.  Each returns 0, or -1 with the error set. */
struct olmo_dp_strategy {
    const char *name;
    /* The model and what the strategy keeps beside it (communicators, shards), in that order. */
    int (*create_model)(struct olmo_trainer *tr);
    /* The optimizer state, once the model has reserved its activations. */
    int (*create_optimizer)(struct olmo_trainer *tr);
    /* Releases what create_model kept beside the model (safe after a partial create). */
    void (*destroy)(struct olmo_trainer *tr);
    /* Before the first micro-batch: gradients start from zero (or the first backward overwrites them). */
    int (*zero_grads)(struct olmo_trainer *tr);
    /* After the last micro-batch: every rank's gradients and the loss sums (cross-entropy, lse^2) combined. */
    int (*sync_grads)(struct olmo_trainer *tr, double sums[2]);
    /* Global gradient L2 norm. */
    int (*grad_norm)(struct olmo_trainer *tr, double *norm);
    /* Gradient clipping to train.clip_grad_norm, the AdamW update at lr, and the weights refreshed. */
    int (*clip_step)(struct olmo_trainer *tr, double norm, double lr);
    /* Collective: the master weights were written from outside (olmo_trainer_master_updated). */
    int (*weights_updated)(struct olmo_trainer *tr);
    int (*init_weights)(struct olmo_trainer *tr, uint64_t seed);
};

struct olmo_trainer {
    struct olmo_config cfg;
    struct olmo_model model;
    struct olmo_optimizer opt;
    const struct olmo_dist *dist; /* data-parallel ranks; NULL = one process */
    const struct olmo_backend *be;
    const struct olmo_dp_strategy *dp; /* how the ranks share the work (never NULL after init) */
    bool fully_sharded;           /* train.sharding: fsdp (model.weights / model.grads are NULL: see fsdp) */
    struct olmo_fsdp fsdp;
    bool device_comm;             /* collectives through the backend (NCCL), not MPI on host memory */
    int32_t *inputs, *targets;    /* host staging for one micro-batch */
    long skipped;                 /* steps skipped (no update): the LR schedule counts them, Adam's bias
                                   * correction (opt.step) does not, as in OLMo-core's SkipStepAdamW
                                   * (step_increment_bugfix: its step advances by the step factor, 0) */
    long adam_step_base;          /* Adam steps carried from an earlier stage (olmoc train --init-from CKPT
                                   * --with-optimizer-state, OLMo-core's load_optim_state without trainer
                                   * state): opt.step started there, the LR schedule at 0 */
};

struct olmo_step_result {
    double ce_loss;   /* mean cross-entropy over the batch's labels */
    double z_loss;    /* mean z-loss term (already multiplied by z_mult) */
    double grad_norm; /* before clipping */
    double lr;
    long loss_tokens;
    bool skipped; /* the update was not applied (olmo_trainer_skip) */
};

/* What to do with a step once its loss and gradient norm are known. */
enum olmo_step_verdict { OLMO_STEP_APPLY, OLMO_STEP_SKIP, OLMO_STEP_STOP };

/* On failure everything made so far is released (no olmo_trainer_destroy needed). */
int olmo_trainer_init(struct olmo_trainer *tr, const struct olmo_config *cfg, const struct olmo_backend *be);
/* Data-parallel variant: train.grad_accum is per rank, so a step consumes
 * world * grad_accum * micro_batch instances; every rank is given the whole
 * batch and works on its own slice.  train.sharding zero1: gradients are
 * all-reduced and the optimizer state is sharded (ZeRO-1); fsdp: weights,
 * gradients and optimizer state are sharded (train/fsdp.h), in groups of
 * train.shard_degree ranks (HSDP).  dist must outlive the trainer. */
int olmo_trainer_init_dist(struct olmo_trainer *tr, const struct olmo_config *cfg, const struct olmo_backend *be,
                           const struct olmo_dist *dist);
/* Collective, after every rank wrote its shard of the master weights (olmo_optimizer_master, e.g. a
 * sharded checkpoint load): ZeRO-1 all-gathers the shards into model.weights and refreshes the compute
 * copy; fsdp drops what it had gathered. */
int olmo_trainer_master_updated(struct olmo_trainer *tr);
/* OLMo-core's initialisation (olmo_model_init_weights) on either layout. */
int olmo_trainer_init_weights(struct olmo_trainer *tr, uint64_t seed);
/* The learning rate of the next optimizer step (skipped steps count). */
double olmo_trainer_next_lr(const struct olmo_trainer *tr);
/* Instances per optimizer step over all ranks. */
size_t olmo_trainer_batch_rows(const struct olmo_trainer *tr);
void olmo_trainer_destroy(struct olmo_trainer *tr);
/* instances: olmo_trainer_batch_rows() rows of seq_len tokens.  Labels are
 * the inputs shifted left; the last position of each row has no label.
 * accumulate, olmo_step_check, then update or skip; a step that must stop
 * the run (train.nonfinite: stop) fails with the reason. */
int olmo_trainer_step(struct olmo_trainer *tr, const int32_t *instances, struct olmo_step_result *res);
/* The step guard: a loss or gradient norm that is not finite stops the run
 * (train.nonfinite: stop) or skips the step (skip).  With train.optimizer
 * skip_step_adamw the step's CE loss and gradient norm (before clipping) then
 * join OLMo-core's SkipStepAdamW rolling window, and a spike (more than
 * train.sigma_factor standard deviations above the window's mean) skips the
 * step.  why (n bytes, OLMO_STEP_WHY_MAX is enough) says which value and which
 * setting.  Every rank decides on the same all-reduced values, so all ranks
 * agree without another collective.  Call it once per step: it records the step. */
#define OLMO_STEP_WHY_MAX 192
enum olmo_step_verdict olmo_step_check(struct olmo_trainer *tr, const struct olmo_step_result *res, char *why,
                                       size_t n);
/* The two halves of a step: gradients (and losses, grad norm) of the batch ... */
int olmo_trainer_accumulate(struct olmo_trainer *tr, const int32_t *instances, struct olmo_step_result *res);
/* ... then clipping and the scheduled AdamW update (fills res->lr). */
int olmo_trainer_update(struct olmo_trainer *tr, struct olmo_step_result *res);
/* ... or no update at all (weights, optimizer state and opt.step unchanged);
 * fills res->lr with the LR the step would have had and sets res->skipped. */
void olmo_trainer_skip(struct olmo_trainer *tr, struct olmo_step_result *res);

#endif
