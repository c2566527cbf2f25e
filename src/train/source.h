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
};

/* Resolves src (a checkpoint is verified: sizes and hashes) and reads its
 * config into cfg (config_path, when given, replaces it). */
int olmo_source_resolve(const char *src, const char *config_path, struct olmo_model_source *s, struct olmo_config *cfg);
/* Loads the source's weights into a created model. */
int olmo_source_load_weights(const struct olmo_model_source *s, struct olmo_model *m);
const char *olmo_source_kind_name(enum olmo_source_kind k);

#endif
