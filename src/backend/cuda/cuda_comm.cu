/* Data-parallel collectives of the CUDA backend: NCCL on device memory, one
 * communicator over the MPI ranks (mpirun launches, MPI broadcasts the NCCL id).
 * Everything runs on the legacy default stream, like the rest of the backend,
 * so a collective is ordered after the kernels that produced its buffer. */
#include "backend/cuda/cuda_internal.h"

#ifndef OLMOC_CUDA_EMULATION
#include <nccl.h>
#endif

extern "C" {
#include "dist/dist.h"
}

static ncclComm_t g_comm;
static int g_comm_world;

#define NCCL_TRY(call, what)                                                                   \
    do {                                                                                       \
        ncclResult_t r_ = (call);                                                              \
        if (r_ != ncclSuccess) return olmo_error("NCCL %s failed: %s", what, ncclGetErrorString(r_)); \
    } while (0)

extern "C" int olmo_cuda_comm_init(const struct olmo_dist *dist) {
    if (g_comm) return olmo_error("NCCL communicator already initialised");
    ncclUniqueId id;
    if (dist->rank == 0) NCCL_TRY(ncclGetUniqueId(&id), "ncclGetUniqueId");
    if (olmo_dist_broadcast_bytes(dist, &id, sizeof id, 0)) return -1;
    NCCL_TRY(ncclCommInitRank(&g_comm, dist->world, id, dist->rank), "ncclCommInitRank");
    g_comm_world = dist->world;
    return 0;
}

extern "C" int olmo_cuda_comm_allreduce_sum(float *buf, size_t n) {
    if (!g_comm) return olmo_error("NCCL all-reduce before the communicator was set up");
    NCCL_TRY(ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, g_comm, 0), "all-reduce");
    return 0;
}

/* Shards differ in size by one element at most, but ncclAllGather needs equal
 * counts: one broadcast per owner, in a group so NCCL runs them together. */
extern "C" int olmo_cuda_comm_allgather(float *buf, const size_t *offsets) {
    if (!g_comm) return olmo_error("NCCL all-gather before the communicator was set up");
    NCCL_TRY(ncclGroupStart(), "group start");
    for (int r = 0; r < g_comm_world; r++) {
        float *slice = buf + offsets[r];
        ncclResult_t res = ncclBroadcast(slice, slice, offsets[r + 1] - offsets[r], ncclFloat32, r, g_comm, 0);
        if (res != ncclSuccess) {
            ncclGroupEnd();
            return olmo_error("NCCL broadcast of rank %d's shard failed: %s", r, ncclGetErrorString(res));
        }
    }
    NCCL_TRY(ncclGroupEnd(), "group end");
    return 0;
}

extern "C" void olmo_cuda_comm_destroy(void) {
    if (g_comm) ncclCommDestroy(g_comm);
    g_comm = NULL;
    g_comm_world = 0;
}
