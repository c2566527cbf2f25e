/* olmoc train: the training loop with a progress line per step. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "backend/backend.h"
#include "backend/profile.h"
#include "cli/commands.h"
#include "config/config.h"
#include "data/token_file.h"
#include "model/weights.h"
#include "train/trainer.h"
#include "util/error.h"

static void train_usage(FILE *out) {
    fprintf(out,
            "usage: olmoc train CONFIG.yaml [options]\n\n"
            "Trains the model described by CONFIG.yaml on data.train_path (.npy token file).\n\n"
            "options:\n"
            "  --set KEY=VALUE   override a config value, e.g. --set train.steps=10 (repeatable)\n"
            "  --init FILE       start from weights in FILE (safetensors, Hugging Face names)\n"
            "                    instead of the seeded OLMo-core initialisation\n"
            "  --save FILE       write the final weights to FILE (default: data.out_dir/model.safetensors)\n"
            "  --help            show this help\n\n"
            "environment:\n"
            "  OLMOC_PROFILE=1   print wall time per op and GEMM GFLOP/s (steps after the first)\n");
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void format_duration(char *buf, size_t n, double s) {
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
}

/* mkdir -p */
static int make_dirs(const char *path) {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) && errno != EEXIST) return olmo_error("cannot create '%s': %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) && errno != EEXIST) return olmo_error("cannot create '%s': %s", buf, strerror(errno));
    return 0;
}

int cmd_train(int argc, char **argv) {
    const char *config_path = NULL, *init_path = NULL, *save_path = NULL;
    struct olmo_config cfg;
    olmo_config_defaults(&cfg);
    /* First pass: find the config so --set applies on top of it. */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            train_usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--set") || !strcmp(argv[i], "--init") || !strcmp(argv[i], "--save")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "olmoc train: %s needs a value\n", argv[i]);
                return 2;
            }
            i++;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "olmoc train: unknown option '%s'\n", argv[i]);
            train_usage(stderr);
            return 2;
        } else if (config_path) {
            fprintf(stderr, "olmoc train: more than one config given ('%s', '%s')\n", config_path, argv[i]);
            return 2;
        } else {
            config_path = argv[i];
        }
    }
    if (!config_path) {
        train_usage(stderr);
        return 2;
    }
    if (olmo_config_load(&cfg, config_path)) goto fail;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--set") && olmo_config_set(&cfg, argv[++i])) goto fail;
        else if (!strcmp(argv[i], "--init")) init_path = argv[++i];
        else if (!strcmp(argv[i], "--save")) save_path = argv[++i];
    }
    if (olmo_config_validate(&cfg)) goto fail;
    if (!cfg.data.train_path[0]) {
        olmo_error("data.train_path is not set: give a .npy token file in the config or with --set");
        goto fail;
    }

    struct olmo_loader loader;
    if (olmo_loader_open(&loader, cfg.data.train_path, cfg.train.seq_len, cfg.model.vocab_size, cfg.train.seed))
        goto fail;
    struct olmo_trainer tr;
    const char *profile_env = getenv("OLMOC_PROFILE");
    const bool profile = profile_env && *profile_env && strcmp(profile_env, "0") != 0;
    if (olmo_trainer_init(&tr, &cfg, profile ? olmo_backend_profiled(olmo_backend_cpu()) : olmo_backend_cpu()))
        goto fail;
    if (init_path) {
        if (olmo_weights_load(&tr.model, init_path)) goto fail;
    } else {
        olmo_model_init_weights(&tr.model, cfg.train.seed);
    }
    if (make_dirs(cfg.data.out_dir)) goto fail;
    char resolved[1200];
    snprintf(resolved, sizeof resolved, "%s/config.yaml", cfg.data.out_dir);
    if (olmo_config_write(&cfg, resolved)) goto fail;

    const struct olmo_train_config *t = &cfg.train;
    const size_t rows = (size_t)t->grad_accum * t->micro_batch;
    int32_t *batch = olmo_malloc(rows * t->seq_len * sizeof(int32_t), "batch");
    if (!batch) goto fail;
    printf("olmoc train: %s | %zu params (%zu non-embedding) | %d layers d_model %d | batch %zu x %d tokens | "
           "%zu instances in %s\n",
           config_path, olmo_model_count_params(&cfg.model, true), olmo_model_count_params(&cfg.model, false),
           cfg.model.n_layers, cfg.model.d_model, rows, t->seq_len, loader.n_instances, cfg.data.train_path);
    fflush(stdout);
    const double start = now_seconds();
    double last = start;
    for (long step = 1; step <= t->steps; step++) {
        struct olmo_step_result res;
        if (olmo_loader_next(&loader, batch, (int)rows) || olmo_trainer_step(&tr, batch, &res)) goto fail;
        double now = now_seconds();
        if (step % t->log_every == 0 || step == t->steps) {
            double tok_s = (double)(rows * t->seq_len) / (now - last);
            char eta[32];
            format_duration(eta, sizeof eta, (now - start) / step * (t->steps - step));
            printf("step %ld/%ld | loss %.4f | z %.2e | grad norm %.3f | lr %.3e | %.0f tok/s | ETA %s\n", step,
                   t->steps, res.ce_loss, res.z_loss, res.grad_norm, res.lr, tok_s, eta);
            fflush(stdout);
        }
        if (profile && step == 1) olmo_profile_reset(); /* the first step pays for page faults */
        last = now_seconds();
    }
    if (profile) olmo_profile_report(stdout);
    double total = now_seconds() - start;
    char weights_path[1200];
    if (!save_path) {
        snprintf(weights_path, sizeof weights_path, "%s/model.safetensors", cfg.data.out_dir);
        save_path = weights_path;
    }
    if (olmo_weights_save(&tr.model, tr.model.weights, save_path)) goto fail;
    printf("done: %ld steps in %.1fs (%.0f tok/s average); weights in %s\n", t->steps, total,
           total > 0 ? (double)t->steps * rows * t->seq_len / total : 0.0, save_path);
    free(batch);
    olmo_trainer_destroy(&tr);
    olmo_loader_close(&loader);
    return 0;
fail:
    fprintf(stderr, "olmoc train: %s\n", olmo_last_error());
    return 1;
}
