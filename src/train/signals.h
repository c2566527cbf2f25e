/* SIGTERM and SIGINT (what a cluster scheduler sends some time before it
 * kills a job, and Ctrl-C): the first one only asks the run to stop, so it
 * finishes the step it is in, writes a checkpoint and exits non-zero; a
 * second one ends the process at once (the default action of that signal).
 * Under MPI the ranks may be signalled at slightly different times, or only
 * some of them: olmo_signals_agree, called by every rank after every step,
 * makes all ranks stop after the same step. */
#ifndef OLMOC_SIGNALS_H
#define OLMOC_SIGNALS_H

#include "dist/dist.h"

/* Installs the handlers (SA_RESTART: interrupted system calls resume). */
int olmo_signals_install(void);
/* Puts back the handlers that were there before. */
void olmo_signals_restore(void);
/* olmo_signals_restore, unless a stop was agreed: then the handlers stay, so
 * that a late signal (a scheduler signals the ranks one after another, and a
 * rank may already be stopping because another one was told) cannot kill the
 * process between the checkpoint and its exit report. The process is about
 * to exit with 128 + the signal anyway. */
void olmo_signals_release(void);
/* Collective when dist has several ranks: the signal to stop on (SIGTERM if
 * any rank got one, else SIGINT if any did), or 0 to go on. */
int olmo_signals_agree(const struct olmo_dist *dist, int *sig);
/* The signal agreed on last (0: none). */
int olmo_signals_stopped_by(void);

#endif
