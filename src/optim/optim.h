/* AdamW with OLMo-core's parameter groups (no decay on embeddings),
 * global-norm gradient clipping, and the learning-rate schedules of the
 * Olmo 3 recipe: linear warmup + cosine (Stage 1), linear decay (Stage 2). */
#ifndef OLMOC_OPTIM_H
#define OLMOC_OPTIM_H

#include "config/config.h"
#include "dist/dist.h"
#include "model/model.h"
#include "optim/schedule.h" /* olmo_lr_at_batch: the learning-rate schedules */

/* ZeRO-1: with several data-parallel ranks each rank keeps the Adam moments
 * of (and updates) only its contiguous shard [lo, hi) of the flat parameter
 * buffer; the updated shards are then all-gathered.  One rank: lo = 0, hi = all. */
/* One piece of a rank's shard: flat parameters [global, global + len) are
 * at [local, local + len) of the rank's shard buffers (its fp32 master
 * weights, gradient shard and Adam moments).  ZeRO-1 has one piece, [lo, hi)
 * at 0; a fully sharded run has a slice of every unit.  Checkpoints save and
 * load shards by these pieces, so a checkpoint written with one layout
 * loads into another. */
struct olmo_shard_range {
    size_t global, local, len;
};

/* OLMo-core's SkipStepOptimizer window (train.optimizer: skip_step_adamw): the CE loss and the
 * gradient norm before clipping of the last rolling_interval_length + 1 steps, skipped steps
 * included, oldest first.  Values are held as the float32 tensors OLMo-core keeps.  Gradient
 * norms are recorded only when clipping is on (OLMo-core sets latest_grad_norm in its clipping
 * branch); without them only the loss decides. */
struct olmo_skip_window {
    int cap;              /* rolling_interval_length + 1; 0 = no window (plain AdamW) */
    int n_loss, n_norm;   /* entries held */
    double *loss, *norm;  /* cap entries each */
};

struct olmo_optimizer {
    float *m, *v;  /* backend buffers of hi - lo floats (shard-local indexing) */
    size_t lo, hi; /* this rank's shard of the flat parameters */
    long step;     /* optimizer steps taken */
    struct olmo_shard_range *ranges; /* this rank's pieces, by global offset; n_local = their total length */
    int n_ranges;
    size_t n_local;
    struct olmo_skip_window win; /* skip_step_adamw only */
    float *master; /* fully sharded (train/fsdp.h): this rank's fp32 master shard; NULL = ZeRO-1 */
    bool primary;  /* this rank's shards are the ones a gather uses (HSDP: the first replica group's) */
};

/* This rank's fp32 master weights, shard-local indexing (ZeRO-1: the model's weights from lo;
 * fully sharded: the master shard). */
float *olmo_optimizer_master(const struct olmo_optimizer *opt, const struct olmo_model *m);


int olmo_optimizer_create(struct olmo_optimizer *opt, const struct olmo_model *m, const struct olmo_dist *dist);
void olmo_optimizer_destroy(struct olmo_optimizer *opt, const struct olmo_model *m);
/* Applies the optimizer choice of train (allocates the skip-step window); after create. */
int olmo_optimizer_configure(struct olmo_optimizer *opt, const struct olmo_train_config *t);
/* The exponent of Adam's bias corrections for the update that makes opt->step applied updates:
 * OLMo-core's state["step"] + 1 -- shifted by the zero-LR initial step (train.optim_init_step),
 * always 1 for skip_step_adamw without step_increment_bugfix (its step never increments). */
long olmo_optimizer_bias_step(const struct olmo_optimizer *opt, const struct olmo_train_config *t);

/* SkipStepOptimizer: records a step's CE loss and gradient norm before clipping (has_norm: clipping
 * is on) as the latest_loss / latest_grad_norm setters do, keeping the last cap entries. */
void olmo_skip_window_push(struct olmo_skip_window *w, double loss, bool has_norm, double grad_norm);
/* get_step_factor(): 0 (step) while the window holds fewer than max(2, rolling_interval_length / 2)
 * losses; else whether (latest - mean) <= sigma_factor * std (std with Bessel's correction, over the
 * entries before the latest) holds for the loss and, when recorded, for the gradient norm: the
 * OLMO_SPIKE_* bits of the values where it does not (skip the step).  A NaN statistic compares
 * false, so it skips, as in torch. */
enum { OLMO_SPIKE_LOSS = 1, OLMO_SPIKE_GRAD_NORM = 2 };
int olmo_skip_window_spikes(const struct olmo_skip_window *w, int rolling_interval_length, double sigma_factor);

/* Optimizer state beyond the moments and opt->step, for checkpoints: the skip-step window as
 * doubles ([n_loss, n_norm, losses..., norms...]; empty for plain AdamW).  All ranks hold the same
 * window (it sees all-reduced values), so rank 0's copy is the state.  Note that OLMo-core itself
 * does not checkpoint the window (it is not in Optimizer.state_dict()): its resumed runs restart
 * with an empty window; restoring it makes a resumed olmoc run equal an uninterrupted one. */
size_t olmo_optimizer_extra_count(const struct olmo_optimizer *opt);
void olmo_optimizer_extra_get(const struct olmo_optimizer *opt, double *out); /* extra_count doubles */
/* 0, or -1 (error set) when `in` is not a window of this optimizer (sizes, non-finite values). */
int olmo_optimizer_extra_set(struct olmo_optimizer *opt, const double *in, size_t n);

int olmo_grad_norm_of(const struct olmo_model *m, double *norm); /* 0, or -1 with the error set */
/* torch.nn.utils.clip_grad_norm_'s factor: max_norm / (norm + 1e-6) as a float when that is < 1 (and
 * max_norm > 0), else 1 (no clipping). */
float olmo_clip_scale(double norm, double max_norm);
/* torch.nn.utils.clip_grad_norm_: scales grads by olmo_clip_scale when that is not 1. */
int olmo_clip_grads(struct olmo_model *m, double norm, double max_norm);
/* Updates this rank's shard of the parameters (no communication). */
int olmo_optimizer_step(struct olmo_optimizer *opt, struct olmo_model *m, const struct olmo_train_config *t,
                         double lr);
/* olmo_clip_grads then olmo_optimizer_step, in one pass over this rank's shard where the backend has
 * adamw_flat (a multi-tensor AdamW: the clipping coefficient applied inside, the weight decays by range;
 * ZeRO-1 layouts, not a fully sharded one).  with_compute: write the compute copy of the updated shard
 * in the same pass, where there is one; *synced says whether it was (else the caller refreshes it). */
int olmo_optimizer_clip_step(struct olmo_optimizer *opt, struct olmo_model *m, const struct olmo_train_config *t,
                             double lr, double norm, bool with_compute, bool *synced);
/* Collective (every rank of dist): full-size host copies of both moments, assembled from every rank's shard
 * (any layout of opt->ranges). */
int olmo_optimizer_gather(const struct olmo_optimizer *opt, const struct olmo_model *m, const struct olmo_dist *dist,
                          float *m_host, float *v_host);
/* Takes this rank's shard (opt->ranges) out of full-size host copies of both moments. */
int olmo_optimizer_scatter(struct olmo_optimizer *opt, const struct olmo_model *m, const float *m_host,
                            const float *v_host);

#endif
