/* Model weights <-> safetensors with Hugging Face Olmo3ForCausalLM names. */
#ifndef OLMOC_WEIGHTS_H
#define OLMOC_WEIGHTS_H

#include "model/model.h"

/* Strict: every parameter must be present with its exact shape, and no
 * unexpected tensor may be present.  Float16/bfloat16 are widened to fp32. */
int olmo_weights_load(struct olmo_model *m, const char *path);
/* which: m->weights or m->grads (any buffer with the parameter layout). */
int olmo_weights_save(const struct olmo_model *m, const float *which, const char *path);

#endif
