/* Asynchronous checkpoint saves (checkpoint.h: olmo_ckpt_save_async).
 *
 * The save is olmo_ckpt_save's three phases (checkpoint_internal.h) with the
 * middle one on a thread:
 *   begin     (main thread, collective)  the temporary directory; this rank's
 *             quantities copied to host memory (to_host, into page-locked
 *             memory on a device); the optimizer's step and window noted;
 *   files     (writer thread)            this rank's shard, or one rank's
 *             model.safetensors and optim.safetensors, from the host copy,
 *             hashed while written and fsync'ed, as a synchronous save writes
 *             them (byte for byte);
 *   commit    (main thread, collective)  when olmo_ckpt_async_complete finds
 *             every rank's thread done: the ranks agree, rank 0 writes
 *             config.yaml and state.json and renames the directory into place.
 * The thread calls nothing collective and nothing of the backend: only the
 * file system.  The collective watchdog (dist/watchdog.c) watches the main
 * thread's blocking collectives, so a long write in the thread does not
 * trigger it; a rank whose write is still going when the others wait for it
 * (a completion with wait) keeps them in one all-reduce, as the slowest
 * writer of a synchronous save does.
 *
 * The thread starts with the signals blocked (train/signals.h: it inherits the
 * main thread's mask), so no signal handler runs on it. */
#include "train/checkpoint.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "train/checkpoint_internal.h"
#include "util/clock.h"
#include "util/error.h"

struct olmo_ckpt_async {
    const struct olmo_backend *be; /* of the host memory */
    float *host;                   /* N_Q x cap floats: the copy of each quantity */
    size_t cap;
    /* the save in flight */
    bool in_flight, threaded;
    pthread_t thread;
    atomic_int done;
    const struct olmo_trainer *tr;
    struct ckpt_save sv;
    struct ckpt_shard_src src; /* several ranks: this rank's shard, in host memory */
    char name[64];
    struct written files[2];
    int rc;
    char err[2048]; /* the thread's error (olmo_last_error is per thread) */
    double copy_s, write_s;
    double delay_s; /* OLMOC_DEBUG_SAVE_DELAY */
};

static float *host_q(const struct olmo_ckpt_async *a, int q) { return a->host + (size_t)q * a->cap; }

static int write_files(struct olmo_ckpt_async *a) {
    char path[4096];
    if (a->src.rank >= 0) return ckpt_write_shard(&a->src, &a->sv.st, a->sv.tmp, a->name, &a->files[0]);
    /* One rank: whole tensors under Hugging Face names, as ckpt_write_gathered writes them. */
    const struct olmo_model *m = &a->tr->model;
    const float *const w[1] = {host_q(a, Q_MASTER)}, *const mv[2] = {host_q(a, Q_M), host_q(a, Q_V)};
    const int q_w = Q_MASTER, q_mv[2] = {Q_M, Q_V};
    return path_join(path, sizeof path, a->sv.tmp, CKPT_V1_MODEL) ||
           ckpt_write_whole_host(m, w, &q_w, 1, NULL, 0, path, &a->files[0]) ||
           path_join(path, sizeof path, a->sv.tmp, CKPT_V1_OPTIM) ||
           ckpt_write_whole_host(m, mv, q_mv, 2, &a->sv.st, a->sv.opt.step, path, &a->files[1]);
}

/* OLMOC_DEBUG_SAVE_DELAY=SECONDS: the writer sleeps that long before it writes (a slow file system:
 * what the tests use to hold a save in flight).  Read on the main thread (getenv is not safe beside
 * a setenv elsewhere). */
static double debug_delay_seconds(void) {
    const char *e = getenv("OLMOC_DEBUG_SAVE_DELAY");
    const double s = e ? strtod(e, NULL) : 0.0;
    return s > 0 && s < 3600 ? s : 0.0;
}

static void sleep_seconds(double s) {
    struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
    while (s > 0 && nanosleep(&ts, &ts) && errno == EINTR) {
    }
}

static void *writer(void *arg) {
    struct olmo_ckpt_async *a = arg;
    const double t0 = olmo_now_seconds();
    sleep_seconds(a->delay_s);
    a->rc = write_files(a) ? -1 : 0;
    if (a->rc) snprintf(a->err, sizeof a->err, "%s", olmo_last_error());
    a->write_s = olmo_now_seconds() - t0;
    atomic_store(&a->done, 1);
    return NULL;
}

/* The host copy of this rank's quantities: its shard in local indexing (several ranks), or every
 * flat parameter in global indexing (one rank: whole tensors are written from it). */
static int copy_to_host(struct olmo_ckpt_async *a, const struct olmo_trainer *tr, int world) {
    const struct olmo_backend *be = tr->model.be;
    const size_t want = world == 1 ? tr->model.n_floats : saved_local(tr);
    if (a->host && (a->cap != want || a->be != be)) {
        olmo_host_free(a->be, a->host);
        a->host = NULL;
    }
    if (!a->host) {
        a->be = be;
        a->cap = want;
        if (!(a->host = olmo_host_alloc(be, N_Q * (want ? want : 1) * sizeof(float))))
            return olmo_error_context("the host copy of an asynchronous checkpoint (train.async_save)");
    }
    if (world > 1) {
        for (int q = 0; q < N_Q; q++)
            if (be->to_host(be, host_q(a, q), q_buffer(tr, q), want * sizeof(float))) return -1;
        a->src = (struct ckpt_shard_src){
            .q = {host_q(a, Q_MASTER), host_q(a, Q_M), host_q(a, Q_V)},
            .be = NULL,
            .ranges = tr->opt.ranges,
            .n_ranges = saved_ranges(tr),
            .n_local = want,
            .rank = rank_of(tr->dist),
            .step = tr->opt.step,
        };
        shard_name(a->name, sizeof a->name, rank_of(tr->dist), world);
        return 0;
    }
    size_t covered = 0;
    for (int i = 0; i < saved_ranges(tr); i++) {
        const struct olmo_shard_range *r = &tr->opt.ranges[i];
        if (r->global + r->len > want) return olmo_error("internal: a piece lies beyond the parameters");
        for (int q = 0; q < N_Q; q++)
            if (be->to_host(be, host_q(a, q) + r->global, q_buffer(tr, q) + r->local, r->len * sizeof(float)))
                return -1;
        covered += r->len;
    }
    if (covered != want)
        return olmo_error("internal: one rank's pieces hold %zu of the %zu parameters", covered, want);
    a->src = (struct ckpt_shard_src){.rank = -1};
    return 0;
}

int olmo_ckpt_save_async(struct olmo_ckpt_async **ap, const char *out_dir, const struct olmo_trainer *tr,
                         const struct olmo_ckpt_state *st) {
    const int world = world_of(tr->dist);
    int rc = 0;
    if (!*ap && !(*ap = calloc(1, sizeof **ap))) rc = olmo_error("out of memory");
    struct olmo_ckpt_async *a = *ap;
    if (a && a->in_flight) return olmo_error("internal: an asynchronous checkpoint save is still in flight");
    const double t0 = olmo_now_seconds();
    if (!rc) rc = copy_to_host(a, tr, world);
    if (ckpt_save_begin(a ? &a->sv : &(struct ckpt_save){0}, out_dir, tr, st, rc)) return -1;
    a->copy_s = olmo_now_seconds() - t0;
    a->tr = tr;
    a->delay_s = debug_delay_seconds();
    a->rc = 0;
    a->err[0] = 0;
    memset(a->files, 0, sizeof a->files);
    atomic_store(&a->done, 0);
    a->in_flight = true;
    /* no thread to be had: the files are written here, as a synchronous save would */
    a->threaded = pthread_create(&a->thread, NULL, writer, a) == 0;
    if (!a->threaded) writer(a);
    return 0;
}

int olmo_ckpt_async_complete(struct olmo_ckpt_async *a, bool wait, long *step, char *path_out, size_t n) {
    if (!a || !a->in_flight) return 0;
    const struct olmo_dist *d = a->tr->dist;
    if (!wait) {
        double pending = atomic_load(&a->done) ? 0.0 : 1.0;
        if (world_of(d) > 1 && olmo_dist_allreduce_f64(d, &pending, 1)) return -1;
        if (pending > 0) return 0;
    }
    if (a->threaded) pthread_join(a->thread, NULL);
    a->threaded = false;
    a->in_flight = false;
    if (a->rc) olmo_error("%s", a->err);
    if (step) *step = a->sv.st.step;
    return ckpt_save_commit(&a->sv, a->tr, a->rc, a->files, path_out, n) ? -1 : 1;
}

bool olmo_ckpt_async_in_flight(const struct olmo_ckpt_async *a) { return a && a->in_flight; }

size_t olmo_ckpt_async_host_bytes(const struct olmo_ckpt_async *a) {
    return a && a->host ? N_Q * (a->cap ? a->cap : 1) * sizeof(float) : 0;
}

void olmo_ckpt_async_times(const struct olmo_ckpt_async *a, double *copy_s, double *write_s) {
    *copy_s = a ? a->copy_s : 0.0;
    *write_s = a ? a->write_s : 0.0;
}

void olmo_ckpt_async_destroy(struct olmo_ckpt_async *a) {
    if (!a) return;
    if (a->threaded) pthread_join(a->thread, NULL);
    if (a->in_flight) ckpt_opt_state_free(&a->sv.opt);
    olmo_host_free(a->be, a->host);
    free(a);
}
