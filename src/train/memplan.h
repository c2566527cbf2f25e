/* The memory plan (olmoc info --ranks N): what one rank of a training run
 * holds, by category, from the config, the backend's dtypes and the layout
 * across ranks, in the bytes the backend's own counters count
 * (backend.h: olmo_backend_mem_stats): the sum of what olmo_model_create /
 * olmo_model_reserve / olmo_optimizer_create (ZeRO-1) or train/fsdp.c
 * allocate, in every checkpointing mode; tests/python/test_memplan.py holds
 * the plan to the measured peak. */
#ifndef OLMOC_MEMPLAN_H
#define OLMOC_MEMPLAN_H

#include <stdbool.h>
#include <stdio.h>

#include "config/config.h"

enum olmo_mem_item {
    OLMO_MEM_WEIGHTS,     /* fp32 master weights (fsdp: this rank's shard) */
    OLMO_MEM_GRADS,       /* fp32 gradients (fsdp: this rank's shard) */
    OLMO_MEM_OPTIM,       /* AdamW's two moments, fp32, this rank's shard */
    OLMO_MEM_COMPUTE,     /* the weights in the compute dtype (bf16 backends; fsdp: of the shard) */
    OLMO_MEM_GATHERED,    /* fsdp: gathered block weights (two blocks on a device: the next one is prefetched) */
    OLMO_MEM_ACTIVATIONS, /* saved for the backward pass (by checkpointing mode), recompute buffers */
    OLMO_MEM_LOGITS,      /* [tokens, vocab] fp32, overwritten by their gradient; cuda-bf16's chunked loss: a
                             [chunk, vocab] fp32 chunk and the [tokens, vocab] bf16 gradient */
    OLMO_MEM_WORK,        /* the backward pass's activation gradients, token ids, RoPE tables */
    OLMO_MEM_SCRATCH,     /* the backend's grow-only scratch (attention, GEMM operand packing, loss) */
    OLMO_MEM_COMM,        /* communication buffers (fsdp: a unit's gradient before reduce-scatter) */
    OLMO_MEM_ITEMS
};

struct olmo_mem_plan_options {
    int ranks;           /* data-parallel ranks (>= 1) */
    int shard_degree;    /* -1: train.shard_degree; else overrides it (0 = all ranks) */
    const char *backend; /* cpu, cpu-openblas, cpu-onednn, cpu-bf16, cuda, cuda-tf32, cuda-bf16, cuda-bf16-cublas */
    int threads;         /* OpenMP threads of a CPU rank (reported; the plan does not depend on it); <= 0: 1 */
};

struct olmo_mem_plan {
    char backend[32];
    bool device;      /* the backend's memory is a device's */
    int ranks, shard_degree, rank; /* the rank planned (the one holding the most) */
    int threads;      /* CPU: the OpenMP threads of the rank (reported only) */
    double bytes[OLMO_MEM_ITEMS];
    double total;     /* sum of bytes: the steady peak of the backend's counters during training */
    double probe;     /* the peak FLOP/s probe's three 2048^2 fp32 matrices at start-up (0: train.peak_flops set) */
    double peak;      /* what the counters peak at: max(total, resident before the first step + probe) */
    double runtime;   /* device: what the counters do not see (CUDA context, cuBLAS, NCCL): an allowance */
    double need;      /* peak + runtime */
    const char *estimate; /* NULL when every figure follows this build's allocations; else what is a design estimate */
};

/* 0, or -1 with the error set (bad backend name, ranks, shard degree). */
int olmo_mem_plan(const struct olmo_config *cfg, const struct olmo_mem_plan_options *o, struct olmo_mem_plan *p);
/* The table, and whether `need` fits in have_bytes (<= 0: not judged). */
void olmo_mem_plan_print(const struct olmo_mem_plan *p, FILE *f, double have_bytes, const char *have_what);
/* "141GB" (10^9), "131.6GiB" (2^30), "512MiB", "80e9B" (bytes): 0, or -1 with the error set (a number
 * without a unit is refused). */
int olmo_parse_bytes(const char *s, double *out);
/* The item's name in the table. */
const char *olmo_mem_item_name(enum olmo_mem_item item);

#endif
