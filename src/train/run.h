/* A training run as a library: what `olmo_run_train` does is what `olmoc
 * train` does (the CLI only parses arguments), and benchmarks drive the same
 * steps through olmo_run_open / olmo_run_step.
 *
 * A run with an output directory (opts.write_files):
 *   - takes an exclusive lock on data.out_dir (flock of data.out_dir/.lock,
 *     which holds the owner's PID): a second run on the same directory is
 *     refused, naming the holder;
 *   - decides where it starts: a new run, --resume (the newest checkpoint),
 *     --resume-from DIR (checked against the data and newer checkpoints),
 *     --init FILE, or --init-from CKPT [--with-optimizer-state] (a new stage);
 *   - writes config.yaml, metrics.jsonl (train/metrics.h), step-NNNNNN/
 *     checkpoints every train.save_every steps (train/checkpoint.h) and the
 *     final weights; evaluates every train.eval_every steps.
 * MFU is against a peak (train/peak.h), times the number of ranks:
 * train.peak_flops when set; else a GPU's datasheet peak for the backend's
 * precision when the device is in the table; else an SGEMM probe at
 * start-up.  If a step runs faster than that peak (a probe that read low on
 * a busy machine, a train.peak_flops set too low), the fastest step's FLOP/s
 * becomes the peak, with a note in the log: MFU never exceeds 100%.
 * Under MPI every rank runs the same steps; rank 0 alone writes files and
 * progress lines.  A function that fails on one rank returns -1 there only:
 * the caller must bring the job down (olmo_dist_abort), or the other ranks
 * wait forever in the next collective. */
#ifndef OLMOC_RUN_H
#define OLMOC_RUN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "backend/backend.h"
#include "config/config.h"
#include "data/token_file.h"
#include "dist/dist.h"
#include "eval/evaluator.h"
#include "train/checkpoint.h"
#include "train/metrics.h"
#include "train/peak.h"
#include "train/trainer.h"

struct olmo_run_options {
    const struct olmo_config *cfg; /* validated here; copied */
    const struct olmo_backend *be;
    const struct olmo_dist *dist; /* NULL: one process */
    const char *config_path;      /* for the header line */
    bool write_files;             /* out_dir, lock, metrics, checkpoints, final weights; false: none */
    bool resume;                  /* continue from the newest checkpoint in data.out_dir */
    const char *resume_from;      /* or from this checkpoint directory */
    const char *init_path;        /* weights to start from (Hugging Face safetensors) */
    const char *init_from;        /* or a checkpoint directory to start a new stage from: its weights ... */
    bool init_optimizer;          /* ... and its AdamW moments and step count (fresh schedule and data order) */
    const char *save_path;        /* final weights; NULL: data.out_dir/model.safetensors */
    const char *dump_path;        /* append each step's batch (raw int32) here */
    long stop_after;              /* stop after this many steps (0: train.steps, which also sets the LR schedule) */
    bool handle_signals;          /* SIGTERM/SIGINT/SIGHUP stop the run after the current step, with a
                                   * checkpoint (train/signals.h); listened to from open, released by close */
    bool profile;                 /* be is profiled (backend/profile.h): reset after step 1, report at the end */
    FILE *log;                    /* progress lines as olmoc train prints them; NULL: none */
    /* Instead of data.train_path / data.mix: fills rows x seq_len tokens per step. */
    int (*next_batch)(void *ctx, int32_t *batch, size_t rows, int seq_len);
    /* Instead of the seeded OLMo-core initialisation (a new run). */
    int (*init_weights)(void *ctx, struct olmo_model *m);
    void *ctx;
};

/* What one step did. */
struct olmo_run_step {
    long step;
    struct olmo_step_result res;
    double seconds;      /* wall time of the step, device synchronised */
    double tokens_per_s; /* of this step */
    double mfu;          /* of this step; 0 when the peak is unknown */
};

struct olmo_run {
    struct olmo_run_options o;
    struct olmo_config cfg;
    struct olmo_trainer tr;
    bool trainer_ready, loader_ready;
    struct olmo_loader loader;
    struct olmo_evaluators ev; /* eval/evaluator.h: data.val_paths, data.eval_tasks */
    struct olmo_metrics metrics;
    struct olmo_ckpt_state st; /* where the run started */
    char ckpt[4096];           /* the checkpoint it resumed from, or "" */
    int lock_fd;               /* -1: none */
    bool created_out_dir;      /* this run made data.out_dir: a failed start removes it again */
    bool opened;               /* olmo_run_open succeeded */
    bool leader;
    FILE *dump;
    int32_t *batch;
    size_t rows;
    long tokens_per_step, tokens, step, steps_since_log;
    long saved_step; /* the step of the last checkpoint this run wrote or has in flight (0: none) */
    struct olmo_ckpt_async *async; /* train.async_save: the writer of checkpoints (NULL until the first) */
    bool signals_installed;
    double flops_per_token, peak; /* peak over all ranks */
    const char *peak_source;
    char peak_text[160]; /* peak_source's text when it is built at start-up */
    bool peak_raised;    /* a step ran faster than the start-up peak: the fastest step is the peak */
    double start, last, interval;
    double eval_seconds, last_eval_seconds; /* in-loop evaluations: all so far, the last one (for the ETA) */
};

/* Sets everything up (lock, starting point, model, data, evaluators, logs);
 * prints the header lines.  On failure call olmo_run_close. */
int olmo_run_open(struct olmo_run *run, const struct olmo_run_options *opts);
/* The next optimizer step (with its metrics record, progress line, and any
 * evaluation and checkpoint due): 1 done (out filled, may be NULL), 0 all
 * train.steps done, -1 error, OLMO_RUN_STOPPED: every rank stopped after the
 * same step, the reason in olmo_last_error:
 *   - its loss or gradient norm was not finite and train.nonfinite is stop:
 *     nothing of the step is applied or saved (the last checkpoint stays the
 *     newest); train.nonfinite: skip logs the step and applies no update;
 *   - SIGTERM, SIGINT or SIGHUP (opts.handle_signals): the step was finished and a
 *     checkpoint written (olmo_signals_stopped_by() says which signal). */
#define OLMO_RUN_STOPPED (-2)
int olmo_run_step(struct olmo_run *run, struct olmo_run_step *out);
/* Closes the logs, writes the final weights, prints the summary. */
int olmo_run_finish(struct olmo_run *run);
void olmo_run_close(struct olmo_run *run);
/* open, every step, finish, close: 0, -1 or OLMO_RUN_STOPPED. */
int olmo_run_train(const struct olmo_run_options *opts);


#endif
