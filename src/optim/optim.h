/* AdamW with OLMo-core's parameter groups (no decay on embeddings),
 * global-norm gradient clipping, and the learning-rate schedules of the
 * Olmo 3 recipe: linear warmup + cosine (Stage 1), linear decay (Stage 2). */
#ifndef OLMOC_OPTIM_H
#define OLMOC_OPTIM_H

#include "config/config.h"
#include "dist/dist.h"
#include "model/model.h"
#include "optim/schedule.h" /* olmo_lr_at: the learning-rate schedules */

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

struct olmo_optimizer {
    float *m, *v;  /* backend buffers of hi - lo floats (shard-local indexing) */
    size_t lo, hi; /* this rank's shard of the flat parameters */
    long step;     /* optimizer steps taken */
    struct olmo_shard_range *ranges; /* this rank's pieces, by global offset; n_local = their total length */
    int n_ranges;
    size_t n_local;
    float *master; /* fully sharded (train/fsdp.h): this rank's fp32 master shard; NULL = ZeRO-1 */
    bool primary;  /* this rank's shards are the ones a gather uses (HSDP: the first replica group's) */
};

/* This rank's fp32 master weights, shard-local indexing (ZeRO-1: the model's weights from lo;
 * fully sharded: the master shard). */
float *olmo_optimizer_master(const struct olmo_optimizer *opt, const struct olmo_model *m);


int olmo_optimizer_create(struct olmo_optimizer *opt, const struct olmo_model *m, const struct olmo_dist *dist);
void olmo_optimizer_destroy(struct olmo_optimizer *opt, const struct olmo_model *m);
/* Global L2 norm of all gradients. */
double olmo_grad_norm(const struct olmo_model *m); /* NaN, error set, when the backend fails */
int olmo_grad_norm_of(const struct olmo_model *m, double *norm); /* 0, or -1 with the error set */
/* torch.nn.utils.clip_grad_norm_: scales grads by max_norm / (norm + 1e-6) when that is < 1. */
int olmo_clip_grads(struct olmo_model *m, double norm, double max_norm);
/* Updates this rank's shard of the parameters (no communication). */
int olmo_optimizer_step(struct olmo_optimizer *opt, struct olmo_model *m, const struct olmo_train_config *t,
                         double lr);
/* Collective (every rank of dist): full-size host copies of both moments, assembled from every rank's shard
 * (any layout of opt->ranges). */
int olmo_optimizer_gather(const struct olmo_optimizer *opt, const struct olmo_model *m, const struct olmo_dist *dist,
                          float *m_host, float *v_host);
/* Takes this rank's shard (opt->ranges) out of full-size host copies of both moments. */
int olmo_optimizer_scatter(struct olmo_optimizer *opt, const struct olmo_model *m, const float *m_host,
                            const float *v_host);

#endif
