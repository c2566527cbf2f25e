/* Model weights <-> safetensors with Hugging Face Olmo3ForCausalLM names. */
#ifndef OLMOC_WEIGHTS_H
#define OLMOC_WEIGHTS_H

#include "io/safetensors.h"
#include "model/model.h"

/* Strict: every parameter must be present with its exact shape, no
 * unexpected tensor may be present, and every value must be finite (a NaN or
 * inf is refused, naming the tensor).  Float16/bfloat16 are widened to fp32. */
int olmo_weights_load(struct olmo_model *m, const char *path);
/* The same checks, into full-size host memory (m->n_floats) instead of the model (a sharded model). */
int olmo_weights_read(const struct olmo_model *m, const char *path, float *host);
/* Parameter p's tensor in an open safetensors file (path names it in messages), with p's exact
 * shape: 0, or -1 with the error set (missing, or another shape). */
int olmo_weights_find(const struct olmo_st_file *f, const char *path, const struct olmo_param *p,
                      const struct olmo_st_tensor **t);
/* which: m->weights or m->grads (any buffer with the parameter layout). */
int olmo_weights_save(const struct olmo_model *m, const float *which, const char *path);
/* From full-size host memory (e.g. olmo_trainer_get_weights of a sharded run). */
int olmo_weights_save_host(const struct olmo_model *m, const float *host, const char *path);

/* Refuses a tensor holding a NaN or inf (x: n floats read from path),
 * naming it and the first such element; 0 when every value is finite. */
int olmo_check_finite(const char *path, const char *tensor, const float *x, size_t n);

#endif
