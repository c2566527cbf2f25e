/* Data parallelism across processes through MPI (launched with mpirun).
 * Without MPI in the build, or when not started by mpirun, this is a
 * single-rank no-op, so every caller can use it unconditionally.
 * Buffers are host memory (the CPU backend's); a device backend moves its
 * buffers with its own collectives (struct olmo_backend's comm_*: NCCL),
 * set up through these. */
#ifndef OLMOC_DIST_H
#define OLMOC_DIST_H

#include <stddef.h>

struct olmo_dist {
    int rank, world;
    int mpi_active; /* MPI_Init was called by us */
    void *comm;     /* a sub-group's communicator (olmo_dist_split); NULL = every rank */
};

/* Initialises MPI when the process was launched by an MPI launcher. */
int olmo_dist_init(struct olmo_dist *d, int *argc, char ***argv);
void olmo_dist_finalize(struct olmo_dist *d);
/* After a failure on this rank: ends every rank of the job (MPI_Abort), so
 * that none waits forever in a collective this one will never join.  Returns
 * only when there is no job to end (one process). */
void olmo_dist_abort(const struct olmo_dist *d, int code);
/* In-place sums over all ranks. */
int olmo_dist_allreduce_f32(const struct olmo_dist *d, float *buf, size_t n);
int olmo_dist_allreduce_f64(const struct olmo_dist *d, double *buf, size_t n);
/* Every rank contributes buf[offsets[r] .. offsets[r+1]) of its own buffer;
 * afterwards all ranks hold all slices.  offsets has world + 1 entries. */
int olmo_dist_allgather_f32(const struct olmo_dist *d, float *buf, const size_t *offsets);
/* Contiguous, near-equal split of n items: [*lo, *hi) for this rank. */
void olmo_dist_shard(const struct olmo_dist *d, size_t n, size_t *lo, size_t *hi);
/* offsets[r] .. offsets[r+1] = rank r's shard of n items (world + 1 entries). */
void olmo_dist_shard_offsets(const struct olmo_dist *d, size_t n, size_t *offsets);
/* Collective over d: splits its ranks into groups of equal color, ordered by
 * key; sub gets this rank's group (rank and world within it).  Free with
 * olmo_dist_free_group.  One rank (or no MPI): sub is a one-rank group. */
int olmo_dist_split(const struct olmo_dist *d, int color, int key, struct olmo_dist *sub);
void olmo_dist_free_group(struct olmo_dist *sub);
/* Every rank contributes bytes [rank * n, (rank + 1) * n) of buf; afterwards all hold all world * n. */
int olmo_dist_allgather_equal_bytes(const struct olmo_dist *d, void *buf, size_t n);
/* Sums world * n floats of `in` over the ranks; this rank receives the sums of
 * its block [rank * n, (rank + 1) * n) in out[0 .. n). */
int olmo_dist_reduce_scatter_f32(const struct olmo_dist *d, const float *in, float *out, size_t n);
/* Root receives every rank's n bytes (n may differ by rank, each under
 * 1 GiB): *recv (malloc'ed, root only; NULL elsewhere) holds them in rank
 * order, counts[r] (root only, world entries) their sizes. */
int olmo_dist_gather_bytes(const struct olmo_dist *d, const void *send, size_t n, int root, void **recv,
                           size_t *counts);
/* Copies root's bytes to every rank (e.g. an NCCL unique id). */
int olmo_dist_broadcast_bytes(const struct olmo_dist *d, void *buf, size_t bytes, int root);

/* The collective watchdog (train.collective_timeout; dist/watchdog.c): a thread
 * that ends the process with OLMO_WATCHDOG_EXIT, naming the collective and the
 * step, when one blocking collective has waited more than timeout_s seconds
 * (a rank stopped responding).  Started only over several ranks and with
 * timeout_s > 0; the process holds one, until olmo_dist_finalize. */
#define OLMO_WATCHDOG_EXIT 3
/* A second start replaces the first (its timeout). */
int olmo_watchdog_start(const struct olmo_dist *d, double timeout_s);
void olmo_watchdog_stop(void);
/* The step that the messages name. */
void olmo_watchdog_step(long step);
/* Around a blocking wait for other ranks (what: a static string, e.g. "MPI
 * all-reduce"); they nest, the outermost names the wait.  Cheap: two atomic
 * stores; no-ops in effect while no watchdog runs. */
void olmo_watchdog_enter(const char *what);
void olmo_watchdog_leave(void);

#endif
