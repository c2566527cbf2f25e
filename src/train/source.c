#include "train/source.h"

#include <stdio.h>
#include <string.h>

#include "model/hf.h"
#include "model/weights.h"
#include "train/checkpoint.h"
#include "util/error.h"
#include "util/fs.h"

const char *olmo_source_kind_name(enum olmo_source_kind k) {
    switch (k) {
    case OLMO_SRC_CHECKPOINT: return "checkpoint";
    case OLMO_SRC_RUN_DIR: return "run directory";
    case OLMO_SRC_HF_DIR: return "Hugging Face directory";
    case OLMO_SRC_FILE: return "safetensors file";
    }
    return "?";
}

static bool has(const char *dir, const char *name) {
    char p[4400];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return olmo_is_file(p);
}

void (*olmo_source_open_hook)(const char *checkpoint, void *arg);
void *olmo_source_open_hook_arg;

/* After a failure to open s->dir, the newest checkpoint of a run directory:
 * 1 when s->dir was rotated away (it is gone, or no longer the newest) and
 * s->dir is now the newest, 0 when the failure is the checkpoint's own. */
static int rotated_away(struct olmo_model_source *s) {
    if (!s->run_dir[0] || s->rotated >= OLMO_SOURCE_RETRIES) return 0;
    char newest[4096];
    const int found = olmo_ckpt_find_latest(s->run_dir, newest, sizeof newest);
    if (found <= 0 || (!strcmp(newest, s->dir) && olmo_is_dir(s->dir))) return 0;
    s->rotated++;
    snprintf(s->note, sizeof s->note,
             "checkpoint '%s' was rotated away (removed by the run's checkpoint retention) while it was being "
             "opened; using the newest, '%s'%s",
             s->dir, newest, s->rotated > 1 ? " (after several rotations)" : "");
    snprintf(s->dir, sizeof s->dir, "%s", newest);
    snprintf(s->weights, sizeof s->weights, "%s/model.safetensors", s->dir);
    return 1;
}

static void before_open(const struct olmo_model_source *s) {
    if (s->run_dir[0] && olmo_source_open_hook) olmo_source_open_hook(s->dir, olmo_source_open_hook_arg);
}

int olmo_source_resolve(const char *src, const char *config_path, struct olmo_model_source *s, struct olmo_config *cfg) {
    memset(s, 0, sizeof *s);
    olmo_config_defaults(cfg);
    if (strlen(src) >= 4000) return olmo_error("path too long: '%.60s...'", src);
    if (olmo_is_dir(src)) {
        snprintf(s->dir, sizeof s->dir, "%s", src);
        if (has(src, "state.json") || has(src, "optim.safetensors")) { /* a checkpoint, maybe damaged */
            s->kind = OLMO_SRC_CHECKPOINT;
        } else if (has(src, "config.json")) {
            s->kind = OLMO_SRC_HF_DIR;
        } else {
            int found = olmo_ckpt_find_latest(src, s->dir, sizeof s->dir);
            if (found < 0) return -1;
            if (found) {
                s->kind = OLMO_SRC_CHECKPOINT;
                snprintf(s->run_dir, sizeof s->run_dir, "%s", src);
            }
            else if (has(src, "config.yaml") && has(src, "model.safetensors")) s->kind = OLMO_SRC_RUN_DIR;
            else
                return olmo_error("'%s' is not a checkpoint (state.json), a run directory (step-*/ or config.yaml + "
                                  "model.safetensors) or a Hugging Face directory (config.json)",
                                  src);
        }
        if (s->kind != OLMO_SRC_HF_DIR) snprintf(s->weights, sizeof s->weights, "%s/model.safetensors", s->dir);
    } else if (olmo_is_file(src)) {
        s->kind = OLMO_SRC_FILE;
        snprintf(s->weights, sizeof s->weights, "%s", src);
        if (!config_path) return olmo_error("'%s' is a weights file: give its model config with --config", src);
    } else {
        return olmo_error("'%s' does not exist", src);
    }
    if (s->kind == OLMO_SRC_CHECKPOINT) {
        int rc;
        do {
            before_open(s);
            rc = olmo_ckpt_verify(s->dir, NULL);
            if (!rc && !config_path) rc = olmo_ckpt_read_config(s->dir, cfg); /* verified */
        } while (rc && rotated_away(s));
        if (rc) return -1;
        if (!config_path) return 0;
    }
    if (config_path) return olmo_config_load(cfg, config_path);
    char path[4400];
    switch (s->kind) {
    case OLMO_SRC_CHECKPOINT: break;
    case OLMO_SRC_RUN_DIR:
        snprintf(path, sizeof path, "%s/config.yaml", s->dir);
        return olmo_config_load(cfg, path);
    case OLMO_SRC_HF_DIR:
        snprintf(path, sizeof path, "%s/config.json", s->dir);
        return olmo_hf_read_config(path, cfg);
    case OLMO_SRC_FILE: break;
    }
    return 0;
}

int olmo_source_load_weights(struct olmo_model_source *s, struct olmo_model *m) {
    int rc;
    switch (s->kind) {
    case OLMO_SRC_HF_DIR: return olmo_hf_load_weights(m, s->dir);
    case OLMO_SRC_CHECKPOINT: /* whole tensors or shards */
        do {
            before_open(s);
            rc = olmo_ckpt_load_weights(s->dir, m);
        } while (rc && rotated_away(s));
        return rc;
    case OLMO_SRC_RUN_DIR:
    case OLMO_SRC_FILE: return olmo_weights_load(m, s->weights);
    }
    return olmo_error("internal: bad model source");
}
