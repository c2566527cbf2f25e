/* What the C test programs share: CHECK (counts checks and failures, prints
 * the failing line and a message), and for tests that write files, a scratch
 * directory (check_dir, made by the test) with path and write helpers.
 * A test ends with `return check_summary();`. */
#ifndef OLMOC_TEST_CHECK_H
#define OLMOC_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

#endif
