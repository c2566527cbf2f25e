/* Loading a checkpoint: into a trainer (resume, or a new stage), into a
 * whole model, or a trainer's initial weights from one safetensors file;
 * the config it was written with; the data loader's position. */
#include "train/checkpoint.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/checkpoint_internal.h"
#include "util/error.h"

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
    if (ckpt_parse_state(dir, &mf)) return -1;
    const bool moments = kind != LOAD_WEIGHTS;
    int rc = ckpt_check_sizes(&mf) || olmo_ckpt_read_config(dir, &ck) ||
             check_compatible(dir, &ck, &tr->cfg, kind == LOAD_RESUME);
    if (!rc && ckpt_build_segments(&mf, &tr->model, moments)) rc = olmo_error_context("checkpoint '%s'", dir);
    if (!rc) {
        ckpt_mark_needed(&mf, tr->opt.ranges, tr->opt.n_ranges, Q_MASTER, moments ? Q_V : Q_MASTER);
        rc = ckpt_check_hashes(&mf, false);
        if (!rc && moments && ckpt_read_steps(&mf)) rc = olmo_error_context("checkpoint '%s'", dir);
    }
    float *dsts[N_Q] = {olmo_optimizer_master(&tr->opt, &tr->model), tr->opt.m, tr->opt.v};
    if (!rc && ckpt_read_quantities(&mf, Q_MASTER, moments ? Q_V : Q_MASTER, tr->opt.ranges, tr->opt.n_ranges, dsts,
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
        if (!rc && mf.has_extra && tr->cfg.train.optimizer == OLMO_OPTIM_SKIP_STEP_ADAMW &&
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
    if (!rc && ckpt_check_records(&mf)) rc = -1;
    ckpt_manifest_free(&mf);
    rc = ckpt_agree(tr->dist, rc, "loading the checkpoint");
    return ckpt_master_loaded(tr, rc);
}

int olmo_ckpt_load(const char *dir, struct olmo_trainer *tr, struct olmo_ckpt_state *st) {
    return load_into_trainer(dir, tr, st, LOAD_RESUME);
}

int olmo_ckpt_init_from(const char *dir, struct olmo_trainer *tr, bool with_optimizer_state) {
    return load_into_trainer(dir, tr, NULL, with_optimizer_state ? LOAD_WEIGHTS_AND_MOMENTS : LOAD_WEIGHTS);
}

int olmo_ckpt_load_weights(const char *dir, struct olmo_model *m) {
    struct manifest mf;
    if (ckpt_parse_state(dir, &mf)) return -1;
    const struct olmo_shard_range all = {.global = 0, .local = 0, .len = m->n_floats};
    int rc = ckpt_check_sizes(&mf);
    if (!rc && ckpt_build_segments(&mf, m, false)) rc = olmo_error_context("checkpoint '%s'", dir);
    if (!rc) {
        ckpt_mark_needed(&mf, &all, 1, Q_MASTER, Q_MASTER);
        rc = ckpt_check_hashes(&mf, false) || ckpt_check_records(&mf) ? -1 : 0;
    }
    float *dsts[N_Q] = {m->weights, NULL, NULL};
    if (!rc && ckpt_read_quantities(&mf, Q_MASTER, Q_MASTER, &all, 1, dsts, m->be))
        rc = olmo_error_context("checkpoint '%s'", dir);
    if (!rc) rc = olmo_model_sync_weights(m);
    ckpt_manifest_free(&mf);
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
    if (!rc)
        rc = ckpt_segs_v1_model(&mf, &tr->model, path, 0) || ckpt_check_tiling(&mf, tr->model.n_floats, Q_MASTER)
                 ? -1
                 : 0;
    if (!rc) {
        ckpt_mark_needed(&mf, tr->opt.ranges, tr->opt.n_ranges, Q_MASTER, Q_MASTER);
        float *dsts[N_Q] = {olmo_optimizer_master(&tr->opt, &tr->model), NULL, NULL};
        rc = ckpt_read_quantities(&mf, Q_MASTER, Q_MASTER, tr->opt.ranges, tr->opt.n_ranges, dsts, tr->model.be);
    }
    ckpt_manifest_free(&mf);
    rc = ckpt_agree_message(tr->dist, rc);
    return ckpt_master_loaded(tr, rc);
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
