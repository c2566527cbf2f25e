/* AdamW with OLMo-core's parameter groups (no decay on embeddings),
 * global-norm gradient clipping, and the learning-rate schedules of the
 * Olmo 3 recipe: linear warmup + cosine (Stage 1), linear decay (Stage 2). */
#ifndef OLMOC_OPTIM_H
#define OLMOC_OPTIM_H

#include "config/config.h"
#include "model/model.h"

struct olmo_optimizer {
    float *m, *v; /* backend buffers with the parameter layout */
    long step;    /* optimizer steps taken */
};

/* Learning rate for the optimizer step number `step` (1-based), following
 * OLMo-core's CosWithWarmup / LinearWithWarmup / ConstantScheduler. */
double olmo_lr_at(const struct olmo_train_config *t, long step);

int olmo_optimizer_create(struct olmo_optimizer *opt, const struct olmo_model *m);
void olmo_optimizer_destroy(struct olmo_optimizer *opt, const struct olmo_model *m);
/* Global L2 norm of all gradients. */
double olmo_grad_norm(const struct olmo_model *m);
/* torch.nn.utils.clip_grad_norm_: scales grads by max_norm / (norm + 1e-6) when that is < 1. */
void olmo_clip_grads(struct olmo_model *m, double norm, double max_norm);
void olmo_optimizer_step(struct olmo_optimizer *opt, struct olmo_model *m, const struct olmo_train_config *t,
                         double lr);

#endif
