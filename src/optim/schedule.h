/* Learning-rate schedules, as OLMo-core's olmo_core.optim.scheduler computes
 * them (same branches, same floating-point operations in the same order, so
 * the same doubles):
 *
 *   cosine (cos_with_warmup)          CosWithWarmup(warmup, alpha_f)
 *   linear (linear_with_warmup)       LinearWithWarmup(warmup, alpha_f)
 *   half_cos_with_warmup              HalfCosWithWarmup(warmup, alpha_f): the
 *                                     second half of a cosine, after a warmup to
 *                                     its midpoint
 *   wsd                               WSD(warmup, decay or decay_fraction), to 0
 *   constant                          ConstantScheduler
 *
 * `step` is OLMo-core's trainer.global_step when the optimizer steps: 1 for
 * the first step.  The schedule length t_max is train.schedule_tokens
 * converted as OLMo-core's Trainer converts a Duration.tokens (ceil(tokens /
 * global batch tokens)), else train.schedule_steps, else train.steps.
 *
 * A second part (train.schedule2, after step train.schedule2_after) replaces
 * the schedule from there on with its own kind, warmup and length, the way the
 * Olmo 3 7B Stage 1 run was resumed with a new scheduler (OLMo-core
 * src/scripts/official/OLMo3/OLMo-3-1025-7B-pretrain-1.py / -2.py). */
#ifndef OLMOC_SCHEDULE_H
#define OLMOC_SCHEDULE_H

#include "config/config.h"

/* OLMo-core Trainer: max steps of a Duration.tokens(tokens) at tokens_per_step. */
long olmo_schedule_steps_for_tokens(long tokens, long tokens_per_step);
/* The learning rate of optimizer step `step` (1-based) with global batches of
 * tokens_per_step tokens (micro_batch x grad_accum x ranks x seq_len). */
double olmo_lr_at_batch(const struct olmo_train_config *t, long tokens_per_step, long step);

#endif
