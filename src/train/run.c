/* The training run (train/run.h): starting point, the step loop with its
 * metrics, progress lines, evaluation and checkpoint cadence, and the end. */
#include "train/run.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/profile.h"
#include "model/weights.h"
#include "train/signals.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/fs.h"
#include "util/threads.h"

/* flock on out_dir/.lock, which then holds this process's PID for the next one to name. */
static int lock_out_dir(const char *dir, int *fd_out) {
    char path[4200];
    snprintf(path, sizeof path, "%s/.lock", dir);
    const int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return olmo_error("cannot create the run lock '%s': %s", path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB)) {
        const int err = errno;
        char pid[32] = "";
        const ssize_t n = err == EWOULDBLOCK ? pread(fd, pid, sizeof pid - 1, 0) : -1;
        close(fd);
        if (err != EWOULDBLOCK) return olmo_error("cannot lock '%s': %s", path, strerror(err));
        pid[n > 0 ? strcspn(pid, "\n") : 0] = 0;
        return olmo_error("data.out_dir '%s' is in use by another training run (pid %s, holding '%s'): wait for it "
                          "to finish, or choose another data.out_dir",
                          dir, pid[0] ? pid : "unknown", path);
    }
    char pid[32];
    const int len = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) || pwrite(fd, pid, (size_t)len, 0) != len) {
        const int err = errno;
        close(fd);
        return olmo_error("cannot write the run lock '%s': %s", path, strerror(err));
    }
    *fd_out = fd;
    return 0;
}

/* Which checkpoint, if any, the run continues from (run->ckpt, "" for none). */
static int choose_start(struct olmo_run *run) {
    const struct olmo_run_options *o = &run->o;
    if (o->resume_from) {
        snprintf(run->ckpt, sizeof run->ckpt, "%s", o->resume_from);
        return 0;
    }
    const int found = olmo_ckpt_find_latest(run->cfg.data.out_dir, run->ckpt, sizeof run->ckpt);
    if (found < 0) return -1;
    if (found && !o->resume)
        return olmo_error("data.out_dir '%s' already holds checkpoint '%s': pass --resume to continue that run, or "
                          "choose another data.out_dir",
                          run->cfg.data.out_dir, run->ckpt);
    if (!found) run->ckpt[0] = 0;
    return 0;
}

/* Loads run->ckpt and checks that it continues this data in this directory. */
static int resume_checkpoint(struct olmo_run *run) {
    const struct olmo_config *cfg = &run->cfg;
    struct olmo_ckpt_state *st = &run->st;
    if (olmo_ckpt_load(run->ckpt, &run->tr, st)) return -1;
    if (run->loader_ready) {
        if (st->loader_seed != cfg->train.seed || st->loader_instances != run->loader.n_instances)
            return olmo_error("checkpoint '%s' was written reading %zu instances with seed %llu, but "
                              "the training data has %zu instances (seed %llu): not the same data",
                              run->ckpt, st->loader_instances, (unsigned long long)st->loader_seed,
                              run->loader.n_instances, (unsigned long long)cfg->train.seed);
        if (olmo_ckpt_seek_loader(&run->loader, st)) return -1;
    }
    /* Newer checkpoints in out_dir would belong to another trajectory: the
     * next auto-resume, and keep-last retention, would mix the two runs. */
    char newest[4096];
    const int found = olmo_ckpt_find_latest(cfg->data.out_dir, newest, sizeof newest);
    if (found < 0) return -1;
    if (found && strcmp(newest, run->ckpt)) {
        const char *base = strrchr(newest, '/');
        const long newest_step = base ? strtol(base + 1 + strlen("step-"), NULL, 10) : 0;
        if (newest_step > st->step)
            return olmo_error("data.out_dir '%s' holds '%s', newer than the checkpoint to resume from (step %ld): "
                              "continuing would mix two runs; remove the newer checkpoints or use another "
                              "data.out_dir",
                              cfg->data.out_dir, newest, st->step);
    }
    return 0;
}

/* OLMOC_DEBUG_MEM=1: each rank's peak resident memory while it sets its
 * initial weights and during each checkpoint save (VmHWM, reset before where
 * /proc/self/clear_refs allows). */
static long vm_kib(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, strlen(key))) v = strtol(line + strlen(key), NULL, 10);
    if (f) fclose(f);
    return v;
}

static bool debug_mem_begin(long *hwm_before) {
    const char *e = getenv("OLMOC_DEBUG_MEM");
    if (!e || strcmp(e, "1")) return false;
    *hwm_before = vm_kib("VmHWM:");
    FILE *f = fopen("/proc/self/clear_refs", "w"); /* "5": reset the peak RSS to the current RSS */
    if (f) {
        fputs("5", f);
        fclose(f);
    }
    return true;
}

static void debug_mem_end(const struct olmo_run *run, const char *what, long hwm_before, long rss_before) {
    fprintf(stderr, "mem: rank %d %s: VmRSS before %.1f MiB, peak during %.1f MiB (VmHWM; before %.1f MiB)\n",
            run->o.dist ? run->o.dist->rank : 0, what, rss_before / 1024.0, vm_kib("VmHWM:") / 1024.0,
            hwm_before / 1024.0);
}

static int start_weights(struct olmo_run *run);

/* The model, the data, the evaluators, and the weights to start from. */
static int open_model_and_data(struct olmo_run *run) {
    const struct olmo_run_options *o = &run->o;
    const struct olmo_config *cfg = &run->cfg;
    if (!o->next_batch) {
        if (olmo_loader_open_run(&run->loader, cfg, o->dist ? o->dist->world : 1))
            return -1;
        run->loader_ready = true;
    }
    if (olmo_trainer_init_dist(&run->tr, cfg, o->be, o->dist)) return -1;
    run->trainer_ready = true;
    if (o->log && cfg->train.eval_every == 0 && (cfg->data.val_paths[0] || cfg->data.eval_tasks[0]))
        fprintf(o->log, "note: data.val_paths / data.eval_tasks are set but train.eval_every is 0: no evaluation\n");
    if (o->write_files && cfg->train.eval_every > 0) {
        const struct olmo_eval_sources src = {
            .val_paths = cfg->data.val_paths,
            .tasks = cfg->data.eval_tasks,
            .val_documents = cfg->data.val_documents,
            .val_all_documents = cfg->data.val_all_documents,
            .ranks = o->dist ? o->dist->world : 1,
            .tokenizer = cfg->data.tokenizer,
            .val_tokenizer = cfg->data.tokenizer,
            .tasks_dir = cfg->data.eval_tasks_dir,
            .bos_id = -1,
        };
        if (olmo_evaluators_open(&run->ev, &src, cfg)) return -1;
    }
    long hwm_before = 0;
    const bool debug_mem = debug_mem_begin(&hwm_before);
    const long rss_before = debug_mem ? vm_kib("VmRSS:") : 0;
    const int rc = start_weights(run);
    if (debug_mem) debug_mem_end(run, "initial weights", hwm_before, rss_before);
    return rc;
}

/* The weights to start from: a checkpoint, a weights file, a callback or the seeded initialisation. */
static int start_weights(struct olmo_run *run) {
    const struct olmo_run_options *o = &run->o;
    const struct olmo_config *cfg = &run->cfg;
    if (run->ckpt[0]) return resume_checkpoint(run);
    if (o->init_from) return olmo_ckpt_init_from(o->init_from, &run->tr, o->init_optimizer);
    /* ranks: each reads only its pieces of the file (ZeRO-1 then all-gathers) */
    if (o->init_path && (run->tr.fully_sharded || (o->dist && o->dist->world > 1)))
        return olmo_ckpt_load_weights_file(o->init_path, &run->tr);
    if (o->init_path) return olmo_weights_load(&run->tr.model, o->init_path);
    if (o->init_weights && run->tr.fully_sharded)
        return olmo_error("an init_weights callback writes full-size weights: not with train.sharding: fsdp");
    if (o->init_weights) /* the callback writes the master weights: refresh a bf16 compute copy */
        return o->init_weights(o->ctx, &run->tr.model) ? -1 : olmo_model_sync_weights(&run->tr.model);
    return olmo_trainer_init_weights(&run->tr, cfg->train.seed);
}

/* Where the final weights go: --save, else data.out_dir/model.safetensors. */
static const char *weights_path(const struct olmo_run *run, char *buf, size_t n) {
    if (run->o.save_path) return run->o.save_path;
    snprintf(buf, n, "%s/model.safetensors", run->cfg.data.out_dir);
    return buf;
}

/* Before any work (rank 0): a weights output that is a device or FIFO is
 * refused now rather than after training, and the .tmp files a killed run
 * left beside this run's outputs, and its incomplete checkpoints, are removed. */
static int prepare_outputs(struct olmo_run *run) {
    char path[4200];
    const char *save = weights_path(run, path, sizeof path);
    if (olmo_check_output(save, "weights file") || olmo_remove_stale_tmp(save) ||
        olmo_ckpt_clean_stale(run->cfg.data.out_dir))
        return -1;
    static const char *const own[] = {"model.safetensors", "metrics.jsonl"}; /* out_dir is locked: ours */
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", run->cfg.data.out_dir, own[i]);
        if (olmo_remove_stale_tmp(path)) return -1;
    }
    return 0;
}

/* config.yaml, the metrics log and the batch dump (rank 0). */
static int open_outputs(struct olmo_run *run) {
    const struct olmo_run_options *o = &run->o;
    char path[4200];
    if (!o->write_files || !run->leader) return olmo_metrics_open(&run->metrics, NULL, 0, NULL);
    snprintf(path, sizeof path, "%s/config.yaml", run->cfg.data.out_dir);
    if (olmo_config_write(&run->cfg, path)) return -1;
    snprintf(path, sizeof path, "%s/metrics.jsonl", run->cfg.data.out_dir);
    if (olmo_metrics_open(&run->metrics, path, run->st.step, o->log)) return -1;
    if (o->dump_path && !(run->dump = fopen(o->dump_path, run->ckpt[0] ? "ab" : "wb")))
        return olmo_error("cannot write '%s': %s", o->dump_path, strerror(errno));
    return 0;
}

static void print_header(const struct olmo_run *run) {
    FILE *log = run->o.log;
    const struct olmo_config *cfg = &run->cfg;
    const struct olmo_backend *be = run->o.be;
    const int world = run->o.dist ? run->o.dist->world : 1;
    if (!log) return;
    fprintf(log,
            "olmoc train: %s | %zu params (%zu non-embedding) | %d layers d_model %d | batch %zu x %d tokens | "
            "%zu instances in %s\n",
            run->o.config_path ? run->o.config_path : "-", olmo_model_count_params(&cfg->model, true),
            olmo_model_count_params(&cfg->model, false), cfg->model.n_layers, cfg->model.d_model, run->rows,
            cfg->train.seq_len, run->loader.n_instances,
            cfg->data.mix[0] ? cfg->data.mix : cfg->data.mix_file[0] ? cfg->data.mix_file : cfg->data.train_path);
    if (world > 1 && run->tr.fully_sharded)
        fprintf(log,
                "data parallel: %d ranks x %d micro-batches of %d; fully sharded (FSDP) in groups of %d ranks, "
                "%d replicas; through %s%s%s\n",
                world, cfg->train.grad_accum, cfg->train.micro_batch, run->tr.fsdp.shard_group.world,
                run->tr.fsdp.replica_group.world, run->tr.fsdp.device ? "NCCL" : "MPI",
                run->tr.fsdp.n_slots == 2 ? "; the next block gathered on a second stream" : "",
                run->tr.fsdp.grad_queue ? "; gradients reduce-scattered on a third stream" : "");
    else if (world > 1)
        fprintf(log,
                "data parallel: %d ranks x %d micro-batches of %d; optimizer state sharded (ZeRO-1); gradients "
                "through %s\n",
                world, cfg->train.grad_accum, cfg->train.micro_batch, run->tr.device_comm ? "NCCL" : "MPI");
    else if (run->tr.fully_sharded && run->tr.fsdp.shard_comm)
        fprintf(log, "fully sharded (FSDP) on one rank; its collectives through NCCL (OLMOC_FSDP_COMM=1)%s\n",
                run->tr.fsdp.grad_queue ? "; gradients reduce-scattered on a third stream" : "");
    fprintf(log, "backend %s", be->name);
    if (be->describe) fprintf(log, " (%s)", be->describe(be));
    fprintf(log, " | MFU: %.4g FLOPs/token, peak %.4g FLOP/s (%s), raised by a faster step\n",
            run->flops_per_token, run->peak, run->peak_source);
    if (be->host_memory) fprintf(log, "OpenMP: %d threads, wait %s\n", omp_get_max_threads(), olmo_openmp_wait_describe());
    if (run->ckpt[0])
        fprintf(log, "resumed from %s at step %ld (epoch %ld, instance %zu)\n", run->ckpt, run->st.step,
                run->st.loader_epoch, run->st.loader_pos);
    fflush(log);
}

int olmo_run_open(struct olmo_run *run, const struct olmo_run_options *opts) {
    memset(run, 0, sizeof *run);
    run->lock_fd = -1;
    run->o = *opts;
    run->cfg = *opts->cfg;
    const struct olmo_config *cfg = &run->cfg;
    const int world = opts->dist ? opts->dist->world : 1;
    run->leader = !opts->dist || opts->dist->rank == 0;
    if (opts->handle_signals) {
        if (olmo_signals_install()) return -1;
        run->signals_installed = true;
    }
    if (olmo_config_validate(cfg)) return -1;
    if (!opts->next_batch && !cfg->data.train_path[0] && !cfg->data.mix[0] && !cfg->data.mix_file[0])
        return olmo_error("none of data.train_path, data.mix and data.mix_file is set: give token files in the "
                          "config or with --set");
    run->rows = (size_t)world * cfg->train.grad_accum * cfg->train.micro_batch;
    if (run->rows * (size_t)cfg->train.seq_len > (size_t)INT_MAX)
        return olmo_error("a step of %zu instances x train.seq_len %d tokens is more than %d tokens", run->rows,
                          cfg->train.seq_len, INT_MAX);
    if (opts->write_files) {
        struct stat st;
        run->created_out_dir = run->leader && stat(cfg->data.out_dir, &st) != 0 && errno == ENOENT;
        if (run->leader && (olmo_make_dirs(cfg->data.out_dir) || lock_out_dir(cfg->data.out_dir, &run->lock_fd) ||
                            prepare_outputs(run)))
            return -1;
        if (choose_start(run)) return -1;
    }
    if (open_model_and_data(run) || open_outputs(run)) return -1;
    run->tokens_per_step = (long)(run->rows * (size_t)cfg->train.seq_len);
    if (!(run->batch = olmo_malloc(run->rows * (size_t)cfg->train.seq_len * sizeof(int32_t), "batch"))) return -1;
    run->flops_per_token = olmo_model_flops_per_token(&cfg->model, cfg->train.seq_len);
    run->peak = cfg->train.peak_flops;
    run->peak_source = "train.peak_flops";
    if (run->peak <= 0) {
        /* the probe runs on every backend, so the memory plan (train/memplan.c) holds on a GPU too */
        const double probe = olmo_measure_peak_flops(opts->be);
        run->peak = olmo_datasheet_peak_flops(opts->be->device, opts->be->name, run->peak_text,
                                              sizeof run->peak_text - 48);
        if (run->peak > 0) {
            const size_t len = strlen(run->peak_text);
            snprintf(run->peak_text + len, sizeof run->peak_text - len, "; the SGEMM probe measured %.4g", probe);
        } else {
            run->peak = probe;
            snprintf(run->peak_text, sizeof run->peak_text, "measured: best of 3 SGEMMs 2048^3");
        }
        run->peak_source = run->peak_text;
    }
    run->peak *= world; /* every rank has the same peak */
    print_header(run);
    run->step = run->st.step;
    run->tokens = run->st.tokens;
    run->start = run->last = olmo_now_seconds();
    run->opened = true;
    /* from here on, a collective that waits longer than train.collective_timeout ends the job (dist/dist.h) */
    if (opts->dist) {
        if (olmo_watchdog_start(opts->dist, cfg->train.collective_timeout)) return -1;
        olmo_watchdog_step(run->step); /* after start, which begins at step 0 */
    }
    return 0;
}

/* A start that failed leaves no out_dir behind that it made itself: the files it wrote there (the lock,
 * the resolved config, the metrics log) go, then the directory if nothing else is in it. */
static void remove_failed_start(const struct olmo_run *run) {
    static const char *const ours[] = {".lock", "config.yaml", "metrics.jsonl"};
    char path[4200];
    for (size_t i = 0; i < sizeof ours / sizeof *ours; i++) {
        snprintf(path, sizeof path, "%s/%s", run->cfg.data.out_dir, ours[i]);
        unlink(path);
    }
    rmdir(run->cfg.data.out_dir);
}

static int write_record(void *metrics, cJSON *rec) { return olmo_metrics_write(metrics, rec); }

/* Every set and task of the run, its records into metrics.jsonl. */
static int run_evals(struct olmo_run *run) {
    const struct olmo_config *cfg = &run->cfg;
    const struct olmo_eval_settings s = {
        .val_batches = cfg->train.eval_batches,
        .doc_batches = cfg->train.eval_batches,
        .doc_masking = cfg->train.intra_doc_masking,
        .pad_id = olmo_eval_pad_id(&cfg->model),
    };
    const struct olmo_eval_sink out = {
        .step = run->step, .text = run->o.log, .progress = run->o.log, .record = write_record, .ctx = &run->metrics};
    const double t0 = olmo_now_seconds();
    const int rc = olmo_eval_run(&run->tr.model, &run->ev, &s, &out);
    run->last_eval_seconds = olmo_now_seconds() - t0;
    run->eval_seconds += run->last_eval_seconds;
    return rc;
}

/* After a checkpoint is complete (rank 0): retention, and the log line. */
static int saved(struct olmo_run *run, long step, const char *path, const char *how) {
    if (run->leader && olmo_ckpt_retain(run->cfg.data.out_dir, run->cfg.train.keep_last)) return -1;
    if (run->o.log) {
        fprintf(run->o.log, "checkpoint step %ld: %s (%s)\n", step, path, how);
        fflush(run->o.log);
    }
    return 0;
}

/* train.async_save: finishes the save in flight, if any (collective: every rank calls it at the same
 * point): wait, whenever this rank's writer is done; else only if every rank's writer is done already.
 * Retention runs only here, between saves, so it never meets a save's temporary directory. */
static int complete_save(struct olmo_run *run, bool wait) {
    if (!olmo_ckpt_async_in_flight(run->async)) return 0;
    char path[4096], how[128];
    long step = 0;
    const double t0 = olmo_now_seconds();
    const int rc = olmo_ckpt_async_complete(run->async, wait, &step, path, sizeof path);
    if (rc <= 0) return rc;
    double copy_s, write_s;
    olmo_ckpt_async_times(run->async, &copy_s, &write_s);
    snprintf(how, sizeof how, "copied in %.2fs, written in the background in %.2fs%s", copy_s, write_s,
             wait && olmo_now_seconds() - t0 > 0.01 ? ", waited for" : "");
    return saved(run, step, path, how);
}

/* A checkpoint of this step: written here (train.async_save false), or copied to host memory and
 * written by a thread while training goes on (true; after the save in flight is finished: at most
 * one is), then finished here too when wait. */
static int save_checkpoint(struct olmo_run *run, bool wait) {
    const double t0 = olmo_now_seconds();
    long hwm_before = 0;
    const bool debug_mem = debug_mem_begin(&hwm_before);
    const long rss_before = debug_mem ? vm_kib("VmRSS:") : 0;
    const struct olmo_ckpt_state cs = {
        .step = run->step,
        .tokens = run->tokens,
        .elapsed = run->st.elapsed + (olmo_now_seconds() - run->start),
        .loader_epoch = run->loader.epoch,
        .loader_pos = run->loader.pos,
        .loader_instances = run->loader.n_instances,
        .loader_seed = run->cfg.train.seed,
        .loader_fingerprint = run->loader.fingerprint,
        .skipped = run->tr.skipped,
    };
    char path[4096], how[64];
    const bool async = run->cfg.train.async_save;
    if (async) {
        if (complete_save(run, true) || olmo_ckpt_save_async(&run->async, run->cfg.data.out_dir, &run->tr, &cs))
            return -1;
    } else if (olmo_ckpt_save(run->cfg.data.out_dir, &run->tr, &cs, path, sizeof path)) {
        return -1;
    }
    if (debug_mem) {
        char what[160];
        snprintf(what, sizeof what, "checkpoint step %ld%s", run->step, async ? " (the copy to host memory)" : "");
        debug_mem_end(run, what, hwm_before, rss_before);
        if (async)
            fprintf(stderr, "mem: rank %d asynchronous checkpoint: %zu bytes of host memory for the copy\n",
                    run->o.dist ? run->o.dist->rank : 0, olmo_ckpt_async_host_bytes(run->async));
    }
    run->saved_step = run->step;
    if (async) return wait ? complete_save(run, true) : 0;
    snprintf(how, sizeof how, "%.2fs", olmo_now_seconds() - t0);
    return saved(run, run->step, path, how);
}

/* In-loop evaluations still to come at the progress line of step, its own included (train.eval_every, and
 * the last step). */
static long evals_left(const struct olmo_run *run, long step) {
    const struct olmo_train_config *t = &run->cfg.train;
    if (t->eval_every <= 0 || !(run->ev.n_val || run->ev.n_tasks || run->ev.n_olmo_tasks) || step > t->steps)
        return 0;
    return t->steps / t->eval_every - (step - 1) / t->eval_every + (t->steps % t->eval_every != 0);
}

/* Time to the last step: the steps at their mean so far (checkpoints included,
 * evaluations not), plus each evaluation still to come at the last one's
 * duration; before the first evaluation, how many are still to come. */
static void format_eta(const struct olmo_run *run, long step, double now, char *buf, size_t n) {
    const long done = step - run->st.step, left = evals_left(run, step);
    const double steps_s = (now - run->start - run->eval_seconds) / (double)done * (double)(run->cfg.train.steps - step);
    const bool timed = run->last_eval_seconds > 0;
    olmo_format_duration(buf, n, steps_s + (timed ? (double)left * run->last_eval_seconds : 0.0));
    if (left && !timed) {
        const size_t len = strlen(buf);
        snprintf(buf + len, n - len, " + %ld evaluation%s", left, left == 1 ? "" : "s");
    }
}

/* Every rank's peak memory so far, in rank order, into rec's "mem_peak_bytes" (collective): the most
 * its backend instance has held (olmo_backend_mem_stats: buffers and scratch), or the process's peak
 * resident memory where the backend counts none. */
static int add_mem_peaks(struct olmo_run *run, cJSON *rec) {
    const struct olmo_dist *d = run->o.dist;
    const int world = d ? d->world : 1, rank = d ? d->rank : 0;
    double *peaks = olmo_calloc((size_t)world, sizeof(double), "memory peaks");
    if (!peaks) return -1;
    struct olmo_mem_stats ms;
    struct rusage ru;
    if (!olmo_backend_mem_stats(run->o.be, &ms)) peaks[rank] = (double)ms.peak;
    else if (!getrusage(RUSAGE_SELF, &ru)) peaks[rank] = (double)ru.ru_maxrss * 1024.0; /* KiB on Linux */
    if (world > 1 && olmo_dist_allgather_equal_bytes(d, peaks, sizeof(double))) {
        free(peaks);
        return -1;
    }
    cJSON *arr = cJSON_AddArrayToObject(rec, "mem_peak_bytes");
    for (int r = 0; r < world; r++) cJSON_AddItemToArray(arr, cJSON_CreateNumber(peaks[r]));
    free(peaks);
    return 0;
}

/* The metrics record of a step, and every log_every steps the progress line. */
static int report_step(struct olmo_run *run, const struct olmo_run_step *s, double now) {
    const struct olmo_train_config *t = &run->cfg.train;
    cJSON *rec = olmo_metrics_record("train", s->step);
    olmo_metrics_add_num(rec, "loss", "%.17g", s->res.ce_loss);
    olmo_metrics_add_num(rec, "z_loss", "%.17g", s->res.z_loss);
    olmo_metrics_add_num(rec, "grad_norm", "%.17g", s->res.grad_norm);
    olmo_metrics_add_num(rec, "lr", "%.17g", s->res.lr);
    olmo_metrics_add_int(rec, "tokens", run->tokens);
    olmo_metrics_add_num(rec, "tokens_per_s", "%.6g", s->tokens_per_s);
    olmo_metrics_add_num(rec, "mfu", "%.6g", s->mfu);
    olmo_metrics_add_num(rec, "elapsed", "%.6f", run->st.elapsed + (now - run->start));
    if (s->res.skipped) cJSON_AddBoolToObject(rec, "skipped", 1);
    olmo_metrics_add_num(rec, "tokens_per_s_per_device", "%.6g",
                         s->tokens_per_s / (run->o.dist ? run->o.dist->world : 1));
    if (add_mem_peaks(run, rec)) {
        cJSON_Delete(rec);
        return -1;
    }
    if (olmo_metrics_write(&run->metrics, rec)) return -1;
    if (!run->o.log || (s->step % t->log_every != 0 && s->step != t->steps)) return 0;
    const double tok_s = (double)(run->steps_since_log * run->tokens_per_step) / run->interval;
    char eta[64];
    format_eta(run, s->step, now, eta, sizeof eta);
    fprintf(run->o.log,
            "step %ld/%ld | loss %.4f | z %.2e | grad norm %.3f | lr %.3e | %.0f tok/s | MFU %.2f%% | ETA %s\n",
            s->step, t->steps, s->res.ce_loss, s->res.z_loss, s->res.grad_norm, s->res.lr, tok_s,
            100.0 * (run->peak > 0 ? tok_s * run->flops_per_token / run->peak : 0.0), eta);
    fflush(run->o.log);
    run->steps_since_log = 0;
    run->interval = 0.0;
    return 0;
}

/* A step whose loss or gradient norm is not finite, under train.nonfinite: stop. */
static int stop_nonfinite(struct olmo_run *run, const char *why) {
    char last[4096] = "";
    if (complete_save(run, true)) return -1; /* an earlier step's save in flight */
    if (run->o.write_files && olmo_ckpt_find_latest(run->cfg.data.out_dir, last, sizeof last) < 0) return -1;
    olmo_error("step %ld: %s: stopping the run (train.nonfinite: stop; train.nonfinite: skip would skip such steps "
               "instead); nothing of this step was applied or saved; %s%s%s",
               run->step, why, last[0] ? "the last checkpoint is '" : "there is no checkpoint to resume from",
               last, last[0] ? "'" : "");
    return OLMO_RUN_STOPPED;
}

/* After a step, on every rank: stop if any rank was sent SIGTERM, SIGINT,
 * SIGHUP or SIGUSR1, with a checkpoint of this step. */
static int stop_on_signal(struct olmo_run *run, long limit) {
    int sig;
    if (!run->signals_installed || run->step >= limit) return 0; /* the last step: the run ends anyway */
    if (olmo_signals_agree(run->o.dist, &sig)) return -1;
    if (!sig) return 0;
    const char *name = olmo_signals_name(sig);
    if (!run->o.write_files) {
        olmo_error("stopped by %s after step %ld (this run writes no checkpoints)", name, run->step);
        return OLMO_RUN_STOPPED;
    }
    if (complete_save(run, true) || (run->saved_step != run->step && save_checkpoint(run, true))) return -1;
    olmo_error("stopped by %s after step %ld: checkpoint '%s/step-%06ld' written; continue with --resume", name,
               run->step, run->cfg.data.out_dir, run->step);
    return OLMO_RUN_STOPPED;
}

/* A step faster than the peak makes its FLOP/s the peak (noted once): MFU never exceeds 100%. */
static void raise_peak(struct olmo_run *run, const struct olmo_run_step *s) {
    const double achieved = s->tokens_per_s * run->flops_per_token;
    if (run->peak <= 0 || achieved <= run->peak) return;
    if (!run->peak_raised && run->o.log) {
        fprintf(run->o.log,
                "note: step %ld ran at %.4g FLOP/s, above the peak of %.4g (%s): MFU is against the fastest step "
                "from here on\n",
                s->step, achieved, run->peak, run->peak_source);
        fflush(run->o.log);
    }
    run->peak_raised = true;
    run->peak = achieved;
    run->peak_source = "the fastest step";
}

/* Gradients, the step guard, and the update (or none). */
static int train_step(struct olmo_run *run, struct olmo_run_step *s, char *why, size_t n) {
    if (olmo_trainer_accumulate(&run->tr, run->batch, &s->res)) return -1;
    const enum olmo_step_verdict v = olmo_step_check(&run->tr, &s->res, why, n);
    if (v == OLMO_STEP_APPLY && olmo_trainer_update(&run->tr, &s->res)) return -1;
    if (v == OLMO_STEP_SKIP) olmo_trainer_skip(&run->tr, &s->res);
    if (v == OLMO_STEP_STOP) s->res.lr = olmo_trainer_next_lr(&run->tr);
    return v;
}

int olmo_run_step(struct olmo_run *run, struct olmo_run_step *out) {
    const struct olmo_run_options *o = &run->o;
    const struct olmo_train_config *t = &run->cfg.train;
    const long limit = o->stop_after > 0 ? o->stop_after : t->steps;
    if (run->step >= limit) return 0;
    const int seq = t->seq_len;
    struct olmo_run_step s = {.step = ++run->step};
    olmo_watchdog_step(s.step);
    const int rc = o->next_batch ? o->next_batch(o->ctx, run->batch, run->rows, seq)
                                 : olmo_loader_next(&run->loader, run->batch, (int)run->rows);
    if (rc) return -1;
    if (run->dump && fwrite(run->batch, sizeof(int32_t), run->rows * seq, run->dump) != run->rows * seq)
        return olmo_error("writing '%s' failed: %s", o->dump_path, strerror(errno));
    char why[OLMO_STEP_WHY_MAX];
    const int verdict = train_step(run, &s, why, sizeof why);
    if (verdict < 0) return -1;
    if (o->be->synchronize && o->be->synchronize(o->be)) return -1; /* the update is asynchronous on a device */
    run->tokens += run->tokens_per_step;
    run->steps_since_log++;
    const double now = olmo_now_seconds();
    s.seconds = now - run->last > 0 ? now - run->last : 1e-9;
    s.tokens_per_s = (double)run->tokens_per_step / s.seconds;
    raise_peak(run, &s);
    s.mfu = run->peak > 0 ? s.tokens_per_s * run->flops_per_token / run->peak : 0.0;
    run->interval += s.seconds;
    if (report_step(run, &s, now)) return -1;
    if (verdict == OLMO_STEP_STOP) return stop_nonfinite(run, why);
    if (verdict == OLMO_STEP_SKIP && o->log) {
        fprintf(o->log, "step %ld/%ld skipped: %s: no update\n", s.step, t->steps, why);
        fflush(o->log);
    }
    const bool last_step = s.step == t->steps;
    if (t->eval_every > 0 && (s.step % t->eval_every == 0 || last_step) &&
        (run->ev.n_val || run->ev.n_tasks || run->ev.n_olmo_tasks) && run_evals(run))
        return -1;
    if (complete_save(run, false)) return -1; /* a save in flight that every rank has written by now */
    if (o->write_files && t->save_every > 0 && (s.step % t->save_every == 0 || last_step) &&
        save_checkpoint(run, false))
        return -1;
    if (o->profile && s.step == run->st.step + 1) olmo_profile_reset(o->be); /* the first step pays for page faults */
    run->last = olmo_now_seconds(); /* evaluation and checkpoint time do not count as step time */
    if (out) *out = s;
    const int stop = stop_on_signal(run, limit);
    return stop ? stop : 1;
}

int olmo_run_finish(struct olmo_run *run) {
    const struct olmo_run_options *o = &run->o;
    if (complete_save(run, true)) return -1; /* the run's end waits for the save in flight */
    if (olmo_metrics_close(&run->metrics)) return -1;
    if (run->dump) {
        const int rc = fclose(run->dump);
        run->dump = NULL;
        if (rc) return olmo_error("writing '%s' failed: %s", o->dump_path, strerror(errno));
    }
    if (o->profile && o->log) olmo_profile_report(o->be, o->log);
    const double total = olmo_now_seconds() - run->start;
    char path[4200];
    const char *save = o->write_files ? weights_path(run, path, sizeof path) : o->save_path;
    if (o->write_files && olmo_ckpt_export_weights(&run->tr, save)) return -1; /* collective: rank 0 writes */
    const long done = run->step - run->st.step;
    if (o->log && run->peak_raised)
        fprintf(o->log, "MFU peak: %.4g FLOP/s, the fastest step's (the start-up peak was lower)\n", run->peak);
    if (o->log && run->tr.fully_sharded)
        fprintf(o->log, "fsdp: %ld block gathers when a block was needed, %ld ahead on the side stream%s\n",
                run->tr.fsdp.gathers, run->tr.fsdp.prefetches,
                run->tr.fsdp.n_slots == 2 ? "" : " (this backend has none: one block buffer)");
    if (o->log)
        fprintf(o->log, "done: %ld steps in %.1fs (%.0f tok/s average); weights in %s\n", done, total,
                total > 0 ? (double)done * (double)run->tokens_per_step / total : 0.0, save ? save : "-");
    return 0;
}

void olmo_run_close(struct olmo_run *run) {
    olmo_ckpt_async_destroy(run->async); /* a writer thread still going reads the trainer: first */
    if (run->metrics.f) fclose(run->metrics.f);
    if (run->dump) fclose(run->dump);
    free(run->batch);
    olmo_evaluators_close(&run->ev);
    if (run->trainer_ready) olmo_trainer_destroy(&run->tr);
    if (run->loader_ready) olmo_loader_close(&run->loader);
    if (!run->opened && run->created_out_dir) remove_failed_start(run);
    if (run->lock_fd >= 0) close(run->lock_fd);
    if (run->signals_installed) olmo_signals_release();
    memset(run, 0, sizeof *run);
    run->lock_fd = -1;
}

int olmo_run_train(const struct olmo_run_options *opts) {
    struct olmo_run run;
    int rc = olmo_run_open(&run, opts);
    if (!rc)
        while ((rc = olmo_run_step(&run, NULL)) > 0) {
        }
    if (!rc) rc = olmo_run_finish(&run);
    olmo_run_close(&run);
    return rc;
}
