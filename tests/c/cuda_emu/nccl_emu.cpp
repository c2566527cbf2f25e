/* Host emulation of the NCCL calls of the CUDA backend's data-parallel path
 * (src/backend/cuda/cuda_comm.cu): MPI collectives on emulated device memory,
 * which is host memory.  Checks what NCCL requires of its caller; see cuda_emu.h. */
#include "cuda_emu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef OLMOC_HAVE_MPI
#define OMPI_SKIP_MPICXX 1 /* the C API only: the deprecated C++ bindings need another library */
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

struct emu_nccl_comm {
    int rank, nranks;
};

namespace {

emu_nccl_comm the_comm;
bool comm_live = false;
int group_depth = 0;

ncclResult_t usage(const char *what) {
    fprintf(stderr, "nccl_emu: %s\n", what);
    return ncclInvalidUsage;
}

void launch_shape(int *rank, int *size) {
    *rank = 0;
    *size = 1;
#ifdef OLMOC_HAVE_MPI
    int up = 0;
    MPI_Initialized(&up);
    if (up) {
        MPI_Comm_rank(MPI_COMM_WORLD, rank);
        MPI_Comm_size(MPI_COMM_WORLD, size);
    }
#endif
}

} // namespace

const char *ncclGetErrorString(ncclResult_t result) {
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclSystemError: return "unhandled system error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    }
    return "unknown result";
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    /* random per call, as the real id (it names a bootstrap socket) is unique per process */
    unsigned seed = (unsigned)getpid() ^ (unsigned)(uintptr_t)id;
    for (size_t i = 0; i < sizeof id->internal; i++) {
        seed = seed * 1103515245u + 12345u;
        id->internal[i] = (char)(seed >> 16);
    }
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    if (comm_live) return usage("a second communicator in one process");
    int mpi_rank, mpi_size;
    launch_shape(&mpi_rank, &mpi_size);
    if (nranks != mpi_size || rank != mpi_rank) {
        fprintf(stderr, "nccl_emu: ncclCommInitRank(nranks %d, rank %d) but the launch has %d ranks, this is %d\n",
                nranks, rank, mpi_size, mpi_rank);
        return ncclInvalidArgument;
    }
#ifdef OLMOC_HAVE_MPI
    if (nranks > 1) { /* every rank must have been given rank 0's id */
        ncclUniqueId root = id;
        MPI_Bcast(&root, (int)sizeof root, MPI_BYTE, 0, MPI_COMM_WORLD);
        int same = !memcmp(&root, &id, sizeof id), all_same = 0;
        MPI_Allreduce(&same, &all_same, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
        if (!all_same) return usage("ncclCommInitRank: the ranks were given different unique ids");
    }
#endif
    the_comm.rank = rank;
    the_comm.nranks = nranks;
    comm_live = true;
    *comm = &the_comm;
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (comm != &the_comm || !comm_live) return usage("ncclCommDestroy of an unknown communicator");
    if (group_depth) return usage("ncclCommDestroy inside a group");
    comm_live = false;
    return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    (void)stream;
    if (comm != &the_comm || !comm_live) return usage("ncclAllReduce on an unknown communicator");
    if (datatype != ncclFloat32 || op != ncclSum) return ncclInvalidArgument;
    if (sendbuff != recvbuff && count) memcpy(recvbuff, sendbuff, count * sizeof(float));
#ifdef OLMOC_HAVE_MPI
    for (size_t off = 0; comm->nranks > 1 && off < count; off += (size_t)1 << 30) {
        size_t n = count - off < ((size_t)1 << 30) ? count - off : (size_t)1 << 30;
        MPI_Allreduce(MPI_IN_PLACE, (float *)recvbuff + off, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
#endif
    return ncclSuccess;
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
    (void)stream;
    if (comm != &the_comm || !comm_live) return usage("ncclBroadcast on an unknown communicator");
    if (datatype != ncclFloat32 || root < 0 || root >= comm->nranks) return ncclInvalidArgument;
    if (comm->rank == root && sendbuff != recvbuff && count) memcpy(recvbuff, sendbuff, count * sizeof(float));
#ifdef OLMOC_HAVE_MPI
    for (size_t off = 0; comm->nranks > 1 && off < count; off += (size_t)1 << 30) {
        size_t n = count - off < ((size_t)1 << 30) ? count - off : (size_t)1 << 30;
        MPI_Bcast((float *)recvbuff + off, (int)n, MPI_FLOAT, root, MPI_COMM_WORLD);
    }
#endif
    return ncclSuccess;
}

/* Collectives inside a group run at once here (MPI blocks); every rank issues
 * them in the same order, which is what NCCL also requires. */
ncclResult_t ncclGroupStart(void) {
    group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
    if (group_depth == 0) return usage("ncclGroupEnd without ncclGroupStart");
    group_depth--;
    return ncclSuccess;
}
