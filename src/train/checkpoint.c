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
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/safetensors.h"
#include "model/weights.h"
#include "util/error.h"
#include "util/fs.h"

#define CKPT_FORMAT "olmoc-checkpoint"
#define CKPT_VERSION 1
#define CKPT_PREFIX "step-"
#define CKPT_TMP_PREFIX ".tmp-step-"
#define CKPT_OLD_PREFIX ".old-step-"

static const char *const ckpt_files[] = {"model.safetensors", "optim.safetensors", "config.yaml"};
enum { N_CKPT_FILES = 3 };

static uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t olmo_hash64(const void *data, size_t len) {
    const uint8_t *p = data;
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ ((uint64_t)len * 0xff51afd7ed558ccdULL);
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h ^= rotl64(w * 0x87c37b91114253d5ULL, 31) * 0x4cf5ad432745937fULL;
        h = rotl64(h, 27) * 5 + 0x52dce729;
    }
    uint64_t tail = 0;
    for (size_t j = 0; i + j < len; j++) tail |= (uint64_t)p[i + j] << (8 * j);
    h ^= rotl64(tail * 0x87c37b91114253d5ULL, 31) * 0x4cf5ad432745937fULL;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
}

static int hash_file(const char *path, uint64_t *hash, size_t *size) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return olmo_error("cannot open '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st)) {
        close(fd);
        return olmo_error("cannot stat '%s': %s", path, strerror(errno));
    }
    *size = (size_t)st.st_size;
    if (st.st_size == 0) {
        close(fd);
        *hash = olmo_hash64("", 0);
        return 0;
    }
    void *map = mmap(NULL, *size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return olmo_error("cannot map '%s': %s", path, strerror(errno));
    *hash = olmo_hash64(map, *size);
    munmap(map, *size);
    return 0;
}

static int path_join(char *buf, size_t n, const char *dir, const char *name) {
    if (snprintf(buf, n, "%s/%s", dir, name) >= (int)n) return olmo_error("path too long: '%s/%s'", dir, name);
    return 0;
}

/* ---- saving ---- */

static int save_optimizer(const struct olmo_trainer *tr, const char *path) {
    const struct olmo_model *m = &tr->model;
    float *mh = malloc(m->n_floats * sizeof(float)), *vh = malloc(m->n_floats * sizeof(float));
    if (!mh || !vh) {
        free(mh);
        free(vh);
        return olmo_error("out of memory saving the optimizer state");
    }
    if (olmo_optimizer_gather(&tr->opt, m, tr->dist, mh, vh)) {
        free(mh);
        free(vh);
        return -1;
    }
    struct st_writer w = {0};
    int rc = 0;
    for (int i = 0; i < m->n_tensors && !rc; i++) {
        const struct olmo_param *p = &m->params[i];
        int64_t shape[2] = {p->rows, p->cols};
        char name[160];
        snprintf(name, sizeof name, "%s.exp_avg", p->name);
        rc = st_writer_add(&w, name, ST_F32, p->cols == 1 ? 1 : 2, shape, mh + p->offset);
        snprintf(name, sizeof name, "%s.exp_avg_sq", p->name);
        if (!rc) rc = st_writer_add(&w, name, ST_F32, p->cols == 1 ? 1 : 2, shape, vh + p->offset);
    }
    int64_t step = tr->opt.step, one = 1;
    if (!rc) rc = st_writer_add(&w, "step", ST_I64, 1, &one, &step);
    if (!rc) rc = st_writer_save(&w, path);
    st_writer_free(&w);
    free(mh);
    free(vh);
    return rc;
}

static int write_state(const char *dir, const struct olmo_ckpt_state *st, const struct olmo_config *cfg) {
    cJSON *root = cJSON_CreateObject();
    char buf[64];
    cJSON_AddStringToObject(root, "format", CKPT_FORMAT);
    cJSON_AddNumberToObject(root, "version", CKPT_VERSION);
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
    cJSON *files = cJSON_AddObjectToObject(root, "files");
    for (int i = 0; i < N_CKPT_FILES; i++) {
        char path[4096];
        uint64_t hash;
        size_t size;
        if (path_join(path, sizeof path, dir, ckpt_files[i]) || hash_file(path, &hash, &size)) {
            cJSON_Delete(root);
            return -1;
        }
        cJSON *f = cJSON_AddObjectToObject(files, ckpt_files[i]);
        cJSON_AddNumberToObject(f, "bytes", (double)size);
        snprintf(buf, sizeof buf, "%016" PRIx64, hash);
        cJSON_AddStringToObject(f, "hash64", buf);
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

int olmo_ckpt_save(const char *out_dir, const struct olmo_trainer *tr, const struct olmo_ckpt_state *st,
                   char *path_out, size_t n) {
    char tmp[4096], final[4096], old[4096], path[4096];
    float *full = NULL; /* train.sharding: fsdp: the weights, gathered from every rank's shards */
    if (tr->fully_sharded) { /* collective; rank 0 receives them */
        const bool writer = !tr->dist || tr->dist->rank == 0;
        if ((writer && !(full = olmo_malloc(tr->model.n_floats * sizeof(float), "checkpoint weights"))) ||
            olmo_trainer_get_weights(tr, full)) {
            free(full);
            return -1;
        }
    }
    if (tr->dist && tr->dist->world > 1 && tr->dist->rank != 0) {
        /* Other ranks only hand their optimizer shards to rank 0, which writes. */
        const struct olmo_model *m = &tr->model;
        float *mh = malloc(m->n_floats * sizeof(float)), *vh = malloc(m->n_floats * sizeof(float));
        int rc = (!mh || !vh) ? olmo_error("out of memory gathering the optimizer state")
                              : olmo_optimizer_gather(&tr->opt, m, tr->dist, mh, vh);
        free(mh);
        free(vh);
        return rc ? rc : olmo_dist_barrier(tr->dist);
    }
    snprintf(tmp, sizeof tmp, "%s/" CKPT_TMP_PREFIX "%06ld", out_dir, st->step);
    snprintf(final, sizeof final, "%s/" CKPT_PREFIX "%06ld", out_dir, st->step);
    snprintf(old, sizeof old, "%s/" CKPT_OLD_PREFIX "%06ld", out_dir, st->step);
    if (olmo_remove_tree(tmp) || olmo_make_dirs(tmp)) goto fail;
    if (path_join(path, sizeof path, tmp, "model.safetensors") ||
        (full ? olmo_weights_save_host(&tr->model, full, path) : olmo_weights_save(&tr->model, tr->model.weights, path)))
        goto fail;
    free(full);
    full = NULL;
    if (path_join(path, sizeof path, tmp, "optim.safetensors") || save_optimizer(tr, path)) goto fail;
    if (path_join(path, sizeof path, tmp, "config.yaml") || olmo_config_write(&tr->cfg, path) ||
        olmo_fsync_path(path))
        goto fail;
    if (write_state(tmp, st, &tr->cfg) || olmo_fsync_path(tmp)) goto fail;
    /* A checkpoint of the same step already there (a rerun from an earlier
     * checkpoint): move it aside, put the new one in place, then delete it. */
    bool replaced = false;
    if (olmo_is_dir(final)) {
        if (olmo_remove_tree(old) || rename(final, old)) {
            olmo_error("cannot move the old '%s' aside: %s", final, strerror(errno));
            goto fail;
        }
        replaced = true;
    }
    if (rename(tmp, final)) {
        olmo_error("cannot rename '%s' to '%s': %s", tmp, final, strerror(errno));
        goto fail;
    }
    if (olmo_fsync_path(out_dir)) goto fail;
    if (replaced && olmo_remove_tree(old)) return olmo_error_context("removing the replaced checkpoint");
    if (path_out) snprintf(path_out, n, "%s", final);
    return tr->dist ? olmo_dist_barrier(tr->dist) : 0;
fail:
    free(full);
    return olmo_error_context("saving checkpoint '%s'", final);
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

int olmo_ckpt_verify(const char *dir, struct olmo_ckpt_state *out) {
    char path[4096];
    char *text = NULL;
    if (!olmo_is_dir(dir)) return olmo_error("checkpoint '%s' is not a directory", dir);
    if (path_join(path, sizeof path, dir, "state.json") || olmo_read_file(path, 1u << 20, &text, NULL))
        return olmo_error_context("checkpoint '%s' is incomplete or corrupt", dir);
    cJSON *root = cJSON_Parse(text);
    free(text);
    int rc = 0;
    struct olmo_ckpt_state st = {0};
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(root, "version");
    const cJSON *loader = cJSON_GetObjectItemCaseSensitive(root, "loader");
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(root, "files");
    if (!cJSON_IsObject(root)) {
        rc = olmo_error("checkpoint '%s' is corrupt: state.json is not a JSON object", dir);
        goto done;
    }
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, CKPT_FORMAT)) {
        rc = olmo_error("checkpoint '%s': state.json is not an olmoc checkpoint state", dir);
        goto done;
    }
    if (!cJSON_IsNumber(ver) || ver->valueint != CKPT_VERSION) {
        rc = olmo_error("checkpoint '%s' has format version %d; this olmoc reads version %d", dir,
                        cJSON_IsNumber(ver) ? ver->valueint : -1, CKPT_VERSION);
        goto done;
    }
    long v;
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
    if (!cJSON_IsObject(files)) {
        rc = olmo_error("checkpoint '%s': state.json lists no files", dir);
        goto done;
    }
    for (int i = 0; i < N_CKPT_FILES; i++) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(files, ckpt_files[i]);
        const cJSON *bytes = cJSON_GetObjectItemCaseSensitive(f, "bytes");
        const cJSON *hash = cJSON_GetObjectItemCaseSensitive(f, "hash64");
        if (!cJSON_IsNumber(bytes) || !cJSON_IsString(hash)) {
            rc = olmo_error("checkpoint '%s': state.json has no size/hash for %s", dir, ckpt_files[i]);
            goto done;
        }
        uint64_t h;
        size_t size;
        if ((rc = path_join(path, sizeof path, dir, ckpt_files[i]))) goto done;
        if (!olmo_is_file(path)) {
            rc = olmo_error("checkpoint '%s' is incomplete: %s is missing", dir, ckpt_files[i]);
            goto done;
        }
        if ((rc = hash_file(path, &h, &size))) goto done;
        if ((double)size != bytes->valuedouble) {
            rc = olmo_error("checkpoint '%s' is corrupt: %s has %zu bytes, state.json says %.0f", dir, ckpt_files[i],
                            size, bytes->valuedouble);
            goto done;
        }
        char hex[32];
        snprintf(hex, sizeof hex, "%016" PRIx64, h);
        if (strcmp(hex, hash->valuestring)) {
            rc = olmo_error("checkpoint '%s' is corrupt: the content hash of %s is %s, state.json says %s", dir,
                            ckpt_files[i], hex, hash->valuestring);
            goto done;
        }
    }
    if (out) *out = st;
done:
    cJSON_Delete(root);
    return rc;
}

int olmo_ckpt_read_config(const char *dir, struct olmo_config *cfg) {
    char path[4096];
    olmo_config_defaults(cfg);
    if (path_join(path, sizeof path, dir, "config.yaml") || olmo_config_load(cfg, path))
        return olmo_error_context("checkpoint '%s'", dir);
    return 0;
}

/* The checkpoint must describe the same network and the same data order. */
static int check_compatible(const char *dir, const struct olmo_config *ck, const struct olmo_config *cur) {
    for (int i = 0; olmo_config_key(i); i++) {
        const char *key = olmo_config_key(i);
        bool relevant = (!strncmp(key, "model.", 6) && strcmp(key, "model.init_std")) ||
                        !strcmp(key, "train.seq_len") || !strcmp(key, "train.seed");
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

/* Adam moments must be finite, and the second moment (a running mean of
 * squares) not negative: either would turn every later update into NaN. */
static int check_moment(const char *path, const char *name, const float *x, size_t n, int second) {
    if (olmo_check_finite(path, name, x, n)) return -1;
    for (size_t i = 0; second && i < n; i++)
        if (x[i] < 0)
            return olmo_error("'%s': tensor '%s' has a negative value at element %zu (%g): a second moment is "
                              "never negative",
                              path, name, i, (double)x[i]);
    return 0;
}

static int load_optimizer(struct olmo_trainer *tr, const char *path) {
    struct olmo_model *m = &tr->model;
    struct st_file f;
    if (st_open(&f, path)) return -1;
    float *mh = malloc(m->n_floats * sizeof(float)), *vh = malloc(m->n_floats * sizeof(float));
    int rc = (!mh || !vh) ? olmo_error("out of memory loading '%s'", path) : 0;
    for (int i = 0; i < m->n_tensors && !rc; i++) {
        const struct olmo_param *p = &m->params[i];
        for (int which = 0; which < 2 && !rc; which++) {
            char name[160];
            snprintf(name, sizeof name, "%s.%s", p->name, which ? "exp_avg_sq" : "exp_avg");
            const struct st_tensor *t = st_find(&f, name);
            if (!t) rc = olmo_error("'%s' has no tensor '%s'", path, name);
            else if (t->dtype != ST_F32 || st_numel(t) != p->numel)
                rc = olmo_error("'%s': tensor '%s' is not F32 with %zu elements", path, name, p->numel);
            else if (!(rc = st_read_f32(&f, t, (which ? vh : mh) + p->offset)))
                rc = check_moment(path, name, (which ? vh : mh) + p->offset, p->numel, which);
        }
    }
    const struct st_tensor *t = st_find(&f, "step");
    int32_t step = 0;
    if (!rc && (!t || st_numel(t) != 1)) rc = olmo_error("'%s' has no scalar tensor 'step'", path);
    if (!rc) rc = st_read_i32(&f, t, &step);
    if (!rc && f.n_tensors != 2 * m->n_tensors + 1)
        rc = olmo_error("'%s' has %d tensors, expected %d", path, f.n_tensors, 2 * m->n_tensors + 1);
    if (!rc && step < 0) rc = olmo_error("'%s': negative optimizer step", path);
    if (!rc) rc = olmo_optimizer_scatter(&tr->opt, m, mh, vh);
    if (!rc) tr->opt.step = step;
    free(mh);
    free(vh);
    st_close(&f);
    return rc;
}

int olmo_ckpt_load(const char *dir, struct olmo_trainer *tr, struct olmo_ckpt_state *st) {
    struct olmo_config ck;
    char path[4096];
    if (olmo_ckpt_verify(dir, st) || olmo_ckpt_read_config(dir, &ck)) return -1;
    if (check_compatible(dir, &ck, &tr->cfg)) return -1;
    if (path_join(path, sizeof path, dir, "model.safetensors")) return olmo_error_context("checkpoint '%s'", dir);
    if (tr->fully_sharded) { /* every rank reads the weights and keeps its shards */
        float *full = olmo_malloc(tr->model.n_floats * sizeof(float), "checkpoint weights");
        const int rc = !full || olmo_weights_read(&tr->model, path, full) || olmo_trainer_set_weights(tr, full);
        free(full);
        if (rc) return olmo_error_context("checkpoint '%s'", dir);
    } else if (olmo_weights_load(&tr->model, path))
        return olmo_error_context("checkpoint '%s'", dir);
    if (path_join(path, sizeof path, dir, "optim.safetensors") || load_optimizer(tr, path))
        return olmo_error_context("checkpoint '%s'", dir);
    if (tr->opt.step + st->skipped != st->step)
        return olmo_error("checkpoint '%s' is inconsistent: optimizer step %ld and %ld skipped steps, state.json "
                          "step %ld",
                          dir, tr->opt.step, st->skipped, st->step);
    tr->skipped = st->skipped;
    return 0;
}

int olmo_ckpt_load_weights(const char *dir, struct olmo_model *m) {
    char path[4096];
    if (olmo_ckpt_verify(dir, NULL)) return -1;
    if (path_join(path, sizeof path, dir, "model.safetensors") || olmo_weights_load(m, path))
        return olmo_error_context("checkpoint '%s'", dir);
    return 0;
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
