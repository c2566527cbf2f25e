/* cuda-bf16's attention through cuDNN's fused SDPA against the CUDA kernels it
 * falls back to (OLMOC_CUDNN=0) and the CPU backend's fp32 attention: forward
 * outputs, lse, dq, dk, dv over windows (none, inside T, 1, 2, = T, > T), GQA,
 * non-power-of-2 T and head sizes 32, 64, 128; the cuDNN forward's lse driving
 * the kernels' backward (the statistics' layout and base); and the fallbacks'
 * messages: cuDNN not loadable, forced off, intra-document masking, a head_dim
 * outside cuda-bf16's bf16 attention (12), a shape cuDNN refuses (injected in
 * the emulation): the kernels must then give their own results, bitwise.
 * Built against the emulated CUDA runtime (cuDNN: tests/c/cuda_emu/
 * emu_cudnn_sdpa.cpp) and, in CUDA builds, against the device (exit 77 when
 * there is none). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "util/error.h"
#include "util/rng.h"
#ifdef OLMOC_CUDA_EMULATION
#include "cuda_emu_inject.h"
#endif

/* Errors are max |x - ref| / max(1, max |ref|) per tensor.  Measured on the emulation (bf16
 * operands and outputs against fp32): cuDNN path vs CPU <= 6.7e-3 forward (out, lse), <= 6.9e-3
 * gradients; vs the tensor-core kernels <= 2.9e-3 forward, <= 1.3e-2 gradients (the kernels'
 * window-1 dq, dk, analytically 0: 1.2e-2 against the CPU); the tolerances leave about 3x, for
 * cuDNN's own rounding on a device (its bf16 probabilities), which only a GPU measures.  The
 * kernels' tolerance in test_backend_parity is 3e-2. */
#define TOL_FWD 2e-2
#define TOL_BWD 3e-2

static int failures, checks;
static struct olmo_rng rng;

static void check(int ok, const char *what) {
    checks++;
    if (!ok) failures++;
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
}

static void die(const char *what) {
    printf("FAIL %s: %s\n", what, olmo_last_error());
    exit(1);
}

enum { T_Q, T_K, T_V, T_DO, T_OUT, T_LSE, T_DQ, T_DK, T_DV, T_N };

struct run {
    float *h[T_N]; /* host copies */
    size_t n[T_N];
};

static void run_free(struct run *r) {
    for (int i = 0; i < T_N; i++) free(r->h[i]);
}

/* Forward and backward of `sh` on `be` from the host inputs of `in` (q, k, v, dO); `fwd_from`:
 * take out and lse from that run instead of running the forward (the backward only). */
static struct run attend(struct olmo_backend *be, const struct run *in, const struct olmo_attn_shape *sh,
                         const int32_t *docs_host, const struct run *fwd_from) {
    struct run r;
    memset(&r, 0, sizeof r);
    void *d[T_N];
    for (int i = 0; i < T_N; i++) {
        r.n[i] = in->n[i];
        r.h[i] = malloc(sizeof(float) * r.n[i]);
        d[i] = be->alloc(be, sizeof(float) * r.n[i]);
        if (!r.h[i] || !d[i]) die("alloc");
        if (i <= T_DO && be->to_device(be, d[i], in->h[i], sizeof(float) * r.n[i])) die("to_device");
    }
    const size_t N = (size_t)sh->batch * sh->seq_len;
    int32_t *docs = NULL;
    if (docs_host) {
        docs = be->alloc(be, sizeof(int32_t) * N);
        if (!docs || be->to_device(be, docs, docs_host, sizeof(int32_t) * N)) die("doc ids");
    }
    if (fwd_from) {
        if (be->to_device(be, d[T_OUT], fwd_from->h[T_OUT], sizeof(float) * r.n[T_OUT]) ||
            be->to_device(be, d[T_LSE], fwd_from->h[T_LSE], sizeof(float) * r.n[T_LSE]))
            die("to_device");
    } else if (be->attention_fwd(be, d[T_OUT], d[T_LSE], d[T_Q], d[T_K], d[T_V], docs, sh)) {
        die("attention_fwd");
    }
    if (be->attention_bwd(be, d[T_DQ], d[T_DK], d[T_DV], d[T_DO], d[T_OUT], d[T_LSE], d[T_Q], d[T_K], d[T_V], docs,
                          sh))
        die("attention_bwd");
    for (int i = 0; i < T_N; i++) {
        if (be->to_host(be, r.h[i], d[i], sizeof(float) * r.n[i])) die("to_host");
        be->free(be, d[i]);
    }
    if (docs) be->free(be, docs);
    return r;
}

static double rel_err(const float *x, const float *ref, size_t n) {
    double e = 0, m = 1;
    for (size_t i = 0; i < n; i++) {
        const double a = fabs((double)x[i] - ref[i]);
        if (!(a <= e)) e = a; /* NaN too */
        if (fabs(ref[i]) > m) m = fabs(ref[i]);
    }
    return e / m;
}

static const char *const names[T_N] = {"q", "k", "v", "dO", "out", "lse", "dq", "dk", "dv"};

/* Compares out, lse and the gradients of x against ref; prints the worst error per tensor. */
static void compare(const char *label, const char *what, const struct run *x, const struct run *ref) {
    char line[256];
    for (int i = T_OUT; i < T_N; i++) {
        const double e = rel_err(x->h[i], ref->h[i], x->n[i]);
        snprintf(line, sizeof line, "%s: %s %s error %.2e", label, what, names[i], e);
        check(e <= (i <= T_LSE ? TOL_FWD : TOL_BWD), line);
    }
}

static int bitwise(const struct run *a, const struct run *b) {
    for (int i = T_OUT; i < T_N; i++)
        if (memcmp(a->h[i], b->h[i], sizeof(float) * a->n[i])) return 0;
    return 1;
}

static struct run inputs(const struct olmo_attn_shape *sh) {
    struct run in;
    memset(&in, 0, sizeof in);
    const size_t N = (size_t)sh->batch * sh->seq_len, q = N * sh->n_heads * sh->head_dim,
                 kv = N * sh->n_kv_heads * sh->head_dim;
    const size_t n[T_N] = {q, kv, kv, q, q, (size_t)sh->batch * sh->n_heads * sh->seq_len, q, kv, kv};
    for (int i = 0; i < T_N; i++) {
        in.n[i] = n[i];
        in.h[i] = calloc(n[i], sizeof(float));
        if (!in.h[i]) die("calloc");
        if (i <= T_DO)
            for (size_t j = 0; j < n[i]; j++) in.h[i][j] = (float)(olmo_rng_normal(&rng) * (i == T_Q ? 1.5 : 1.0));
    }
    return in;
}

static int has(const struct olmo_backend *be, const char *text) {
    const char *line = be->describe ? be->describe(be) : NULL;
    return line && strstr(line, text);
}

int main(void) {
    olmo_rng_seed(&rng, 43);
    /* cuDNN not loadable: first, before any instance has loaded it (the library stays loaded) */
    setenv("OLMOC_CUDNN_LIB", "/nonexistent/libcudnn.so.9", 1);
    struct olmo_backend *none = olmo_backend_create("cuda-bf16");
    if (!none) {
        printf("SKIP: no CUDA device (%s)\n", olmo_last_error());
        return 77;
    }
    printf("     %s\n", none->describe(none));
    check(has(none, "tensor-core kernels (cuDNN not loaded: /nonexistent/libcudnn.so.9"),
          "no cuDNN at run time: the kernels run, and describe() says why");
    unsetenv("OLMOC_CUDNN_LIB");
    setenv("OLMOC_CUDNN", "0", 1);
    struct olmo_backend *kern = olmo_backend_create("cuda-bf16");
    unsetenv("OLMOC_CUDNN");
    struct olmo_backend *cudnn = olmo_backend_create("cuda-bf16");
    struct olmo_backend *cpu = olmo_backend_create("cpu");
    if (!kern || !cudnn || !cpu) die("backend");
    printf("     %s\n     %s\n", kern->describe(kern), cudnn->describe(cudnn));
    check(has(kern, "tensor-core kernels (cuDNN SDPA off: OLMOC_CUDNN=0)"), "OLMOC_CUDNN=0 forces the kernels");
    const int loaded = has(cudnn, "fused SDPA");
    check(loaded, "cuDNN loaded: describe() names its version and library");
    if (!loaded) goto done;

    const struct olmo_attn_shape shapes[] = {
        /* batch, T, heads, kv heads, head_dim, window, scale (set below) */
        {2, 67, 4, 2, 32, 0, 0},   {1, 67, 4, 4, 32, 16, 0}, {1, 50, 2, 1, 64, 50, 0}, {1, 50, 2, 1, 64, 80, 0},
        {1, 40, 2, 2, 16, 1, 0},   {1, 40, 2, 2, 16, 2, 0},  {1, 70, 4, 1, 128, 33, 0},
    };
    for (size_t c = 0; c < sizeof shapes / sizeof *shapes; c++) {
        struct olmo_attn_shape sh = shapes[c];
        sh.scale = 1.0f / sqrtf((float)sh.head_dim);
        char label[128];
        snprintf(label, sizeof label, "B%d T%d H%d/%d D%d window %d", sh.batch, sh.seq_len, sh.n_heads, sh.n_kv_heads,
                 sh.head_dim, sh.window);
        struct run in = inputs(&sh);
        struct run ref = attend(cpu, &in, &sh, NULL, NULL), a = attend(cudnn, &in, &sh, NULL, NULL),
                   k = attend(kern, &in, &sh, NULL, NULL);
        compare(label, "cuDNN vs cpu", &a, &ref);
        compare(label, "cuDNN vs kernels", &a, &k);
        compare(label, "kernels vs cpu", &k, &ref);
        /* the kernels' backward from cuDNN's out and lse: the same statistics */
        struct run mixed = attend(kern, &in, &sh, NULL, &a);
        compare(label, "kernels' backward from cuDNN's lse vs cpu", &mixed, &ref);
        run_free(&in), run_free(&ref), run_free(&a), run_free(&k), run_free(&mixed);
    }
    check(!has(cudnn, "kernels run"), "no fallback for the shapes above");

    { /* intra-document masking: the kernels run it, bitwise as with OLMOC_CUDNN=0 */
        struct olmo_attn_shape sh = {1, 48, 2, 1, 32, 0, 0};
        sh.scale = 1.0f / sqrtf(32.0f);
        int32_t docs[48];
        for (int t = 0; t < 48; t++) docs[t] = t < 20 ? 0 : t < 31 ? 1 : 2;
        struct run in = inputs(&sh);
        struct run a = attend(cudnn, &in, &sh, docs, NULL), k = attend(kern, &in, &sh, docs, NULL),
                   ref = attend(cpu, &in, &sh, docs, NULL);
        check(bitwise(&a, &k), "intra-document masking: the kernels' results, bitwise");
        compare("doc masking", "cuda-bf16 vs cpu", &a, &ref);
        check(has(cudnn, "intra-document masking: the tensor-core kernels run"), "doc masking: said in describe()");
        run_free(&in), run_free(&a), run_free(&k), run_free(&ref);
    }
    { /* head_dim 12: outside cuda-bf16's bf16 attention, the fp32 kernels run it */
        struct olmo_attn_shape sh = {1, 33, 2, 2, 12, 5, 0};
        sh.scale = 1.0f / sqrtf(12.0f);
        struct run in = inputs(&sh);
        struct run a = attend(cudnn, &in, &sh, NULL, NULL), k = attend(kern, &in, &sh, NULL, NULL);
        check(bitwise(&a, &k), "head_dim 12: the kernels' results, bitwise");
        check(has(cudnn, "head_dim 12: the fp32 kernels run"), "head_dim 12: said in describe()");
        run_free(&in), run_free(&a), run_free(&k);
    }
#ifdef OLMOC_CUDA_EMULATION
    { /* a shape cuDNN refuses (injected: building its forward graph fails), forward and backward */
        struct olmo_attn_shape sh = {1, 45, 2, 1, 32, 7, 0};
        sh.scale = 1.0f / sqrtf(32.0f);
        struct run in = inputs(&sh);
        cuda_emu_inject(CUDA_EMU_FAIL_CUDNN, 1);
        struct run a = attend(cudnn, &in, &sh, NULL, NULL), k = attend(kern, &in, &sh, NULL, NULL);
        check(!memcmp(a.h[T_OUT], k.h[T_OUT], sizeof(float) * a.n[T_OUT]) &&
                  !memcmp(a.h[T_LSE], k.h[T_LSE], sizeof(float) * a.n[T_LSE]),
              "refused forward: the kernels' out and lse, bitwise");
        check(!bitwise(&a, &k), "its backward (not refused): cuDNN's, from the kernels' out and lse");
        struct run ref = attend(cpu, &in, &sh, NULL, NULL);
        compare("refused forward", "cuda-bf16 vs cpu", &a, &ref);
        run_free(&ref);
        check(has(cudnn, "cuDNN refused a shape, the kernels run it"), "refused shape: said in describe()");
        run_free(&in), run_free(&a), run_free(&k);
    }
#else
    printf("SKIP a shape cuDNN refuses: on a device, which shapes its engines refuse is the device's\n");
#endif
    printf("     %s\n", cudnn->describe(cudnn));
done:
    olmo_backend_destroy(none);
    olmo_backend_destroy(kern);
    olmo_backend_destroy(cudnn);
    olmo_backend_destroy(cpu);
    printf("%d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
