/* SIGTERM, SIGINT, SIGHUP and SIGUSR1 (what a cluster scheduler sends some
 * time before it kills a job, Ctrl-C, a lost terminal, and the warning a
 * Slurm job asks for with --signal=USR1@SECONDS): the first one only
 * asks the run to stop, so it finishes the step it is in, writes a checkpoint
 * and exits with 128 + the signal; a second one ends the process at once
 * (the default action of that signal).
 *
 * No signal handler ever runs on a compute thread: olmo_signals_start blocks
 * the four signals in the calling thread, before it starts any other thread
 * (OpenMP, oneDNN, MPI progress threads inherit the mask), and one dedicated
 * thread takes them with sigwait. A handler interrupting a library kernel
 * would put its frame wherever the kernel's stack pointer is: oneDNN's JIT
 * GEMMs point it at a heap workspace, and a signal there corrupts the heap.
 * (Should a thread unblock them anyway, a handler doing the same bookkeeping
 * is installed too; a SIGHUP ignored by the parent, as under nohup, stays
 * ignored.)
 *
 * Under MPI the ranks may be signalled at slightly different times, or only
 * some of them: olmo_signals_agree, called by every rank after every step,
 * makes all ranks stop after the same step. */
#ifndef OLMOC_SIGNALS_H
#define OLMOC_SIGNALS_H

#include "dist/dist.h"

/* Blocks the signals in this thread and starts the thread that waits for
 * them; from then on a signal asks for a stop (it is remembered until a run
 * asks, so one that comes while the process starts stops the run after its
 * first step). Call it first, before anything starts a thread. Once per
 * process; later calls do nothing. */
int olmo_signals_start(void);
/* A run starts listening: olmo_signals_start if nobody called it (threads
 * started before then are not covered); for a second run in this process,
 * forgets the signal the last one stopped on. */
int olmo_signals_install(void);
/* Signals end the process again (their default action; an inherited
 * SIG_IGN is kept). */
void olmo_signals_restore(void);
/* olmo_signals_restore, unless a stop was agreed: then a late signal (a
 * scheduler signals the ranks one after another, and a rank may already be
 * stopping because another one was told) cannot kill the process between
 * the checkpoint and its exit report. The process is about to exit with
 * 128 + the signal anyway. */
void olmo_signals_release(void);
/* Collective when dist has several ranks: the signal to stop on (SIGTERM if
 * any rank got one, else SIGUSR1, else SIGHUP, else SIGINT), or 0 to go on. */
int olmo_signals_agree(const struct olmo_dist *dist, int *sig);
/* The signal agreed on last (0: none). */
int olmo_signals_stopped_by(void);
/* "SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1" (or "a signal"). */
const char *olmo_signals_name(int sig);

#endif
