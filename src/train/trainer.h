/* One optimizer step of the Olmo 3 recipe: forward/backward over
 * grad_accum micro-batches, loss normalised by the batch's label count (as
 * OLMo-core does), gradient clipping, scheduled AdamW update. */
#ifndef OLMOC_TRAINER_H
#define OLMOC_TRAINER_H

#include "config/config.h"
#include "dist/dist.h"
#include "model/model.h"
#include "optim/optim.h"

struct olmo_trainer {
    struct olmo_config cfg;
    struct olmo_model model;
    struct olmo_optimizer opt;
    const struct olmo_dist *dist; /* data-parallel ranks; NULL = one process */
    bool device_comm;             /* collectives through the backend (NCCL), not MPI on host memory */
    int32_t *inputs, *targets;    /* host staging for one micro-batch */
};

struct olmo_step_result {
    double ce_loss;   /* mean cross-entropy over the batch's labels */
    double z_loss;    /* mean z-loss term (already multiplied by z_mult) */
    double grad_norm; /* before clipping */
    double lr;
    long loss_tokens;
};

int olmo_trainer_init(struct olmo_trainer *tr, const struct olmo_config *cfg, const struct olmo_backend *be);
/* Data-parallel variant: train.grad_accum is per rank, so a step consumes
 * world * grad_accum * micro_batch instances; every rank is given the whole
 * batch and works on its own slice; gradients are all-reduced and the
 * optimizer state is sharded (ZeRO-1).  dist must outlive the trainer. */
int olmo_trainer_init_dist(struct olmo_trainer *tr, const struct olmo_config *cfg, const struct olmo_backend *be,
                           const struct olmo_dist *dist);
/* Instances per optimizer step over all ranks. */
size_t olmo_trainer_batch_rows(const struct olmo_trainer *tr);
void olmo_trainer_destroy(struct olmo_trainer *tr);
/* instances: olmo_trainer_batch_rows() rows of seq_len tokens.  Labels are
 * the inputs shifted left; the last position of each row has no label. */
int olmo_trainer_step(struct olmo_trainer *tr, const int32_t *instances, struct olmo_step_result *res);
/* The two halves of a step: gradients (and losses, grad norm) of the batch ... */
int olmo_trainer_accumulate(struct olmo_trainer *tr, const int32_t *instances, struct olmo_step_result *res);
/* ... then clipping and the scheduled AdamW update (fills res->lr). */
int olmo_trainer_update(struct olmo_trainer *tr, struct olmo_step_result *res);
/* Loss only (no update): mean CE over instances (n_rows rows of seq_len). */
int olmo_trainer_eval(struct olmo_trainer *tr, const int32_t *instances, int n_rows, double *ce_loss);

#endif
