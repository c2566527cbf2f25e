#include "train/signals.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "util/error.h"

static volatile sig_atomic_t pending; /* the first signal received, 0 none */
static int agreed;
static struct sigaction saved_term, saved_int;
static int installed;

static void say(const char *msg) {
    ssize_t ignored = write(STDERR_FILENO, msg, strlen(msg));
    (void)ignored;
}

static void on_signal(int sig) {
    if (pending) {
        say("olmoc: second signal: exiting at once, without a checkpoint\n");
        signal(sig, SIG_DFL); /* delivered as soon as this handler returns */
        raise(sig);
        return;
    }
    pending = sig;
    say(sig == SIGTERM ? "olmoc: SIGTERM: finishing this step, then writing a checkpoint (send it again to exit at "
                         "once)\n"
                       : "olmoc: SIGINT: finishing this step, then writing a checkpoint (press Ctrl-C again to exit "
                         "at once)\n");
}

int olmo_signals_install(void) {
    if (installed) { /* a second run in this process: start afresh, keep what was saved */
        pending = 0;
        agreed = 0;
        return 0;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    pending = 0;
    agreed = 0;
    if (sigaction(SIGTERM, &sa, &saved_term) || sigaction(SIGINT, &sa, &saved_int))
        return olmo_error("cannot install the SIGTERM/SIGINT handlers");
    installed = 1;
    return 0;
}

void olmo_signals_restore(void) {
    if (!installed) return;
    sigaction(SIGTERM, &saved_term, NULL);
    sigaction(SIGINT, &saved_int, NULL);
    installed = 0;
}

void olmo_signals_release(void) {
    if (!agreed) olmo_signals_restore();
}

int olmo_signals_agree(const struct olmo_dist *dist, int *sig) {
    const int mine = pending;
    *sig = mine;
    if (dist && dist->world > 1) {
        double got[2] = {mine == SIGTERM, mine == SIGINT}; /* ranks that got each */
        if (olmo_dist_allreduce_f64(dist, got, 2)) return -1;
        *sig = got[0] > 0 ? SIGTERM : got[1] > 0 ? SIGINT : 0;
    }
    if (*sig) agreed = *sig;
    return 0;
}

int olmo_signals_stopped_by(void) { return agreed; }
