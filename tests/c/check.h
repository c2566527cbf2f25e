/* What the C test programs share: CHECK (counts checks and failures, prints
 * the failing line and a message), and for tests that write files, a scratch
 * directory (check_dir, made by the test) with path and write helpers.
 * A test ends with `return check_summary();`. */
#ifndef OLMOC_TEST_CHECK_H
#define OLMOC_TEST_CHECK_H

#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/error.h"

static int failures, checks;
static char check_dir[256];

#define CHECK(cond, ...)                                \
    do {                                                \
        checks++;                                       \
        if (!(cond)) {                                  \
            failures++;                                 \
            printf("FAIL %s:%d: ", __FILE__, __LINE__); \
            printf(__VA_ARGS__);                        \
            printf("\n");                               \
        }                                               \
    } while (0)

static inline int check_summary(void) {
    printf("%d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}

/* check_dir/name, in one of four rotating buffers (so a call can take several). */
static inline const char *path_of(const char *name) {
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", check_dir, name);
    return buf[k];
}

static inline void write_bytes(const char *name, const void *p, size_t n) {
    FILE *f = fopen(path_of(name), "wb");
    if (!f || fwrite(p, 1, n, f) != n || fclose(f)) {
        printf("cannot write %s\n", path_of(name));
        exit(1);
    }
}

static inline void write_text(const char *name, const char *text) { write_bytes(name, text, strlen(text)); }

/* The last error mentions a (and b, when given). */
static inline int error_has(const char *a, const char *b) {
    const char *e = olmo_last_error();
    return strstr(e, a) && (!b || strstr(e, b));
}

/* A named case of a test program that runs cases (check_main). */
struct check_case {
    const char *name;
    void (*fn)(void);
    unsigned seconds; /* the case's alarm: a hang or unbounded work fails it; 0: 30 s */
};

static inline void check_on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "FAIL: timed out (a hang, or work that is not bounded)\n";
    if (write(1, msg, sizeof msg - 1)) _exit(1);
    _exit(1);
}

/* PROG [NAME...]: the named cases only (all by default), each under its alarm, in a scratch check_dir
 * (/tmp/olmoc_PROG_XXXXXX, removed at the end); one "ok"/"FAIL" line a case, then check_summary(). */
static inline int check_main(const char *prog, const struct check_case *cases, size_t n, int argc, char **argv) {
    snprintf(check_dir, sizeof check_dir, "/tmp/olmoc_%s_XXXXXX", prog);
    if (!mkdtemp(check_dir)) {
        perror("mkdtemp");
        return 1;
    }
    signal(SIGALRM, check_on_alarm);
    for (size_t i = 0; i < n; i++) {
        bool run = argc < 2;
        for (int a = 1; a < argc; a++) run |= !strcmp(argv[a], cases[i].name);
        if (!run) continue;
        const int before = failures;
        alarm(cases[i].seconds ? cases[i].seconds : 30);
        cases[i].fn();
        alarm(0);
        printf("%s %s\n", failures == before ? "ok  " : "FAIL", cases[i].name);
        fflush(stdout); /* a hang in the next case exits without flushing */
    }
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", check_dir);
    if (system(cmd)) printf("warning: could not remove %s\n", check_dir);
    return check_summary();
}

#endif
