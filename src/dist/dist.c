#include "dist/dist.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

#ifdef OLMOC_HAVE_MPI
#include <mpi.h>

/* MPI counts are int: move large buffers in chunks. */
#define MPI_CHUNK ((size_t)1 << 30)

/* d's communicator: a sub-group's, or every rank's */
static MPI_Comm comm_of(const struct olmo_dist *d) { return d->comm ? *(MPI_Comm *)d->comm : MPI_COMM_WORLD; }

/* A blocking MPI call, watched (olmo_watchdog_enter): its status */
static int left(int rc) {
    olmo_watchdog_leave();
    return rc;
}
#define WATCHED(what, call) (olmo_watchdog_enter(what), left(call))

static int launched_by_mpi(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK") || getenv("MPI_LOCALNRANKS");
}

int olmo_dist_init(struct olmo_dist *d, int *argc, char ***argv) {
    memset(d, 0, sizeof *d);
    d->world = 1;
    if (!launched_by_mpi()) return 0;
    if (MPI_Init(argc, argv) != MPI_SUCCESS) return olmo_error("MPI_Init failed");
    d->mpi_active = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &d->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &d->world);
    return 0;
}

void olmo_dist_finalize(struct olmo_dist *d) {
    if (d->mpi_active) (void)WATCHED("MPI_Finalize", MPI_Finalize());
    d->mpi_active = 0;
    olmo_watchdog_stop();
}

void olmo_dist_abort(const struct olmo_dist *d, int code) {
    if (d->mpi_active && d->world > 1) MPI_Abort(MPI_COMM_WORLD, code);
}

static int allreduce(const struct olmo_dist *d, void *buf, size_t n, MPI_Datatype type, size_t elem) {
    if (d->world == 1) return 0;
    for (size_t off = 0; off < n; off += MPI_CHUNK) {
        size_t count = n - off < MPI_CHUNK ? n - off : MPI_CHUNK;
        void *at = (char *)buf + off * elem;
        if (WATCHED("MPI all-reduce", MPI_Allreduce(MPI_IN_PLACE, at, (int)count, type, MPI_SUM, comm_of(d))) !=
            MPI_SUCCESS)
            return olmo_error("MPI_Allreduce failed");
    }
    return 0;
}

int olmo_dist_allreduce_f32(const struct olmo_dist *d, float *buf, size_t n) {
    return allreduce(d, buf, n, MPI_FLOAT, sizeof(float));
}

int olmo_dist_allreduce_f64(const struct olmo_dist *d, double *buf, size_t n) {
    return allreduce(d, buf, n, MPI_DOUBLE, sizeof(double));
}

int olmo_dist_allgather_f32(const struct olmo_dist *d, float *buf, const size_t *offsets) {
    if (d->world == 1) return 0;
    /* Broadcast each rank's slice from its owner, chunked to stay within int counts. */
    for (int r = 0; r < d->world; r++)
        for (size_t off = offsets[r]; off < offsets[r + 1]; off += MPI_CHUNK) {
            size_t count = offsets[r + 1] - off < MPI_CHUNK ? offsets[r + 1] - off : MPI_CHUNK;
            if (WATCHED("MPI all-gather (broadcasts)", MPI_Bcast(buf + off, (int)count, MPI_FLOAT, r, comm_of(d))) !=
                MPI_SUCCESS)
                return olmo_error("MPI_Bcast failed");
        }
    return 0;
}

int olmo_dist_broadcast_bytes(const struct olmo_dist *d, void *buf, size_t bytes, int root) {
    if (d->world == 1) return 0;
    if (bytes > (size_t)1 << 30) return olmo_error("broadcast of %zu bytes: too large", bytes);
    if (WATCHED("MPI broadcast", MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, comm_of(d))) != MPI_SUCCESS)
        return olmo_error("MPI_Bcast failed");
    return 0;
}

int olmo_dist_gather_bytes(const struct olmo_dist *d, const void *send, size_t n, int root, void **recv,
                           size_t *counts) {
    *recv = NULL;
    if (d->world == 1) {
        counts[0] = n;
        if (!(*recv = malloc(n ? n : 1))) return olmo_error("out of memory gathering %zu bytes", n);
        if (n) memcpy(*recv, send, n);
        return 0;
    }
    if (n > (size_t)1 << 30) return olmo_error("gather of %zu bytes: too large", n);
    unsigned long long mine = n, *all = NULL;
    int *cnt = NULL, *displ = NULL;
    const int is_root = d->rank == root;
    if (is_root) {
        all = malloc(sizeof *all * (size_t)d->world);
        cnt = malloc(sizeof *cnt * (size_t)d->world);
        displ = malloc(sizeof *displ * (size_t)d->world);
    }
    int rc = is_root && (!all || !cnt || !displ) ? olmo_error("out of memory gathering") : 0;
    /* every rank joins both collectives, even after a failure on root */
    if (WATCHED("MPI gather",
                MPI_Gather(&mine, 1, MPI_UNSIGNED_LONG_LONG, all, 1, MPI_UNSIGNED_LONG_LONG, root, MPI_COMM_WORLD)) !=
        MPI_SUCCESS)
        rc = olmo_error("MPI_Gather failed");
    size_t total = 0;
    if (is_root && !rc) {
        for (int r = 0; r < d->world; r++) {
            counts[r] = (size_t)all[r];
            displ[r] = (int)total;
            cnt[r] = (int)all[r];
            total += (size_t)all[r];
        }
        if (total > (size_t)1 << 30) rc = olmo_error("gather of %zu bytes: too large", total);
        else if (!(*recv = malloc(total ? total : 1))) rc = olmo_error("out of memory gathering %zu bytes", total);
    }
    if (!rc && WATCHED("MPI gather", MPI_Gatherv(send, (int)n, MPI_BYTE, *recv, cnt, displ, MPI_BYTE, root,
                                                 MPI_COMM_WORLD)) != MPI_SUCCESS)
        rc = olmo_error("MPI_Gatherv failed");
    free(all);
    free(cnt);
    free(displ);
    if (rc) {
        free(*recv);
        *recv = NULL;
    }
    return rc;
}

int olmo_dist_split(const struct olmo_dist *d, int color, int key, struct olmo_dist *sub) {
    memset(sub, 0, sizeof *sub);
    sub->world = 1;
    if (d->world == 1) return 0;
    MPI_Comm *c = olmo_malloc(sizeof *c, "communicator");
    if (!c) return -1;
    if (WATCHED("MPI_Comm_split", MPI_Comm_split(comm_of(d), color, key, c)) != MPI_SUCCESS) {
        free(c);
        return olmo_error("MPI_Comm_split failed");
    }
    sub->comm = c;
    MPI_Comm_rank(*c, &sub->rank);
    MPI_Comm_size(*c, &sub->world);
    return 0;
}

void olmo_dist_free_group(struct olmo_dist *sub) {
    if (sub->comm) {
        MPI_Comm_free((MPI_Comm *)sub->comm);
        free(sub->comm);
    }
    memset(sub, 0, sizeof *sub);
    sub->world = 1;
}

int olmo_dist_allgather_equal_bytes(const struct olmo_dist *d, void *buf, size_t n) {
    if (d->world == 1) return 0;
    if (n > MPI_CHUNK) return olmo_error("all-gather of %zu bytes per rank: too large", n);
    if (WATCHED("MPI all-gather", MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, (int)n, MPI_BYTE,
                                                comm_of(d))) != MPI_SUCCESS)
        return olmo_error("MPI_Allgather failed");
    return 0;
}

int olmo_dist_reduce_scatter_f32(const struct olmo_dist *d, const float *in, float *out, size_t n) {
    if (d->world == 1) return n && out != in ? (memcpy(out, in, n * sizeof(float)), 0) : 0;
    if (n > MPI_CHUNK) return olmo_error("reduce-scatter of %zu floats per rank: too large", n);
    if (WATCHED("MPI reduce-scatter", MPI_Reduce_scatter_block(in, out, (int)n, MPI_FLOAT, MPI_SUM, comm_of(d))) !=
        MPI_SUCCESS)
        return olmo_error("MPI_Reduce_scatter_block failed");
    return 0;
}

#else /* single process build */

int olmo_dist_init(struct olmo_dist *d, int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    memset(d, 0, sizeof *d);
    d->world = 1;
    if (getenv("OMPI_COMM_WORLD_SIZE") && atoi(getenv("OMPI_COMM_WORLD_SIZE")) > 1)
        return olmo_error("started by mpirun with %s ranks, but this olmoc was built without MPI",
                          getenv("OMPI_COMM_WORLD_SIZE"));
    return 0;
}
void olmo_dist_finalize(struct olmo_dist *d) { (void)d; }
void olmo_dist_abort(const struct olmo_dist *d, int code) { (void)d, (void)code; }
int olmo_dist_allreduce_f32(const struct olmo_dist *d, float *buf, size_t n) {
    (void)d, (void)buf, (void)n;
    return 0;
}
int olmo_dist_allreduce_f64(const struct olmo_dist *d, double *buf, size_t n) {
    (void)d, (void)buf, (void)n;
    return 0;
}
int olmo_dist_allgather_f32(const struct olmo_dist *d, float *buf, const size_t *offsets) {
    (void)d, (void)buf, (void)offsets;
    return 0;
}
int olmo_dist_split(const struct olmo_dist *d, int color, int key, struct olmo_dist *sub) {
    (void)d, (void)color, (void)key;
    memset(sub, 0, sizeof *sub);
    sub->world = 1;
    return 0;
}
void olmo_dist_free_group(struct olmo_dist *sub) {
    memset(sub, 0, sizeof *sub);
    sub->world = 1;
}
int olmo_dist_allgather_equal_bytes(const struct olmo_dist *d, void *buf, size_t n) {
    (void)d, (void)buf, (void)n;
    return 0;
}
int olmo_dist_reduce_scatter_f32(const struct olmo_dist *d, const float *in, float *out, size_t n) {
    (void)d;
    if (n && out != in) memcpy(out, in, n * sizeof(float));
    return 0;
}
int olmo_dist_broadcast_bytes(const struct olmo_dist *d, void *buf, size_t bytes, int root) {
    (void)d, (void)buf, (void)bytes, (void)root;
    return 0;
}
int olmo_dist_gather_bytes(const struct olmo_dist *d, const void *send, size_t n, int root, void **recv,
                           size_t *counts) {
    (void)d, (void)root;
    counts[0] = n;
    if (!(*recv = malloc(n ? n : 1))) return olmo_error("out of memory gathering %zu bytes", n);
    if (n) memcpy(*recv, send, n);
    return 0;
}
#endif

void olmo_dist_shard(const struct olmo_dist *d, size_t n, size_t *lo, size_t *hi) {
    size_t base = n / (size_t)d->world, extra = n % (size_t)d->world, r = (size_t)d->rank;
    *lo = r * base + (r < extra ? r : extra);
    *hi = *lo + base + (r < extra ? 1 : 0);
}

void olmo_dist_shard_offsets(const struct olmo_dist *d, size_t n, size_t *offsets) {
    struct olmo_dist other = *d;
    for (int r = 0; r < d->world; r++) {
        other.rank = r;
        olmo_dist_shard(&other, n, &offsets[r], &offsets[r + 1]);
    }
}
