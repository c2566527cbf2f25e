/* Would fused q/k/v and gate/up projections pay?  Times the model's
 * projection GEMMs as olmoc runs them (three q/k/v GEMMs, two gate/up GEMMs:
 * forward, input gradient, weight gradient) against one GEMM over the stacked
 * weights (what a fused layout would run), on the same backend and shapes,
 * best of --repeats.  On a backend that multiplies in bf16 (cpu-bf16,
 * cuda-bf16) every operand is a bf16 buffer, as the model's compute copy of
 * the weights and bf16 activations are, so the two sides differ only in the
 * GEMMs' shapes, not in conversions.
 *
 * usage: fused_projections [--tokens N] [--d-model D] [--mlp-hidden F] [--repeats R] [--backend NAME]
 * (defaults: configs/olmo3-20m.yaml at T=512, micro-batch 4: N 2048, D 384, F 1024; backend cpu) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "util/error.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static struct olmo_backend *be;

static void die(void) {
    fprintf(stderr, "fused_projections: %s\n", olmo_last_error());
    exit(1);
}

/* n floats of backend memory, filled from the host (a device backend's memory is not the host's). */
static float *buf(size_t n) {
    float *host = malloc(n * sizeof(float)), *p = be->alloc(be, n * sizeof(float));
    if (!host) {
        fprintf(stderr, "fused_projections: out of host memory for %zu floats\n", n);
        exit(1);
    }
    if (!p) die();
    for (size_t i = 0; i < n; i++) host[i] = (float)((double)(i % 97) / 97.0 - 0.5);
    if (be->to_device(be, p, host, n * sizeof(float))) die();
    free(host);
    return p;
}

/* src (n floats of backend memory) in `type`: src itself for fp32, else a converted copy. */
static const void *typed(const float *src, size_t n, enum olmo_float_type type) {
    if (type == OLMO_F32) return src;
    void *p = be->alloc(be, n * olmo_float_type_size(type));
    if (!p || be->convert(be, p, type, src, OLMO_F32, n)) die();
    return p;
}

/* C (+)= op(A) op(B) for `parts` equal pieces (separate) or once over the stacked pieces (fused).
 * kind 0: forward Y[N, P] = X[N, D] W[P, D]^T; 1: dX[N, D] += dY[N, P] W[P, D]; 2: dW[P, D] += dY^T X. */
/* The GEMMs' operands: x, w and the output gradient dy in the backend's compute type (y: the forward's
 * fp32 output). */
struct operands {
    const void *x, *w, *dy;
    enum olmo_float_type type;
};

static const void *at(const struct operands *o, const void *base, size_t i) {
    return (const char *)base + i * olmo_float_type_size(o->type);
}

static int run(int kind, int parts, bool fused, int N, int D, int P, const struct operands *o, float *y, float *dx,
               float *dw) {
    const int n_calls = fused ? 1 : parts, p = fused ? P * parts : P;
    const enum olmo_float_type t = o->type;
    for (int i = 0; i < n_calls; i++) {
        const size_t wo = (size_t)i * P * D, yo = (size_t)i * N * P;
        const int ld = fused ? P * parts : P; /* fused: one [N, parts * P] activation buffer */
        int rc = 0;
        if (kind == 0)
            rc = be->gemm(be, false, true, N, p, D, 1.0f, o->x, t, D, at(o, o->w, wo), t, D, 0.0f, y + yo, ld);
        else if (kind == 1)
            rc = be->gemm(be, false, false, N, D, p, 1.0f, at(o, o->dy, yo), t, ld, at(o, o->w, wo), t, D, 1.0f, dx, D);
        else
            rc = be->gemm(be, true, false, p, D, N, 1.0f, at(o, o->dy, yo), t, ld, o->x, t, D, 1.0f, dw + wo, D);
        if (rc) return rc;
    }
    return be->synchronize ? be->synchronize(be) : 0;
}

int main(int argc, char **argv) {
    int N = 2048, D = 384, F = 1024, repeats = 15;
    const char *backend = "cpu";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: fused_projections [--tokens N] [--d-model D] [--mlp-hidden F] [--repeats R] "
                   "[--backend NAME]\n"
                   "Times the q/k/v (3 x D x D) and gate/up (2 x F x D) projection GEMMs as olmoc runs them\n"
                   "(one GEMM per weight) against one GEMM over the stacked weights, forward, input gradient\n"
                   "and weight gradient; best of R. Defaults: N 2048, D 384, F 1024 (configs/olmo3-20m.yaml,\n"
                   "4 x 512 tokens), R 15, backend cpu. Threads: OMP_NUM_THREADS.\n");
            return 0;
        }
        if (strcmp(a, "--tokens") && strcmp(a, "--d-model") && strcmp(a, "--mlp-hidden") && strcmp(a, "--repeats") &&
            strcmp(a, "--backend")) {
            fprintf(stderr, "fused_projections: unknown option %s (see --help)\n", a);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "fused_projections: %s needs a value (see --help)\n", a);
            return 2;
        }
        const char *v = argv[++i];
        if (!strcmp(a, "--tokens")) N = atoi(v);
        else if (!strcmp(a, "--d-model")) D = atoi(v);
        else if (!strcmp(a, "--mlp-hidden")) F = atoi(v);
        else if (!strcmp(a, "--repeats")) repeats = atoi(v);
        else backend = v;
    }
    if (N < 1 || D < 1 || F < 1 || repeats < 1 || N > 1 << 20 || D > 1 << 15 || F > 1 << 16) {
        fprintf(stderr, "fused_projections: sizes must be positive (tokens <= 2^20, d-model <= 2^15, "
                        "mlp-hidden <= 2^16)\n");
        return 2;
    }
    be = olmo_backend_create(backend);
    if (!be) {
        fprintf(stderr, "fused_projections: %s\n", olmo_last_error());
        return 1;
    }
    const int P[2] = {D, F}, parts[2] = {3, 2};
    const char *group[2] = {"q/k/v", "gate/up"}, *what[3] = {"forward", "input gradient", "weight gradient"};
    double total[2] = {0, 0};
    printf("fused_projections: backend %s, %d tokens, d_model %d, mlp_hidden %d, %s operands, best of %d\n", backend,
           N, D, F, be->compute_dtype == OLMO_BF16 ? "bf16" : "fp32", repeats);
    for (int g = 0; g < 2; g++) {
        const size_t wn = (size_t)parts[g] * P[g] * D, yn = (size_t)N * parts[g] * P[g];
        float *x = buf((size_t)N * D), *w = buf(wn), *y = buf(yn), *dx = buf((size_t)N * D), *dw = buf(wn);
        const enum olmo_float_type type = be->compute_dtype;
        const struct operands o = {typed(x, (size_t)N * D, type), typed(w, wn, type), typed(y, yn, type), type};
        for (int kind = 0; kind < 3; kind++) {
            double best[2] = {1e30, 1e30};
            for (int r = 0; r < repeats; r++)
                for (int f = 0; f < 2; f++) {
                    const double t0 = now();
                    if (run(kind, parts[g], f, N, D, P[g], &o, y, dx, dw)) {
                        fprintf(stderr, "fused_projections: %s\n", olmo_last_error());
                        return 1;
                    }
                    const double t = now() - t0;
                    best[f] = t < best[f] ? t : best[f];
                }
            total[0] += best[0];
            total[1] += best[1];
            printf("  %-8s %-16s separate %8.2f ms  fused %8.2f ms  fused speed-up %.2fx\n", group[g], what[kind],
                   best[0] * 1e3, best[1] * 1e3, best[0] / best[1]);
        }
        if (type != OLMO_F32) {
            be->free(be, (void *)o.x); be->free(be, (void *)o.w); be->free(be, (void *)o.dy);
        }
        be->free(be, x); be->free(be, w); be->free(be, y); be->free(be, dx); be->free(be, dw);
    }
    printf("  all projections: separate %.2f ms, fused %.2f ms, fused speed-up %.3fx\n", total[0] * 1e3,
           total[1] * 1e3, total[0] / total[1]);
    olmo_backend_destroy(be);
    return 0;
}
