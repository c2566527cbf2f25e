/* Saving a checkpoint directory (rank 0's whole-tensor files or every
 * rank's shard, then config.yaml, state.json and the rename into place),
 * finding the newest, retention, and the ranks' agreement on a result.
 * The format is described in checkpoint.h; the other concerns are in
 * checkpoint_hash.c, checkpoint_state.c (state.json), checkpoint_export.c
 * (whole tensors gathered to rank 0), checkpoint_read.c (reading segments
 * of any sharding) and checkpoint_load.c (loading into a trainer or model). */
#include "train/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "train/checkpoint_internal.h"
#include "util/error.h"
#include "util/fs.h"

/* Every rank learns whether any rank failed (rc != 0 here); a rank that did
 * not fail itself reports that another did.  Collective. */
int ckpt_agree(const struct olmo_dist *d, int rc, const char *what) {
    if (world_of(d) == 1) return rc;
    double bad = rc ? 1.0 : 0.0;
    if (olmo_dist_allreduce_f64(d, &bad, 1)) return -1;
    if (rc) return rc;
    return bad > 0 ? olmo_error("%s failed on another rank (its message names the cause)", what) : 0;
}

/* As agree, but every rank ends with the message of the lowest failing rank
 * (a failure only some ranks see, e.g. a NaN in one rank's piece of a file,
 * is then reported the same wherever the error is printed).  Collective. */
int ckpt_agree_message(const struct olmo_dist *d, int rc) {
    const int world = world_of(d);
    if (world == 1) return rc;
    double *bad = calloc((size_t)world, sizeof *bad);
    if (!bad) return ckpt_agree(d, rc ? rc : olmo_error("out of memory"), "reading the weights");
    bad[d->rank] = rc ? 1.0 : 0.0;
    if (olmo_dist_allreduce_f64(d, bad, (size_t)world)) {
        free(bad);
        return -1;
    }
    int first = 0;
    while (first < world && bad[first] == 0) first++;
    free(bad);
    if (first == world) return 0;
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", rc ? olmo_last_error() : "");
    if (olmo_dist_broadcast_bytes(d, msg, sizeof msg, first)) return -1;
    msg[sizeof msg - 1] = 0;
    return rc ? rc : olmo_error("%s", msg);
}

/* After a load into tr's master weights (rc: the ranks' agreed result): the trainer picks them up; a
 * failed load may have written part of them, so under fsdp nothing gathered still counts as current. */
int ckpt_master_loaded(struct olmo_trainer *tr, int rc) {
    if (!rc) return olmo_trainer_master_updated(tr);
    if (tr->fully_sharded) olmo_fsdp_master_updated(&tr->fsdp);
    return rc;
}

/* ---- saving ---- */

/* A shard file: the master weights and both moments in local indexing,
 * streamed from the backend a chunk at a time (or written from host memory);
 * its __metadata__ records its name, rank, pieces and the run state
 * (checkpoint_internal.h). */
int ckpt_write_shard(const struct ckpt_shard_src *src, const struct olmo_ckpt_state *st, const char *dir,
                     const char *name, struct written *out) {
    char path[4096];
    if (path_join(path, sizeof path, dir, name)) return -1;
    const struct olmo_backend *be = src->be;
    const size_t n = src->n_local;
    struct olmo_st_writer w = {0};
    struct olmo_st_stream s = {0};
    struct ckpt_hash hs = {0};
    s.fd = -1;
    int64_t shape = (int64_t)n;
    int rc = 0;
    char rank[32], n_local[32];
    snprintf(rank, sizeof rank, "%d", src->rank);
    snprintf(n_local, sizeof n_local, "%zu", n);
    char *pieces = ckpt_pieces_record(src->ranges, src->n_ranges), *state = ckpt_state_record(st);
    rc = !pieces || !state || olmo_st_writer_set_metadata(&w, "format", "olmoc-shard") ||
         olmo_st_writer_set_metadata(&w, "rank", rank) || olmo_st_writer_set_metadata(&w, "file", name) ||
         olmo_st_writer_set_metadata(&w, "n_local", n_local) || olmo_st_writer_set_metadata(&w, "pieces", pieces) ||
         olmo_st_writer_set_metadata(&w, "state", state);
    free(pieces);
    free(state);
    for (int q = 0; q < N_Q && !rc; q++) rc = olmo_st_writer_declare(&w, q_shard_tensor[q], OLMO_ST_F32, 1, &shape);
    int64_t one = 1;
    if (!rc) rc = olmo_st_writer_declare(&w, "step", OLMO_ST_I64, 1, &one); /* Adam's step count, under the hash */
    float *buf = be ? malloc(CHUNK_FLOATS * sizeof(float)) : NULL;
    if (be && !buf) rc = olmo_error("out of memory writing '%s'", path);
    if (!rc) rc = ckpt_stream_begin_hashed(&s, &w, &hs, path, &out->bytes);
    for (int q = 0; q < N_Q && !rc; q++) {
        const float *from = src->q[q];
        for (size_t c = 0; c < n && !rc; c += CHUNK_FLOATS) {
            const size_t k = n - c < CHUNK_FLOATS ? n - c : CHUNK_FLOATS;
            if (be) rc = be->to_host(be, buf, from + c, k * sizeof(float));
            if (!rc) rc = olmo_st_stream_write(&s, be ? buf : from + c, k * sizeof(float));
        }
    }
    const int64_t step = src->step;
    if (!rc) rc = olmo_st_stream_write(&s, &step, sizeof step);
    if (!rc) rc = olmo_st_stream_finish(&s);
    else olmo_st_stream_abort(&s);
    if (!rc) out->hash = ckpt_hash_end(&hs);
    ckpt_hash_free(&hs);
    free(buf);
    olmo_st_writer_free(&w);
    return rc;
}

/* Rank 0 only: config.yaml, state.json, then the rename into place. */
static int finish_save(const struct ckpt_save *sv, const struct olmo_trainer *tr, const char *const *names,
                       struct written *files, int n_files, const uint64_t *shards, const size_t *words, int world) {
    char path[4096];
    if (path_join(path, sizeof path, sv->tmp, "config.yaml") || olmo_config_write(&tr->cfg, path) ||
        olmo_fsync_path(path) ||
        ckpt_hash_file(path, CKPT_HASH_XXH3_64, &files[n_files - 1].hash, &files[n_files - 1].bytes))
        return -1;
    if (ckpt_write_state(sv->tmp, &sv->st, tr, &sv->opt, names, files, n_files, shards, words, world) ||
        olmo_fsync_path(sv->tmp))
        return -1;
    /* A checkpoint of the same step already there (a rerun from an earlier
     * checkpoint): move it aside, put the new one in place, then delete it. */
    bool replaced = false;
    if (olmo_is_dir(sv->final)) {
        if (olmo_remove_tree(sv->old) || rename(sv->final, sv->old))
            return olmo_error("cannot move the old '%s' aside: %s", sv->final, strerror(errno));
        replaced = true;
    }
    if (rename(sv->tmp, sv->final))
        return olmo_error("cannot rename '%s' to '%s': %s", sv->tmp, sv->final, strerror(errno));
    if (olmo_fsync_path(sv->out_dir)) return -1;
    if (replaced && olmo_remove_tree(sv->old)) return olmo_error_context("removing the replaced checkpoint");
    return 0;
}

int ckpt_save_begin(struct ckpt_save *sv, const char *out_dir, const struct olmo_trainer *tr,
                    const struct olmo_ckpt_state *st, int rc) {
    memset(sv, 0, sizeof *sv);
    snprintf(sv->out_dir, sizeof sv->out_dir, "%s", out_dir);
    snprintf(sv->tmp, sizeof sv->tmp, "%s/" CKPT_TMP_PREFIX "%06ld", out_dir, st->step);
    snprintf(sv->final, sizeof sv->final, "%s/" CKPT_PREFIX "%06ld", out_dir, st->step);
    snprintf(sv->old, sizeof sv->old, "%s/" CKPT_OLD_PREFIX "%06ld", out_dir, st->step);
    sv->st = *st;
    if (!rc) rc = ckpt_opt_state_get(tr, &sv->opt);
    if (!rc && rank_of(tr->dist) == 0 && (olmo_remove_tree(sv->tmp) || olmo_make_dirs(sv->tmp))) rc = -1;
    if ((rc = ckpt_agree(tr->dist, rc, "starting the checkpoint"))) {
        olmo_error_context("saving checkpoint '%s'", sv->final);
        ckpt_opt_state_free(&sv->opt);
    }
    return rc;
}

int ckpt_save_commit(struct ckpt_save *sv, const struct olmo_trainer *tr, int rc, const struct written *files,
                     char *path_out, size_t n) {
    const struct olmo_dist *d = tr->dist;
    const int world = world_of(d), rank = rank_of(d);
    if (world == 1) {
        static const char *const names[] = {CKPT_V1_MODEL, CKPT_V1_OPTIM, "config.yaml"};
        struct written all[3] = {files[0], files[1], {0}};
        if (!rc) rc = finish_save(sv, tr, names, all, 3, NULL, NULL, 1);
    } else {
        /* Every rank wrote its own shard; rank 0 the manifest. */
        const size_t words = 4 + 3 * (size_t)saved_ranges(tr);
        uint64_t *rec = malloc(words * sizeof *rec);
        if (!rec) rc = olmo_error("out of memory");
        else {
            rec[0] = files[0].bytes;
            rec[1] = files[0].hash;
            rec[2] = saved_local(tr);
            rec[3] = (uint64_t)saved_ranges(tr);
            for (int i = 0; i < saved_ranges(tr); i++) {
                rec[4 + 3 * i] = tr->opt.ranges[i].global;
                rec[5 + 3 * i] = tr->opt.ranges[i].local;
                rec[6 + 3 * i] = tr->opt.ranges[i].len;
            }
        }
        void *all = NULL;
        size_t *counts = calloc((size_t)world, sizeof *counts);
        if (!counts) rc = olmo_error("out of memory");
        if ((rc = ckpt_agree(d, rc, "writing the checkpoint shards")) == 0)
            rc = olmo_dist_gather_bytes(or_one(d), rec, words * sizeof *rec, 0, &all, counts);
        free(rec);
        if (!rc && rank == 0) {
            for (int r = 0; r < world; r++) counts[r] /= sizeof(uint64_t);
            static const char *const names[] = {"config.yaml"};
            struct written cfg_file[1] = {{0}};
            rc = finish_save(sv, tr, names, cfg_file, 1, all, counts, world);
        }
        free(all);
        free(counts);
    }
    ckpt_opt_state_free(&sv->opt);
    if (rc) {
        olmo_error_context("saving checkpoint '%s'", sv->final);
        return ckpt_agree(d, -1, "saving the checkpoint");
    }
    if ((rc = ckpt_agree(d, rc, "saving the checkpoint"))) return rc;
    if (path_out) snprintf(path_out, n, "%s", sv->final);
    return 0;
}

int olmo_ckpt_save(const char *out_dir, const struct olmo_trainer *tr, const struct olmo_ckpt_state *st,
                   char *path_out, size_t n) {
    struct ckpt_save sv;
    if (ckpt_save_begin(&sv, out_dir, tr, st, 0)) return -1;
    const struct olmo_dist *d = tr->dist;
    const int world = world_of(d), rank = rank_of(d);
    struct written files[2] = {{0}};
    char path[4096];
    int rc;
    if (world == 1) {
        /* One rank: whole tensors under Hugging Face names (version 1). */
        const int q_w = Q_MASTER, q_mv[2] = {Q_M, Q_V};
        rc = path_join(path, sizeof path, sv.tmp, CKPT_V1_MODEL) ||
             ckpt_write_gathered(tr, &q_w, 1, NULL, path, &files[0]) ||
             path_join(path, sizeof path, sv.tmp, CKPT_V1_OPTIM) ||
             ckpt_write_gathered(tr, q_mv, 2, st, path, &files[1]);
    } else {
        const struct ckpt_shard_src src = {
            .q = {q_buffer(tr, Q_MASTER), q_buffer(tr, Q_M), q_buffer(tr, Q_V)},
            .be = tr->model.be,
            .ranges = tr->opt.ranges,
            .n_ranges = saved_ranges(tr),
            .n_local = saved_local(tr),
            .rank = rank,
            .step = tr->opt.step,
        };
        char name[64];
        shard_name(name, sizeof name, rank, world);
        rc = ckpt_write_shard(&src, st, sv.tmp, name, &files[0]);
    }
    return ckpt_save_commit(&sv, tr, rc, files, path_out, n);
}

/* ---- finding and retention ---- */

/* Parses "step-NNNNNN" (digits only); -1 if name is something else. */
static long parse_step_name(const char *name, const char *prefix) {
    size_t pl = strlen(prefix);
    if (strncmp(name, prefix, pl) || !name[pl]) return -1;
    long v = 0;
    for (const char *p = name + pl; *p; p++) {
        if (*p < '0' || *p > '9' || v > 100000000000L) return -1;
        v = v * 10 + (*p - '0');
    }
    return v;
}

static int cmp_long(const void *a, const void *b) {
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

/* Sorted steps of the checkpoint directories in out_dir. */
static int list_steps(const char *out_dir, long **steps, int *count) {
    *steps = NULL;
    *count = 0;
    DIR *d = opendir(out_dir);
    if (!d) {
        if (errno == ENOENT) return 0;
        return olmo_error("cannot open '%s': %s", out_dir, strerror(errno));
    }
    int cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        long s = parse_step_name(e->d_name, CKPT_PREFIX);
        if (s < 0) continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", out_dir, e->d_name);
        if (!olmo_is_dir(path)) continue;
        if (*count == cap) {
            cap = cap ? 2 * cap : 16;
            long *p = realloc(*steps, sizeof(long) * (size_t)cap);
            if (!p) {
                closedir(d);
                free(*steps);
                *steps = NULL;
                return olmo_error("out of memory listing checkpoints");
            }
            *steps = p;
        }
        (*steps)[(*count)++] = s;
    }
    closedir(d);
    if (*count) qsort(*steps, (size_t)*count, sizeof(long), cmp_long);
    return 0;
}

int olmo_ckpt_find_latest(const char *out_dir, char *buf, size_t n) {
    long *steps;
    int count;
    if (list_steps(out_dir, &steps, &count)) return -1;
    int found = 0;
    if (count) {
        snprintf(buf, n, "%s/" CKPT_PREFIX "%06ld", out_dir, steps[count - 1]);
        found = 1;
    }
    free(steps);
    return found;
}

int olmo_ckpt_clean_stale(const char *out_dir) {
    DIR *d = opendir(out_dir);
    if (!d) return 0;
    struct dirent *e;
    int rc = 0;
    while (!rc && (e = readdir(d))) {
        const long tmp_step = parse_step_name(e->d_name, CKPT_TMP_PREFIX);
        const long old_step = parse_step_name(e->d_name, CKPT_OLD_PREFIX);
        if (tmp_step < 0 && old_step < 0) continue;
        char path[4096], final[4096];
        snprintf(path, sizeof path, "%s/%s", out_dir, e->d_name);
        if (old_step >= 0) {
            /* moved aside for a new checkpoint of the same step: stale once that one is in place; without it,
             * the only complete copy of the step (a save killed between its two renames) */
            snprintf(final, sizeof final, "%s/" CKPT_PREFIX "%06ld", out_dir, old_step);
            if (!olmo_is_dir(final)) {
                fprintf(stderr, "note: '%s' is the complete checkpoint of step %ld that an interrupted save moved "
                                "aside: rename it to '%s' to use it\n", path, old_step, final);
                continue;
            }
        }
        rc = olmo_remove_tree(path);
    }
    closedir(d);
    return rc;
}

int olmo_ckpt_retain(const char *out_dir, int keep) {
    if (olmo_ckpt_clean_stale(out_dir)) return -1;
    if (keep <= 0) return 0;
    long *steps;
    int count;
    if (list_steps(out_dir, &steps, &count)) return -1;
    int rc = 0;
    for (int i = 0; i + keep < count && !rc; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/" CKPT_PREFIX "%06ld", out_dir, steps[i]);
        rc = olmo_remove_tree(path);
    }
    free(steps);
    return rc;
}
