#include "train/checkpoint.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/safetensors.h"
#include "model/weights.h"
#include "util/error.h"
#include "util/fs.h"

#define CKPT_FORMAT "olmoc-checkpoint"
#define CKPT_PREFIX "step-"
#define CKPT_TMP_PREFIX ".tmp-step-"
#define CKPT_OLD_PREFIX ".old-step-"


static uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

/* olmo_hash64 fed in pieces (the total length must be known up front). */
struct hash_stream {
    uint64_t h;
    uint8_t buf[8];
    int nbuf;
};

static void hash_begin(struct hash_stream *s, size_t len) {
    s->h = 0x9e3779b97f4a7c15ULL ^ ((uint64_t)len * 0xff51afd7ed558ccdULL);
    s->nbuf = 0;
}

static void hash_word(struct hash_stream *s, uint64_t w) {
    s->h ^= rotl64(w * 0x87c37b91114253d5ULL, 31) * 0x4cf5ad432745937fULL;
    s->h = rotl64(s->h, 27) * 5 + 0x52dce729;
}

static void hash_update(void *ctx, const uint8_t *p, size_t n) {
    struct hash_stream *s = ctx;
    while (n && s->nbuf) {
        s->buf[s->nbuf++] = *p++;
        n--;
        if (s->nbuf == 8) {
            uint64_t w;
            memcpy(&w, s->buf, 8);
            hash_word(s, w);
            s->nbuf = 0;
        }
    }
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        hash_word(s, w);
    }
    if (n) { /* here nbuf is 0 */
        memcpy(s->buf, p, n);
        s->nbuf = (int)n;
    }
}

static uint64_t hash_end(struct hash_stream *s) {
    uint64_t tail = 0, h = s->h;
    for (int j = 0; j < s->nbuf; j++) tail |= (uint64_t)s->buf[j] << (8 * j);
    h ^= rotl64(tail * 0x87c37b91114253d5ULL, 31) * 0x4cf5ad432745937fULL;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
}

uint64_t olmo_hash64(const void *data, size_t len) {
    struct hash_stream s;
    hash_begin(&s, len);
    hash_update(&s, data, len);
    return hash_end(&s);
}

/* Staging for file and device transfers: 16 MiB, whatever the model size. */
#define CHUNK_FLOATS ((size_t)4 << 20)

/* Hashes a file read in chunks (no mapping: the page cache, not this
 * process, holds what was read). */
static int hash_file(const char *path, uint64_t *hash, size_t *size) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return olmo_error("cannot open '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st)) {
        close(fd);
        return olmo_error("cannot stat '%s': %s", path, strerror(errno));
    }
    *size = (size_t)st.st_size;
    uint8_t *buf = malloc(CHUNK_FLOATS * sizeof(float));
    if (!buf) {
        close(fd);
        return olmo_error("out of memory hashing '%s'", path);
    }
    struct hash_stream hs;
    hash_begin(&hs, *size);
    size_t done = 0;
    int rc = 0;
    while (done < *size) {
        const size_t want = *size - done < CHUNK_FLOATS * sizeof(float) ? *size - done : CHUNK_FLOATS * sizeof(float);
        const ssize_t got = pread(fd, buf, want, (off_t)done);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            rc = olmo_error("reading '%s' failed: %s", path, got < 0 ? strerror(errno) : "the file shrank");
            break;
        }
        hash_update(&hs, buf, (size_t)got);
        done += (size_t)got;
    }
    free(buf);
    close(fd);
    *hash = hash_end(&hs);
    return rc;
}

static int path_join(char *buf, size_t n, const char *dir, const char *name) {
    if (snprintf(buf, n, "%s/%s", dir, name) >= (int)n) return olmo_error("path too long: '%s/%s'", dir, name);
    return 0;
}

static int world_of(const struct olmo_dist *d) { return d ? d->world : 1; }
/* A trainer without ranks (dist NULL) gathers as a one-rank job. */
static const struct olmo_dist *or_one(const struct olmo_dist *d) {
    static const struct olmo_dist one = {.rank = 0, .world = 1, .mpi_active = 0};
    return d ? d : &one;
}
static int rank_of(const struct olmo_dist *d) { return d ? d->rank : 0; }

/* Every rank learns whether any rank failed (rc != 0 here); a rank that did
 * not fail itself reports that another did.  Collective. */
static int agree(const struct olmo_dist *d, int rc, const char *what) {
    if (world_of(d) == 1) return rc;
    double bad = rc ? 1.0 : 0.0;
    if (olmo_dist_allreduce_f64(d, &bad, 1)) return -1;
    if (rc) return rc;
    return bad > 0 ? olmo_error("%s failed on another rank (its message names the cause)", what) : 0;
}

/* As agree, but every rank ends with the message of the lowest failing rank
 * (a failure only some ranks see, e.g. a NaN in one rank's piece of a file,
 * is then reported the same wherever the error is printed).  Collective. */
static int agree_message(const struct olmo_dist *d, int rc) {
    const int world = world_of(d);
    if (world == 1) return rc;
    double *bad = calloc((size_t)world, sizeof *bad);
    if (!bad) return agree(d, rc ? rc : olmo_error("out of memory"), "reading the weights");
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
static int master_loaded(struct olmo_trainer *tr, int rc) {
    if (!rc) return olmo_trainer_master_updated(tr);
    if (tr->fully_sharded) olmo_fsdp_master_updated(&tr->fsdp);
    return rc;
}

/* The quantities a checkpoint holds per flat parameter. */
enum { Q_MASTER, Q_M, Q_V, N_Q };
static const char *const q_shard_tensor[N_Q] = {"weights", "exp_avg", "exp_avg_sq"};
static const char *const q_suffix[N_Q] = {"", ".exp_avg", ".exp_avg_sq"};

/* This rank's buffer of a quantity (local indexing, backend memory). */
static float *q_buffer(const struct olmo_trainer *tr, int q) {
    return q == Q_MASTER ? olmo_optimizer_master(&tr->opt, &tr->model) : q == Q_M ? tr->opt.m : tr->opt.v;
}

/* ---- saving ---- */

/* Streams the tensors of one quantity, under Hugging Face names (+ suffix),
 * in parameter order, into s (root only): for each chunk of a tensor every
 * rank sends root the parts its pieces hold, so no rank holds more than a
 * chunk beyond its shard.  all_pieces: every rank's pieces (root only),
 * by rank.  Collective; errors are carried to the end so every rank joins
 * every gather. */
/* The pieces this rank saves and hands to a gather: its own, unless it is a
 * replica (HSDP: a later replica group holds copies of the first group's
 * pieces, which alone are saved, so the saved pieces tile the parameters). */
static int saved_ranges(const struct olmo_trainer *tr) { return tr->opt.primary ? tr->opt.n_ranges : 0; }
static size_t saved_local(const struct olmo_trainer *tr) { return tr->opt.primary ? tr->opt.n_local : 0; }

struct piece_table {
    struct olmo_shard_range *p; /* all ranks' pieces, concatenated */
    int *first, *count;         /* per rank */
};

static int gather_pieces(const struct olmo_trainer *tr, struct piece_table *t) {
    const struct olmo_dist *d = tr->dist;
    const int world = world_of(d);
    memset(t, 0, sizeof *t);
    void *recv = NULL;
    size_t *counts = calloc((size_t)world, sizeof *counts);
    if (!counts) return olmo_error("out of memory");
    int rc = olmo_dist_gather_bytes(or_one(d), tr->opt.ranges, sizeof *tr->opt.ranges * (size_t)saved_ranges(tr), 0, &recv,
                                    counts);
    if (!rc && rank_of(d) == 0) {
        t->p = recv;
        recv = NULL;
        t->first = calloc((size_t)world, sizeof(int));
        t->count = calloc((size_t)world, sizeof(int));
        if (!t->first || !t->count) rc = olmo_error("out of memory");
        for (int r = 0, at = 0; r < world && !rc; r++) {
            t->first[r] = at;
            t->count[r] = (int)(counts[r] / sizeof *t->p);
            at += t->count[r];
        }
    }
    free(recv);
    free(counts);
    return rc;
}

static void free_pieces(struct piece_table *t) {
    free(t->p);
    free(t->first);
    free(t->count);
    memset(t, 0, sizeof *t);
}

struct gather_buf {
    float *send, *out;
};

/* The parts of flat [g0, g1) this rank holds, packed in piece order. */
static int pack_range(const struct olmo_trainer *tr, const float *src, size_t g0, size_t g1, float *send, size_t *n) {
    const struct olmo_backend *be = tr->model.be;
    *n = 0;
    for (int i = 0; i < saved_ranges(tr); i++) {
        const struct olmo_shard_range *r = &tr->opt.ranges[i];
        const size_t a = r->global > g0 ? r->global : g0, b = r->global + r->len < g1 ? r->global + r->len : g1;
        if (a >= b) continue;
        if (be->to_host(be, send + *n, src + r->local + (a - r->global), (b - a) * sizeof(float))) return -1;
        *n += b - a;
    }
    return 0;
}

/* Root: places every rank's packed parts of [g0, g1) into out. */
static int unpack_range(const struct piece_table *t, int world, const float *recv, const size_t *counts, size_t g0,
                        size_t g1, float *out) {
    size_t at = 0, covered = 0;
    for (int r = 0; r < world; r++) {
        size_t used = 0;
        for (int i = 0; i < t->count[r]; i++) {
            const struct olmo_shard_range *p = &t->p[t->first[r] + i];
            const size_t a = p->global > g0 ? p->global : g0, b = p->global + p->len < g1 ? p->global + p->len : g1;
            if (a >= b) continue;
            if ((used + b - a) * sizeof(float) > counts[r])
                return olmo_error("internal: rank %d sent fewer values than its pieces hold", r);
            memcpy(out + (a - g0), recv + at + used, (b - a) * sizeof(float));
            used += b - a;
            covered += b - a;
        }
        at += counts[r] / sizeof(float);
    }
    if (covered != g1 - g0)
        return olmo_error("the ranks' shards hold %zu of the %zu values of flat parameters [%zu, %zu): they do not "
                          "tile the parameters",
                          covered, g1 - g0, g0, g1);
    return 0;
}

static int stream_quantity(const struct olmo_trainer *tr, const struct piece_table *t, int q, struct gather_buf *gb,
                           struct st_stream *s, int rc) {
    const struct olmo_model *m = &tr->model;
    const struct olmo_dist *d = tr->dist;
    const int world = world_of(d), root = rank_of(d) == 0;
    const float *src = q_buffer(tr, q);
    size_t *counts = calloc((size_t)world, sizeof *counts);
    if (!counts) return olmo_error("out of memory"); /* a few bytes: the job is lost anyway */
    for (int i = 0; i < m->n_tensors; i++) {
        const struct olmo_param *p = &m->params[i];
        for (size_t c = 0; c < p->numel; c += CHUNK_FLOATS) {
            const size_t g0 = p->offset + c, g1 = g0 + (p->numel - c < CHUNK_FLOATS ? p->numel - c : CHUNK_FLOATS);
            size_t n = 0;
            if (!rc) rc = pack_range(tr, src, g0, g1, gb->send, &n);
            void *recv = NULL;
            if (olmo_dist_gather_bytes(or_one(d), gb->send, n * sizeof(float), 0, &recv, counts)) rc = -1;
            if (root && !rc) rc = unpack_range(t, world, recv, counts, g0, g1, gb->out);
            if (root && !rc) rc = st_stream_write(s, gb->out, (g1 - g0) * sizeof(float));
            free(recv);
        }
    }
    free(counts);
    return rc;
}

static int declare_quantity(struct st_writer *w, const struct olmo_model *m, int q) {
    for (int i = 0; i < m->n_tensors; i++) {
        const struct olmo_param *p = &m->params[i];
        int64_t shape[2] = {p->rows, p->cols};
        char name[200];
        snprintf(name, sizeof name, "%s%s", p->name, q_suffix[q]);
        if (st_writer_declare(w, name, ST_F32, p->cols == 1 ? 1 : 2, shape)) return -1;
    }
    return 0;
}

struct written {
    size_t bytes;
    uint64_t hash;
};

/* A safetensors file of whole tensors (Hugging Face names) gathered from every
 * rank's shard: the weights (q_list {Q_MASTER}) or the optimizer moments
 * ({Q_M, Q_V} and "step").  Collective; root writes path. */
static int write_gathered(const struct olmo_trainer *tr, const int *q_list, int n_q, bool with_step, const char *path,
                          struct written *out) {
    const bool root = rank_of(tr->dist) == 0;
    struct piece_table t;
    struct gather_buf gb = {0};
    struct st_writer w = {0};
    struct st_stream s = {0};
    struct hash_stream hs;
    s.fd = -1;
    int rc = gather_pieces(tr, &t);
    gb.send = malloc(CHUNK_FLOATS * sizeof(float));
    if (root) gb.out = malloc(CHUNK_FLOATS * sizeof(float));
    if (!gb.send || (root && !gb.out)) rc = olmo_error("out of memory writing '%s'", path);
    if (root && !rc) {
        for (int k = 0; k < n_q && !rc; k++) rc = declare_quantity(&w, &tr->model, q_list[k]);
        int64_t one = 1;
        if (!rc && with_step) rc = st_writer_declare(&w, "step", ST_I64, 1, &one);
        if (!rc) {
            out->bytes = st_writer_file_size(&w);
            hash_begin(&hs, out->bytes);
            s.hash_update = hash_update;
            s.hash_ctx = &hs;
            rc = st_stream_begin(&s, &w, path);
        }
    }
    for (int k = 0; k < n_q; k++) rc = stream_quantity(tr, &t, q_list[k], &gb, &s, rc);
    if (root && !rc && with_step) {
        int64_t step = tr->opt.step;
        rc = st_stream_write(&s, &step, sizeof step);
    }
    if (root && !rc) rc = st_stream_finish(&s);
    if (root && rc) st_stream_abort(&s);
    if (root && !rc) out->hash = hash_end(&hs);
    st_writer_free(&w);
    free(gb.send);
    free(gb.out);
    free_pieces(&t);
    return rc;
}

int olmo_ckpt_export_weights(const struct olmo_trainer *tr, const char *path) {
    const int q = Q_MASTER;
    struct written wr;
    int rc = write_gathered(tr, &q, 1, false, path, &wr);
    return agree(tr->dist, rc, "writing the weights");
}

/* This rank's shard file: its master weights and both moments, local
 * indexing, streamed from the backend a chunk at a time. */
static int write_shard(const struct olmo_trainer *tr, const char *path, struct written *out) {
    const struct olmo_backend *be = tr->model.be;
    const size_t n = saved_local(tr);
    struct st_writer w = {0};
    struct st_stream s = {0};
    struct hash_stream hs;
    s.fd = -1;
    int64_t shape = (int64_t)n;
    int rc = 0;
    char rank[32];
    snprintf(rank, sizeof rank, "%d", rank_of(tr->dist));
    rc = st_writer_set_metadata(&w, "format", "olmoc-shard") || st_writer_set_metadata(&w, "rank", rank);
    for (int q = 0; q < N_Q && !rc; q++) rc = st_writer_declare(&w, q_shard_tensor[q], ST_F32, 1, &shape);
    int64_t one = 1;
    if (!rc) rc = st_writer_declare(&w, "step", ST_I64, 1, &one); /* Adam's step count, under the hash */
    float *buf = malloc(CHUNK_FLOATS * sizeof(float));
    if (!buf) rc = olmo_error("out of memory writing '%s'", path);
    if (!rc) {
        out->bytes = st_writer_file_size(&w);
        hash_begin(&hs, out->bytes);
        s.hash_update = hash_update;
        s.hash_ctx = &hs;
        rc = st_stream_begin(&s, &w, path);
    }
    for (int q = 0; q < N_Q && !rc; q++) {
        const float *src = q_buffer(tr, q);
        for (size_t c = 0; c < n && !rc; c += CHUNK_FLOATS) {
            const size_t k = n - c < CHUNK_FLOATS ? n - c : CHUNK_FLOATS;
            rc = be->to_host(be, buf, src + c, k * sizeof(float)) || st_stream_write(&s, buf, k * sizeof(float));
        }
    }
    const int64_t step = tr->opt.step;
    if (!rc) rc = st_stream_write(&s, &step, sizeof step);
    if (!rc) rc = st_stream_finish(&s);
    else st_stream_abort(&s);
    if (!rc) out->hash = hash_end(&hs);
    free(buf);
    st_writer_free(&w);
    return rc;
}

static void shard_name(char *buf, size_t n, int rank, int world) {
    snprintf(buf, n, "shard-%05d-of-%05d.safetensors", rank, world);
}

static void add_file(cJSON *obj, const char *name, const struct written *wr) {
    char hex[32];
    cJSON *f = cJSON_AddObjectToObject(obj, name);
    cJSON_AddNumberToObject(f, "bytes", (double)wr->bytes);
    snprintf(hex, sizeof hex, "%016" PRIx64, wr->hash);
    cJSON_AddStringToObject(f, "hash64", hex);
}

/* state.json.  files: the whole-tensor files (version 1) and config.yaml;
 * shards (version 2, NULL otherwise): one record per rank, as gathered:
 * bytes, hash, n_local, n_ranges, then n_ranges x (global, local, len). */
static int write_state(const char *dir, const struct olmo_ckpt_state *st, const struct olmo_trainer *tr,
                       const char *const *names, const struct written *files, int n_files, const uint64_t *shards,
                       const size_t *shard_words, int world) {
    const struct olmo_config *cfg = &tr->cfg;
    cJSON *root = cJSON_CreateObject();
    char buf[64];
    cJSON_AddStringToObject(root, "format", CKPT_FORMAT);
    cJSON_AddNumberToObject(root, "version", shards ? 2 : 1);
    cJSON_AddNumberToObject(root, "step", (double)st->step);
    cJSON_AddNumberToObject(root, "tokens", (double)st->tokens);
    cJSON_AddNumberToObject(root, "elapsed_s", st->elapsed);
    if (st->skipped) cJSON_AddNumberToObject(root, "skipped_steps", (double)st->skipped);
    cJSON *loader = cJSON_AddObjectToObject(root, "loader");
    cJSON_AddStringToObject(loader, "train_path", cfg->data.train_path);
    snprintf(buf, sizeof buf, "%" PRIu64, st->loader_seed);
    cJSON_AddStringToObject(loader, "seed", buf);
    cJSON_AddNumberToObject(loader, "epoch", (double)st->loader_epoch);
    cJSON_AddNumberToObject(loader, "pos", (double)st->loader_pos);
    cJSON_AddNumberToObject(loader, "n_instances", (double)st->loader_instances);
    snprintf(buf, sizeof buf, "%" PRIu64, st->loader_fingerprint);
    cJSON_AddStringToObject(loader, "fingerprint", buf);
    /* The optimizer's own state beyond the moments: SkipStepAdamW's rolling
     * window of losses and gradient norms ("skip_step", as
     * olmo_optimizer_extra_get lays it out; cJSON prints doubles so that they
     * read back exactly), the same on every rank. */
    cJSON *opt = cJSON_AddObjectToObject(root, "optimizer");
    cJSON_AddStringToObject(opt, "name", tr->cfg.train.optimizer == OPTIM_SKIP_STEP_ADAMW ? "SkipStepAdamW" : "AdamW");
    cJSON_AddNumberToObject(opt, "step", (double)tr->opt.step);
    if (tr->adam_step_base) cJSON_AddNumberToObject(opt, "step_base", (double)tr->adam_step_base);
    const size_t n_extra = olmo_optimizer_extra_count(&tr->opt);
    if (n_extra) {
        double *extra = olmo_malloc(sizeof(double) * n_extra, "skip-step window");
        if (!extra) {
            cJSON_Delete(root);
            return -1;
        }
        olmo_optimizer_extra_get(&tr->opt, extra);
        cJSON_AddItemToObject(opt, "skip_step", cJSON_CreateDoubleArray(extra, (int)n_extra));
        free(extra);
    }
    cJSON *fobj = cJSON_AddObjectToObject(root, "files");
    for (int i = 0; i < n_files; i++) add_file(fobj, names[i], &files[i]);
    if (shards) {
        cJSON_AddNumberToObject(root, "world", world);
        cJSON_AddNumberToObject(root, "n_floats", (double)tr->model.n_floats);
        cJSON *arr = cJSON_AddArrayToObject(root, "shards");
        size_t at = 0;
        for (int r = 0; r < world; r++) {
            const uint64_t *rec = shards + at;
            at += shard_words[r];
            cJSON *sh = cJSON_CreateObject();
            cJSON_AddItemToArray(arr, sh);
            char name[64];
            shard_name(name, sizeof name, r, world);
            cJSON_AddStringToObject(sh, "file", name);
            cJSON_AddNumberToObject(sh, "rank", r);
            cJSON_AddNumberToObject(sh, "bytes", (double)rec[0]);
            snprintf(buf, sizeof buf, "%016" PRIx64, rec[1]);
            cJSON_AddStringToObject(sh, "hash64", buf);
            cJSON_AddStringToObject(sh, "dtype", "F32");
            cJSON *tn = cJSON_AddArrayToObject(sh, "tensors");
            for (int q = 0; q < N_Q; q++) cJSON_AddItemToArray(tn, cJSON_CreateString(q_shard_tensor[q]));
            cJSON_AddNumberToObject(sh, "n_local", (double)rec[2]);
            cJSON *pieces = cJSON_AddArrayToObject(sh, "pieces"); /* [global, local, len] */
            for (uint64_t k = 0; k < rec[3]; k++) {
                cJSON *pc = cJSON_CreateArray();
                for (int j = 0; j < 3; j++) cJSON_AddItemToArray(pc, cJSON_CreateNumber((double)rec[4 + 3 * k + j]));
                cJSON_AddItemToArray(pieces, pc);
            }
        }
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) return olmo_error("out of memory writing state.json");
    char path[4096];
    int rc = path_join(path, sizeof path, dir, "state.json");
    if (!rc) rc = olmo_write_file_atomic(path, text, strlen(text));
    free(text);
    return rc;
}

/* Rank 0 only: config.yaml, state.json, then the rename into place. */
static int finish_save(const char *out_dir, const char *tmp, const char *final, const char *old,
                       const struct olmo_trainer *tr, const struct olmo_ckpt_state *st, const char *const *names,
                       struct written *files, int n_files, const uint64_t *shards, const size_t *words, int world) {
    char path[4096];
    if (path_join(path, sizeof path, tmp, "config.yaml") || olmo_config_write(&tr->cfg, path) ||
        olmo_fsync_path(path) || hash_file(path, &files[n_files - 1].hash, &files[n_files - 1].bytes))
        return -1;
    if (write_state(tmp, st, tr, names, files, n_files, shards, words, world) || olmo_fsync_path(tmp)) return -1;
    /* A checkpoint of the same step already there (a rerun from an earlier
     * checkpoint): move it aside, put the new one in place, then delete it. */
    bool replaced = false;
    if (olmo_is_dir(final)) {
        if (olmo_remove_tree(old) || rename(final, old))
            return olmo_error("cannot move the old '%s' aside: %s", final, strerror(errno));
        replaced = true;
    }
    if (rename(tmp, final)) return olmo_error("cannot rename '%s' to '%s': %s", tmp, final, strerror(errno));
    if (olmo_fsync_path(out_dir)) return -1;
    if (replaced && olmo_remove_tree(old)) return olmo_error_context("removing the replaced checkpoint");
    return 0;
}

int olmo_ckpt_save(const char *out_dir, const struct olmo_trainer *tr, const struct olmo_ckpt_state *st,
                   char *path_out, size_t n) {
    char tmp[4096], final[4096], old[4096], path[4096];
    const struct olmo_dist *d = tr->dist;
    const int world = world_of(d), rank = rank_of(d);
    snprintf(tmp, sizeof tmp, "%s/" CKPT_TMP_PREFIX "%06ld", out_dir, st->step);
    snprintf(final, sizeof final, "%s/" CKPT_PREFIX "%06ld", out_dir, st->step);
    snprintf(old, sizeof old, "%s/" CKPT_OLD_PREFIX "%06ld", out_dir, st->step);
    int rc = rank == 0 && (olmo_remove_tree(tmp) || olmo_make_dirs(tmp)) ? -1 : 0;
    if ((rc = agree(d, rc, "creating the checkpoint directory"))) goto fail;
    if (world == 1) {
        /* One rank: whole tensors under Hugging Face names (version 1). */
        static const char *const names[] = {"model.safetensors", "optim.safetensors", "config.yaml"};
        struct written files[3] = {{0}};
        const int q_w = Q_MASTER, q_mv[2] = {Q_M, Q_V};
        rc = path_join(path, sizeof path, tmp, names[0]) || write_gathered(tr, &q_w, 1, false, path, &files[0]) ||
             path_join(path, sizeof path, tmp, names[1]) || write_gathered(tr, q_mv, 2, true, path, &files[1]) ||
             finish_save(out_dir, tmp, final, old, tr, st, names, files, 3, NULL, NULL, 1);
        if (rc) goto fail;
    } else {
        /* Every rank writes its own shard; rank 0 the manifest. */
        struct written mine = {0};
        char name[64];
        shard_name(name, sizeof name, rank, world);
        rc = path_join(path, sizeof path, tmp, name) || write_shard(tr, path, &mine);
        const size_t words = 4 + 3 * (size_t)saved_ranges(tr);
        uint64_t *rec = malloc(words * sizeof *rec);
        if (!rec) rc = olmo_error("out of memory");
        else {
            rec[0] = mine.bytes;
            rec[1] = mine.hash;
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
        if ((rc = agree(d, rc, "writing the checkpoint shards")) == 0)
            rc = olmo_dist_gather_bytes(or_one(d), rec, words * sizeof *rec, 0, &all, counts);
        free(rec);
        if (!rc && rank == 0) {
            for (int r = 0; r < world; r++) counts[r] /= sizeof(uint64_t);
            static const char *const names[] = {"config.yaml"};
            struct written files[1] = {{0}};
            rc = finish_save(out_dir, tmp, final, old, tr, st, names, files, 1, all, counts, world);
        }
        free(all);
        free(counts);
        if (rc) goto fail;
    }
    if ((rc = agree(d, rc, "saving the checkpoint"))) return rc;
    if (path_out) snprintf(path_out, n, "%s", final);
    return 0;
fail:
    olmo_error_context("saving checkpoint '%s'", final);
    return agree(d, -1, "saving the checkpoint");
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

int olmo_ckpt_retain(const char *out_dir, int keep) {
    /* Temporaries of an interrupted save are never valid checkpoints. */
    DIR *d = opendir(out_dir);
    if (d) {
        struct dirent *e;
        int rc = 0;
        while (!rc && (e = readdir(d))) {
            if (parse_step_name(e->d_name, CKPT_TMP_PREFIX) < 0 && parse_step_name(e->d_name, CKPT_OLD_PREFIX) < 0)
                continue;
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", out_dir, e->d_name);
            rc = olmo_remove_tree(path);
        }
        closedir(d);
        if (rc) return rc;
    }
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

/* ---- loading ---- */

static int json_long(const cJSON *obj, const char *key, long *out, const char *dir) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 9.0e15 || v->valuedouble != floor(v->valuedouble))
        return olmo_error("checkpoint '%s': state.json has no valid '%s'", dir, key);
    *out = (long)v->valuedouble;
    return 0;
}

struct ckpt_file {
    char name[128];
    size_t bytes;
    char hash[32];
    bool need;         /* this rank reads from it: its hash is checked */
    size_t step_at;    /* file offset of its optimizer "step" scalar (0: none), read once hashed */
    enum st_dtype step_dtype;
};

/* A run of flat parameters [global, global + len) of one quantity stored
 * contiguously in a file: element global is at byte off, in dtype.  For
 * messages: the tensor's name and the flat offset of its element 0. */
struct seg {
    int file;
    size_t global, len, off, base;
    enum st_dtype dtype;
    char name[200];
};

struct manifest {
    const char *dir;
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

static void manifest_free(struct manifest *mf) {
    free(mf->files);
    free(mf->extra);
    for (int q = 0; q < N_Q; q++) free(mf->segs[q]);
    for (int i = 0; mf->shards && i < mf->world; i++) free(mf->shards[i].pieces);
    free(mf->shards);
    memset(mf, 0, sizeof *mf);
}

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

static int file_entry(struct manifest *mf, const cJSON *f, const char *name) {
    const cJSON *bytes = cJSON_GetObjectItemCaseSensitive(f, "bytes");
    const cJSON *hash = cJSON_GetObjectItemCaseSensitive(f, "hash64");
    if (!cJSON_IsNumber(bytes) || bytes->valuedouble < 0 || !cJSON_IsString(hash) || strlen(hash->valuestring) > 16)
        return olmo_error("checkpoint '%s': state.json has no size/hash for %s", mf->dir, name);
    if (strlen(name) >= sizeof mf->files[0].name || strchr(name, '/') || !strcmp(name, "..") || !name[0])
        return olmo_error("checkpoint '%s': state.json names a file '%.60s' that is not a plain file name", mf->dir,
                          name);
    struct ckpt_file *cf = &mf->files[mf->n_files++];
    snprintf(cf->name, sizeof cf->name, "%s", name);
    cf->bytes = (size_t)bytes->valuedouble;
    snprintf(cf->hash, sizeof cf->hash, "%s", hash->valuestring);
    return 0;
}

static bool json_size(const cJSON *v, size_t *out) {
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 9.0e15 || v->valuedouble != floor(v->valuedouble))
        return false;
    *out = (size_t)v->valuedouble;
    return true;
}

/* Version 2's shard list: files and pieces (checked against the model later). */
static int parse_shards(struct manifest *mf, const cJSON *root) {
    const cJSON *shards = cJSON_GetObjectItemCaseSensitive(root, "shards");
    long world = 0;
    size_t nf = 0;
    if (json_long(root, "world", &world, mf->dir)) return -1;
    if (!json_size(cJSON_GetObjectItemCaseSensitive(root, "n_floats"), &nf))
        return olmo_error("checkpoint '%s': state.json has no valid 'n_floats'", mf->dir);
    if (!cJSON_IsArray(shards) || world < 1 || cJSON_GetArraySize(shards) != world || world > 1000000)
        return olmo_error("checkpoint '%s': state.json's 'shards' is not a list of %ld shard files", mf->dir, world);
    mf->world = (int)world;
    mf->n_floats = nf;
    if (!(mf->shards = calloc((size_t)world, sizeof *mf->shards))) return olmo_error("out of memory");
    int r = 0;
    const cJSON *sh;
    cJSON_ArrayForEach(sh, shards) {
        const cJSON *file = cJSON_GetObjectItemCaseSensitive(sh, "file");
        const cJSON *pieces = cJSON_GetObjectItemCaseSensitive(sh, "pieces");
        const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(sh, "dtype");
        if (!cJSON_IsString(file) || !cJSON_IsArray(pieces) || !json_size(cJSON_GetObjectItemCaseSensitive(sh, "n_local"),
                                                                          &mf->shards[r].n_local))
            return olmo_error("checkpoint '%s': shard %d of state.json needs file, n_local and pieces", mf->dir, r);
        if (!cJSON_IsString(dtype) || strcmp(dtype->valuestring, "F32"))
            return olmo_error("checkpoint '%s': shard '%s' is not F32", mf->dir, file->valuestring);
        mf->shards[r].file = mf->n_files;
        if (file_entry(mf, sh, file->valuestring)) return -1;
        const int np = cJSON_GetArraySize(pieces);
        if (!(mf->shards[r].pieces = calloc((size_t)np + 1, sizeof *mf->shards[r].pieces)))
            return olmo_error("out of memory");
        const cJSON *pc;
        cJSON_ArrayForEach(pc, pieces) {
            struct olmo_shard_range *p = &mf->shards[r].pieces[mf->shards[r].n_pieces];
            if (!cJSON_IsArray(pc) || cJSON_GetArraySize(pc) != 3 || !json_size(cJSON_GetArrayItem(pc, 0), &p->global) ||
                !json_size(cJSON_GetArrayItem(pc, 1), &p->local) || !json_size(cJSON_GetArrayItem(pc, 2), &p->len) ||
                p->local + p->len > mf->shards[r].n_local || p->global + p->len > nf)
                return olmo_error("checkpoint '%s': shard '%s' has a piece that is not [global, local, len] inside "
                                  "its %zu values and the %zu parameters",
                                  mf->dir, file->valuestring, mf->shards[r].n_local, nf);
            mf->shards[r].n_pieces++;
        }
        r++;
    }
    return 0;
}

/* state.json: what it says, no file opened yet. */
static int parse_state(const char *dir, struct manifest *mf) {
    char path[4096];
    char *text = NULL;
    memset(mf, 0, sizeof *mf);
    mf->dir = dir;
    if (!olmo_is_dir(dir)) return olmo_error("checkpoint '%s' is not a directory", dir);
    if (path_join(path, sizeof path, dir, "state.json")) return -1;
    if (olmo_read_file(path, 1 << 28, &text, NULL))
        return olmo_error_context("checkpoint '%s' is incomplete or corrupt", dir);
    cJSON *root = cJSON_Parse(text);
    free(text);
    int rc = 0;
    struct olmo_ckpt_state st = {0};
    long v;
    const cJSON *format = cJSON_GetObjectItemCaseSensitive(root, "format");
    const cJSON *version = cJSON_GetObjectItemCaseSensitive(root, "version");
    const cJSON *loader = cJSON_GetObjectItemCaseSensitive(root, "loader");
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(root, "files");
    if (!cJSON_IsObject(root)) {
        rc = olmo_error("checkpoint '%s': state.json is not a JSON object", dir);
        goto done;
    }
    if (!cJSON_IsString(format) || strcmp(format->valuestring, CKPT_FORMAT)) {
        rc = olmo_error("checkpoint '%s': state.json is not an olmoc checkpoint state", dir);
        goto done;
    }
    if (!cJSON_IsNumber(version) || (version->valuedouble != 1 && version->valuedouble != 2)) {
        rc = olmo_error("checkpoint '%s': state.json has format version %g; this olmoc reads versions 1 and 2", dir,
                        cJSON_IsNumber(version) ? version->valuedouble : -1.0);
        goto done;
    }
    mf->version = (int)version->valuedouble;
    if ((rc = json_long(root, "step", &st.step, dir)) || (rc = json_long(root, "tokens", &st.tokens, dir)))
        goto done;
    if (cJSON_GetObjectItemCaseSensitive(root, "skipped_steps") &&
        (rc = json_long(root, "skipped_steps", &st.skipped, dir)))
        goto done;
    const cJSON *el = cJSON_GetObjectItemCaseSensitive(root, "elapsed_s");
    st.elapsed = cJSON_IsNumber(el) ? el->valuedouble : 0.0;
    const cJSON *seed = cJSON_GetObjectItemCaseSensitive(loader, "seed");
    const cJSON *fingerprint = cJSON_GetObjectItemCaseSensitive(loader, "fingerprint");
    if (!cJSON_IsObject(loader) || !cJSON_IsString(seed) || !cJSON_IsString(fingerprint)) {
        rc = olmo_error("checkpoint '%s': state.json has no valid 'loader'", dir);
        goto done;
    }
    st.loader_seed = strtoull(seed->valuestring, NULL, 10);
    st.loader_fingerprint = strtoull(fingerprint->valuestring, NULL, 10);
    if ((rc = json_long(loader, "epoch", &st.loader_epoch, dir))) goto done;
    if ((rc = json_long(loader, "pos", &v, dir))) goto done;
    st.loader_pos = (size_t)v;
    if ((rc = json_long(loader, "n_instances", &v, dir))) goto done;
    st.loader_instances = (size_t)v;
    const cJSON *opt = cJSON_GetObjectItemCaseSensitive(root, "optimizer");
    if (opt) {
        if (!cJSON_IsObject(opt) || (rc = json_long(opt, "step", &mf->opt_step, dir))) {
            if (!rc) rc = olmo_error("checkpoint '%s': state.json's 'optimizer' is not an object", dir);
            goto done;
        }
        mf->has_opt_step = true;
        const cJSON *win = cJSON_GetObjectItemCaseSensitive(opt, "skip_step");
        if (win) {
            const int n = cJSON_IsArray(win) ? cJSON_GetArraySize(win) : -1;
            if (n < 0 || !(mf->extra = malloc(sizeof(double) * (size_t)(n ? n : 1)))) {
                rc = n < 0 ? olmo_error("checkpoint '%s': state.json's 'optimizer.skip_step' is not an array", dir)
                           : olmo_error("out of memory");
                goto done;
            }
            int i = 0;
            for (const cJSON *e = win->child; e; e = e->next, i++) {
                if (!cJSON_IsNumber(e)) {
                    rc = olmo_error("checkpoint '%s': state.json's 'optimizer.skip_step' holds a non-number", dir);
                    goto done;
                }
                mf->extra[i] = e->valuedouble;
            }
            mf->n_extra = (size_t)n;
            mf->has_extra = true;
        }
        if (cJSON_GetObjectItemCaseSensitive(opt, "step_base") &&
            (rc = json_long(opt, "step_base", &mf->step_base, dir)))
            goto done;
    }
    if (!cJSON_IsObject(files)) {
        rc = olmo_error("checkpoint '%s': state.json lists no files", dir);
        goto done;
    }
    const cJSON *shards = cJSON_GetObjectItemCaseSensitive(root, "shards");
    const int n_max = 3 + (cJSON_IsArray(shards) ? cJSON_GetArraySize(shards) : 0);
    if (!(mf->files = calloc((size_t)n_max, sizeof *mf->files))) {
        rc = olmo_error("out of memory");
        goto done;
    }
    static const char *const v1_files[] = {"model.safetensors", "optim.safetensors", "config.yaml"};
    for (int i = mf->version == 1 ? 0 : 2; i < 3 && !rc; i++)
        rc = file_entry(mf, cJSON_GetObjectItemCaseSensitive(files, v1_files[i]), v1_files[i]);
    if (!rc && mf->version == 2) rc = parse_shards(mf, root);
    if (!rc && mf->version == 2 && !mf->has_opt_step)
        rc = olmo_error("checkpoint '%s': state.json has no valid 'optimizer'", dir);
    mf->st = st;
done:
    cJSON_Delete(root);
    if (rc) manifest_free(mf);
    return rc;
}

/* Every file exists with its size. */
static int check_sizes(const struct manifest *mf) {
    char path[4096];
    for (int i = 0; i < mf->n_files; i++) {
        const struct ckpt_file *f = &mf->files[i];
        if (path_join(path, sizeof path, mf->dir, f->name)) return -1;
        struct stat sb;
        if (stat(path, &sb) || !S_ISREG(sb.st_mode))
            return olmo_error("checkpoint '%s' is incomplete: %s is missing", mf->dir, f->name);
        if ((size_t)sb.st_size != f->bytes)
            return olmo_error("checkpoint '%s' is corrupt: %s has %zu bytes, state.json says %zu", mf->dir, f->name,
                              (size_t)sb.st_size, f->bytes);
    }
    return 0;
}

/* The content hash of the files marked needed (all: every file). */
static int check_hashes(const struct manifest *mf, bool all) {
    char path[4096];
    for (int i = 0; i < mf->n_files; i++) {
        const struct ckpt_file *f = &mf->files[i];
        if (!all && !f->need) continue;
        uint64_t h;
        size_t size;
        if (path_join(path, sizeof path, mf->dir, f->name) || hash_file(path, &h, &size)) return -1;
        char hex[32];
        snprintf(hex, sizeof hex, "%016" PRIx64, h);
        if (size != f->bytes || strcmp(hex, f->hash))
            return olmo_error("checkpoint '%s' is corrupt: the content hash of %s is %s, state.json says %s", mf->dir,
                              f->name, hex, f->hash);
    }
    return 0;
}

int olmo_ckpt_verify(const char *dir, struct olmo_ckpt_state *out) {
    struct manifest mf;
    if (parse_state(dir, &mf)) return -1;
    int rc = check_sizes(&mf) || check_hashes(&mf, true);
    if (!rc && out) *out = mf.st;
    manifest_free(&mf);
    return rc;
}

/* Version 1: whole tensors under Hugging Face names in model.safetensors
 * (weights, any float dtype) and optim.safetensors (F32 moments and "step"),
 * checked as strictly as a weights file. */
static int segs_v1_model(struct manifest *mf, const struct olmo_model *m, const char *path, int file) {
    struct st_file f;
    if (st_open(&f, path)) return -1;
    int rc = 0;
    const size_t data0 = (size_t)(f.data - f.map);
    for (int i = 0; i < m->n_tensors && !rc; i++) {
        const struct olmo_param *p = &m->params[i];
        const struct st_tensor *t;
        if ((rc = olmo_weights_find(&f, path, p, &t))) break;
        if (t->dtype != ST_F32 && t->dtype != ST_BF16 && t->dtype != ST_F16) {
            rc = olmo_error("tensor '%s' in '%s' is %s: weights must be F32, BF16 or F16", t->name, path,
                            st_dtype_name(t->dtype));
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
    st_close(&f);
    return rc;
}

/* Where a file's scalar "step" (I32 or I64) is; read by read_steps once the file is hashed. */
static int step_location(struct manifest *mf, const struct st_file *f, const char *path, int file) {
    const struct st_tensor *t = st_find(f, "step");
    if (!t || st_numel(t) != 1 || (t->dtype != ST_I64 && t->dtype != ST_I32))
        return olmo_error("'%s' has no scalar tensor 'step'", path);
    mf->files[file].step_at = (size_t)(f->data - f->map) + t->begin;
    mf->files[file].step_dtype = t->dtype;
    return 0;
}

/* The optimizer step of the hashed files: version 1's optim.safetensors is
 * the authority; version 2's shards must agree with state.json. */
static int read_steps(struct manifest *mf) {
    for (int i = 0; i < mf->n_files; i++) {
        struct ckpt_file *cf = &mf->files[i];
        if (!cf->need || !cf->step_at) continue;
        char path[4096];
        uint8_t b[8] = {0};
        const size_t n = cf->step_dtype == ST_I64 ? 8 : 4;
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
    struct st_file f;
    if (st_open(&f, path)) return -1;
    int rc = 0;
    const size_t data0 = (size_t)(f.data - f.map);
    for (int i = 0; i < m->n_tensors && !rc; i++) {
        const struct olmo_param *p = &m->params[i];
        for (int q = Q_M; q <= Q_V && !rc; q++) {
            char name[200];
            snprintf(name, sizeof name, "%s%s", p->name, q_suffix[q]);
            const struct st_tensor *t = st_find(&f, name);
            if (!t) rc = olmo_error("'%s' has no tensor '%s'", path, name);
            else if (t->dtype != ST_F32 || st_numel(t) != p->numel)
                rc = olmo_error("'%s': tensor '%s' is not F32 with %zu elements", path, name, p->numel);
            else {
                struct seg s = {.file = file, .global = p->offset, .len = p->numel, .off = data0 + t->begin,
                                .base = p->offset, .dtype = ST_F32};
                snprintf(s.name, sizeof s.name, "%s", name);
                rc = add_seg(mf, q, &s);
            }
        }
    }
    if (!rc) rc = step_location(mf, &f, path, file);
    if (!rc && f.n_tensors != 2 * m->n_tensors + 1)
        rc = olmo_error("'%s' has %d tensors, expected %d", path, f.n_tensors, 2 * m->n_tensors + 1);
    st_close(&f);
    return rc;
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
        struct st_file f;
        if (st_open(&f, path)) return -1;
        int rc = f.n_tensors != N_Q + 1 ? olmo_error("'%s' has %d tensors, expected %d", path, f.n_tensors, N_Q + 1)
                                        : 0;
        if (!rc) rc = step_location(mf, &f, path, mf->shards[r].file);
        const size_t data0 = (size_t)(f.data - f.map);
        for (int q = 0; q < N_Q && !rc; q++) {
            const struct st_tensor *t = st_find(&f, q_shard_tensor[q]);
            if (!t) rc = olmo_error("'%s' has no tensor '%s'", path, q_shard_tensor[q]);
            else if (t->dtype != ST_F32 || t->ndim != 1 || st_numel(t) != mf->shards[r].n_local)
                rc = olmo_error("'%s': tensor '%s' is not F32 [%zu] (state.json's n_local)", path, q_shard_tensor[q],
                                mf->shards[r].n_local);
            for (int k = 0; k < mf->shards[r].n_pieces && !rc; k++) {
                const struct olmo_shard_range *p = &mf->shards[r].pieces[k];
                if (!p->len) continue;
                struct seg s = {.file = mf->shards[r].file, .global = p->global, .len = p->len,
                                .off = data0 + t->begin + p->local * sizeof(float), .base = p->global - p->local,
                                .dtype = ST_F32};
                snprintf(s.name, sizeof s.name, "%s", q_shard_tensor[q]);
                rc = add_seg(mf, q, &s);
            }
        }
        st_close(&f);
        if (rc) return rc;
    }
    return 0;
}

static int cmp_seg(const void *a, const void *b) {
    const struct seg *x = a, *y = b;
    return (x->global > y->global) - (x->global < y->global);
}

/* The segments of quantities 0..q_hi tile [0, n_floats) exactly. */
static int check_tiling(struct manifest *mf, size_t n_floats, int q_hi) {
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
static int build_segments(struct manifest *mf, const struct olmo_model *m, bool moments) {
    const int q_hi = moments ? Q_V : Q_MASTER;
    if (mf->version == 2) return segs_v2(mf, m) || check_tiling(mf, m->n_floats, q_hi) ? -1 : 0;
    char path[4096];
    if (path_join(path, sizeof path, mf->dir, "model.safetensors") || segs_v1_model(mf, m, path, 0)) return -1;
    if (moments &&
        (path_join(path, sizeof path, mf->dir, "optim.safetensors") || segs_v1_optim(mf, m, path, 1)))
        return -1;
    return check_tiling(mf, m->n_floats, q_hi);
}

static bool overlaps(const struct seg *s, const struct olmo_shard_range *r, int n) {
    for (int i = 0; i < n; i++)
        if (r[i].len && s->global < r[i].global + r[i].len && r[i].global < s->global + s->len) return true;
    return false;
}

/* Marks the files this rank reads quantities q_lo..q_hi of its pieces from. */
static void mark_needed(struct manifest *mf, const struct olmo_shard_range *r, int n, int q_lo, int q_hi) {
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
            const size_t esz = st_dtype_size(s->dtype);
            for (size_t c = a; c < b; c += CHUNK_FLOATS) {
                const size_t n = b - c < CHUNK_FLOATS ? b - c : CHUNK_FLOATS;
                uint8_t *into = s->dtype == ST_F32 ? (uint8_t *)buf : raw;
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
                if (s->dtype != ST_F32 && st_convert_f32(s->dtype, raw, n, buf)) return -1;
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
static int read_quantities(const struct manifest *mf, int q_lo, int q_hi, const struct olmo_shard_range *ranges,
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

int olmo_ckpt_read_config(const char *dir, struct olmo_config *cfg) {
    char path[4096];
    olmo_config_defaults(cfg);
    if (path_join(path, sizeof path, dir, "config.yaml") || olmo_config_load(cfg, path))
        return olmo_error_context("checkpoint '%s'", dir);
    return 0;
}

/* The checkpoint must describe the same network (and, to resume, the same data order). */
static int check_compatible(const char *dir, const struct olmo_config *ck, const struct olmo_config *cur,
                            bool resume) {
    for (int i = 0; olmo_config_key(i); i++) {
        const char *key = olmo_config_key(i);
        bool relevant = (!strncmp(key, "model.", 6) && strcmp(key, "model.init_std")) ||
                        (resume && (!strcmp(key, "train.seq_len") || !strcmp(key, "train.seed")));
        if (!relevant) continue;
        char a[1100], b[1100];
        olmo_config_format(ck, key, a, sizeof a);
        olmo_config_format(cur, key, b, sizeof b);
        if (strcmp(a, b))
            return olmo_error("checkpoint '%s' does not match the config: %s is %s in the checkpoint but %s in "
                              "the config",
                              dir, key, a, b);
    }
    return 0;
}

/* What a trainer takes from a checkpoint. */
enum load_kind { LOAD_RESUME, LOAD_WEIGHTS, LOAD_WEIGHTS_AND_MOMENTS };

static int load_into_trainer(const char *dir, struct olmo_trainer *tr, struct olmo_ckpt_state *st,
                             enum load_kind kind) {
    struct manifest mf;
    struct olmo_config ck;
    if (parse_state(dir, &mf)) return -1;
    const bool moments = kind != LOAD_WEIGHTS;
    int rc = check_sizes(&mf) || olmo_ckpt_read_config(dir, &ck) ||
             check_compatible(dir, &ck, &tr->cfg, kind == LOAD_RESUME);
    if (!rc && build_segments(&mf, &tr->model, moments)) rc = olmo_error_context("checkpoint '%s'", dir);
    if (!rc) {
        mark_needed(&mf, tr->opt.ranges, tr->opt.n_ranges, Q_MASTER, moments ? Q_V : Q_MASTER);
        rc = check_hashes(&mf, false);
        if (!rc && moments && read_steps(&mf)) rc = olmo_error_context("checkpoint '%s'", dir);
    }
    float *dsts[N_Q] = {olmo_optimizer_master(&tr->opt, &tr->model), tr->opt.m, tr->opt.v};
    if (!rc && read_quantities(&mf, Q_MASTER, moments ? Q_V : Q_MASTER, tr->opt.ranges, tr->opt.n_ranges, dsts,
                               tr->model.be))
        rc = olmo_error_context("checkpoint '%s'", dir);
    if (!rc && moments) {
        if (!mf.has_opt_step) rc = olmo_error("checkpoint '%s' has no optimizer step", dir);
        else tr->opt.step = mf.opt_step;
    }
    if (!rc && kind == LOAD_RESUME) {
        /* opt.step counts Adam updates since any carried stage began at step_base */
        if (mf.step_base > tr->opt.step || tr->opt.step - mf.step_base + mf.st.skipped != mf.st.step)
            rc = olmo_error("checkpoint '%s' is inconsistent: optimizer step %ld and %ld skipped steps, state.json "
                            "step %ld",
                            dir, tr->opt.step - mf.step_base, mf.st.skipped, mf.st.step);
        tr->skipped = mf.st.skipped;
        tr->adam_step_base = mf.step_base;
        /* SkipStepAdamW's window, so that the resumed run equals an uninterrupted one (OLMo-core does not
         * save it: its resumed runs, and imported ones, start with an empty window, as a checkpoint
         * without it does here) */
        if (!rc && mf.has_extra && tr->cfg.train.optimizer == OPTIM_SKIP_STEP_ADAMW &&
            olmo_optimizer_extra_set(&tr->opt, mf.extra, mf.n_extra))
            rc = olmo_error_context("checkpoint '%s': optimizer.skip_step", dir);
        if (st) *st = mf.st;
    } else if (!rc) {
        /* A new stage: fresh schedule and data order; with the moments, Adam's
         * step count (its bias correction) carries on, as OLMo-core's
         * load_optim_state=True loads each parameter's state["step"]. */
        tr->skipped = 0;
        tr->adam_step_base = tr->opt.step;
    }
    manifest_free(&mf);
    rc = agree(tr->dist, rc, "loading the checkpoint");
    return master_loaded(tr, rc);
}

int olmo_ckpt_load(const char *dir, struct olmo_trainer *tr, struct olmo_ckpt_state *st) {
    return load_into_trainer(dir, tr, st, LOAD_RESUME);
}

int olmo_ckpt_init_from(const char *dir, struct olmo_trainer *tr, bool with_optimizer_state) {
    return load_into_trainer(dir, tr, NULL, with_optimizer_state ? LOAD_WEIGHTS_AND_MOMENTS : LOAD_WEIGHTS);
}

int olmo_ckpt_load_weights(const char *dir, struct olmo_model *m) {
    struct manifest mf;
    if (parse_state(dir, &mf)) return -1;
    const struct olmo_shard_range all = {.global = 0, .local = 0, .len = m->n_floats};
    int rc = check_sizes(&mf);
    if (!rc && build_segments(&mf, m, false)) rc = olmo_error_context("checkpoint '%s'", dir);
    if (!rc) {
        mark_needed(&mf, &all, 1, Q_MASTER, Q_MASTER);
        rc = check_hashes(&mf, false);
    }
    float *dsts[N_Q] = {m->weights, NULL, NULL};
    if (!rc && read_quantities(&mf, Q_MASTER, Q_MASTER, &all, 1, dsts, m->be))
        rc = olmo_error_context("checkpoint '%s'", dir);
    if (!rc) rc = olmo_model_sync_weights(m);
    manifest_free(&mf);
    return rc;
}

int olmo_ckpt_load_weights_file(const char *path, struct olmo_trainer *tr) {
    struct manifest mf;
    memset(&mf, 0, sizeof mf);
    mf.dir = path;
    mf.single = path;
    mf.version = 1;
    int rc = 0;
    if (!(mf.files = calloc(1, sizeof *mf.files))) rc = olmo_error("out of memory");
    else {
        mf.n_files = 1;
        snprintf(mf.files[0].name, sizeof mf.files[0].name, "weights");
    }
    /* the checks of olmo_weights_read: every tensor with its shape, nothing
     * else, float dtypes; the values (finite) as this rank's pieces are read */
    if (!rc) rc = segs_v1_model(&mf, &tr->model, path, 0) || check_tiling(&mf, tr->model.n_floats, Q_MASTER) ? -1 : 0;
    if (!rc) {
        mark_needed(&mf, tr->opt.ranges, tr->opt.n_ranges, Q_MASTER, Q_MASTER);
        float *dsts[N_Q] = {olmo_optimizer_master(&tr->opt, &tr->model), NULL, NULL};
        rc = read_quantities(&mf, Q_MASTER, Q_MASTER, tr->opt.ranges, tr->opt.n_ranges, dsts, tr->model.be);
    }
    manifest_free(&mf);
    rc = agree_message(tr->dist, rc);
    return master_loaded(tr, rc);
}

/* state.json is not covered by a hash (it holds the others): its loader
 * position must agree with the tokens trained on, which every step advances
 * by the same instances the loader hands out (tokens = instances x seq_len). */
static int check_loader_position(const struct olmo_loader *l, const struct olmo_ckpt_state *st) {
    size_t n = l->n_instances, seq = (size_t)l->seq_len;
    size_t epoch = (size_t)st->loader_epoch, tokens = (size_t)st->tokens;
    bool ok = st->loader_epoch >= 0 && st->tokens >= 0 && st->loader_pos <= n && tokens % seq == 0 &&
              epoch <= (SIZE_MAX - st->loader_pos) / n && epoch * n + st->loader_pos == tokens / seq;
    if (!ok)
        return olmo_error("state.json is inconsistent: loader epoch %ld, position %zu (of %zu instances per epoch) "
                          "does not match %ld tokens trained on (%ld instances of %d tokens)",
                          st->loader_epoch, st->loader_pos, n, st->tokens, st->tokens / l->seq_len, l->seq_len);
    return 0;
}

int olmo_ckpt_seek_loader(struct olmo_loader *l, const struct olmo_ckpt_state *st) {
    if (check_loader_position(l, st)) return olmo_error_context("restoring the data loader position");
    struct olmo_loader_state state = {
        .epoch = (uint64_t)st->loader_epoch,
        .position = st->loader_pos,
        .fingerprint = st->loader_fingerprint,
    };
    if (st->loader_epoch < 0 || olmo_loader_state_set(l, &state))
        return olmo_error_context("restoring the data loader position");
    return 0;
}
