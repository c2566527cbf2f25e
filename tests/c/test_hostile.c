/* Hostile and careless inputs (issue 19): each case here crashed, hung,
 * overflowed a buffer or was silently accepted before its fix.  Runs under
 * ASan+UBSan too; every case is bounded to seconds (an alarm turns a hang
 * into a failure). */
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "config/config.h"
#include "data/token_file.h"
#include "io/safetensors.h"
#include "util/error.h"

static int failures, checks;
static char dir[256];

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

static const char *path_of(const char *name) {
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

static void write_bytes(const char *name, const void *p, size_t n) {
    FILE *f = fopen(path_of(name), "wb");
    if (!f || fwrite(p, 1, n, f) != n || fclose(f)) {
        printf("cannot write %s\n", path_of(name));
        exit(1);
    }
}

static __attribute__((unused)) void write_text(const char *name, const char *text) { write_bytes(name, text, strlen(text)); }

static int error_has(const char *a, const char *b) {
    const char *e = olmo_last_error();
    return strstr(e, a) && (!b || strstr(e, b));
}

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "FAIL: timed out (a hang)\n";
    if (write(1, msg, sizeof msg - 1)) _exit(1);
    _exit(1);
}

/* ---------------------------------------------------------------- token files */

/* Weights whose sum overflows to inf: the per-source counts were NaN-derived
 * garbage and build_epoch wrote past the order array. */
static void test_mix_weight_overflow(void) {
    uint16_t tok[64];
    for (int i = 0; i < 64; i++) tok[i] = (uint16_t)i;
    write_bytes("w.u16", tok, sizeof tok);
    char mix[1200];
    snprintf(mix, sizeof mix, "%s:1e308,%s:1e308", path_of("w.u16"), path_of("w.u16"));
    struct olmo_loader l;
    int rc = olmo_loader_open_mix(&l, mix, OLMO_DTYPE_AUTO, 8, 64, 1);
    CHECK(!rc, "weights 1e308,1e308 open: %s", olmo_last_error());
    if (!rc) {
        /* equal weights: an even split of the 16 instances */
        CHECK(l.n_instances == 16 && l.sources[0].take == 8 && l.sources[1].take == 8, "takes %zu %zu of %zu",
              l.sources[0].take, l.sources[1].take, l.n_instances);
        int32_t row[8];
        for (int i = 0; i < 40; i++) CHECK(!olmo_loader_next(&l, row, 1), "next: %s", olmo_last_error());
        olmo_loader_close(&l);
    }
    /* one finite weight so large that N * w overflows though the sum does not */
    snprintf(mix, sizeof mix, "%s:1e308,%s:1e300", path_of("w.u16"), path_of("w.u16"));
    rc = olmo_loader_open_mix(&l, mix, OLMO_DTYPE_AUTO, 8, 64, 1);
    CHECK(!rc && l.sources[0].take == 16 && l.sources[1].take == 0, "1e308 vs 1e300: %s", olmo_last_error());
    if (!rc) olmo_loader_close(&l);
}

/* A FIFO named as a token file: open() waited forever for a writer. */
static void test_fifo_token_file(void) {
    if (mkfifo(path_of("fifo.u16"), 0600)) {
        CHECK(0, "mkfifo failed");
        return;
    }
    struct olmo_token_file f;
    CHECK(olmo_token_file_open(&f, path_of("fifo.u16")) && error_has("fifo.u16", "not a regular file"),
          "FIFO refused: %s", olmo_last_error());
    CHECK(olmo_token_file_open(&f, dir) && error_has(dir, "directory"), "directory refused: %s", olmo_last_error());
}

/* The file shrinks while mapped: reading the vanished pages raised SIGBUS. */
static void test_token_file_shrinks(void) {
    enum { N = 64 * 1024 };
    uint16_t *tok = malloc(N * sizeof *tok);
    for (int i = 0; i < N; i++) tok[i] = (uint16_t)(i % 100);
    write_bytes("shrink.u16", tok, N * sizeof *tok);
    struct olmo_loader l;
    CHECK(!olmo_loader_open(&l, path_of("shrink.u16"), 1024, 100, 7), "open: %s", olmo_last_error());
    int32_t *rows = malloc(64 * 1024 * sizeof *rows);
    CHECK(!olmo_loader_next(&l, rows, 2), "read before the shrink: %s", olmo_last_error());
    CHECK(!truncate(path_of("shrink.u16"), 4096), "truncate");
    int rc = olmo_loader_next(&l, rows, 64); /* every instance of the epoch: most are gone now */
    CHECK(rc && error_has("shrink.u16", "shrank while it was being read"), "shrink reported: %s",
          olmo_last_error());
    olmo_loader_close(&l);
    /* a SIGBUS elsewhere still takes its default action (not swallowed by the guard) */
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        FILE *null = freopen("/dev/null", "w", stderr); /* ASan's report */
        (void)null;
        raise(SIGBUS);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    /* the default action, or (under ASan) its handler's report and exit */
    CHECK((WIFSIGNALED(status) && WTERMSIG(status) == SIGBUS) || (WIFEXITED(status) && WEXITSTATUS(status)),
          "an unrelated SIGBUS still kills (status %d)", status);
    free(tok);
    free(rows);
}

static const struct {
    const char *name;
    void (*fn)(void);
} tests[] = {
    {"mix_weight_overflow", test_mix_weight_overflow},
    {"fifo_token_file", test_fifo_token_file},
    {"token_file_shrinks", test_token_file_shrinks},
};

/* test_hostile [NAME...]: the named cases only (all by default). */
int main(int argc, char **argv) {
    snprintf(dir, sizeof dir, "/tmp/olmoc_test_hostile_XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    signal(SIGALRM, on_alarm);
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
        bool run = argc < 2;
        for (int a = 1; a < argc; a++) run |= !strcmp(argv[a], tests[i].name);
        if (!run) continue;
        int before = failures;
        alarm(30); /* a hang fails the run instead of blocking it */
        tests[i].fn();
        alarm(0);
        printf("%s %s\n", failures == before ? "ok  " : "FAIL", tests[i].name);
        fflush(stdout);
    }
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) printf("warning: could not remove %s\n", dir);
    printf("%d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
