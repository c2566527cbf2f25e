#include "train/signals.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "util/error.h"

#define N_SIGNALS 4
/* SIGUSR1: what a Slurm job asks for with --signal=USR1@SECONDS before its
 * time limit (SIGTERM is what scancel and preemption send): a job script can
 * tell the two apart by the exit status, 138 or 143, and requeue only on 138. */
static const int signals[N_SIGNALS] = {SIGTERM, SIGINT, SIGHUP, SIGUSR1};

static atomic_int pending; /* the first signal since the run started listening, 0 none */
static atomic_int armed;   /* 1: a signal asks for a stop; 0: it has its default action */
static int agreed;
static int started, installed;
static sigset_t waited;                      /* the signals the thread takes */
static struct sigaction before[N_SIGNALS];   /* what the process had */

const char *olmo_signals_name(int sig) {
    switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGHUP: return "SIGHUP";
    case SIGUSR1: return "SIGUSR1";
    default: return "a signal";
    }
}

static void say(const char *msg) {
    ssize_t ignored = write(STDERR_FILENO, msg, strlen(msg));
    (void)ignored;
}

/* Ends the process by sig's default action, from this thread. */
static void die(int sig) {
    signal(sig, SIG_DFL);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    pthread_sigmask(SIG_UNBLOCK, &one, NULL);
    raise(sig);
    _exit(128 + sig); /* not reached */
}

static int ignored_before(int sig) {
    for (int i = 0; i < N_SIGNALS; i++)
        if (signals[i] == sig) return before[i].sa_handler == SIG_IGN;
    return 0;
}

/* From the waiting thread, or from the handler on a thread that unblocked
 * the signal: only async-signal-safe calls. */
static void got(int sig) {
    if (!atomic_load(&armed)) {
        if (!ignored_before(sig)) die(sig);
        return;
    }
    int none = 0;
    if (!atomic_compare_exchange_strong(&pending, &none, sig)) {
        say("olmoc: second signal: exiting at once, without a checkpoint\n");
        die(sig);
    }
    /* async-signal-safe: no snprintf; the messages differ only in the name */
    say(sig == SIGINT ? "olmoc: SIGINT: finishing this step, then writing a checkpoint (press Ctrl-C again to exit "
                        "at once)\n"
        : sig == SIGHUP ? "olmoc: SIGHUP: finishing this step, then writing a checkpoint (send it again to exit at "
                          "once)\n"
        : sig == SIGUSR1 ? "olmoc: SIGUSR1: finishing this step, then writing a checkpoint (send it again to exit at "
                           "once)\n"
                         : "olmoc: SIGTERM: finishing this step, then writing a checkpoint (send it again to exit at "
                           "once)\n");
}

static void on_signal(int sig) { got(sig); }

static void *wait_for_signals(void *arg) {
    (void)arg;
    for (;;) {
        int sig;
        if (!sigwait(&waited, &sig)) got(sig);
    }
    return NULL;
}

/* A child process (fork, then exec) does not inherit the blocked mask. */
static void unblock_in_child(void) { pthread_sigmask(SIG_UNBLOCK, &waited, NULL); }

int olmo_signals_start(void) {
    if (started) return 0;
    sigemptyset(&waited);
    for (int i = 0; i < N_SIGNALS; i++) {
        if (sigaction(signals[i], NULL, &before[i])) return olmo_error("cannot read the handler of %s",
                                                                        olmo_signals_name(signals[i]));
        /* nohup's SIGHUP stays ignored; SIGTERM and SIGINT stop a run even if ignored by the parent */
        if (signals[i] == SIGHUP && before[i].sa_handler == SIG_IGN) continue;
        sigaddset(&waited, signals[i]);
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigfillset(&sa.sa_mask);
    atomic_store(&pending, 0);
    atomic_store(&armed, 1);
    for (int i = 0; i < N_SIGNALS; i++)
        if (sigismember(&waited, signals[i]) && sigaction(signals[i], &sa, NULL))
            return olmo_error("cannot install the %s handler", olmo_signals_name(signals[i]));
    int e = pthread_sigmask(SIG_BLOCK, &waited, NULL);
    if (e) return olmo_error("cannot block SIGTERM, SIGINT, SIGHUP and SIGUSR1: %s", strerror(e));
    if ((e = pthread_atfork(NULL, NULL, unblock_in_child)))
        return olmo_error("cannot register the fork handler: %s", strerror(e));
    pthread_attr_t attr;
    pthread_t thread;
    if ((e = pthread_attr_init(&attr))) return olmo_error("cannot start the signal thread: %s", strerror(e));
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    e = pthread_create(&thread, &attr, wait_for_signals, NULL);
    pthread_attr_destroy(&attr);
    if (e) return olmo_error("cannot start the signal thread: %s", strerror(e));
    started = 1;
    return 0;
}

int olmo_signals_install(void) {
    if (!started && olmo_signals_start()) return -1;
    if (installed) atomic_store(&pending, 0); /* a second run in this process: start afresh */
    installed = 1;
    agreed = 0;
    atomic_store(&armed, 1);
    return 0;
}

void olmo_signals_restore(void) { atomic_store(&armed, 0); }

void olmo_signals_release(void) {
    if (!agreed) olmo_signals_restore();
}

int olmo_signals_agree(const struct olmo_dist *dist, int *sig) {
    const int mine = atomic_load(&pending);
    *sig = mine;
    if (dist && dist->world > 1) {
        /* ranks that got each, in the order that decides */
        static const int order[N_SIGNALS] = {SIGTERM, SIGUSR1, SIGHUP, SIGINT};
        double got_by[N_SIGNALS];
        for (int i = 0; i < N_SIGNALS; i++) got_by[i] = mine == order[i];
        if (olmo_dist_allreduce_f64(dist, got_by, N_SIGNALS)) return -1;
        *sig = 0;
        for (int i = N_SIGNALS - 1; i >= 0; i--)
            if (got_by[i] > 0) *sig = order[i];
    }
    if (*sig) agreed = *sig;
    return 0;
}

int olmo_signals_stopped_by(void) { return agreed; }
