/* Training throughput of a config on a backend: full optimizer steps
 * (forward, backward, clipping, AdamW) on random tokens, so no data files
 * are needed.  Prints tokens/s, achieved model TFLOP/s and MFU.
 *
 *   bench_train CONFIG.yaml BACKEND [--steps N] [--warmup N] [--peak-tflops X] [--quick-init]
 *               [--profile-steps N] [--set KEY=VALUE ...]
 *
 * --profile-steps N runs N more steps after the timed ones with every op
 * timed (backend/profile.h: time per op, GEMM and attention GFLOP/s).  On a
 * device each op then waits for the one before, so these steps are not part
 * of the throughput.
 *
 * OLMOC_MEMSTATS=1 prints the backend's counted peak at the end, as olmoc train does.
 *
 * --quick-init fills the matrices with uniform noise of the configured std (a
 * few seconds for 1.5e9 parameters) instead of the seeded truncated normal
 * (a minute on one core); throughput does not depend on the values.
 *
 * Model FLOPs per token are olmo_model_flops_per_token (6 x matmul parameters,
 * LM head included, plus causal/sliding attention), the usual MFU convention.
 * MFU is reported against the H200 SXM dense bf16 tensor peak (989.4 TFLOP/s)
 * and against the peak of the precision the backend computes GEMMs in
 * (fp32 non-tensor 66.9, TF32 tensor 494.7, bf16 tensor 989.4), or against
 * --peak-tflops when given. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/clock.h"
#include "backend/backend.h"
#include "backend/profile.h"
#include "config/config.h"
#include "model/model.h"
#include "train/run.h"
#include "util/error.h"
#include "util/rng.h"

#ifdef OLMOC_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define H200_BF16_DENSE_TFLOPS 989.4
#define H200_TF32_DENSE_TFLOPS 494.7
#define H200_FP32_TFLOPS 66.9

static void usage(FILE *out) {
    fprintf(out, "usage: bench_train CONFIG.yaml BACKEND [--steps N] [--warmup N] [--peak-tflops X] [--quick-init] "
                 "[--profile-steps N] [--set KEY=VALUE ...]\n"
                 "Training throughput (tokens/s, model TFLOP/s, MFU) of CONFIG on BACKEND, on random tokens.\n"
                 "BACKEND: cpu, cpu-openblas, cpu-onednn, cpu-bf16, and in CUDA builds cuda, cuda-tf32, cuda-bf16,\n"
                 "         cuda-bf16-cublas\n"
                 "  --steps N          timed steps (default 5)\n"
                 "  --warmup N         untimed steps first (default 1)\n"
                 "  --peak-tflops X    MFU against X instead of the H200 peak of the backend's precision\n"
                 "  --quick-init       uniform weights of the configured std (fast for large models)\n"
                 "  --profile-steps N  N more steps with every op timed, then a profile (default 0)\n"
                 "  --set KEY=VALUE    override a config value (as in olmoc train)\n");
}

/* A whole non-negative decimal number, or -1. */
static int count_arg(const char *text) {
    char *end;
    const long v = strtol(text, &end, 10);
    return *text && !*end && v >= 0 && v <= 1000000 ? (int)v : -1;
}

/* Matrices uniform in [-a, a] with a = std * sqrt(3) (same std as the real init), norm weights 1. */
static int quick_init(struct olmo_model *m, uint64_t seed) {
    float *host = olmo_malloc(m->n_floats * sizeof(float), "weights");
    if (!host) return -1;
    const float a = (float)(m->cfg.init_std * 1.7320508075688772);
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int i = 0; i < m->n_tensors; i++) {
        const struct olmo_param *p = &m->params[i];
        float *w = host + p->offset;
        for (size_t j = 0; j < p->numel; j++) {
            if (p->cols == 1) {
                w[j] = 1.0f;
                continue;
            }
            x ^= x << 13, x ^= x >> 7, x ^= x << 17; /* xorshift64 */
            w[j] = a * (2.0f * (float)(x >> 40) / 16777216.0f - 1.0f);
        }
    }
    const int rc = m->be->to_device(m->be, m->weights, host, m->n_floats * sizeof(float));
    free(host);
    return rc;
}

struct bench {
    struct olmo_rng rng;
    int vocab;
    uint64_t seed;
};

static int random_batch(void *ctx, int32_t *batch, size_t rows, int seq_len) {
    struct bench *b = ctx;
    for (size_t i = 0; i < rows * (size_t)seq_len; i++)
        batch[i] = (int32_t)(olmo_rng_next(&b->rng) % (uint64_t)b->vocab);
    return 0;
}

static int init_weights(void *ctx, struct olmo_model *m) { return quick_init(m, ((const struct bench *)ctx)->seed); }

/* The steps of the run: warmup, timed, profiled; returns the timed steps' seconds, or -1. */
static double run_steps(struct olmo_run *run, int warmup, int steps, int profile_steps) {
    double timed = 0.0;
    for (int s = 0; s < warmup + steps + profile_steps; s++) {
        const bool timed_step = s >= warmup && s < warmup + steps, profiled = s >= warmup + steps;
        if (s == warmup + steps) {
            olmo_profile_reset(run->o.be);
            olmo_profile_enable(run->o.be, true);
        }
        struct olmo_run_step st;
        if (olmo_run_step(run, &st) != 1) return -1.0;
        if (timed_step) timed += st.seconds;
        printf("%s step %d: loss %.4f | grad norm %.3f | %.3fs | %.0f tok/s\n",
               timed_step ? "timed  " : profiled ? "profile" : "warmup ", s + 1, st.res.ce_loss, st.res.grad_norm,
               st.seconds, st.tokens_per_s);
        fflush(stdout);
    }
    return timed;
}

/* The H200 datasheet peak of the precision the backend computes GEMMs in (0 for the CPU); its name. */
static const char *datasheet_peak(const char *backend, double *tflops) {
    if (strstr(backend, "bf16")) return *tflops = H200_BF16_DENSE_TFLOPS, "H200 bf16 dense";
    if (strstr(backend, "tf32")) return *tflops = H200_TF32_DENSE_TFLOPS, "H200 tf32 dense";
    if (!strncmp(backend, "cuda", 4)) return *tflops = H200_FP32_TFLOPS, "H200 fp32 non-tensor";
    *tflops = 0.0;
    return "";
}

int main(int argc, char **argv) {
    struct olmo_backend *backend = NULL, *profiled = NULL; /* the wrapper first, then the instance */
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
    if (argc < 3) {
        usage(stderr);
        return 2;
    }
    const char *config_path = argv[1], *backend_name = argv[2];
    int steps = 5, warmup = 1, profile_steps = 0;
    bool fast_init = false;
    double peak_override = 0.0;
    struct olmo_config cfg;
    olmo_config_defaults(&cfg);
    if (olmo_config_load(&cfg, config_path)) goto fail;
    for (int i = 3; i < argc; i++) {
        if (!strcmp(argv[i], "--quick-init")) {
            fast_init = true;
            continue;
        }
        if (i + 1 >= argc) {
            usage(stderr);
            return 2;
        }
        if (!strcmp(argv[i], "--steps")) steps = count_arg(argv[++i]);
        else if (!strcmp(argv[i], "--warmup")) warmup = count_arg(argv[++i]);
        else if (!strcmp(argv[i], "--profile-steps")) profile_steps = count_arg(argv[++i]);
        else if (!strcmp(argv[i], "--peak-tflops")) {
            char *end;
            peak_override = strtod(argv[++i], &end);
            if (*end || !(peak_override > 0.0)) {
                fprintf(stderr, "bench_train: --peak-tflops wants a positive number, not '%s'\n", argv[i]);
                return 2;
            }
        }
        else if (!strcmp(argv[i], "--set")) {
            if (olmo_config_set(&cfg, argv[++i])) goto fail;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (steps < 1 || warmup < 0 || profile_steps < 0) {
        fprintf(stderr, "bench_train: --steps wants a whole number >= 1, --warmup and --profile-steps >= 0\n");
        usage(stderr);
        return 2;
    }
    if (olmo_config_validate(&cfg)) goto fail;
    if (!(backend = olmo_backend_create(backend_name))) goto fail;
    const struct olmo_backend *be = backend;
    if (profile_steps > 0) { /* wrapped from the start, timing only the profiled steps */
        if (!(profiled = olmo_backend_profiled(backend))) goto fail;
        be = profiled;
        olmo_profile_enable(be, false);
    }

    const struct olmo_train_config *t = &cfg.train;
    const struct olmo_model_config *mc = &cfg.model;
    const size_t rows = (size_t)t->grad_accum * t->micro_batch, tokens_per_step = rows * t->seq_len;
    const double flops_per_token = olmo_model_flops_per_token(mc, t->seq_len);
    printf("bench_train: %s on %s | %zu params (%zu non-embedding) | %d layers d_model %d heads %d/%d mlp %d "
           "vocab %d | batch %zu x %d tokens (micro-batch %d) | %.4g model FLOPs/token\n",
           config_path, be->name, olmo_model_count_params(mc, true), olmo_model_count_params(mc, false),
           mc->n_layers, mc->d_model, mc->n_heads, mc->n_kv_heads, mc->mlp_hidden, mc->vocab_size, rows, t->seq_len,
           t->micro_batch, flops_per_token);
#ifdef OLMOC_HAVE_CUDA
    if (!strncmp(be->name, "cuda", 4)) {
        struct cudaDeviceProp prop;
        if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
            printf("device: %s, %d SMs, %.1f GiB\n", prop.name, prop.multiProcessorCount,
                   (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
    }
#endif
    fflush(stdout);

    /* The training run of olmoc train (train/run.h) without files: random tokens, no evaluation or checkpoints. */
    struct bench bench = {.vocab = mc->vocab_size, .seed = t->seed};
    olmo_rng_seed(&bench.rng, t->seed + 1);
    if (cfg.train.peak_flops <= 0) cfg.train.peak_flops = H200_BF16_DENSE_TFLOPS * 1e12; /* no startup measurement */
    const struct olmo_run_options opts = {
        .cfg = &cfg, .be = be, .config_path = config_path, .next_batch = random_batch,
        .init_weights = fast_init ? init_weights : NULL, .ctx = &bench,
        .stop_after = warmup + steps + profile_steps};
    struct olmo_run run;
    double t_init = olmo_now_seconds();
    if (olmo_run_open(&run, &opts)) goto fail;
    printf("init (%s): %.1fs\n", fast_init ? "uniform, --quick-init" : "truncated normal", olmo_now_seconds() - t_init);

    const double timed = run_steps(&run, warmup, steps, profile_steps);
    if (timed < 0) goto fail;
    if (olmo_run_finish(&run)) goto fail;
    const double tok_s = (double)tokens_per_step * steps / timed;
    const double tflops = tok_s * flops_per_token / 1e12;
    double own_peak = peak_override;
    const char *own = own_peak > 0.0 ? "--peak-tflops" : datasheet_peak(be->name, &own_peak);
    printf("throughput: %.0f tokens/s | %.2f model TFLOP/s | MFU %.2f%% of %.1f TFLOP/s (H200 bf16 dense peak)",
           tok_s, tflops, 100.0 * tflops / H200_BF16_DENSE_TFLOPS, H200_BF16_DENSE_TFLOPS);
    if (own_peak > 0.0) printf(" | %.2f%% of %.1f TFLOP/s (%s)", 100.0 * tflops / own_peak, own_peak, own);
    printf("\n");
#ifdef OLMOC_HAVE_CUDA
    if (!strncmp(be->name, "cuda", 4)) {
        size_t free_b = 0, total_b = 0;
        if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
            printf("device memory in use: %.1f GiB of %.1f GiB\n", (double)(total_b - free_b) / (1 << 30),
                   (double)total_b / (1 << 30));
    }
#endif
    printf("RESULT backend=%s config=%s seq_len=%d batch_rows=%zu tokens_per_s=%.1f model_tflops=%.3f "
           "mfu_bf16_peak=%.4f\n",
           be->name, config_path, t->seq_len, rows, tok_s, tflops, tflops / H200_BF16_DENSE_TFLOPS);
    if (profile_steps > 0) {
        printf("profile of the last %d step%s (each op waits for the one before):\n", profile_steps,
               profile_steps > 1 ? "s" : "");
        olmo_profile_report(be, stdout);
    }
    olmo_run_close(&run);
    /* OLMOC_MEMSTATS=1: the backend's counted peak, as olmoc train prints it (scripts/gpu_check.sh checks it
     * against the memory plan of `olmoc info`) */
    olmo_backend_report_mem_stats(backend, 0, 1, stdout);
    olmo_backend_destroy(profiled);
    olmo_backend_destroy(backend);
    return 0;
fail:
    fprintf(stderr, "bench_train: %s\n", olmo_last_error());
    olmo_backend_destroy(profiled);
    olmo_backend_destroy(backend);
    return 1;
}
