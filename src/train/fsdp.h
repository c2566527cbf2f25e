/* Fully sharded data parallelism (train.sharding: fsdp; OLMo-core's FSDP,
 * and HSDP with train.shard_degree): each rank of a shard group owns 1/G of
 * every unit's fp32 master weights, gradients and AdamW moments; a unit's
 * weights are all-gathered just before the forward or backward pass uses
 * them (into a block-sized buffer, reused by every block; the root unit,
 * embeddings + final norm + LM head, stays gathered from the forward pass
 * through the end of the backward pass), converted there to the backend's
 * compute type, and a block's gradients are reduce-scattered in fp32 right
 * after its backward pass and added to the owner's shard, so gradient
 * accumulation keeps only shards.  Replica groups (HSDP: ranks with the same
 * position in different shard groups) all-reduce their gradient shards once
 * per step.
 *
 * Prefetch (backends with a side queue, CUDA: a second stream): two block
 * buffers; when block l is acquired, the block the pass needs next (l + 1
 * going forward, l - 1 going backward) is gathered into the other buffer on
 * the side stream, so its all-gather runs while block l computes, and the
 * main stream waits for it only when that block is acquired.  A buffer
 * remembers which block it holds and for which master weights (a version
 * bumped by every optimizer step or weight load), so a block still held is
 * not gathered again (the last block from the forward pass to the backward
 * pass, block 0 from one micro-batch's backward pass to the next forward
 * pass).  Backends without a side queue keep one buffer, gathered when a
 * block is acquired (the same reuse applies).
 *
 * Gradient queue (backends with one, CUDA: a third stream): a block's
 * reduce-scatter and the addition to the gradient shard are queued there when
 * its backward pass ends, after an event, and run while the next block's
 * backward pass computes into the other of two block-gradient buffers; the
 * main stream waits for that work only before it writes the buffer again (two
 * blocks later) and at the end of the backward pass (the root's
 * reduce-scatter, after which the gradient shard is complete).  All-gathers
 * and reduce-scatters use separate communicators (NCCL gives no progress
 * guarantee to concurrent operations on one communicator from two streams).
 *
 * Regions, in flat-parameter order: 0 = the embeddings, 1 .. n_layers = the
 * blocks, n_layers + 1 = final norm + LM head, each contiguous in the flat
 * parameter vector and cut into units of one kind: on a bf16 backend the GEMM
 * matrices are gathered in bf16 (the compute copy the GEMMs read), the
 * embeddings and norm weights in fp32; on an fp32 backend a region is one
 * unit.  Rank g of a group owns [g * S, (g + 1) * S) of every unit
 * (S = ceil(len / G)), the real part of which
 * is one olmo_shard_range.  Collectives go through MPI on host-memory
 * backends and through the backend's group communicators (NCCL) on device
 * backends; scalars (the grad norm's sum of squares) always through MPI. */
#ifndef OLMOC_FSDP_H
#define OLMOC_FSDP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dist/dist.h"
#include "model/model.h"
#include "optim/optim.h"

struct olmo_fsdp_unit {
    size_t start, len; /* flat parameters [start, start + len) */
    size_t shard;      /* ceil(len / G): every rank's part in the collectives */
    size_t my_lo, my_len; /* this rank's real part: unit elements [my_lo, my_lo + my_len) */
    size_t local;      /* where it is in the rank's shard buffers */
    int region;        /* the region it belongs to */
    bool low;          /* gathered in the backend's compute type (a GEMM matrix on a bf16 backend) */
};

/* What is resident together: the embeddings (0), block l (1 + l), the final norm + LM head (last). */
struct olmo_fsdp_region {
    size_t start, len;
    int first, n_units; /* its units */
};

struct olmo_fsdp {
    struct olmo_model *m;
    struct olmo_dist shard_group, replica_group;
    bool device;                     /* collectives through the backend (comm_group_*), not MPI */
    /* the backend's communicators (device; groups of more than one rank): the shard group's all-gathers
     * (main and side queue), its reduce-scatters (the gradient queue), the replicas' all-reduce --
     * one per queue, as NCCL asks of operations that may be in flight at the same time */
    void *shard_comm, *rs_comm, *replica_comm;
    int n_regions, n_units;
    struct olmo_fsdp_region *regions;
    struct olmo_fsdp_unit *units;
    size_t n_local;
    float *master, *grad; /* this rank's shards (n_local floats, backend buffers) */
    float *root_w[2], *root_g[2]; /* regions 0 and n_regions - 1, gathered (+ G spare elements) */
    void *root_c[2];              /* their compute copies (bf16 backends) */
    struct olmo_fsdp_slot {
        float *w;     /* one block, gathered (+ G spare elements) */
        void *c;      /* its compute copy (bf16 backends) */
        int block;    /* the block it holds, -1 none */
        unsigned long version; /* of the master weights it was gathered from */
        bool pending; /* gathered on the side queue: side_wait(slot) before use */
    } slot[2];
    int n_slots;   /* 2 with prefetch (the backend has a side queue), else 1 */
    int next_slot; /* where the next gather on demand goes */
    unsigned long version; /* the master weights' version: bumped whenever they change */
    float *blk_g[2]; /* block gradients (+ G spare elements): the acquired block's, and (with a gradient
                      * queue) the previous one's, still being reduce-scattered */
    int n_grad_bufs; /* 2 where the backend has a gradient queue, else 1 */
    int grad_buf;    /* the acquired block's gradient buffer */
    bool grad_pending[2]; /* gradient-queue work reads blk_g[i]: grad_wait(i) before it is written */
    bool grad_queue;      /* the reduce-scatters go to the backend's gradient queue */
    long gathers, prefetches; /* blocks gathered on demand and on the side queue (counters for tests) */
    float *rs_out; /* a reduce-scatter's result (the largest shard) */
    bool root_valid; /* root_w holds the current master weights */
    struct olmo_unit_hooks hooks;
};

/* Shards the model (created with olmo_model_create_sharded) over dist's
 * ranks in groups of shard_degree (0 = all ranks; must divide the world),
 * installs the model's residency hooks and fills the optimizer's ranges,
 * moments and master pointer (opt->master). */
int olmo_fsdp_create(struct olmo_fsdp *fs, struct olmo_model *m, struct olmo_optimizer *opt,
                     const struct olmo_dist *dist, int shard_degree);
void olmo_fsdp_destroy(struct olmo_fsdp *fs, struct olmo_optimizer *opt);
/* Gradient shards to zero (the start of a step). */
int olmo_fsdp_zero_grads(struct olmo_fsdp *fs);
/* After the last micro-batch: all-reduce the gradient shards across replicas (HSDP). */
int olmo_fsdp_sync_replicas(struct olmo_fsdp *fs);
/* Global gradient L2 norm (collective over the shard group). */
int olmo_fsdp_grad_norm(struct olmo_fsdp *fs, double *norm);
/* clip_grad_norm_ on the shards, then AdamW on this rank's shard (opt's moments): one pass over the local
 * shard where the backend has adamw_flat (the clip coefficient applied inside; the same results), else a
 * scaling pass and an AdamW call per unit.  norm: olmo_fsdp_grad_norm's.  The gathered root is stale
 * afterwards. */
int olmo_fsdp_clip_step(struct olmo_fsdp *fs, struct olmo_optimizer *opt, const struct olmo_train_config *t,
                        double lr, double norm);
/* The master shard was written from outside (a checkpoint): the gathered root and blocks are stale. */
int olmo_fsdp_master_updated(struct olmo_fsdp *fs);
/* OLMo-core's initialisation (olmo_model_init_weights), a tensor at a time: no full-size copy. */
int olmo_fsdp_init_weights(struct olmo_fsdp *fs, uint64_t seed);

#endif
