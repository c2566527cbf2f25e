#include "optim/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

int olmo_optimizer_create(struct olmo_optimizer *opt, const struct olmo_model *m, const struct olmo_dist *dist) {
    opt->step = 0;
    opt->lo = 0;
    opt->hi = m->n_floats;
    if (dist) olmo_dist_shard(dist, m->n_floats, &opt->lo, &opt->hi);
    size_t n = opt->hi - opt->lo;
    opt->ranges = olmo_malloc(sizeof *opt->ranges, "shard ranges");
    if (!opt->ranges) return -1;
    opt->ranges[0] = (struct olmo_shard_range){.global = opt->lo, .local = 0, .len = n};
    opt->n_ranges = 1;
    opt->n_local = n;
    opt->master = NULL;
    opt->primary = true;
    opt->m = m->be->alloc(m->be, n * sizeof(float));
    opt->v = m->be->alloc(m->be, n * sizeof(float));
    if (!opt->m || !opt->v) return olmo_error_context("optimizer state");
    return 0;
}

void olmo_optimizer_destroy(struct olmo_optimizer *opt, const struct olmo_model *m) {
    m->be->free(m->be, opt->m);
    m->be->free(m->be, opt->v);
    opt->m = opt->v = NULL;
    free(opt->ranges);
    opt->ranges = NULL;
    opt->n_ranges = 0;
}

float *olmo_optimizer_master(const struct olmo_optimizer *opt, const struct olmo_model *m) {
    return opt->master ? opt->master : m->weights + opt->lo;
}

int olmo_grad_norm_of(const struct olmo_model *m, double *norm) {
    double ss;
    if (m->be->sum_squares(m->be, m->grads, m->n_floats, &ss)) return -1;
    *norm = sqrt(ss);
    return 0;
}

double olmo_grad_norm(const struct olmo_model *m) {
    double norm;
    return olmo_grad_norm_of(m, &norm) ? NAN : norm;
}

int olmo_clip_grads(struct olmo_model *m, double norm, double max_norm) {
    if (max_norm <= 0) return 0;
    double coef = max_norm / (norm + 1e-6);
    return coef < 1.0 ? m->be->scale(m->be, m->grads, m->n_floats, (float)coef) : 0;
}

int olmo_optimizer_step(struct olmo_optimizer *opt, struct olmo_model *m, const struct olmo_train_config *t,
                         double lr) {
    opt->step++;
    for (int i = 0; i < m->n_tensors; i++) {
        const struct olmo_param *p = &m->params[i];
        /* the part of this tensor inside the shard */
        size_t lo = p->offset > opt->lo ? p->offset : opt->lo;
        size_t hi = p->offset + p->numel < opt->hi ? p->offset + p->numel : opt->hi;
        if (lo >= hi) continue;
        double wd = p->is_embedding ? t->embedding_weight_decay : t->weight_decay;
        if (m->be->adamw(m->be, m->weights + lo, m->grads + lo, opt->m + (lo - opt->lo), opt->v + (lo - opt->lo),
                         hi - lo, lr, (float)t->beta1, (float)t->beta2, (float)t->eps, wd, opt->step))
            return -1;
    }
    return 0;
}

int olmo_optimizer_gather(const struct olmo_optimizer *opt, const struct olmo_model *m, const struct olmo_dist *dist,
                          float *m_host, float *v_host) {
    if (opt->master) { /* any layout: every element has one primary owner, the others add zeros (exact) */
        memset(m_host, 0, m->n_floats * sizeof(float));
        memset(v_host, 0, m->n_floats * sizeof(float));
        for (int i = 0; i < opt->n_ranges && opt->primary; i++) {
            const struct olmo_shard_range *r = &opt->ranges[i];
            if (m->be->to_host(m->be, m_host + r->global, opt->m + r->local, r->len * sizeof(float)) ||
                m->be->to_host(m->be, v_host + r->global, opt->v + r->local, r->len * sizeof(float)))
                return -1;
        }
        if (!dist) return 0;
        return olmo_dist_allreduce_f32(dist, m_host, m->n_floats) || olmo_dist_allreduce_f32(dist, v_host, m->n_floats)
                   ? -1
                   : 0;
    }
    size_t n = opt->hi - opt->lo;
    if (m->be->to_host(m->be, m_host + opt->lo, opt->m, n * sizeof(float)) ||
        m->be->to_host(m->be, v_host + opt->lo, opt->v, n * sizeof(float)))
        return -1;
    if (!dist || dist->world == 1) return 0;
    size_t *offsets = olmo_malloc(sizeof(size_t) * (size_t)(dist->world + 1), "shard offsets");
    if (!offsets) return -1;
    olmo_dist_shard_offsets(dist, m->n_floats, offsets);
    int rc = olmo_dist_allgather_f32(dist, m_host, offsets) || olmo_dist_allgather_f32(dist, v_host, offsets);
    free(offsets);
    return rc ? -1 : 0;
}

int olmo_optimizer_scatter(struct olmo_optimizer *opt, const struct olmo_model *m, const float *m_host,
                           const float *v_host) {
    for (int i = 0; i < opt->n_ranges; i++) {
        const struct olmo_shard_range *r = &opt->ranges[i];
        if (m->be->to_device(m->be, opt->m + r->local, m_host + r->global, r->len * sizeof(float)) ||
            m->be->to_device(m->be, opt->v + r->local, v_host + r->global, r->len * sizeof(float)))
            return -1;
    }
    return 0;
}
