/* Reading a checkpoint's tensors in any sharding: the files' headers become
 * segments (runs of flat parameters stored contiguously in a file), checked
 * to tile the parameters; each rank then reads, by pread, the overlaps of
 * its pieces with the segments, a chunk at a time, and checks the values. */
#include "train/checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/safetensors.h"
#include "model/weights.h"
#include "train/checkpoint_internal.h"
#include "util/error.h"

static int add_seg(struct manifest *mf, int q, const struct seg *s) {
    if (mf->n_segs[q] == mf->cap_segs[q]) {
        int cap = mf->cap_segs[q] ? 2 * mf->cap_segs[q] : 64;
        struct seg *p = realloc(mf->segs[q], sizeof *p * (size_t)cap);
        if (!p) return olmo_error("out of memory reading a checkpoint");
        mf->segs[q] = p;
        mf->cap_segs[q] = cap;
    }
    mf->segs[q][mf->n_segs[q]++] = *s;
    return 0;
}

/* The path of file i. */
static int file_path(const struct manifest *mf, int i, char *buf, size_t n) {
    if (!mf->single) return path_join(buf, n, mf->dir, mf->files[i].name);
    if (snprintf(buf, n, "%s", mf->single) >= (int)n) return olmo_error("path too long: '%s'", mf->single);
    return 0;
}

/* Version 1: whole tensors under Hugging Face names in model.safetensors
 * (weights, any float dtype) and optim.safetensors (F32 moments and "step"),
 * checked as strictly as a weights file. */
int ckpt_segs_v1_model(struct manifest *mf, const struct olmo_model *m, const char *path, int file) {
    struct olmo_st_file f;
    if (olmo_st_open(&f, path)) return -1;
    int rc = 0;
    const size_t data0 = (size_t)(f.data - f.map);
    for (int i = 0; i < m->n_tensors && !rc; i++) {
        const struct olmo_param *p = &m->params[i];
        const struct olmo_st_tensor *t;
        if ((rc = olmo_weights_find(&f, path, p, &t))) break;
        if (t->dtype != OLMO_ST_F32 && t->dtype != OLMO_ST_BF16 && t->dtype != OLMO_ST_F16) {
            rc = olmo_error("tensor '%s' in '%s' is %s: weights must be F32, BF16 or F16", t->name, path,
                            olmo_st_dtype_name(t->dtype));
            break;
        }
        struct seg s = {.file = file, .global = p->offset, .len = p->numel, .off = data0 + t->begin,
                        .base = p->offset, .dtype = t->dtype};
        snprintf(s.name, sizeof s.name, "%s", p->name);
        rc = add_seg(mf, Q_MASTER, &s);
    }
    for (int i = 0; i < f.n_tensors && !rc; i++)
        if (!olmo_model_find_param(m, f.tensors[i].name))
            rc = olmo_error("'%s' has unexpected tensor '%s' (config mismatch?)", path, f.tensors[i].name);
    olmo_st_close(&f);
    return rc;
}

/* Where a file's scalar "step" (I32 or I64) is; read by ckpt_read_steps once the file is hashed. */
static int step_location(struct manifest *mf, const struct olmo_st_file *f, const char *path, int file) {
    const struct olmo_st_tensor *t = olmo_st_find(f, "step");
    if (!t || olmo_st_numel(t) != 1 || (t->dtype != OLMO_ST_I64 && t->dtype != OLMO_ST_I32))
        return olmo_error("'%s' has no scalar tensor 'step'", path);
    mf->files[file].step_at = (size_t)(f->data - f->map) + t->begin;
    mf->files[file].step_dtype = t->dtype;
    return 0;
}

/* The optimizer step of the hashed files: version 1's optim.safetensors is
 * the authority; version 2's shards must agree with state.json. */
int ckpt_read_steps(struct manifest *mf) {
    for (int i = 0; i < mf->n_files; i++) {
        struct ckpt_file *cf = &mf->files[i];
        if (!cf->need || !cf->step_at) continue;
        char path[4096];
        uint8_t b[8] = {0};
        const size_t n = cf->step_dtype == OLMO_ST_I64 ? 8 : 4;
        if (path_join(path, sizeof path, mf->dir, cf->name)) return -1;
        const int fd = open(path, O_RDONLY | O_CLOEXEC);
        const ssize_t got = fd >= 0 ? pread(fd, b, n, (off_t)cf->step_at) : -1;
        if (fd >= 0) close(fd);
        if (got != (ssize_t)n) return olmo_error("cannot read the optimizer step of '%s'", path);
        int64_t v = 0;
        if (n == 8) memcpy(&v, b, 8);
        else {
            int32_t v32;
            memcpy(&v32, b, 4);
            v = v32;
        }
        if (v < 0 || v > INT32_MAX) return olmo_error("'%s': optimizer step %lld out of range", path, (long long)v);
        if (mf->version == 1) {
            mf->opt_step = (long)v; /* the file is hashed; state.json's copy is not */
            mf->has_opt_step = true;
        } else if (v != mf->opt_step) {
            return olmo_error("'%s' holds optimizer step %lld, state.json says %ld", path, (long long)v, mf->opt_step);
        }
    }
    return 0;
}

static int segs_v1_optim(struct manifest *mf, const struct olmo_model *m, const char *path, int file) {
    struct olmo_st_file f;
    if (olmo_st_open(&f, path)) return -1;
    int rc = 0;
    const size_t data0 = (size_t)(f.data - f.map);
    for (int i = 0; i < m->n_tensors && !rc; i++) {
        const struct olmo_param *p = &m->params[i];
        for (int q = Q_M; q <= Q_V && !rc; q++) {
            char name[200];
            snprintf(name, sizeof name, "%s%s", p->name, q_suffix[q]);
            const struct olmo_st_tensor *t = olmo_st_find(&f, name);
            if (!t) rc = olmo_error("'%s' has no tensor '%s'", path, name);
            else if (t->dtype != OLMO_ST_F32 || olmo_st_numel(t) != p->numel)
                rc = olmo_error("'%s': tensor '%s' is not F32 with %zu elements", path, name, p->numel);
            else {
                struct seg s = {.file = file, .global = p->offset, .len = p->numel, .off = data0 + t->begin,
                                .base = p->offset, .dtype = OLMO_ST_F32};
                snprintf(s.name, sizeof s.name, "%s", name);
                rc = add_seg(mf, q, &s);
            }
        }
    }
    if (!rc) rc = step_location(mf, &f, path, file);
    if (!rc && f.n_tensors != 2 * m->n_tensors + 1)
        rc = olmo_error("'%s' has %d tensors, expected %d", path, f.n_tensors, 2 * m->n_tensors + 1);
    olmo_st_close(&f);
    return rc;
}

/* A shard's own record (its __metadata__, under its content hash) against
 * what state.json says of the shard listed r-th: its name, rank, n_local and
 * pieces, and the run state.  A file without the entries (written by an
 * earlier olmoc) is accepted: state.json's word is all there is. */
static int check_shard_record(const struct manifest *mf, int r, const struct olmo_st_file *f, const char *path) {
    const char *fname = mf->files[mf->shards[r].file].name;
    const char *name = olmo_st_metadata(f, "file"), *rank = olmo_st_metadata(f, "rank");
    const char *n_local = olmo_st_metadata(f, "n_local"), *pieces = olmo_st_metadata(f, "pieces");
    char want[32];
    if (name && strcmp(name, fname))
        return olmo_error("checkpoint '%s': state.json lists '%s' as shard %d, but the file records that it was "
                          "written as '%.100s': state.json was edited (file names swapped?)",
                          mf->dir, fname, r, name);
    snprintf(want, sizeof want, "%d", r);
    if (rank && strcmp(rank, want))
        return olmo_error("checkpoint '%s': state.json lists '%s' as the shard of rank %d, but the file records "
                          "rank %.20s: state.json was edited (shards reordered?)",
                          mf->dir, fname, r, rank);
    if (pieces) {
        char *expected = ckpt_pieces_record(mf->shards[r].pieces, mf->shards[r].n_pieces);
        if (!expected) return -1;
        const bool same = !strcmp(expected, pieces);
        if (!same)
            olmo_error("checkpoint '%s': state.json's pieces of '%s' (%.60s%s) are not the ones the file records "
                       "(%.60s%s): state.json was edited (piece lists swapped?); loading it would place the "
                       "weights at the wrong parameters",
                       mf->dir, fname, expected, strlen(expected) > 60 ? "..." : "", pieces,
                       strlen(pieces) > 60 ? "..." : "");
        free(expected);
        if (!same) return -1;
    }
    snprintf(want, sizeof want, "%zu", mf->shards[r].n_local);
    if (n_local && strcmp(n_local, want))
        return olmo_error("checkpoint '%s': state.json gives '%s' n_local %s, but the file records %.30s: state.json "
                          "was edited",
                          mf->dir, fname, want, n_local);
    return ckpt_check_state_record(mf, f, path);
}

/* The records of the shards (version 2) or of optim.safetensors (version 1)
 * marked needed agree with state.json: checked once their hashes are, after
 * the checks of state.json's own consistency (their messages are the more
 * specific ones). */
int ckpt_check_records(const struct manifest *mf) {
    for (int i = 0; mf->version == 1 && i < mf->n_files; i++) { /* optim.safetensors records the run state */
        if (!mf->files[i].need || strcmp(mf->files[i].name, CKPT_V1_OPTIM)) continue;
        char path[4096];
        struct olmo_st_file f;
        if (file_path(mf, i, path, sizeof path) || olmo_st_open(&f, path)) return -1;
        const int rc = ckpt_check_state_record(mf, &f, path);
        olmo_st_close(&f);
        if (rc) return -1;
    }
    for (int r = 0; mf->version == 2 && r < mf->world; r++) {
        if (!mf->files[mf->shards[r].file].need) continue;
        char path[4096];
        struct olmo_st_file f;
        if (file_path(mf, mf->shards[r].file, path, sizeof path) || olmo_st_open(&f, path)) return -1;
        const int rc = check_shard_record(mf, r, &f, path);
        olmo_st_close(&f);
        if (rc) return -1;
    }
    return 0;
}

/* Version 2: each shard file holds "weights", "exp_avg", "exp_avg_sq" (F32,
 * n_local each) and "step" (I64 [1], as state.json's optimizer step); its
 * pieces place local runs at global offsets. */
static int segs_v2(struct manifest *mf, const struct olmo_model *m) {
    if (mf->n_floats != m->n_floats)
        return olmo_error("checkpoint '%s' holds %zu parameters but the model has %zu", mf->dir, mf->n_floats,
                          m->n_floats);
    for (int r = 0; r < mf->world; r++) {
        char path[4096];
        const char *fname = mf->files[mf->shards[r].file].name;
        if (path_join(path, sizeof path, mf->dir, fname)) return -1;
        struct olmo_st_file f;
        if (olmo_st_open(&f, path)) return -1;
        int rc = f.n_tensors != N_Q + 1 ? olmo_error("'%s' has %d tensors, expected %d", path, f.n_tensors, N_Q + 1)
                                        : 0;
        if (!rc) rc = step_location(mf, &f, path, mf->shards[r].file);
        const size_t data0 = (size_t)(f.data - f.map);
        for (int q = 0; q < N_Q && !rc; q++) {
            const struct olmo_st_tensor *t = olmo_st_find(&f, q_shard_tensor[q]);
            if (!t) rc = olmo_error("'%s' has no tensor '%s'", path, q_shard_tensor[q]);
            else if (t->dtype != OLMO_ST_F32 || t->ndim != 1 || olmo_st_numel(t) != mf->shards[r].n_local)
                rc = olmo_error("'%s': tensor '%s' is not F32 [%zu] (state.json's n_local)", path, q_shard_tensor[q],
                                mf->shards[r].n_local);
            for (int k = 0; k < mf->shards[r].n_pieces && !rc; k++) {
                const struct olmo_shard_range *p = &mf->shards[r].pieces[k];
                if (!p->len) continue;
                struct seg s = {.file = mf->shards[r].file, .global = p->global, .len = p->len,
                                .off = data0 + t->begin + p->local * sizeof(float), .base = p->global - p->local,
                                .dtype = OLMO_ST_F32};
                snprintf(s.name, sizeof s.name, "%s", q_shard_tensor[q]);
                rc = add_seg(mf, q, &s);
            }
        }
        olmo_st_close(&f);
        if (rc) return rc;
    }
    return 0;
}

static int cmp_seg(const void *a, const void *b) {
    const struct seg *x = a, *y = b;
    return (x->global > y->global) - (x->global < y->global);
}

/* The segments of quantities 0..q_hi tile [0, n_floats) exactly. */
int ckpt_check_tiling(struct manifest *mf, size_t n_floats, int q_hi) {
    for (int q = 0; q <= q_hi; q++) {
        qsort(mf->segs[q], (size_t)mf->n_segs[q], sizeof *mf->segs[q], cmp_seg);
        size_t at = 0;
        for (int i = 0; i < mf->n_segs[q]; i++) {
            const struct seg *s = &mf->segs[q][i];
            if (s->global != at)
                return olmo_error("checkpoint '%s': the shards' pieces %s flat parameters at %zu (the %s)", mf->dir,
                                  s->global < at ? "overlap" : "leave a hole in the", s->global < at ? s->global : at,
                                  q_shard_tensor[q]);
            at += s->len;
        }
        if (at != n_floats)
            return olmo_error("checkpoint '%s': the shards' pieces hold %zu of the %zu parameters (the %s)", mf->dir,
                              at, n_floats, q_shard_tensor[q]);
    }
    return 0;
}

/* Reads the files' headers into segments and checks them against the
 * model (the optimizer's only with moments). */
int ckpt_build_segments(struct manifest *mf, const struct olmo_model *m, bool moments) {
    const int q_hi = moments ? Q_V : Q_MASTER;
    if (mf->version == 2) return segs_v2(mf, m) || ckpt_check_tiling(mf, m->n_floats, q_hi) ? -1 : 0;
    char path[4096];
    if (path_join(path, sizeof path, mf->dir, "model.safetensors") || ckpt_segs_v1_model(mf, m, path, 0)) return -1;
    if (moments &&
        (path_join(path, sizeof path, mf->dir, "optim.safetensors") || segs_v1_optim(mf, m, path, 1)))
        return -1;
    return ckpt_check_tiling(mf, m->n_floats, q_hi);
}

static bool overlaps(const struct seg *s, const struct olmo_shard_range *r, int n) {
    for (int i = 0; i < n; i++)
        if (r[i].len && s->global < r[i].global + r[i].len && r[i].global < s->global + s->len) return true;
    return false;
}

/* Marks the files this rank reads quantities q_lo..q_hi of its pieces from. */
void ckpt_mark_needed(struct manifest *mf, const struct olmo_shard_range *r, int n, int q_lo, int q_hi) {
    for (int i = 0; i < mf->n_files; i++)
        if (!strcmp(mf->files[i].name, "config.yaml")) mf->files[i].need = true;
    for (int q = q_lo; q <= q_hi; q++)
        for (int i = 0; i < mf->n_segs[q]; i++)
            if (overlaps(&mf->segs[q][i], r, n)) mf->files[mf->segs[q][i].file].need = true;
}

/* Values of a tensor (or shard) read from a checkpoint: finite, and a
 * second moment not negative.  first: the index of x[0] in the tensor. */
static int check_values(const char *path, const char *name, const float *x, size_t n, size_t first, int q) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += !isfinite(x[i]);
    if (bad) {
        size_t i = 0;
        while (isfinite(x[i])) i++;
        return olmo_error("'%s': tensor '%s' has %zu values that are not finite (the first, element %zu, is %s): "
                          "refusing weights or optimizer state from a run that diverged or a damaged file",
                          path, name, bad, first + i, isnan(x[i]) ? "NaN" : x[i] > 0 ? "+inf" : "-inf");
    }
    for (size_t i = 0; q == Q_V && i < n; i++)
        if (x[i] < 0)
            return olmo_error("'%s': tensor '%s' has a negative value at element %zu (%g): a second moment is "
                              "never negative",
                              path, name, first + i, (double)x[i]);
    return 0;
}

/* Reads quantity q of the flat parameters in ranges (the destination's
 * pieces) into dst (backend memory, local indexing): for each piece, the
 * overlap with every segment, a chunk at a time (pread, no mapping). */
static int read_quantity(const struct manifest *mf, int q, const struct olmo_shard_range *ranges, int n_ranges,
                         float *dst, const struct olmo_backend *be, const int *fds, float *buf, uint8_t *raw) {
    char path[4096];
    for (int k = 0; k < n_ranges; k++) {
        const struct olmo_shard_range *r = &ranges[k];
        if (!r->len) continue;
        /* first segment ending after r->global (the segments are sorted and tile) */
        int lo = 0, hi = mf->n_segs[q];
        while (lo < hi) {
            const int mid = (lo + hi) / 2;
            if (mf->segs[q][mid].global + mf->segs[q][mid].len <= r->global) lo = mid + 1;
            else hi = mid;
        }
        for (int i = lo; i < mf->n_segs[q] && mf->segs[q][i].global < r->global + r->len; i++) {
            const struct seg *s = &mf->segs[q][i];
            const size_t a = s->global > r->global ? s->global : r->global;
            const size_t b = s->global + s->len < r->global + r->len ? s->global + s->len : r->global + r->len;
            const size_t esz = olmo_st_dtype_size(s->dtype);
            for (size_t c = a; c < b; c += CHUNK_FLOATS) {
                const size_t n = b - c < CHUNK_FLOATS ? b - c : CHUNK_FLOATS;
                uint8_t *into = s->dtype == OLMO_ST_F32 ? (uint8_t *)buf : raw;
                size_t done = 0;
                const off_t at = (off_t)(s->off + (c - s->global) * esz);
                while (done < n * esz) {
                    const ssize_t got = pread(fds[s->file], into + done, n * esz - done, at + (off_t)done);
                    if (got < 0 && errno == EINTR) continue;
                    if (got <= 0) {
                        if (file_path(mf, s->file, path, sizeof path)) return -1;
                        return olmo_error("reading '%s' failed: %s", path, got < 0 ? strerror(errno) : "short file");
                    }
                    done += (size_t)got;
                }
                if (s->dtype != OLMO_ST_F32 && olmo_st_convert_f32(s->dtype, raw, n, buf)) return -1;
                if (file_path(mf, s->file, path, sizeof path) ||
                    check_values(path, s->name, buf, n, c - s->base, q) ||
                    be->to_device(be, dst + r->local + (c - r->global), buf, n * sizeof(float)))
                    return -1;
            }
        }
    }
    return 0;
}

/* Reads quantities q_lo..q_hi of ranges into dsts[q]. */
int ckpt_read_quantities(const struct manifest *mf, int q_lo, int q_hi, const struct olmo_shard_range *ranges,
                         int n_ranges, float *const *dsts, const struct olmo_backend *be) {
    int *fds = malloc(sizeof(int) * (size_t)mf->n_files);
    float *buf = malloc(CHUNK_FLOATS * sizeof(float));
    uint8_t *raw = malloc(CHUNK_FLOATS * sizeof(float));
    int rc = !fds || !buf || !raw ? olmo_error("out of memory reading a checkpoint") : 0;
    for (int i = 0; fds && i < mf->n_files; i++) fds[i] = -1;
    for (int i = 0; i < mf->n_files && !rc; i++) {
        char path[4096];
        if (!mf->files[i].need || !strcmp(mf->files[i].name, "config.yaml")) continue;
        if (file_path(mf, i, path, sizeof path)) rc = -1;
        else if ((fds[i] = open(path, O_RDONLY | O_CLOEXEC)) < 0)
            rc = olmo_error("cannot open '%s': %s", path, strerror(errno));
    }
    for (int q = q_lo; q <= q_hi && !rc; q++) rc = read_quantity(mf, q, ranges, n_ranges, dsts[q], be, fds, buf, raw);
    for (int i = 0; fds && i < mf->n_files; i++)
        if (fds[i] >= 0) close(fds[i]);
    free(fds);
    free(buf);
    free(raw);
    return rc;
}
