/* olmoc train: the training loop, with a progress line per step, a JSONL
 * metrics log, atomic checkpoints, resume, and in-loop evaluation. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/clock.h"
#include "backend/backend.h"
#include "backend/profile.h"
#include "cli/commands.h"
#include "config/config.h"
#include "dist/dist.h"
#include "data/token_file.h"
#include "model/weights.h"
#include "train/checkpoint.h"
#include "train/evaluate.h"
#include "train/trainer.h"
#include "util/error.h"
#include "util/fs.h"

static void train_usage(FILE *out) {
    fprintf(out,
            "usage: olmoc train CONFIG.yaml [options]\n\n"
            "Trains the model described by CONFIG.yaml on data.train_path (a token file) or\n"
            "data.mix (several, with weights: \"a.npy:0.7,b.npy+c.npy:0.3\").\n"
            "Writes to data.out_dir: config.yaml (resolved), metrics.jsonl (one JSON object per\n"
            "step and per evaluation), step-NNNNNN/ checkpoints every train.save_every steps\n"
            "(the newest train.keep_last kept) and model.safetensors at the end.\n"
            "Under mpirun -np N, train.grad_accum is per rank: each step takes N x grad_accum x\n"
            "micro_batch instances.\n\n"
            "options:\n"
            "  --set KEY=VALUE     override a config value, e.g. --set train.steps=10 (repeatable)\n"
            "  --resume            continue from the newest checkpoint in data.out_dir (start fresh\n"
            "                      when there is none)\n"
            "  --resume-from DIR   continue from the checkpoint directory DIR\n"
            "  --init FILE         start from weights in FILE (safetensors, Hugging Face names)\n"
            "                      instead of the seeded OLMo-core initialisation\n"
            "  --save FILE         write the final weights to FILE (default: data.out_dir/model.safetensors)\n"
            "  --dump-batches FILE append every step's token batch to FILE (raw int32, steps x rows x\n"
            "                      seq_len), so another implementation can train on the same data order\n"
            "  --backend NAME      where to compute: cpu (default), or\n"
            "                        cpu-openblas      the CPU with OpenBLAS GEMMs (cpu uses oneDNN's\n"
            "                                          when the build has it)\n"
            "                        cpu-onednn        the CPU with oneDNN GEMMs\n"
            "                        cpu-bf16          the CPU with bf16 GEMM operands, fp32 accumulation,\n"
            "                                          fp32 master weights and optimizer state (oneDNN)\n"
            "                      or in a CUDA build\n"
            "                        cuda              fp32 GEMMs (matches cpu within fp32 rounding)\n"
            "                        cuda-tf32         GEMMs on TF32 tensor cores\n"
            "                        cuda-bf16         bf16 GEMM and attention operands, fp32 accumulation,\n"
            "                                          fp32 master weights and optimizer state\n"
            "                        cuda-bf16-cublas  the same, with cuBLAS converting the GEMM operands\n"
            "                      a checkpoint resumes on any backend\n"
            "  --help              show this help\n\n"
            "Evaluation (train.eval_every > 0): held-out loss on data.val_paths (comma-separated\n"
            ".npy files, train.eval_batches micro-batches each, in file order) and accuracy on\n"
            "data.eval_tasks (comma-separated multiple-choice .jsonl files, see olmoc eval --help).\n"
            "MFU uses train.peak_flops, or a peak measured with an SGEMM at startup when it is 0.\n\n"
            "environment:\n"
            "  OLMOC_PROFILE=1     print wall time per op, GEMM and attention GFLOP/s (steps after the\n"
            "                      first; on a CUDA backend each op waits for the device, so the run is slower)\n");
}

static void format_duration(char *buf, size_t n, double s) {
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
}

/* Peak FLOP/s of this machine's SGEMM: best of a few 2048^3 products (1024^3
 * ones, timed right after start-up, came out at half the speed on 2 cores). */
static double measure_peak_flops(const struct olmo_backend *be) {
    const int n = 2048;
    const size_t bytes = sizeof(float) * (size_t)n * n;
    float *a = be->alloc(be, bytes), *b = be->alloc(be, bytes), *c = be->alloc(be, bytes);
    double best = 0.0;
    if (a && b && c) {
        be->gemm(be, false, false, n, n, n, 1.0f, a, OLMO_F32, n, b, OLMO_F32, n, 0.0f, c, n); /* warm-up */
        for (int rep = 0; rep < 3; rep++) {
            double t0 = olmo_now_seconds();
            be->gemm(be, false, false, n, n, n, 1.0f, a, OLMO_F32, n, b, OLMO_F32, n, 0.0f, c, n);
            double dt = olmo_now_seconds() - t0;
            if (dt > 0 && 2.0 * n * n * (double)n / dt > best) best = 2.0 * n * n * (double)n / dt;
        }
    }
    be->free(be, a);
    be->free(be, b);
    be->free(be, c);
    return best;
}

/* Keeps the metrics lines of steps <= last_step (a resumed run rewrites the
 * rest), dropping a line cut short by a kill. */
static int truncate_metrics(const char *path, long last_step) {
    if (!olmo_is_file(path)) return 0;
    char *text;
    size_t len;
    if (olmo_read_file(path, (size_t)1 << 31, &text, &len)) return -1;
    char *out = malloc(len + 1);
    if (!out) {
        free(text);
        return olmo_error("out of memory rewriting '%s'", path);
    }
    size_t n = 0;
    for (char *line = text; *line;) {
        char *nl = strchr(line, '\n');
        if (!nl) break; /* incomplete last line */
        *nl = 0;
        cJSON *obj = cJSON_Parse(line);
        const cJSON *step = cJSON_GetObjectItemCaseSensitive(obj, "step");
        if (cJSON_IsNumber(step) && step->valuedouble <= (double)last_step) {
            size_t l = strlen(line);
            memcpy(out + n, line, l);
            out[n + l] = '\n';
            n += l + 1;
        }
        cJSON_Delete(obj);
        line = nl + 1;
    }
    int rc = olmo_write_file_atomic(path, out, n);
    free(text);
    free(out);
    return rc;
}

struct evaluators {
    struct olmo_val_set *val;
    int n_val;
    struct olmo_mc_task *tasks;
    int n_tasks;
};

static int run_evals(struct olmo_trainer *tr, const struct evaluators *ev, long step, FILE *metrics) {
    const struct olmo_config *cfg = &tr->cfg;
    for (int i = 0; i < ev->n_val; i++) {
        double loss;
        long tokens;
        double t0 = olmo_now_seconds();
        if (olmo_eval_val_set(&tr->model, &ev->val[i], cfg->train.eval_batches, cfg->train.intra_doc_masking, &loss,
                              &tokens))
            return -1;
        printf("eval step %ld | %s | loss %.4f | ppl %.3f | %ld tokens | %.2fs\n", step, ev->val[i].name, loss,
               exp(loss), tokens, olmo_now_seconds() - t0);
        fprintf(metrics, "{\"type\":\"eval\",\"step\":%ld,\"set\":\"%s\",\"loss\":%.17g,\"ppl\":%.17g,\"tokens\":%ld}\n",
                step, ev->val[i].name, loss, exp(loss), tokens);
    }
    int pad = cfg->model.pad_token_id >= 0 && cfg->model.pad_token_id < cfg->model.vocab_size ? cfg->model.pad_token_id
                                                                                               : cfg->model.eos_token_id;
    for (int i = 0; i < ev->n_tasks; i++) {
        struct olmo_mc_result r;
        if (olmo_mc_eval(&tr->model, &ev->tasks[i], pad, &r, NULL)) return -1;
        printf("eval step %ld | task %s | acc %.4f | acc_per_token %.4f | %d examples\n", step, ev->tasks[i].name,
               r.acc, r.acc_per_token, r.n);
        fprintf(metrics,
                "{\"type\":\"downstream\",\"step\":%ld,\"task\":\"%s\",\"acc\":%.17g,\"acc_per_token\":%.17g,"
                "\"n\":%d}\n",
                step, ev->tasks[i].name, r.acc, r.acc_per_token, r.n);
    }
    fflush(stdout);
    fflush(metrics);
    return 0;
}

int cmd_train(int argc, char **argv) {
    const char *config_path = NULL, *init_path = NULL, *save_path = NULL, *resume_from = NULL, *dump_path = NULL,
               *backend_name = "cpu";
    struct olmo_backend *backend = NULL, *profiled = NULL; /* destroyed at the end */
    bool resume = false;
    struct olmo_config cfg;
    olmo_config_defaults(&cfg);
    /* First pass: find the config so --set applies on top of it. */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            train_usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--set") || !strcmp(argv[i], "--init") || !strcmp(argv[i], "--save") ||
            !strcmp(argv[i], "--resume-from") || !strcmp(argv[i], "--dump-batches") || !strcmp(argv[i], "--backend")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "olmoc train: %s needs a value\n", argv[i]);
                return 2;
            }
            i++;
        } else if (!strcmp(argv[i], "--resume")) {
            resume = true;
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
        else if (!strcmp(argv[i], "--resume-from")) resume_from = argv[++i];
        else if (!strcmp(argv[i], "--dump-batches")) dump_path = argv[++i];
        else if (!strcmp(argv[i], "--backend")) backend_name = argv[++i];
    }
    if (resume_from && resume) {
        fprintf(stderr, "olmoc train: give either --resume or --resume-from, not both\n");
        return 2;
    }
    if (init_path && (resume || resume_from)) {
        fprintf(stderr, "olmoc train: --init starts a new run; it cannot be combined with --resume\n");
        return 2;
    }
    if (olmo_config_validate(&cfg)) goto fail;
    if (!cfg.data.train_path[0] && !cfg.data.mix[0]) {
        olmo_error("neither data.train_path nor data.mix is set: give token files in the config or with --set");
        goto fail;
    }

    /* Which checkpoint, if any, this run continues from. */
    char ckpt[4096] = "";
    if (resume_from) {
        snprintf(ckpt, sizeof ckpt, "%s", resume_from);
    } else {
        int found = olmo_ckpt_find_latest(cfg.data.out_dir, ckpt, sizeof ckpt);
        if (found < 0) goto fail;
        if (found && !resume) {
            olmo_error("data.out_dir '%s' already holds checkpoint '%s': pass --resume to continue that run, or "
                       "choose another data.out_dir",
                       cfg.data.out_dir, ckpt);
            goto fail;
        }
        if (!found) ckpt[0] = 0;
    }

    /* Under mpirun every rank runs this same loop on its slice of each batch;
     * rank 0 alone prints and writes files. */
    static struct olmo_dist dist; /* static: zero (world 0) if an earlier error reaches fail */
    if (olmo_dist_init(&dist, NULL, NULL)) goto fail;
    const bool leader = dist.rank == 0;
    if (!leader && !freopen("/dev/null", "w", stdout)) {
        olmo_error("cannot silence rank %d's output", dist.rank);
        goto fail;
    }
    struct olmo_loader loader;
    if (olmo_loader_open_config(&loader, &cfg.data, cfg.train.seq_len, cfg.model.vocab_size, cfg.train.seed))
        goto fail;
    struct olmo_trainer tr;
    const char *profile_env = getenv("OLMOC_PROFILE");
    const bool profile = profile_env && *profile_env && strcmp(profile_env, "0") != 0;
    if (!(backend = olmo_backend_create(backend_name))) goto fail;
    if (profile && !(profiled = olmo_backend_profiled(backend))) goto fail;
    const struct olmo_backend *be = profile ? profiled : backend;
    if (olmo_trainer_init_dist(&tr, &cfg, be, &dist)) goto fail;
    struct evaluators ev = {0};
    if (cfg.train.eval_every == 0 && (cfg.data.val_paths[0] || cfg.data.eval_tasks[0]))
        printf("note: data.val_paths / data.eval_tasks are set but train.eval_every is 0: no evaluation\n");
    if (cfg.train.eval_every > 0) {
        if (olmo_val_sets_open(cfg.data.val_paths, cfg.train.seq_len, &ev.val, &ev.n_val)) goto fail;
        if (olmo_mc_tasks_load(cfg.data.eval_tasks, cfg.model.vocab_size, &ev.tasks, &ev.n_tasks)) goto fail;
    }
    struct olmo_ckpt_state st = {0};
    if (ckpt[0]) {
        if (olmo_ckpt_load(ckpt, &tr, &st)) goto fail;
        if (st.loader_seed != cfg.train.seed || st.loader_instances != loader.n_instances) {
            olmo_error("checkpoint '%s' was written reading %zu instances with seed %llu, but data.train_path '%s' "
                       "has %zu instances (seed %llu): not the same data",
                       ckpt, st.loader_instances, (unsigned long long)st.loader_seed, cfg.data.train_path,
                       loader.n_instances, (unsigned long long)cfg.train.seed);
            goto fail;
        }
        if (olmo_ckpt_seek_loader(&loader, &st)) goto fail;
        /* Newer checkpoints in out_dir would belong to another trajectory: the
         * next auto-resume, and keep-last retention, would mix the two runs. */
        char newest[4096];
        int found = olmo_ckpt_find_latest(cfg.data.out_dir, newest, sizeof newest);
        if (found < 0) goto fail;
        if (found && strcmp(newest, ckpt)) {
            const char *base = strrchr(newest, '/');
            long newest_step = base ? strtol(base + 1 + strlen("step-"), NULL, 10) : 0;
            if (newest_step > st.step) {
                olmo_error("data.out_dir '%s' holds '%s', newer than the checkpoint to resume from (step %ld): "
                           "continuing would mix two runs; remove the newer checkpoints or use another "
                           "data.out_dir",
                           cfg.data.out_dir, newest, st.step);
                goto fail;
            }
        }
    } else if (init_path) {
        if (olmo_weights_load(&tr.model, init_path)) goto fail;
    } else {
        if (olmo_model_init_weights(&tr.model, cfg.train.seed)) goto fail;
    }
    if (olmo_make_dirs(cfg.data.out_dir)) goto fail;
    char path[4200];
    snprintf(path, sizeof path, "%s/config.yaml", cfg.data.out_dir);
    if (leader && olmo_config_write(&cfg, path)) goto fail;
    char metrics_path[4200];
    snprintf(metrics_path, sizeof metrics_path, "%s/metrics.jsonl", cfg.data.out_dir);
    if (!leader) snprintf(metrics_path, sizeof metrics_path, "/dev/null");
    else if (truncate_metrics(metrics_path, st.step)) goto fail;
    FILE *metrics = fopen(metrics_path, "a");
    if (!metrics) {
        olmo_error("cannot open '%s': %s", metrics_path, strerror(errno));
        goto fail;
    }

    const struct olmo_train_config *t = &cfg.train;
    const size_t rows = olmo_trainer_batch_rows(&tr);
    const long tokens_per_step = (long)(rows * (size_t)t->seq_len);
    int32_t *batch = olmo_malloc(rows * t->seq_len * sizeof(int32_t), "batch");
    if (!batch) goto fail;
    const double flops_per_token = olmo_model_flops_per_token(&cfg.model, t->seq_len);
    double peak = t->peak_flops;
    const char *peak_source = "train.peak_flops";
    if (peak <= 0) {
        peak = measure_peak_flops(be);
        peak_source = "measured: best of 3 SGEMMs 2048^3";
    }
    peak *= dist.world; /* every rank has the same peak */
    printf("olmoc train: %s | %zu params (%zu non-embedding) | %d layers d_model %d | batch %zu x %d tokens | "
           "%zu instances in %s\n",
           config_path, olmo_model_count_params(&cfg.model, true), olmo_model_count_params(&cfg.model, false),
           cfg.model.n_layers, cfg.model.d_model, rows, t->seq_len, loader.n_instances,
           cfg.data.mix[0] ? cfg.data.mix : cfg.data.train_path);
    if (dist.world > 1)
        printf("data parallel: %d ranks x %d micro-batches of %d; optimizer state sharded (ZeRO-1); gradients "
               "through %s\n",
               dist.world, t->grad_accum, t->micro_batch, tr.device_comm ? "NCCL" : "MPI");
    printf("backend %s", be->name);
    if (be->describe) printf(" (%s)", be->describe(be));
    printf(" | MFU: %.4g FLOPs/token, peak %.4g FLOP/s (%s)\n", flops_per_token, peak, peak_source);
    if (ckpt[0])
        printf("resumed from %s at step %ld (epoch %ld, instance %zu)\n", ckpt, st.step, st.loader_epoch,
               st.loader_pos);
    fflush(stdout);

    FILE *dump = NULL;
    if (dump_path && leader && !(dump = fopen(dump_path, ckpt[0] ? "ab" : "wb"))) {
        olmo_error("cannot write '%s': %s", dump_path, strerror(errno));
        goto fail;
    }
    const long first_step = st.step + 1;
    const double start = olmo_now_seconds(), elapsed_before = st.elapsed;
    double last = start, interval = 0.0; /* end of the previous step; step time since the last log line */
    long tokens = st.tokens, steps_since_log = 0;
    for (long step = first_step; step <= t->steps; step++) {
        struct olmo_step_result res;
        if (olmo_loader_next(&loader, batch, (int)rows)) goto fail;
        if (dump && fwrite(batch, sizeof(int32_t), rows * t->seq_len, dump) != rows * t->seq_len) {
            olmo_error("writing '%s' failed: %s", dump_path, strerror(errno));
            goto fail;
        }
        if (olmo_trainer_step(&tr, batch, &res)) goto fail;
        tokens += tokens_per_step;
        steps_since_log++;
        double now = olmo_now_seconds();
        const double step_time = now - last > 0 ? now - last : 1e-9;
        const double step_tok_s = (double)tokens_per_step / step_time;
        interval += step_time;
        double mfu = peak > 0 ? step_tok_s * flops_per_token / peak : 0.0;
        double elapsed = elapsed_before + (now - start);
        fprintf(metrics,
                "{\"type\":\"train\",\"step\":%ld,\"loss\":%.17g,\"z_loss\":%.17g,\"grad_norm\":%.17g,\"lr\":%.17g,"
                "\"tokens\":%ld,\"tokens_per_s\":%.6g,\"mfu\":%.6g,\"elapsed\":%.6f}\n",
                step, res.ce_loss, res.z_loss, res.grad_norm, res.lr, tokens, step_tok_s, mfu, elapsed);
        fflush(metrics);
        if (step % t->log_every == 0 || step == t->steps) {
            double tok_s = (double)(steps_since_log * tokens_per_step) / interval;
            char eta[32];
            format_duration(eta, sizeof eta, (now - start) / (double)(step - first_step + 1) * (double)(t->steps - step));
            printf("step %ld/%ld | loss %.4f | z %.2e | grad norm %.3f | lr %.3e | %.0f tok/s | MFU %.2f%% | ETA %s\n",
                   step, t->steps, res.ce_loss, res.z_loss, res.grad_norm, res.lr, tok_s,
                   100.0 * (peak > 0 ? tok_s * flops_per_token / peak : 0.0), eta);
            fflush(stdout);
            steps_since_log = 0;
            interval = 0.0;
        }
        const bool last_step = step == t->steps;
        if (t->eval_every > 0 && (step % t->eval_every == 0 || last_step) && (ev.n_val || ev.n_tasks))
            if (run_evals(&tr, &ev, step, metrics)) goto fail;
        if (t->save_every > 0 && (step % t->save_every == 0 || last_step)) {
            double t0 = olmo_now_seconds();
            struct olmo_ckpt_state cs = {
                .step = step,
                .tokens = tokens,
                .elapsed = elapsed_before + (olmo_now_seconds() - start),
                .loader_epoch = loader.epoch,
                .loader_pos = loader.pos,
                .loader_instances = loader.n_instances,
                .loader_seed = cfg.train.seed,
                .loader_fingerprint = loader.fingerprint,
            };
            char saved[4096];
            if (olmo_ckpt_save(cfg.data.out_dir, &tr, &cs, saved, sizeof saved) ||
                (leader && olmo_ckpt_retain(cfg.data.out_dir, t->keep_last)))
                goto fail;
            printf("checkpoint step %ld: %s (%.2fs)\n", step, saved, olmo_now_seconds() - t0);
            fflush(stdout);
        }
        if (profile && step == first_step) olmo_profile_reset(profiled); /* the first step pays for page faults */
        last = olmo_now_seconds(); /* evaluation and checkpoint time do not count as step time */
    }
    fclose(metrics);
    if (dump && fclose(dump)) {
        olmo_error("writing '%s' failed: %s", dump_path, strerror(errno));
        goto fail;
    }
    if (profile) olmo_profile_report(profiled, stdout);
    double total = olmo_now_seconds() - start;
    char weights_path[4200];
    if (!save_path) {
        snprintf(weights_path, sizeof weights_path, "%s/model.safetensors", cfg.data.out_dir);
        save_path = weights_path;
    }
    if (leader && olmo_weights_save(&tr.model, tr.model.weights, save_path)) goto fail;
    long done_steps = t->steps >= first_step ? t->steps - first_step + 1 : 0;
    printf("done: %ld steps in %.1fs (%.0f tok/s average); weights in %s\n", done_steps, total,
           total > 0 ? (double)done_steps * (double)tokens_per_step / total : 0.0, save_path);
    free(batch);
    olmo_val_sets_close(ev.val, ev.n_val);
    olmo_mc_tasks_free(ev.tasks, ev.n_tasks);
    olmo_trainer_destroy(&tr);
    olmo_backend_destroy(profiled);
    olmo_backend_destroy(backend);
    olmo_loader_close(&loader);
    olmo_dist_finalize(&dist);
    return 0;
fail:
    olmo_backend_destroy(profiled);
    olmo_backend_destroy(backend);
    if (dist.world > 1) fprintf(stderr, "olmoc train (rank %d): %s\n", dist.rank, olmo_last_error());
    else fprintf(stderr, "olmoc train: %s\n", olmo_last_error());
    return 1;
}
