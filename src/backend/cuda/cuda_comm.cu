/* Data-parallel collectives of the CUDA backend: NCCL on device memory, one
 * communicator over the MPI ranks (mpirun launches, MPI broadcasts the NCCL id).
 * Everything runs on the legacy default stream, like the rest of the backend,
 * so a collective is ordered after the kernels that produced its buffer; the
 * exceptions are fully sharded training's: the group all-gather runs on the
 * side stream and the group reduce-scatter on the gradient stream when those
 * are selected (cuda_internal.h), ordered by their events.  NCCL gives no
 * progress guarantee to two operations in flight on one communicator from
 * different streams, so the caller (train/fsdp.c) keeps them apart: one
 * communicator for the all-gathers, another for the reduce-scatters, a third
 * for the replicas' all-reduce; the all-gathers of the main and side streams
 * on their shared communicator are ordered by the side stream's events.
 * tests/c/cuda_emu/nccl_emu.cpp refuses an operation on a communicator whose
 * previous one, on another stream, is not ordered before it. */
#include "backend/cuda/cuda_internal.h"

#ifndef OLMOC_CUDA_EMULATION
#include <nccl.h>
#endif

/* A collective, watched (dist/dist.h's collective watchdog): NCCL may block
 * in the call (on the emulation it always does); on a GPU the wait for its
 * kernels is watched where the host waits for the device (OLMO_CUDA_WAIT). */
#define NCCL_WAIT(call, what)                                                                  \
    do {                                                                                       \
        olmo_watchdog_enter("NCCL " what);                                                     \
        ncclResult_t r_ = (call);                                                              \
        olmo_watchdog_leave();                                                                 \
        if (r_ != ncclSuccess) return olmo_error("NCCL %s failed: %s", what, ncclGetErrorString(r_)); \
    } while (0)

/* The instance's communicator */
#define COMM(be) ((ncclComm_t)CUDA_STATE(be)->comm)

#define NCCL_TRY(call, what)                                                                   \
    do {                                                                                       \
        ncclResult_t r_ = (call);                                                              \
        if (r_ != ncclSuccess) return olmo_error("NCCL %s failed: %s", what, ncclGetErrorString(r_)); \
    } while (0)

int olmo_cuda_comm_init(OLMO_BE, const struct olmo_dist *dist) {
    if (COMM(be)) return olmo_error("NCCL communicator already initialised");
    ncclUniqueId id;
    if (dist->rank == 0) NCCL_TRY(ncclGetUniqueId(&id), "ncclGetUniqueId");
    if (olmo_dist_broadcast_bytes(dist, &id, sizeof id, 0)) return -1;
    ncclComm_t comm;
    NCCL_WAIT(ncclCommInitRank(&comm, dist->world, id, dist->rank), "ncclCommInitRank");
    CUDA_STATE(be)->comm = comm;
    CUDA_STATE(be)->comm_world = dist->world;
    return 0;
}

int olmo_cuda_comm_allreduce_sum(OLMO_BE, float *buf, size_t n) {
    if (!COMM(be)) return olmo_error("NCCL all-reduce before the communicator was set up");
    NCCL_WAIT(ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, COMM(be), 0), "all-reduce");
    return 0;
}

/* Shards differ in size by one element at most, but ncclAllGather needs equal
 * counts: one broadcast per owner, in a group so NCCL runs them together. */
static int broadcast_shards(OLMO_BE, float *buf, const size_t *offsets) {
    NCCL_TRY(ncclGroupStart(), "group start");
    for (int r = 0; r < CUDA_STATE(be)->comm_world; r++) {
        float *slice = buf + offsets[r];
        ncclResult_t res = ncclBroadcast(slice, slice, offsets[r + 1] - offsets[r], ncclFloat32, r, COMM(be), 0);
        if (res != ncclSuccess) {
            ncclGroupEnd();
            return olmo_error("NCCL broadcast of rank %d's shard failed: %s", r, ncclGetErrorString(res));
        }
    }
    NCCL_TRY(ncclGroupEnd(), "group end");
    return 0;
}

int olmo_cuda_comm_allgather(OLMO_BE, float *buf, const size_t *offsets) {
    if (!COMM(be)) return olmo_error("NCCL all-gather before the communicator was set up");
    olmo_watchdog_enter("NCCL all-gather (broadcasts)");
    const int rc = broadcast_shards(be, buf, offsets);
    olmo_watchdog_leave();
    return rc;
}

void olmo_cuda_comm_destroy(OLMO_BE) {
    if (COMM(be)) ncclCommDestroy(COMM(be));
    CUDA_STATE(be)->comm = NULL;
    CUDA_STATE(be)->comm_world = 0;
}

/* ---- group communicators (fully sharded training: shard and replica groups) ---- */

void *olmo_cuda_comm_group_create(OLMO_BE, const struct olmo_dist *group) {
    (void)be;
    ncclUniqueId id;
    ncclResult_t r;
    if (group->rank == 0 && (r = ncclGetUniqueId(&id)) != ncclSuccess) {
        olmo_error("NCCL ncclGetUniqueId failed: %s", ncclGetErrorString(r));
        return NULL;
    }
    if (olmo_dist_broadcast_bytes(group, &id, sizeof id, 0)) return NULL;
    ncclComm_t comm;
    olmo_watchdog_enter("NCCL ncclCommInitRank");
    r = ncclCommInitRank(&comm, group->world, id, group->rank);
    olmo_watchdog_leave();
    if (r != ncclSuccess) {
        olmo_error("NCCL ncclCommInitRank (a group of %d ranks) failed: %s", group->world, ncclGetErrorString(r));
        return NULL;
    }
    return comm;
}

/* n bytes per rank (fp32 or bf16 elements alike), in place */
/* on the side stream when it is selected (the next block's gather in fully sharded training) */
int olmo_cuda_comm_group_allgather(OLMO_BE, void *comm, void *buf, size_t n) {
    int rank;
    NCCL_TRY(ncclCommUserRank((ncclComm_t)comm, &rank), "ncclCommUserRank");
    NCCL_WAIT(ncclAllGather((char *)buf + (size_t)rank * n, buf, n, ncclInt8, (ncclComm_t)comm,
                           olmo_cuda_current_stream(be)),
             "all-gather");
    return 0;
}

/* on the gradient stream when it is selected (fully sharded training's gradients) */
int olmo_cuda_comm_group_reduce_scatter(OLMO_BE, void *comm, const float *in, float *out, size_t n) {
    NCCL_WAIT(ncclReduceScatter(in, out, n, ncclFloat32, ncclSum, (ncclComm_t)comm, olmo_cuda_current_stream(be)),
              "reduce-scatter");
    return 0;
}

int olmo_cuda_comm_group_allreduce_sum(OLMO_BE, void *comm, float *buf, size_t n) {
    (void)be;
    NCCL_WAIT(ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, (ncclComm_t)comm, 0), "all-reduce");
    return 0;
}

void olmo_cuda_comm_group_destroy(OLMO_BE, void *comm) {
    (void)be;
    if (comm) ncclCommDestroy((ncclComm_t)comm);
}
