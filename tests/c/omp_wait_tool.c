/* How much processor time OpenMP's idle threads take: olmo_openmp_wait_default,
 * then 300 tiny parallel regions each after 1 ms of serial sleep.  Threads
 * that spin while the main thread sleeps make the process's CPU time a large
 * share of the wall time; threads that wait passively, a small one.  Prints
 * "policy=<OMP_WAIT_POLICY or unset> threads=N cpu_per_wall=R"
 * (tests/python/test_run.py::test_openmp_wait_is_passive_by_default). */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include "util/clock.h"
#include "util/threads.h"

int main(int argc, char **argv) {
    (void)argc;
    olmo_openmp_wait_default(argv);
    volatile int sink = 0;
    const double t0 = olmo_now_seconds();
    for (int i = 0; i < 300; i++) {
        usleep(1000);
#pragma omp parallel
        sink += omp_get_thread_num() >= 0;
    }
    const double wall = olmo_now_seconds() - t0;
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    const double cpu = (double)r.ru_utime.tv_sec + 1e-6 * (double)r.ru_utime.tv_usec + (double)r.ru_stime.tv_sec +
                       1e-6 * (double)r.ru_stime.tv_usec;
    const char *policy = getenv("OMP_WAIT_POLICY");
    printf("policy=%s threads=%d cpu_per_wall=%.4f\n", policy ? policy : "unset", omp_get_max_threads(), cpu / wall);
    return sink > 0 ? 0 : 1;
}
