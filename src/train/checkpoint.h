/* Training checkpoints: a directory out_dir/step-NNNNNN/ holding
 *   model.safetensors  weights (Hugging Face Olmo3ForCausalLM names, fp32)
 *   optim.safetensors  AdamW state: "<param>.exp_avg", "<param>.exp_avg_sq" (fp32), "step" (I64 [1])
 *   config.yaml        the resolved run config
 *   state.json         step, tokens, elapsed time, data-loader position, and the
 *                      size + 64-bit content hash of each file above
 * written to out_dir/.tmp-step-NNNNNN/, every file fsync'ed, then renamed
 * into place (and the parent fsync'ed): a checkpoint directory either exists
 * complete or not at all, whenever the process dies.
 *
 * Randomness: the training step draws no random numbers (Olmo 3 has no
 * dropout); the data order is a seeded shuffle per epoch, so the loader's
 * (seed, epoch, position) is the whole random state that has to survive. */
#ifndef OLMOC_CHECKPOINT_H
#define OLMOC_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "data/token_file.h"
#include "train/trainer.h"

struct olmo_ckpt_state {
    long step;          /* optimizer steps done */
    long tokens;        /* training tokens consumed */
    double elapsed;     /* training wall time so far (seconds) */
    long loader_epoch;  /* struct olmo_loader epoch / pos / n_instances / seed */
    size_t loader_pos;
    size_t loader_instances;
    uint64_t loader_seed;
    uint64_t loader_fingerprint; /* identity of the data (files, weights, seed, seq_len) */
    long skipped;                /* steps skipped (train.nonfinite: skip): step = optimizer step + skipped;
                                  * in state.json as "skipped_steps" only when not 0 */
};

/* Writes out_dir/step-<step>; its path goes to path_out. */
int olmo_ckpt_save(const char *out_dir, const struct olmo_trainer *tr, const struct olmo_ckpt_state *st,
                   char *path_out, size_t n);
/* Finds the newest checkpoint directory in out_dir: 1 found (path in buf), 0 none, -1 error. */
int olmo_ckpt_find_latest(const char *out_dir, char *buf, size_t n);
/* Checks state.json and the size and hash of every file; fills st (may be NULL). */
int olmo_ckpt_verify(const char *dir, struct olmo_ckpt_state *st);
/* Reads the checkpoint's config.yaml (over the defaults). */
int olmo_ckpt_read_config(const char *dir, struct olmo_config *cfg);
/* Verifies the checkpoint, checks that its model shape (and train.seq_len /
 * train.seed) match tr's config, and loads weights, optimizer state and st. */
int olmo_ckpt_load(const char *dir, struct olmo_trainer *tr, struct olmo_ckpt_state *st);
/* Loads only the weights of a checkpoint (verified) into a model. */
int olmo_ckpt_load_weights(const char *dir, struct olmo_model *m);
/* Removes all but the newest `keep` checkpoints (keep 0: remove none), and stale temporaries. */
int olmo_ckpt_retain(const char *out_dir, int keep);
/* Restores a loader's position; fails when the checkpoint was written
 * reading other data (the fingerprint differs). */
int olmo_ckpt_seek_loader(struct olmo_loader *l, const struct olmo_ckpt_state *st);

/* 64-bit content hash used in state.json (not cryptographic: detects corruption). */
uint64_t olmo_hash64(const void *data, size_t len);

#endif
