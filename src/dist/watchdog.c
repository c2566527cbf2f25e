/* The collective watchdog (dist/dist.h): a thread that ends the process when
 * one blocking collective has waited longer than the timeout.
 *
 * A rank that stops responding (stopped, a stalled file system, a wedged
 * GPU) leaves the others blocked in their next collective for ever: MPI
 * notices a process that died, not one that stopped.  The collectives mark
 * when they start waiting (olmo_watchdog_enter) and when they are done
 * (olmo_watchdog_leave); the thread wakes every second and, once the wait
 * is older than the timeout, prints what waited and at which step and ends
 * the process with OLMO_WATCHDOG_EXIT.  It exits rather than calling
 * MPI_Abort: MPI was initialised for one thread (MPI_THREAD_SINGLE), and the
 * main thread is inside the library.  mpirun ends every other rank when one
 * exits with a non-zero status before MPI_Finalize.  The waiting thread is
 * not woken: it still spins (OpenMPI polls) until then. */
#include "dist/dist.h"

#include <errno.h>
#include <stdbool.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "util/error.h"

static struct {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    bool running, stop;
    double timeout;
    int rank;
    /* what the main thread waits in: since (CLOCK_MONOTONIC nanoseconds; 0 = no wait), its name, the step */
    _Atomic long long since;
    _Atomic(const char *) what;
    _Atomic long step;
    _Atomic int depth;
} wd = {.lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void olmo_watchdog_enter(const char *what) {
    if (atomic_fetch_add(&wd.depth, 1) != 0) return; /* the outermost wait names it */
    atomic_store(&wd.what, what);
    atomic_store(&wd.since, now_ns());
}

void olmo_watchdog_leave(void) {
    if (atomic_fetch_sub(&wd.depth, 1) == 1) atomic_store(&wd.since, 0);
}

void olmo_watchdog_step(long step) { atomic_store(&wd.step, step); }

static void fire(double waited) {
    char msg[512];
    const int n = snprintf(msg, sizeof msg,
                           "olmoc (rank %d): %s has waited %.0f s at step %ld, more than train.collective_timeout "
                           "(%g s): another rank stopped responding; ending this rank (exit %d)\n",
                           wd.rank, atomic_load(&wd.what), waited, atomic_load(&wd.step), wd.timeout,
                           OLMO_WATCHDOG_EXIT);
    /* write(2): stdio's locks may be held by the thread that hangs */
    if (n > 0 && write(STDERR_FILENO, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1) < 0) {
    }
    _exit(OLMO_WATCHDOG_EXIT);
}

static void *watch(void *arg) {
    (void)arg;
    const long long poll_ns = wd.timeout < 4 ? (long long)(wd.timeout * 2.5e8) : 1000000000LL;
    long long last = now_ns();
    pthread_mutex_lock(&wd.lock);
    while (!wd.stop) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        const long long ns = (long long)until.tv_nsec + poll_ns;
        until.tv_sec += (time_t)(ns / 1000000000LL);
        until.tv_nsec = (long)(ns % 1000000000LL);
        const int rc = pthread_cond_timedwait(&wd.wake, &wd.lock, &until);
        if (wd.stop || (rc && rc != ETIMEDOUT)) break;
        /* a gap far longer than the poll: this process itself was stopped (SIGSTOP, a suspended machine);
         * that time is not a wait for the other ranks */
        const long long now = now_ns(), paused = now - last - 2 * poll_ns - 1000000000LL;
        last = now;
        long long since = atomic_load(&wd.since);
        if (since && paused > 0 && atomic_compare_exchange_strong(&wd.since, &since, since + paused)) since += paused;
        if (since && (double)(now - since) * 1e-9 > wd.timeout) fire((double)(now - since) * 1e-9);
    }
    pthread_mutex_unlock(&wd.lock);
    return NULL;
}

int olmo_watchdog_start(const struct olmo_dist *d, double timeout_s) {
    olmo_watchdog_stop(); /* a second run of the process: its own timeout */
    if (d->world <= 1 || timeout_s <= 0) return 0;
    wd.timeout = timeout_s;
    wd.rank = d->rank;
    wd.stop = false;
    atomic_store(&wd.since, 0);
    atomic_store(&wd.depth, 0);
    atomic_store(&wd.step, 0);
    const int rc = pthread_create(&wd.thread, NULL, watch, NULL);
    if (rc) return olmo_error("cannot start the collective watchdog thread (error %d)", rc);
    wd.running = true;
    return 0;
}

void olmo_watchdog_stop(void) {
    if (!wd.running) return;
    pthread_mutex_lock(&wd.lock);
    wd.stop = true;
    pthread_cond_signal(&wd.wake);
    pthread_mutex_unlock(&wd.lock);
    pthread_join(wd.thread, NULL);
    wd.running = false;
    wd.stop = false;
}
