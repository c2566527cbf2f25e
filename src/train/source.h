/* Where eval / generate / convert get a model from: a checkpoint directory
 * (step-NNNNNN/), a run directory (its newest checkpoint, else its
 * config.yaml + model.safetensors), a Hugging Face directory (config.json +
 * safetensors, single or sharded), or a .safetensors file with --config. */
#ifndef OLMOC_TRAIN_SOURCE_H
#define OLMOC_TRAIN_SOURCE_H

#include "config/config.h"
#include "model/model.h"

enum olmo_source_kind { OLMO_SRC_CHECKPOINT, OLMO_SRC_RUN_DIR, OLMO_SRC_HF_DIR, OLMO_SRC_FILE };

struct olmo_model_source {
    enum olmo_source_kind kind;
    char dir[4096];     /* checkpoint / run / HF directory */
    char weights[4200]; /* safetensors file (not for OLMO_SRC_HF_DIR) */
    char run_dir[4096]; /* the run directory whose newest checkpoint dir is ("" otherwise) */
    int rotated;        /* how many times that checkpoint was rotated away while being opened */
    char note[8400];    /* what the caller should tell the user ("" if nothing): the rotations */
};

/* Resolves src (a checkpoint is verified: sizes and hashes) and reads its
 * config into cfg (config_path, when given, replaces it).  A run directory of
 * a live run: its newest checkpoint can be deleted by the run's retention
 * (train.keep_last) while it is opened; then the newest one is opened
 * instead, up to OLMO_SOURCE_RETRIES times, and s->note says so. */
int olmo_source_resolve(const char *src, const char *config_path, struct olmo_model_source *s, struct olmo_config *cfg);
/* Loads the source's weights into a created model (a run directory's
 * checkpoint rotated away meanwhile: its newest, as above; s->dir follows). */
int olmo_source_load_weights(struct olmo_model_source *s, struct olmo_model *m);
#define OLMO_SOURCE_RETRIES 8
/* For tests: called with a run directory's checkpoint just before it is
 * opened (resolve, load), as a live run's rotation could strike there. */
extern void (*olmo_source_open_hook)(const char *checkpoint, void *arg);
extern void *olmo_source_open_hook_arg;
const char *olmo_source_kind_name(enum olmo_source_kind k);

#endif
