/* state.json: writing it, and reading it into a manifest (the files with
 * their sizes and hashes, the shards' pieces, the run and optimizer state);
 * checking the files against it (olmo_ckpt_verify). */
#include "train/checkpoint.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "train/checkpoint_internal.h"
#include "util/error.h"
#include "util/fs.h"

static void add_file(cJSON *obj, const char *name, const struct written *wr) {
    char hex[32];
    cJSON *f = cJSON_AddObjectToObject(obj, name);
    cJSON_AddNumberToObject(f, "bytes", (double)wr->bytes);
    snprintf(hex, sizeof hex, "%016" PRIx64, wr->hash);
    cJSON_AddStringToObject(f, "hash64", hex);
}

int ckpt_opt_state_get(const struct olmo_trainer *tr, struct ckpt_opt_state *o) {
    *o = (struct ckpt_opt_state){.step = tr->opt.step, .n_extra = olmo_optimizer_extra_count(&tr->opt)};
    if (!o->n_extra) return 0;
    if (!(o->extra = olmo_malloc(sizeof(double) * o->n_extra, "skip-step window"))) return -1;
    olmo_optimizer_extra_get(&tr->opt, o->extra);
    return 0;
}

void ckpt_opt_state_free(struct ckpt_opt_state *o) {
    free(o->extra);
    *o = (struct ckpt_opt_state){0};
}

/* state.json.  files: the whole-tensor files (version 1) and config.yaml;
 * shards (version 2, NULL otherwise): one record per rank, as gathered:
 * bytes, hash, n_local, n_ranges, then n_ranges x (global, local, len). */
int ckpt_write_state(const char *dir, const struct olmo_ckpt_state *st, const struct olmo_trainer *tr,
                     const struct ckpt_opt_state *o, const char *const *names, const struct written *files,
                     int n_files, const uint64_t *shards, const size_t *shard_words, int world) {
    const struct olmo_config *cfg = &tr->cfg;
    cJSON *root = cJSON_CreateObject();
    char buf[64];
    cJSON_AddStringToObject(root, "format", CKPT_FORMAT);
    cJSON_AddNumberToObject(root, "version", shards ? 2 : 1);
    cJSON_AddStringToObject(root, "hash", CKPT_HASH_XXH3_64_NAME); /* of every "hash64" below */
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
    cJSON_AddStringToObject(opt, "name", tr->cfg.train.optimizer == OLMO_OPTIM_SKIP_STEP_ADAMW ? "SkipStepAdamW" : "AdamW");
    cJSON_AddNumberToObject(opt, "step", (double)o->step);
    if (tr->adam_step_base) cJSON_AddNumberToObject(opt, "step_base", (double)tr->adam_step_base);
    if (o->n_extra) cJSON_AddItemToObject(opt, "skip_step", cJSON_CreateDoubleArray(o->extra, (int)o->n_extra));
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

/* ---- the files' own records (their "__metadata__"), under their content hash ---- */

char *ckpt_state_record(const struct olmo_ckpt_state *st) {
    char *text = malloc(400);
    if (!text) {
        olmo_error("out of memory");
        return NULL;
    }
    snprintf(text, 400,
             "{\"step\":%ld,\"tokens\":%ld,\"skipped_steps\":%ld,\"loader_epoch\":%ld,\"loader_pos\":%zu,"
             "\"loader_n_instances\":%zu,\"loader_seed\":\"%" PRIu64 "\",\"loader_fingerprint\":\"%" PRIu64 "\"}",
             st->step, st->tokens, st->skipped, st->loader_epoch, st->loader_pos, st->loader_instances,
             st->loader_seed, st->loader_fingerprint);
    return text;
}

char *ckpt_pieces_record(const struct olmo_shard_range *r, int n) {
    const size_t cap = 4 + (size_t)n * 66;
    char *text = malloc(cap);
    if (!text) {
        olmo_error("out of memory");
        return NULL;
    }
    size_t at = (size_t)snprintf(text, cap, "[");
    for (int i = 0; i < n; i++)
        at += (size_t)snprintf(text + at, cap - at, "%s[%zu,%zu,%zu]", i ? "," : "", r[i].global, r[i].local, r[i].len);
    snprintf(text + at, cap - at, "]");
    return text;
}

/* "state.json says K = a, the file's own record b", for the first entry of
 * the two records that differs. */
static int record_mismatch(const char *dir, const char *path, const char *expected, const char *got) {
    cJSON *a = cJSON_Parse(expected), *b = cJSON_Parse(got);
    char key[64] = "", va[64] = "", vb[64] = "";
    const cJSON *x;
    cJSON_ArrayForEach(x, a) {
        const cJSON *y = cJSON_GetObjectItemCaseSensitive(b, x->string);
        char *pa = cJSON_PrintUnformatted(x), *pb = y ? cJSON_PrintUnformatted(y) : NULL;
        const bool same = pa && pb && !strcmp(pa, pb);
        if (!same) {
            snprintf(key, sizeof key, "%s", x->string);
            snprintf(va, sizeof va, "%s", pa ? pa : "?");
            snprintf(vb, sizeof vb, "%s", pb ? pb : "(none)");
        }
        free(pa);
        free(pb);
        if (!same) break;
    }
    cJSON_Delete(a);
    cJSON_Delete(b);
    if (!key[0])
        return olmo_error("checkpoint '%s': '%s' records a run state that state.json does not hold: %.200s", dir, path,
                          got);
    return olmo_error("checkpoint '%s': state.json is inconsistent with its files: it says %s = %s, but '%s' (under "
                      "the content hash) records %s; state.json was edited or belongs to another checkpoint",
                      dir, key, va, path, vb);
}

int ckpt_check_state_record(const struct manifest *mf, const struct olmo_st_file *f, const char *path) {
    const char *got = olmo_st_metadata(f, "state");
    if (!got) return 0; /* a file of an earlier olmoc (or a Python tool): no record to check */
    char *expected = ckpt_state_record(&mf->st);
    if (!expected) return -1;
    const int rc = strcmp(expected, got) ? record_mismatch(mf->dir, path, expected, got) : 0;
    free(expected);
    return rc;
}

static int json_long(const cJSON *obj, const char *key, long *out, const char *dir) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 9.0e15 || v->valuedouble != floor(v->valuedouble))
        return olmo_error("checkpoint '%s': state.json has no valid '%s'", dir, key);
    *out = (long)v->valuedouble;
    return 0;
}

void ckpt_manifest_free(struct manifest *mf) {
    free(mf->files);
    free(mf->extra);
    for (int q = 0; q < N_Q; q++) free(mf->segs[q]);
    for (int i = 0; mf->shards && i < mf->world; i++) free(mf->shards[i].pieces);
    free(mf->shards);
    memset(mf, 0, sizeof *mf);
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

/* A decimal unsigned 64-bit number, digits only (as state.json writes the
 * loader's seed and fingerprint: strings, since JSON numbers hold 53 bits). */
static bool parse_u64(const char *s, uint64_t *out) {
    uint64_t v = 0;
    if (!*s || strlen(s) > 20) return false;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9') return false;
        const uint64_t d = (uint64_t)(*p - '0');
        if (v > (UINT64_MAX - d) / 10) return false;
        v = v * 10 + d;
    }
    *out = v;
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
int ckpt_parse_state(const char *dir, struct manifest *mf) {
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
    /* the files' hash: XXH3-64, or without "hash" (earlier olmoc versions) the hash they wrote */
    const cJSON *hash = cJSON_GetObjectItemCaseSensitive(root, "hash");
    mf->hash_alg = CKPT_HASH_LEGACY64;
    if (hash) {
        if (!cJSON_IsString(hash) || strcmp(hash->valuestring, CKPT_HASH_XXH3_64_NAME)) {
            rc = olmo_error("checkpoint '%s': state.json's 'hash' is '%.40s'; this olmoc reads '" CKPT_HASH_XXH3_64_NAME
                            "' (or no 'hash': the earlier 64-bit hash)",
                            dir, cJSON_IsString(hash) ? hash->valuestring : "(not a string)");
            goto done;
        }
        mf->hash_alg = CKPT_HASH_XXH3_64;
    }
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
    const bool seed_ok = parse_u64(seed->valuestring, &st.loader_seed);
    if (!seed_ok || !parse_u64(fingerprint->valuestring, &st.loader_fingerprint)) {
        rc = olmo_error("checkpoint '%s': state.json's loader %s \"%.40s\" is not a decimal 64-bit number (a string "
                        "of digits)",
                        dir, seed_ok ? "fingerprint" : "seed", seed_ok ? fingerprint->valuestring : seed->valuestring);
        goto done;
    }
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
    if (rc) ckpt_manifest_free(mf);
    return rc;
}

/* Every file exists with its size. */
int ckpt_check_sizes(const struct manifest *mf) {
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
int ckpt_check_hashes(const struct manifest *mf, bool all) {
    char path[4096];
    for (int i = 0; i < mf->n_files; i++) {
        const struct ckpt_file *f = &mf->files[i];
        if (!all && !f->need) continue;
        uint64_t h;
        size_t size;
        if (path_join(path, sizeof path, mf->dir, f->name) || ckpt_hash_file(path, mf->hash_alg, &h, &size))
            return -1;
        char hex[32];
        snprintf(hex, sizeof hex, "%016" PRIx64, h);
        if (size != f->bytes || strcmp(hex, f->hash))
            return olmo_error("checkpoint '%s' is corrupt: the content hash of %s is %s, state.json says %s (%s)",
                              mf->dir, f->name, hex, f->hash, ckpt_hash_name(mf->hash_alg));
    }
    return 0;
}

int olmo_ckpt_verify(const char *dir, struct olmo_ckpt_state *out) {
    struct manifest mf;
    if (ckpt_parse_state(dir, &mf)) return -1;
    int rc = ckpt_check_sizes(&mf) || ckpt_check_hashes(&mf, true);
    if (!rc && out) *out = mf.st;
    ckpt_manifest_free(&mf);
    return rc;
}
