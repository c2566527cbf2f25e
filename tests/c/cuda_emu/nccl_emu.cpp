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
    bool live;
    bool used;               /* an operation was issued on it */
    cudaStream_t last;       /* the stream of its last operation */
    unsigned long long upto; /* that operation's place in its stream (emu_stream_seq after it) */
#ifdef OLMOC_HAVE_MPI
    MPI_Comm mpi; /* the ranks of this communicator */
#endif
};

namespace {

/* Fully sharded training holds a shard-group and a replica-group communicator, ZeRO-1 one over all ranks. */
enum { MAX_COMMS = 8 };
emu_nccl_comm comms[MAX_COMMS];
int group_depth = 0;

ncclResult_t usage(const char *what) {
    fprintf(stderr, "nccl_emu: %s\n", what);
    return ncclInvalidUsage;
}

bool known(ncclComm_t comm) { return comm >= comms && comm < comms + MAX_COMMS && comm->live; }

/* NCCL gives no progress guarantee to two operations in flight on one communicator from different
 * streams (each can wait for the other's peers: a hang on the device).  An operation on `stream` is
 * refused unless the communicator's previous one, when on another stream, is ordered before it (an
 * event the stream waited for, or a host synchronisation). */
ncclResult_t check_stream(ncclComm_t comm, cudaStream_t stream, const char *what) {
    if (!comm->used || comm->last == stream || emu_stream_ordered(stream, comm->last, comm->upto))
        return ncclSuccess;
    fprintf(stderr, "nccl_emu: %s on a communicator whose previous operation, on another stream, may still be in "
            "flight (no event orders it first): NCCL gives no progress guarantee to concurrent operations on one "
            "communicator from several streams\n", what);
    return ncclInvalidUsage;
}

/* after the operation was submitted on `stream` */
void issued(ncclComm_t comm, cudaStream_t stream) {
    comm->used = true;
    comm->last = stream;
    comm->upto = emu_stream_seq(stream);
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

/* The emulation is collective over every rank of the launch (MPI_Comm_split on a hash of the id: the ranks
 * given the same id form one communicator), which is how olmoc creates them: every group of a split at once. */
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    emu_nccl_comm *c = NULL;
    for (int i = 0; i < MAX_COMMS && !c; i++)
        if (!comms[i].live) c = &comms[i];
    if (!c) return usage("more communicators in one process than the emulation holds");
    if (nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
#ifdef OLMOC_HAVE_MPI
    int up = 0, world = 1;
    MPI_Initialized(&up);
    if (up) MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (world > 1) {
        unsigned h = 2166136261u;
        for (size_t i = 0; i < sizeof id.internal; i++) h = (h ^ (unsigned char)id.internal[i]) * 16777619u;
        MPI_Comm_split(MPI_COMM_WORLD, (int)(h & 0x7fffffff), rank, &c->mpi);
        int size, me;
        MPI_Comm_size(c->mpi, &size);
        MPI_Comm_rank(c->mpi, &me);
        if (size != nranks || me != rank) {
            fprintf(stderr, "nccl_emu: ncclCommInitRank(nranks %d, rank %d) but %d ranks were given this id, and "
                    "this is their rank %d\n", nranks, rank, size, me);
            MPI_Comm_free(&c->mpi);
            return ncclInvalidArgument;
        }
        /* every rank must have been given its root's id (a hash collision aside, the split checks that too) */
        ncclUniqueId root = id;
        MPI_Bcast(&root, (int)sizeof root, MPI_BYTE, 0, c->mpi);
        int same = !memcmp(&root, &id, sizeof id), all_same = 0;
        MPI_Allreduce(&same, &all_same, 1, MPI_INT, MPI_LAND, c->mpi);
        if (!all_same) {
            MPI_Comm_free(&c->mpi);
            return usage("ncclCommInitRank: the ranks were given different unique ids");
        }
    } else {
        c->mpi = MPI_COMM_SELF;
    }
#endif
#ifndef OLMOC_HAVE_MPI
    (void)id;
    if (nranks > 1) {
        fprintf(stderr, "nccl_emu: ncclCommInitRank(nranks %d) in a build without MPI\n", nranks);
        return ncclInvalidArgument;
    }
#endif
    c->rank = rank;
    c->nranks = nranks;
    c->live = true;
    c->used = false;
    *comm = c;
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!known(comm)) return usage("ncclCommDestroy of an unknown communicator");
    if (group_depth) return usage("ncclCommDestroy inside a group");
    cudaDeviceSynchronize(); /* its queued collectives run first */
#ifdef OLMOC_HAVE_MPI
    if (comm->mpi != MPI_COMM_SELF) MPI_Comm_free(&comm->mpi);
#endif
    comm->live = false;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
    if (!known(comm)) return usage("ncclCommUserRank of an unknown communicator");
    *rank = comm->rank;
    return ncclSuccess;
}

/* The collectives run on `stream` as cuda_emu.h's Streams say: at once on the default stream, when
 * the stream's queue runs on a created one.  Every rank issues its collectives in the same order and
 * runs a stream's queue at the same points of its program, so the MPI calls still match. */
ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    if (!known(comm)) return usage("ncclAllReduce on an unknown communicator");
    if (ncclResult_t r = check_stream(comm, stream, "ncclAllReduce")) return r;
    if (datatype != ncclFloat32 || op != ncclSum) return ncclInvalidArgument;
    emu_stream_submit(stream, [=]() {
        if (sendbuff != recvbuff && count) memcpy(recvbuff, sendbuff, count * sizeof(float));
#ifdef OLMOC_HAVE_MPI
        for (size_t off = 0; comm->nranks > 1 && off < count; off += (size_t)1 << 30) {
            size_t n = count - off < ((size_t)1 << 30) ? count - off : (size_t)1 << 30;
            MPI_Allreduce(MPI_IN_PLACE, (float *)recvbuff + off, (int)n, MPI_FLOAT, MPI_SUM, comm->mpi);
        }
#endif
    });
    issued(comm, stream);
    return ncclSuccess;
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
    if (!known(comm)) return usage("ncclBroadcast on an unknown communicator");
    if (ncclResult_t r = check_stream(comm, stream, "ncclBroadcast")) return r;
    if (datatype != ncclFloat32 || root < 0 || root >= comm->nranks) return ncclInvalidArgument;
    emu_stream_submit(stream, [=]() {
        if (comm->rank == root && sendbuff != recvbuff && count) memcpy(recvbuff, sendbuff, count * sizeof(float));
#ifdef OLMOC_HAVE_MPI
        for (size_t off = 0; comm->nranks > 1 && off < count; off += (size_t)1 << 30) {
            size_t n = count - off < ((size_t)1 << 30) ? count - off : (size_t)1 << 30;
            MPI_Bcast((float *)recvbuff + off, (int)n, MPI_FLOAT, root, comm->mpi);
        }
#endif
    });
    issued(comm, stream);
    return ncclSuccess;
}

/* NCCL's in-place all-gather: sendbuff = recvbuff + rank * sendcount. */
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
    if (!known(comm)) return usage("ncclAllGather on an unknown communicator");
    if (ncclResult_t r = check_stream(comm, stream, "ncclAllGather")) return r;
    if (datatype != ncclFloat32 && datatype != ncclInt8) return ncclInvalidArgument;
    const size_t bytes = sendcount * (datatype == ncclFloat32 ? sizeof(float) : 1);
    if (comm->nranks > 1 && bytes > ((size_t)1 << 30)) return usage("ncclAllGather: count too large for the emulation");
    char *mine = (char *)recvbuff + (size_t)comm->rank * bytes;
    emu_stream_submit(stream, [=]() {
        if (sendbuff != mine && bytes) memmove(mine, sendbuff, bytes);
#ifdef OLMOC_HAVE_MPI
        if (comm->nranks > 1)
            MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recvbuff, (int)bytes, MPI_BYTE, comm->mpi);
#endif
    });
    issued(comm, stream);
    return ncclSuccess;
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    if (!known(comm)) return usage("ncclReduceScatter on an unknown communicator");
    if (ncclResult_t r = check_stream(comm, stream, "ncclReduceScatter")) return r;
    if (datatype != ncclFloat32 || op != ncclSum) return ncclInvalidArgument;
    if (comm->nranks > 1 && recvcount > ((size_t)1 << 30))
        return usage("ncclReduceScatter: count too large for the emulation");
    emu_stream_submit(stream, [=]() {
        if (comm->nranks == 1) {
            if (sendbuff != recvbuff && recvcount) memmove(recvbuff, sendbuff, recvcount * sizeof(float));
            return;
        }
#ifdef OLMOC_HAVE_MPI
        MPI_Reduce_scatter_block(sendbuff, recvbuff, (int)recvcount, MPI_FLOAT, MPI_SUM, comm->mpi);
#endif
    });
    issued(comm, stream);
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
