/* Peak FLOP/s of this CPU, measured two ways, for the benchmark's MFU:
 *   fma   - a register-only loop of independent fused multiply-adds on every
 *           thread (the machine's real peak at its real clock, no memory);
 *           with AVX-512 also the same on 256-bit registers (fma_avx2: the
 *           peak of AVX2 kernels there), with AVX512-BF16 the same for bf16
 *           dot products (bf16_dot), with AMX-BF16 the tile unit's bf16
 *           products (amx_bf16: what oneDNN's bf16 matmul runs there);
 *   sgemm - the GEMM of an olmoc CPU backend (--backend: cpu, the default,
 *           cpu-openblas or cpu-onednn; the same function olmoc trains
 *           with) on a large square problem and, with --shape, on the
 *           model's own shapes; with --cold, each call after a 64 MiB
 *           buffer is written (the L2s then hold none of the operands, as
 *           in a training step, where the last ops touched other arrays).
 * Prints one JSON object per line; bench/bench_train.py reads them.
 *
 * usage: peak_gemm [--backend NAME] [--size N] [--seconds S] [--cold] [--shape M,N,K,TA,TB ...] */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "util/error.h"

#if defined(__AVX512F__) || defined(__AVX2__) || defined(__FMA__)
#include <immintrin.h>
#endif
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* 12 independent accumulator chains hide the FMA latency (4-5 cycles) on two pipes. */
enum { CHAINS = 12 };

#if defined(__FMA__)
/* The FMA loop on 8 lanes (256-bit registers): the peak of an AVX2 processor, and on one that
 * also has AVX-512 the peak against which AVX2 kernels forced there (OLMOC_CPU_ISA=avx2) are
 * measured. */
static double fma256_loop(long iters, int *lanes) {
    __m256 acc[CHAINS], a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
    for (int c = 0; c < CHAINS; c++) acc[c] = _mm256_set1_ps((float)c);
    for (long i = 0; i < iters; i++)
        for (int c = 0; c < CHAINS; c++) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
    float out[8];
    __m256 s = acc[0];
    for (int c = 1; c < CHAINS; c++) s = _mm256_add_ps(s, acc[c]);
    _mm256_storeu_ps(out, s);
    *lanes = 8;
    return (double)(out[0] + out[7]);
}
#endif

static double fma_loop(long iters, int *lanes) {
#if defined(__AVX512F__)
    __m512 acc[CHAINS], a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
    for (int c = 0; c < CHAINS; c++) acc[c] = _mm512_set1_ps((float)c);
    for (long i = 0; i < iters; i++)
        for (int c = 0; c < CHAINS; c++) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
    __m512 s = acc[0];
    for (int c = 1; c < CHAINS; c++) s = _mm512_add_ps(s, acc[c]);
    *lanes = 16;
    return (double)_mm512_reduce_add_ps(s);
#elif defined(__FMA__)
    return fma256_loop(iters, lanes);
#else
    float acc[CHAINS];
    for (int c = 0; c < CHAINS; c++) acc[c] = (float)c;
    for (long i = 0; i < iters; i++)
        for (int c = 0; c < CHAINS; c++) acc[c] = acc[c] * 0.999999f + 1e-7f;
    *lanes = 1;
    return (double)acc[0];
#endif
}

#if defined(__AVX512BF16__)
/* The bf16 peak (cpu-bf16's GEMMs): vdpbf16ps adds two bf16 products to each
 * of 16 fp32 lanes, 4 FLOPs per lane and instruction. */
static double bf16_dot_loop(long iters, int *lanes) {
    __m512 acc[CHAINS];
    const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.999f), _mm512_set1_ps(0.999f)),
                   b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-7f), _mm512_set1_ps(1e-7f));
    for (int c = 0; c < CHAINS; c++) acc[c] = _mm512_set1_ps((float)c);
    for (long i = 0; i < iters; i++)
        for (int c = 0; c < CHAINS; c++) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
    __m512 s = acc[0];
    for (int c = 1; c < CHAINS; c++) s = _mm512_add_ps(s, acc[c]);
    *lanes = 16;
    return (double)_mm512_reduce_add_ps(s);
}
#endif

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
/* The AMX peak: tdpbf16ps multiplies a 16 x 32 bf16 tile by a 32 x 16 one (as 16 x 16 pairs) into a
 * 16 x 16 fp32 tile, 32 products (64 FLOPs) per output lane; 4 independent accumulator tiles from 2 A
 * and 2 B tiles, all in tile registers.  The operands' values do not matter (zeros). */
enum { AMX_CHAINS = 4 };
static double amx_bf16_loop(long iters, int *lanes) {
    struct {
        unsigned char palette, start_row, reserved[14];
        unsigned short colsb[16];
        unsigned char rows[16];
    } cfg = {.palette = 1};
    for (int t = 0; t < 8; t++) cfg.colsb[t] = 64, cfg.rows[t] = 16;
    static _Alignas(64) unsigned char zeros[16 * 64];
    static _Thread_local _Alignas(64) float out[16 * 16];
    _tile_loadconfig(&cfg);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, zeros, 64);
    _tile_loadd(5, zeros, 64);
    _tile_loadd(6, zeros, 64);
    _tile_loadd(7, zeros, 64);
    for (long i = 0; i < iters; i++) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, out, 64);
    _tile_release();
    *lanes = 16 * 16;
    return (double)out[0] + 1.0;
}

/* Linux gives a process the AMX tile state only when it asks (ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA). */
static int amx_permitted(void) {
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
}
#endif

/* FLOP/s of a register-only loop (flops_per_lane per lane, chain and
 * iteration; `chains` independent accumulators): the best of many short rounds
 * (a round that no other process interrupted shows the real peak), on one
 * thread and on all. */
static void measure_loop(const char *kind, double (*loop)(long, int *), double flops_per_lane, int chains,
                         double seconds) {
    long iters = 1 << 12;
    int lanes = 1;
    double sink = 0.0;
    for (;;) { /* calibrate to ~1 ms per round: short enough to often run uninterrupted */
        double t0 = now();
        sink += loop(iters, &lanes);
        if (now() - t0 > 0.001 || iters > (1L << 34)) break;
        iters *= 2;
    }
    int threads = omp_get_max_threads();
    double best1 = 0.0, best_all = 0.0;
    for (double start = now(); now() - start < seconds / 2;) {
        double t0 = now();
        sink += loop(iters, &lanes);
        double f = flops_per_lane * lanes * chains * (double)iters / (now() - t0);
        if (f > best1) best1 = f;
    }
    for (double start = now(); now() - start < seconds / 2;) {
        double t0 = now();
#pragma omp parallel reduction(+ : sink)
        {
            int l;
            sink += loop(iters, &l);
        }
        double f = flops_per_lane * lanes * chains * (double)iters * threads / (now() - t0);
        if (f > best_all) best_all = f;
    }
    printf("{\"kind\": \"%s\", \"threads\": %d, \"simd_lanes\": %d, \"gflops\": %.2f, \"gflops_one_thread\": %.2f, "
           "\"sink\": %.1f}\n",
           kind, threads, lanes, best_all * 1e-9, best1 * 1e-9, sink > 0 ? 1.0 : 0.0);
}

static struct olmo_backend *be; /* the process's: freed at exit */

/* --cold: many times the L2s (2 MiB a core on the Intel VMs); how much of the L3 (480 MiB reported, the
 * host's) 2 vCPUs get is not known, so the operands may still come from there rather than from memory */
enum { EVICT_BYTES = 64 << 20 };
static float *evict_buf;
static double evict_sink;

static void evict_caches(void) {
    const size_t n = EVICT_BYTES / sizeof(float);
    double s = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : s)
    for (size_t i = 0; i < n; i++) {
        evict_buf[i] += 1.0f;
        if ((i & 4095) == 0) s += evict_buf[i];
    }
    evict_sink += s;
}

static void measure_sgemm(int m, int n, int k, int ta, int tb, double seconds, const char *kind) {
    /* Row-major op(A) m x k, op(B) k x n. */
    size_t sa = (size_t)m * k, sb = (size_t)k * n, sc = (size_t)m * n;
    float *a = malloc(sa * sizeof(float)), *b = malloc(sb * sizeof(float)), *c = malloc(sc * sizeof(float));
    if (!a || !b || !c) {
        fprintf(stderr, "peak_gemm: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < sa; i++) a[i] = (float)((i * 7) % 13) * 0.01f;
    for (size_t i = 0; i < sb; i++) b[i] = (float)((i * 5) % 11) * 0.01f;
    memset(c, 0, sc * sizeof(float));
    int lda = ta ? m : k, ldb = tb ? k : n;
    double flop = 2.0 * m * n * (double)k;
    /* warm up, then time repetitions until `seconds` pass; report the median */
    be->gemm(be, ta, tb, m, n, k, 1.0f, a, OLMO_F32, lda, b, OLMO_F32, ldb, 0.0f, c, n);
    double times[256];
    int reps = 0;
    double start = now(), evicting = 0.0;
    while (reps < 256 && (reps < 3 || now() - start - evicting < seconds)) {
        if (evict_buf) {
            double e0 = now();
            evict_caches();
            evicting += now() - e0;
        }
        double t0 = now();
        be->gemm(be, ta, tb, m, n, k, 1.0f, a, OLMO_F32, lda, b, OLMO_F32, ldb, 0.0f, c, n);
        times[reps++] = now() - t0;
    }
    for (int i = 1; i < reps; i++) /* insertion sort for the median */
        for (int j = i; j > 0 && times[j] < times[j - 1]; j--) {
            double t = times[j];
            times[j] = times[j - 1];
            times[j - 1] = t;
        }
    printf("{\"kind\": \"%s\", \"m\": %d, \"n\": %d, \"k\": %d, \"ta\": %d, \"tb\": %d, \"reps\": %d, "
           "\"gflops\": %.2f, \"gflops_best\": %.2f}\n",
           kind, m, n, k, ta, tb, reps, flop / times[reps / 2] * 1e-9, flop / times[0] * 1e-9);
    fflush(stdout);
    free(a);
    free(b);
    free(c);
}

int main(int argc, char **argv) {
    int size = 2048;
    double seconds = 1.0;
    int n_shapes = 0, cold = 0;
    int shapes[64][5];
    const char *backend = "cpu";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--backend") && i + 1 < argc) {
            backend = argv[++i];
        } else if (!strcmp(argv[i], "--size") && i + 1 < argc) {
            size = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) {
            seconds = atof(argv[++i]);
        } else if (!strcmp(argv[i], "--cold")) {
            cold = 1;
        } else if (!strcmp(argv[i], "--shape") && i + 1 < argc && n_shapes < 64) {
            int *s = shapes[n_shapes];
            if (sscanf(argv[++i], "%d,%d,%d,%d,%d", &s[0], &s[1], &s[2], &s[3], &s[4]) != 5 || s[0] <= 0 ||
                s[1] <= 0 || s[2] <= 0) {
                fprintf(stderr, "peak_gemm: --shape wants M,N,K,TA,TB\n");
                return 2;
            }
            n_shapes++;
        } else {
            fprintf(stderr, "usage: peak_gemm [--backend cpu|cpu-openblas|cpu-onednn] [--size N] [--seconds S] [--cold] "
                            "[--shape M,N,K,TA,TB ...]\n");
            return 2;
        }
    }
    be = olmo_backend_create(backend);
    if (!be || !be->host_memory) {
        fprintf(stderr, "peak_gemm: %s\n", be ? "a CPU backend, please" : olmo_last_error());
        return 2;
    }
    /* the library and its kernels (OpenBLAS: its choice for this processor, or OPENBLAS_CORETYPE's) */
    const char *coretype = getenv("OPENBLAS_CORETYPE");
    printf("{\"kind\": \"blas\", \"backend\": \"%s\", \"gemm\": \"%s\", \"openblas_coretype\": \"%s\"}\n", be->name,
           be->describe(be), coretype ? coretype : "");
    measure_loop("fma", fma_loop, 2.0, CHAINS, seconds);
#if defined(__AVX512F__) && defined(__FMA__)
    measure_loop("fma_avx2", fma256_loop, 2.0, CHAINS, seconds);
#endif
#if defined(__AVX512BF16__)
    measure_loop("bf16_dot", bf16_dot_loop, 4.0, CHAINS, seconds);
#endif
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
    if (amx_permitted()) measure_loop("amx_bf16", amx_bf16_loop, 64.0, AMX_CHAINS, seconds);
#endif
    if (size > 0) measure_sgemm(size, size, size, 0, 0, seconds * 2, "sgemm_square");
    for (int i = 0; i < n_shapes; i++)
        measure_sgemm(shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3], shapes[i][4], seconds, "sgemm_shape");
    if (cold && n_shapes > 0) {
        evict_buf = calloc(EVICT_BYTES / sizeof(float), sizeof(float));
        if (!evict_buf) {
            fprintf(stderr, "peak_gemm: out of memory\n");
            return 1;
        }
        for (int i = 0; i < n_shapes; i++)
            measure_sgemm(shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3], shapes[i][4], seconds,
                          "sgemm_shape_cold");
        if (evict_sink < 0) printf("%g\n", evict_sink);
        free(evict_buf);
    }
    return 0;
}
