/* Training checkpoints: a directory out_dir/step-NNNNNN/ holding
 *   config.yaml        the resolved run config
 *   state.json         step, tokens, elapsed time, data-loader position, the
 *                      optimizer's step ("optimizer"), and the size and 64-bit
 *                      content hash ("hash64", hex) of each file below, by the
 *                      algorithm "hash" names: "xxh3_64" (xxHash's XXH3-64,
 *                      seed 0).  A state.json without "hash" (earlier olmoc
 *                      versions) holds their own 64-bit hash, still read.
 * and, written by one rank (state.json "version": 1; also what Python tools write):
 *   model.safetensors  weights (Hugging Face Olmo3ForCausalLM names, fp32)
 *   optim.safetensors  AdamW state: "<param>.exp_avg", "<param>.exp_avg_sq" (fp32), "step" (I64 [1])
 * or, written by N > 1 ranks ("version": 2), one file per rank, written by that rank:
 *   shard-RRRRR-of-NNNNN.safetensors  "weights" (fp32 master), "exp_avg", "exp_avg_sq":
 *                      the rank's shard in its local indexing, and "step"
 *                      (I64 [1], Adam's step count); state.json's
 *                      "shards" lists per file its pieces [global, local, len]
 *                      of the flat parameters (optim.h's olmo_shard_range),
 *                      n_local, dtype, bytes and hash64.  Each shard's
 *                      __metadata__ records the same of itself ("file",
 *                      "rank", "n_local", "pieces") and the run state
 *                      ("state": steps, tokens, the loader's position, seed
 *                      and fingerprint), under its hash: a state.json that
 *                      disagrees (edited, swapped entries) is refused on
 *                      load.  Shards of earlier versions, without these
 *                      entries, load on state.json's word.
 * Written to out_dir/.tmp-step-NNNNNN/, every file fsync'ed (temp + rename),
 * then renamed into place (and the parent fsync'ed): a checkpoint directory
 * either exists complete or not at all, whenever the process dies.
 *
 * Memory: no rank holds more than its shard and a 16 MiB staging chunk;
 * files are streamed (the hashes computed while writing), whole-tensor files
 * are gathered a chunk of a tensor at a time to rank 0.  Loading re-shards:
 * each rank reads, by pread, the overlaps of its pieces with every file's
 * pieces, so a checkpoint of N ranks resumes on M, and checks the hash of
 * every file it reads from.
 *
 * Randomness: the training step draws no random numbers (Olmo 3 has no
 * dropout); the data order is a seeded shuffle per epoch, so the loader's
 * (seed, epoch, position) is the whole random state that has to survive. */
#ifndef OLMOC_CHECKPOINT_H
#define OLMOC_CHECKPOINT_H

#include <stdbool.h>
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
/* Asynchronous saves (train.async_save; checkpoint_async.c).  olmo_ckpt_save_async
 * (collective) makes the temporary directory, copies this rank's shard of the master weights and
 * of both moments to host memory (one rank: every flat parameter; page-locked on a device,
 * allocated at the first save and kept) and returns; a thread then writes the files from that copy,
 * with the same hashes, fsyncs and names as olmo_ckpt_save.  olmo_ckpt_async_complete (collective)
 * finishes it on the calling thread: the ranks agree that every shard is written, then rank 0
 * writes config.yaml and state.json and renames the directory into place (olmo_ckpt_save's last
 * steps), so the checkpoint appears complete or not at all, as a synchronous one.  At most one save
 * is in flight: olmo_ckpt_save_async refuses a second. */
struct olmo_ckpt_async;
/* *a: NULL the first time (created here); freed by olmo_ckpt_async_destroy. */
int olmo_ckpt_save_async(struct olmo_ckpt_async **a, const char *out_dir, const struct olmo_trainer *tr,
                         const struct olmo_ckpt_state *st);
/* Collective (every rank at the same point, with the same save in flight): wait, the save in
 * flight is finished once this rank's thread is done; !wait, only when every rank's thread is done
 * already (an all-reduce of one number while a save is in flight; nothing without one).  1: a save
 * was finished (its directory in path_out; its step in *step), 0: none in flight, or (!wait) not
 * done yet, -1: it failed (on every rank; the temporary directory stays for the next start to
 * remove). */
int olmo_ckpt_async_complete(struct olmo_ckpt_async *a, bool wait, long *step, char *path_out, size_t n);
/* Whether a save is in flight; the host memory held for the copy (bytes; 0 before the first save). */
bool olmo_ckpt_async_in_flight(const struct olmo_ckpt_async *a);
size_t olmo_ckpt_async_host_bytes(const struct olmo_ckpt_async *a);
/* Seconds the last save took: copying to host memory, and writing in the thread. */
void olmo_ckpt_async_times(const struct olmo_ckpt_async *a, double *copy_s, double *write_s);
/* Waits for the thread (no collective: after a failure, or when the run ends early) and frees
 * everything; a save not completed leaves its temporary directory.  NULL: nothing. */
void olmo_ckpt_async_destroy(struct olmo_ckpt_async *a);

/* Finds the newest checkpoint directory in out_dir: 1 found (path in buf), 0 none, -1 error. */
int olmo_ckpt_find_latest(const char *out_dir, char *buf, size_t n);
/* Checks state.json and the size and hash of every file; fills st (may be NULL). */
int olmo_ckpt_verify(const char *dir, struct olmo_ckpt_state *st);
/* Reads the checkpoint's config.yaml (over the defaults). */
int olmo_ckpt_read_config(const char *dir, struct olmo_config *cfg);
/* Collective: verifies the checkpoint, checks that its model shape (and
 * train.seq_len / train.seed) match tr's config, and loads this rank's shard
 * of the weights and optimizer state, and st; then shares the weights
 * (olmo_trainer_master_updated).  Fails on every rank when it fails on one. */
int olmo_ckpt_load(const char *dir, struct olmo_trainer *tr, struct olmo_ckpt_state *st);
/* Collective: a new stage from a checkpoint (olmoc train --init-from): its
 * weights and, with_optimizer_state, its AdamW moments and step count, as
 * OLMo-core's load_optim_state=True, load_trainer_state=False: the step
 * count (Adam's bias correction, each parameter's state["step"] there)
 * continues, while the LR schedule, data order and skipped-step count start
 * afresh (tr->adam_step_base = the carried count). */
int olmo_ckpt_init_from(const char *dir, struct olmo_trainer *tr, bool with_optimizer_state);
/* Loads only the weights of a checkpoint (verified) into a whole model (one process). */
int olmo_ckpt_load_weights(const char *dir, struct olmo_model *m);
/* Collective: initial weights from one safetensors file with Hugging Face
 * names (olmoc train --init), as strictly as olmo_weights_load (every
 * parameter with its shape, no other tensor, F32/BF16/F16 widened, every
 * value finite), but each rank reads only its pieces of the master weights
 * (opt.ranges), a chunk at a time: no rank holds a full-size copy.  Then
 * olmo_trainer_master_updated (ZeRO-1 all-gathers).  A failure on one rank
 * fails every rank with the message of the lowest failing rank. */
int olmo_ckpt_load_weights_file(const char *path, struct olmo_trainer *tr);
/* Collective: the weights as one safetensors file with Hugging Face names
 * (what olmo_weights_save writes), gathered a chunk at a time to rank 0,
 * which writes path. */
int olmo_ckpt_export_weights(const struct olmo_trainer *tr, const char *path);
/* Removes all but the newest `keep` checkpoints (keep 0: remove none), and stale temporaries. */
int olmo_ckpt_retain(const char *out_dir, int keep);
/* Removes what interrupted saves left in out_dir: .tmp-step-* directories (never complete checkpoints) and
 * .old-step-N ones whose step-N is in place (a lone .old-step-N, the only copy of its step, is kept with a
 * note on stderr).  Rank 0, with out_dir locked: at a run's start and after each save (olmo_ckpt_retain). */
int olmo_ckpt_clean_stale(const char *out_dir);
/* Restores a loader's position; fails when the checkpoint was written
 * reading other data (the fingerprint differs). */
int olmo_ckpt_seek_loader(struct olmo_loader *l, const struct olmo_ckpt_state *st);

/* The 64-bit content hash olmoc writes in state.json: XXH3-64, seed 0 (not
 * cryptographic: detects corruption). */
uint64_t olmo_hash64(const void *data, size_t len);

#endif
