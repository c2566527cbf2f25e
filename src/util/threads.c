/* OpenMP's wait policy (util/threads.h). */
#include "util/threads.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Marks a process that olmo_openmp_wait_default executed again: the policy is olmoc's choice, not the user's. */
#define MARK "OLMOC_OMP_WAIT_DEFAULT"

void olmo_openmp_wait_default(char **argv) {
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT") || getenv("KMP_BLOCKTIME")) return;
    if (setenv("OMP_WAIT_POLICY", "passive", 1) || setenv(MARK, "1", 1)) return;
    fflush(NULL);
    execv("/proc/self/exe", argv);
    unsetenv("OMP_WAIT_POLICY"); /* no /proc: the runtime's default wait, and no header saying otherwise */
    unsetenv(MARK);
}

const char *olmo_openmp_wait_describe(void) {
    static char text[96];
    const char *policy = getenv("OMP_WAIT_POLICY"), *spin = getenv("GOMP_SPINCOUNT");
    const char *mark = getenv(MARK);
    if (policy && mark && !strcmp(mark, "1") && !strcmp(policy, "passive"))
        return "passive (olmoc's default; OMP_WAIT_POLICY=active to spin)";
    if (policy) snprintf(text, sizeof text, "OMP_WAIT_POLICY=%.40s", policy);
    else if (spin) snprintf(text, sizeof text, "GOMP_SPINCOUNT=%.40s", spin);
    else if (getenv("KMP_BLOCKTIME")) snprintf(text, sizeof text, "KMP_BLOCKTIME=%.40s", getenv("KMP_BLOCKTIME"));
    else return "the OpenMP runtime's default";
    return text;
}
