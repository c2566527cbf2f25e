#include "model/weights.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "util/error.h"

int olmo_check_finite(const char *path, const char *tensor, const float *x, size_t n) {
    size_t bad = 0; /* a plain loop the compiler vectorises; the position only when there is one */
    for (size_t i = 0; i < n; i++) bad += !isfinite(x[i]);
    if (!bad) return 0;
    size_t i = 0;
    while (isfinite(x[i])) i++;
    return olmo_error("'%s': tensor '%s' has %zu values that are not finite (the first, element %zu, is %s): "
                      "refusing weights or optimizer state from a run that diverged or a damaged file",
                      path, tensor, bad, i, isnan(x[i]) ? "NaN" : x[i] > 0 ? "+inf" : "-inf");
}

int olmo_weights_load(struct olmo_model *m, const char *path) {
    if (m->sharded) return olmo_error("'%s': a sharded model loads weights through olmo_weights_read", path);
    float *host = malloc(m->n_floats * sizeof(float));
    if (!host) return olmo_error("out of memory loading '%s'", path);
    int rc = olmo_weights_read(m, path, host);
    if (!rc) rc = m->be->to_device(m->be, m->weights, host, m->n_floats * sizeof(float));
    if (!rc) rc = olmo_model_sync_weights(m);
    free(host);
    return rc;
}

int olmo_weights_find(const struct olmo_st_file *f, const char *path, const struct olmo_param *p,
                      const struct olmo_st_tensor **out) {
    const struct olmo_st_tensor *t = olmo_st_find(f, p->name);
    *out = t;
    if (!t) return olmo_error("'%s' has no tensor '%s'", path, p->name);
    int64_t rows = t->ndim >= 1 ? t->shape[0] : 0, cols = t->ndim == 2 ? t->shape[1] : 1;
    if (t->ndim >= 1 && t->ndim <= 2 && rows == p->rows && cols == p->cols) return 0;
    char shape[128] = "[";
    for (int d = 0; d < t->ndim && d < 8; d++)
        snprintf(shape + strlen(shape), sizeof shape - strlen(shape), d ? ", %lld" : "%lld", (long long)t->shape[d]);
    strcat(shape, "]");
    return p->cols == 1 ? olmo_error("'%s': tensor '%s' has shape %s but the config needs [%d]", path, p->name, shape,
                                     p->rows)
                        : olmo_error("'%s': tensor '%s' has shape %s but the config needs [%d, %d]", path, p->name,
                                     shape, p->rows, p->cols);
}

int olmo_weights_read(const struct olmo_model *m, const char *path, float *host) {
    struct olmo_st_file f;
    if (olmo_st_open(&f, path)) return -1;
    int rc = 0;
    for (int i = 0; i < m->n_tensors && !rc; i++) {
        const struct olmo_param *p = &m->params[i];
        const struct olmo_st_tensor *t;
        if (olmo_weights_find(&f, path, p, &t)) rc = -1;
        else if (olmo_st_read_f32(&f, t, host + p->offset) || olmo_check_finite(path, p->name, host + p->offset, p->numel))
            rc = -1;
    }
    for (int i = 0; i < f.n_tensors && !rc; i++)
        if (!olmo_model_find_param(m, f.tensors[i].name))
            rc = olmo_error("'%s' has unexpected tensor '%s' (config mismatch?)", path, f.tensors[i].name);
    olmo_st_close(&f);
    return rc;
}

int olmo_weights_save(const struct olmo_model *m, const float *which, const char *path) {
    if (!which) return olmo_error("'%s': no full-size weights to save (a sharded model: olmo_weights_save_host)", path);
    float *host = malloc(m->n_floats * sizeof(float));
    if (!host) return olmo_error("out of memory saving '%s'", path);
    int rc = m->be->to_host(m->be, host, which, m->n_floats * sizeof(float));
    if (!rc) rc = olmo_weights_save_host(m, host, path);
    free(host);
    return rc;
}

int olmo_weights_save_host(const struct olmo_model *m, const float *host, const char *path) {
    struct olmo_st_writer w = {0};
    int rc = 0;
    for (int i = 0; i < m->n_tensors && !rc; i++) {
        const struct olmo_param *p = &m->params[i];
        int64_t shape[2] = {p->rows, p->cols};
        rc = olmo_st_writer_add(&w, p->name, OLMO_ST_F32, p->cols == 1 ? 1 : 2, shape, host + p->offset);
    }
    if (!rc) rc = olmo_st_writer_save(&w, path);
    olmo_st_writer_free(&w);
    return rc;
}
