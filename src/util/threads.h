#ifndef OLMOC_THREADS_H
#define OLMOC_THREADS_H

/* How OpenMP's idle threads wait.  By default they spin for a while
 * (libgomp: 300000 iterations) before they sleep; on a machine where other
 * processes run, a spinning thread takes the core that the thread it waits
 * for needs, and a step can take several times as long.  olmoc makes them
 * wait passively (OMP_WAIT_POLICY=passive) unless the user chose a policy:
 * OMP_WAIT_POLICY, GOMP_SPINCOUNT or KMP_BLOCKTIME in the environment.
 *
 * libgomp reads the variable once, when it is loaded, before main: setting
 * it afterwards changes nothing, so the process sets it and executes itself
 * again (execv of /proc/self/exe with the same arguments; same PID).  Call it
 * first thing in main, before any thread or file is made.  Returns only when
 * nothing was to be done or the exec failed (then the variable is unset
 * again and the runtime's default stays). */
void olmo_openmp_wait_default(char **argv);

/* What the process runs with, for log headers: "passive (olmoc's default)",
 * "OMP_WAIT_POLICY=active", "GOMP_SPINCOUNT=..." or "the OpenMP runtime's default". */
const char *olmo_openmp_wait_describe(void);

#endif
