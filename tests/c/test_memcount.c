/* The backends' memory counters (backend.h: mem_stats): the allocation table
 * itself, then a backend instance (argument: its name; CUDA without a device
 * exits 77): alloc and free at the size it holds, the peak, scratch growth
 * inside an op, the profiling wrapper's forwarding.  tests/python/test_memplan.py
 * holds the memory plan to the same counters during training. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/memcount.h"
#include "backend/profile.h"
#include "util/error.h"

static int failures, checks;

static void check(int ok, const char *what) {
    checks++;
    if (!ok) failures++;
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
}

static void table(void) {
    struct olmo_memcount c = {0};
    enum { N = 5000 };
    static char blocks[N + 1];
    size_t want = 0;
    int ok = 1;
    for (int i = 0; i < N; i++) {
        ok &= olmo_memcount_add(&c, blocks + i, (size_t)i + 1) == 0;
        want += (size_t)i + 1;
    }
    check(ok && c.live == want && c.peak == want && c.n_live == N, "table: 5000 pointers added (growing the table)");
    for (int i = 0; i < N; i += 2) {
        olmo_memcount_remove(&c, blocks + i);
        want -= (size_t)i + 1;
    }
    olmo_memcount_remove(&c, NULL);
    olmo_memcount_remove(&c, blocks + N); /* never added: nothing */
    check(c.live == want && c.n_live == N / 2 && c.peak > c.live, "table: every other one removed, peak kept");
    for (int i = 0; i < N; i += 2) ok &= olmo_memcount_add(&c, blocks + i, 1) == 0; /* into tombstones */
    check(ok && c.live == want + N / 2 && c.n_live == N, "table: re-added into freed slots");
    olmo_memcount_scratch(&c, 0, 1000);
    olmo_memcount_scratch(&c, 1000, 400);
    check(c.scratch == 400 && c.live == want + N / 2 + 400, "table: scratch grows and shrinks within live");
    olmo_memcount_free(&c);
}

static struct olmo_mem_stats stats(const struct olmo_backend *be) {
    struct olmo_mem_stats s;
    if (olmo_backend_mem_stats(be, &s)) {
        printf("FAIL %s\n", olmo_last_error());
        exit(1);
    }
    return s;
}

int main(int argc, char **argv) {
    const char *name = argc > 1 ? argv[1] : "cpu";
    table();
    struct olmo_backend *be = olmo_backend_create(name);
    if (!be) {
        const int skip = !strncmp(name, "cuda", 4); /* no CUDA backend or device here */
        printf("%s%s: %s\n", skip ? "SKIP: " : "", name, olmo_last_error());
        return skip ? 77 : 1;
    }
    const size_t align = be->host_memory ? 64 : 256;
    const struct olmo_mem_stats s0 = stats(be);
    void *a = be->alloc(be, 1000), *b = be->alloc(be, (size_t)1 << 20);
    const size_t a_bytes = (1000 + align - 1) / align * align;
    struct olmo_mem_stats s1 = stats(be);
    check(a && b && s1.live == s0.live + a_bytes + ((size_t)1 << 20) && s1.n_live == s0.n_live + 2,
          "alloc counts each buffer at its rounded size");
    be->free(be, a);
    struct olmo_mem_stats s2 = stats(be);
    check(s2.live == s1.live - a_bytes && s2.peak == s1.peak && s2.n_live == s1.n_live - 1,
          "free subtracts it; the peak stays");
    /* A GEMM whose operand the backend converts into its scratch: a bf16 operand on an fp32
     * backend (widened), an fp32 one on a bf16 backend (rounded or packed). */
    const int n = 64;
    const enum olmo_float_type a_type = be->compute_dtype == OLMO_BF16 ? OLMO_F32 : OLMO_BF16;
    void *x = be->alloc(be, sizeof(float) * n * n), *y = be->alloc(be, sizeof(float) * n * n);
    float *z = be->alloc(be, sizeof(float) * n * n);
    const struct olmo_mem_stats s3 = stats(be);
    const int rc = be->gemm(be, false, false, n, n, n, 1.0f, x, a_type, n, y, OLMO_F32, n, 0.0f, z, n);
    if (be->synchronize) be->synchronize(be);
    const struct olmo_mem_stats s4 = stats(be);
    check(rc == 0 && s4.scratch > s3.scratch && s4.live - s3.live == s4.scratch - s3.scratch && s4.peak >= s4.live,
          "an op's scratch growth counts in live and peak");
    struct olmo_backend *prof = olmo_backend_profiled(be);
    struct olmo_mem_stats sp = stats(prof);
    check(prof && sp.live == s4.live && sp.peak == s4.peak, "the profiling wrapper forwards the counters");
    olmo_backend_destroy(prof);
    be->free(be, b);
    be->free(be, x);
    be->free(be, y);
    be->free(be, z);
    const struct olmo_mem_stats s5 = stats(be);
    check(s5.live == s5.scratch && s5.n_live == 0 && s5.peak == s4.peak, "all freed: only scratch is left");
    printf("%s: peak %zu bytes, scratch %zu bytes\n", name, s5.peak, s5.scratch);
    olmo_backend_destroy(be);
    printf("%d/%d checks passed\n", checks - failures, checks);
    return failures ? 1 : 0;
}
