/* Shared between the checkpoint's files (src/train/):
 *   checkpoint.c         saving a checkpoint directory, finding the newest, retention,
 *                        the ranks' agreement on a result;
 *   checkpoint_async.c   saving with the files written by a thread from a host copy;
 *   checkpoint_hash.c    the content hash of the files (streamed while writing; of a file on disk);
 *   checkpoint_state.c   state.json: writing it, reading it into a manifest, checking files against it;
 *   checkpoint_export.c  whole tensors under Hugging Face names, gathered to rank 0;
 *   checkpoint_read.c    segments of any sharding, read by each rank for its pieces;
 *   checkpoint_load.c    loading into a trainer or model, the config, the loader's position.
 * The format is described in checkpoint.h. */
#ifndef OLMOC_CHECKPOINT_INTERNAL_H
#define OLMOC_CHECKPOINT_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "io/safetensors.h"
#include "train/checkpoint.h"
#include "util/error.h"

#define CKPT_FORMAT "olmoc-checkpoint"
#define CKPT_PREFIX "step-"
#define CKPT_TMP_PREFIX ".tmp-step-"
#define CKPT_OLD_PREFIX ".old-step-"

/* Staging for file and device transfers: 16 MiB, whatever the model size. */
#define CHUNK_FLOATS ((size_t)4 << 20)

/* ---- the content hash (checkpoint_hash.c) ---- */

/* Which hash state.json's "hash64" entries hold: "hash": "xxh3_64" (what
 * olmoc writes), or no "hash" at all (checkpoints of earlier olmoc versions). */
enum ckpt_hash_alg { CKPT_HASH_LEGACY64, CKPT_HASH_XXH3_64 };
#define CKPT_HASH_XXH3_64_NAME "xxh3_64"

/* The earlier olmoc hash fed in pieces (the total length must be known up front). */
struct hash_stream {
    uint64_t h;
    uint8_t buf[8];
    int nbuf;
};

struct XXH3_state_s;

/* A hash of either kind, fed in pieces. */
struct ckpt_hash {
    enum ckpt_hash_alg alg;
    struct hash_stream legacy;
    struct XXH3_state_s *xxh; /* XXH3_createState's, until ckpt_hash_end or ckpt_hash_free */
};

/* len: the total length to come (the earlier hash starts from it). */
int ckpt_hash_begin(struct ckpt_hash *h, enum ckpt_hash_alg alg, size_t len);
/* ctx: a struct ckpt_hash (the signature of struct olmo_st_stream's hash_update). */
void ckpt_hash_update(void *ctx, const uint8_t *p, size_t n);
/* The digest; frees what ckpt_hash_begin allocated. */
uint64_t ckpt_hash_end(struct ckpt_hash *h);
/* Frees a hash that will not be ended (an error path); harmless after ckpt_hash_end. */
void ckpt_hash_free(struct ckpt_hash *h);
const char *ckpt_hash_name(enum ckpt_hash_alg alg);
/* Hashes a file read in chunks (no mapping: the page cache, not this
 * process, holds what was read). */
int ckpt_hash_file(const char *path, enum ckpt_hash_alg alg, uint64_t *hash, size_t *size);
/* Starts streaming the file writer w declared to path, hashed (XXH3-64) as it is written: *bytes = its
 * size, h the hash that s updates (ckpt_hash_end it after olmo_st_stream_finish). */
int ckpt_stream_begin_hashed(struct olmo_st_stream *s, struct olmo_st_writer *w, struct ckpt_hash *h,
                             const char *path, size_t *bytes);

/* ---- paths and ranks ---- */

static inline int path_join(char *buf, size_t n, const char *dir, const char *name) {
    if (snprintf(buf, n, "%s/%s", dir, name) >= (int)n) return olmo_error("path too long: '%s/%s'", dir, name);
    return 0;
}

static inline int world_of(const struct olmo_dist *d) { return d ? d->world : 1; }
/* A trainer without ranks (dist NULL) gathers as a one-rank job. */
static inline const struct olmo_dist *or_one(const struct olmo_dist *d) {
    static const struct olmo_dist one = {.rank = 0, .world = 1, .mpi_active = 0};
    return d ? d : &one;
}
static inline int rank_of(const struct olmo_dist *d) { return d ? d->rank : 0; }

/* Every rank learns whether any rank failed (rc != 0 here); a rank that did
 * not fail itself reports that another did.  Collective. */
int ckpt_agree(const struct olmo_dist *d, int rc, const char *what);
/* As ckpt_agree, but every rank ends with the message of the lowest failing rank
 * (a failure only some ranks see, e.g. a NaN in one rank's piece of a file,
 * is then reported the same wherever the error is printed).  Collective. */
int ckpt_agree_message(const struct olmo_dist *d, int rc);
/* After a load into tr's master weights (rc: the ranks' agreed result): the trainer picks them up; a
 * failed load may have written part of them, so under fsdp nothing gathered still counts as current. */
int ckpt_master_loaded(struct olmo_trainer *tr, int rc);

/* ---- what a checkpoint holds ---- */

/* The quantities a checkpoint holds per flat parameter. */
enum { Q_MASTER, Q_M, Q_V, N_Q };
static const char *const q_shard_tensor[N_Q] = {"weights", "exp_avg", "exp_avg_sq"};
static const char *const q_suffix[N_Q] = {"", ".exp_avg", ".exp_avg_sq"};

/* This rank's buffer of a quantity (local indexing, backend memory). */
static inline float *q_buffer(const struct olmo_trainer *tr, int q) {
    return q == Q_MASTER ? olmo_optimizer_master(&tr->opt, &tr->model) : q == Q_M ? tr->opt.m : tr->opt.v;
}

/* The pieces this rank saves and hands to a gather: its own, unless it is a
 * replica (HSDP: a later replica group holds copies of the first group's
 * pieces, which alone are saved, so the saved pieces tile the parameters). */
static inline int saved_ranges(const struct olmo_trainer *tr) { return tr->opt.primary ? tr->opt.n_ranges : 0; }
static inline size_t saved_local(const struct olmo_trainer *tr) { return tr->opt.primary ? tr->opt.n_local : 0; }

static inline void shard_name(char *buf, size_t n, int rank, int world) {
    snprintf(buf, n, "shard-%05d-of-%05d.safetensors", rank, world);
}

/* A file written: its size and content hash. */
struct written {
    size_t bytes;
    uint64_t hash;
};

/* ---- writing (checkpoint.c, checkpoint_export.c, checkpoint_state.c) ---- */

/* The optimizer's state beyond the moments as of a save (state.json's "optimizer"): Adam's step
 * count and SkipStepAdamW's window (olmo_optimizer_extra_get's layout; NULL when it has none). */
struct ckpt_opt_state {
    long step;
    double *extra;
    size_t n_extra;
};
int ckpt_opt_state_get(const struct olmo_trainer *tr, struct ckpt_opt_state *o);
void ckpt_opt_state_free(struct ckpt_opt_state *o);

/* A rank's shard as a save writes it: its quantities in local indexing (be: backend memory, read a
 * chunk at a time through be->to_host; be NULL: host memory, written as it is), the pieces it saves
 * and Adam's step count.  Nothing in it changes while a writer thread reads it. */
struct ckpt_shard_src {
    const float *q[N_Q];
    const struct olmo_backend *be;
    const struct olmo_shard_range *ranges;
    int n_ranges;
    size_t n_local;
    int rank;
    int64_t step;
};
/* The shard of src as rank's shard file `name` in dir (no collective: any thread). */
int ckpt_write_shard(const struct ckpt_shard_src *src, const struct olmo_ckpt_state *st, const char *dir,
                     const char *name, struct written *out);

/* A save in phases: begin (collective: the temporary directory, made by rank 0), the files (every
 * rank its shard, or one rank's two whole-tensor files), commit (collective: every rank wrote its
 * files, then rank 0's config.yaml, state.json and the rename).  olmo_ckpt_save runs them in a row;
 * checkpoint_async.c writes the files in a thread in between. */
struct ckpt_save {
    char out_dir[4096], tmp[4096], final[4096], old[4096];
    struct olmo_ckpt_state st;
    struct ckpt_opt_state opt; /* as of begin */
};
/* rc: this rank's status so far (a failure on any rank fails every rank's begin). */
int ckpt_save_begin(struct ckpt_save *sv, const char *out_dir, const struct olmo_trainer *tr,
                    const struct olmo_ckpt_state *st, int rc);
/* The files' names in the temporary directory: one rank's whole-tensor files (version 1). */
#define CKPT_V1_MODEL "model.safetensors"
#define CKPT_V1_OPTIM "optim.safetensors"
/* rc: this rank's status writing its files: one rank: files[0..1] the weights and optimizer files;
 * several: files[0] this rank's shard.  Frees sv's allocations whatever the result. */
int ckpt_save_commit(struct ckpt_save *sv, const struct olmo_trainer *tr, int rc, const struct written *files,
                     char *path_out, size_t n);

/* A safetensors file of whole tensors (Hugging Face names) gathered from every
 * rank's shard: the weights (q_list {Q_MASTER}; st NULL) or the optimizer
 * moments ({Q_M, Q_V}; with st: "step", and the run state recorded in its
 * __metadata__ as a shard records it).  Collective; root writes path. */
int ckpt_write_gathered(const struct olmo_trainer *tr, const int *q_list, int n_q, const struct olmo_ckpt_state *st,
                        const char *path, struct written *out);
/* The same file of one rank's host copies: host[k] holds quantity q_list[k] of every flat parameter
 * (global indexing); with st, Adam's `step`.  No collective, nothing of the trainer but the model's
 * tensor names and shapes (m): a writer thread's. */
int ckpt_write_whole_host(const struct olmo_model *m, const float *const *host, const int *q_list, int n_q,
                          const struct olmo_ckpt_state *st, int64_t step, const char *path, struct written *out);
/* state.json.  files: the whole-tensor files (version 1) and config.yaml;
 * shards (version 2, NULL otherwise): one record per rank, as gathered:
 * bytes, hash, n_local, n_ranges, then n_ranges x (global, local, len).
 * opt: the optimizer's state as of the save. */
int ckpt_write_state(const char *dir, const struct olmo_ckpt_state *st, const struct olmo_trainer *tr,
                     const struct ckpt_opt_state *opt, const char *const *names, const struct written *files,
                     int n_files, const uint64_t *shards, const size_t *shard_words, int world);

/* ---- the shards' own records (checkpoint_state.c) ----
 * Each shard file (version 2) holds in its "__metadata__", under its content
 * hash, what state.json says of it: its "file" name, "rank", "n_local" and
 * "pieces" ([[global, local, len], ...]), and the run state ("state": steps,
 * tokens, skipped steps, the loader's epoch, position, instances, seed and
 * fingerprint).  Loading compares them with state.json (ckpt_check_records),
 * so an edited or swapped state.json is refused, not loaded as permuted
 * weights.  Shards without them (earlier olmoc versions) load as before.
 * Version 1's files (Hugging Face names, one rank) keep no record. */

/* The run state record (malloc'ed JSON text; NULL on error). */
char *ckpt_state_record(const struct olmo_ckpt_state *st);
/* A shard's pieces record (malloc'ed JSON text; NULL on error). */
char *ckpt_pieces_record(const struct olmo_shard_range *r, int n);

/* ---- reading: the manifest (checkpoint_state.c) ---- */

struct ckpt_file {
    char name[128];
    size_t bytes;
    char hash[32];
    bool need;         /* this rank reads from it: its hash is checked */
    size_t step_at;    /* file offset of its optimizer "step" scalar (0: none), read once hashed */
    enum olmo_st_dtype step_dtype;
};

/* A run of flat parameters [global, global + len) of one quantity stored
 * contiguously in a file: element global is at byte off, in dtype.  For
 * messages: the tensor's name and the flat offset of its element 0. */
struct seg {
    int file;
    size_t global, len, off, base;
    enum olmo_st_dtype dtype;
    char name[200];
};

struct manifest {
    const char *dir;
    enum ckpt_hash_alg hash_alg; /* of the files' "hash64" (state.json's "hash") */
    const char *single; /* a plain weights file (olmo_ckpt_load_weights_file): its one file's path, not dir/name */
    int version;
    struct olmo_ckpt_state st;
    long opt_step, step_base;
    bool has_opt_step;
    double *extra; /* optimizer.skip_step: SkipStepAdamW's window */
    size_t n_extra;
    bool has_extra;
    struct ckpt_file *files;
    int n_files;
    struct seg *segs[N_Q];
    int n_segs[N_Q], cap_segs[N_Q];
    /* version 2 */
    int world;
    size_t n_floats;
    struct {
        int file;
        size_t n_local;
        struct olmo_shard_range *pieces;
        int n_pieces;
    } *shards;
};

void ckpt_manifest_free(struct manifest *mf);
/* state.json: what it says, no file opened yet. */
int ckpt_parse_state(const char *dir, struct manifest *mf);
/* A file's "state" record equals state.json's run state (no record: accepted). */
int ckpt_check_state_record(const struct manifest *mf, const struct olmo_st_file *f, const char *path);
/* The records of the shards marked needed agree with state.json (checkpoint_read.c). */
int ckpt_check_records(const struct manifest *mf);
/* Every file exists with its size. */
int ckpt_check_sizes(const struct manifest *mf);
/* The content hash of the files marked needed (all: every file). */
int ckpt_check_hashes(const struct manifest *mf, bool all);

/* ---- reading: segments (checkpoint_read.c) ---- */

/* Version 1's model.safetensors (or a plain weights file): whole tensors
 * under Hugging Face names, any float dtype, checked as strictly as a weights file. */
int ckpt_segs_v1_model(struct manifest *mf, const struct olmo_model *m, const char *path, int file);
/* The segments of quantities 0..q_hi tile [0, n_floats) exactly. */
int ckpt_check_tiling(struct manifest *mf, size_t n_floats, int q_hi);
/* Reads the files' headers into segments and checks them against the
 * model (the optimizer's only with moments). */
int ckpt_build_segments(struct manifest *mf, const struct olmo_model *m, bool moments);
/* Marks the files this rank reads quantities q_lo..q_hi of its pieces from. */
void ckpt_mark_needed(struct manifest *mf, const struct olmo_shard_range *r, int n, int q_lo, int q_hi);
/* The optimizer step of the hashed files: version 1's optim.safetensors is
 * the authority; version 2's shards must agree with state.json. */
int ckpt_read_steps(struct manifest *mf);
/* Reads quantities q_lo..q_hi of ranges into dsts[q]. */
int ckpt_read_quantities(const struct manifest *mf, int q_lo, int q_hi, const struct olmo_shard_range *ranges,
                         int n_ranges, float *const *dsts, const struct olmo_backend *be);

#endif
