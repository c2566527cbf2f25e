#include "optim/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

int olmo_optimizer_create(struct olmo_optimizer *opt, const struct olmo_model *m, const struct olmo_dist *dist) {
    opt->step = 0;
    opt->win = (struct olmo_skip_window){0};
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
    free(opt->win.loss);
    free(opt->win.norm);
    opt->win = (struct olmo_skip_window){0};
    opt->n_ranges = 0;
}

int olmo_optimizer_configure(struct olmo_optimizer *opt, const struct olmo_train_config *t) {
    free(opt->win.loss);
    free(opt->win.norm);
    opt->win = (struct olmo_skip_window){0};
    if (t->optimizer != OLMO_OPTIM_SKIP_STEP_ADAMW) return 0;
    const int cap = t->rolling_interval_length + 1;
    opt->win.loss = olmo_malloc(sizeof(double) * (size_t)cap, "skip-step window");
    opt->win.norm = olmo_malloc(sizeof(double) * (size_t)cap, "skip-step window");
    if (!opt->win.loss || !opt->win.norm) return -1;
    opt->win.cap = cap;
    return 0;
}

long olmo_optimizer_bias_step(const struct olmo_optimizer *opt, const struct olmo_train_config *t) {
    if (t->optimizer == OLMO_OPTIM_SKIP_STEP_ADAMW && !t->step_increment_bugfix) return 1;
    return opt->step + (t->optim_init_step ? 1 : 0);
}

/* appends x to a FIFO of at most cap entries */
static void window_append(double *a, int *n, int cap, double x) {
    if (*n == cap) {
        memmove(a, a + 1, sizeof(double) * (size_t)(cap - 1));
        (*n)--;
    }
    a[(*n)++] = x;
}

void olmo_skip_window_push(struct olmo_skip_window *w, double loss, bool has_norm, double grad_norm) {
    if (!w->cap) return;
    window_append(w->loss, &w->n_loss, w->cap, (float)loss);
    if (has_norm) window_append(w->norm, &w->n_norm, w->cap, (float)grad_norm);
}

/* (latest - mean) <= sigma * std over a[0 .. n-2], latest a[n-1] (torch.std_mean, correction 1) */
static bool within(const double *a, int n, double sigma) {
    const int k = n - 1;
    double mean = 0.0, ss = 0.0;
    for (int i = 0; i < k; i++) mean += a[i];
    mean /= k;
    for (int i = 0; i < k; i++) ss += (a[i] - mean) * (a[i] - mean);
    const double std = sqrt(ss / (k - 1)); /* one entry: 0/0 = NaN, as torch.std of one value */
    return a[k] - mean <= sigma * std;
}

int olmo_skip_window_spikes(const struct olmo_skip_window *w, int rolling_interval_length, double sigma_factor) {
    const int min = rolling_interval_length / 2 > 2 ? rolling_interval_length / 2 : 2;
    if (!w->cap || w->n_loss < min) return 0;
    return (within(w->loss, w->n_loss, sigma_factor) ? 0 : OLMO_SPIKE_LOSS) |
           (w->n_norm < 2 || within(w->norm, w->n_norm, sigma_factor) ? 0 : OLMO_SPIKE_GRAD_NORM);
}

size_t olmo_optimizer_extra_count(const struct olmo_optimizer *opt) {
    return opt->win.cap ? 2 + (size_t)opt->win.n_loss + (size_t)opt->win.n_norm : 0;
}

void olmo_optimizer_extra_get(const struct olmo_optimizer *opt, double *out) {
    if (!opt->win.cap) return;
    out[0] = opt->win.n_loss;
    out[1] = opt->win.n_norm;
    memcpy(out + 2, opt->win.loss, sizeof(double) * (size_t)opt->win.n_loss);
    memcpy(out + 2 + opt->win.n_loss, opt->win.norm, sizeof(double) * (size_t)opt->win.n_norm);
}

int olmo_optimizer_extra_set(struct olmo_optimizer *opt, const double *in, size_t n) {
    struct olmo_skip_window *w = &opt->win;
    if (!w->cap) {
        if (n) return olmo_error("optimizer state has a skip-step window (%zu values) but train.optimizer is adamw", n);
        return 0;
    }
    if (n < 2 || !(in[0] >= 0 && in[0] <= w->cap && in[0] == floor(in[0])) ||
        !(in[1] >= 0 && in[1] <= w->cap && in[1] == floor(in[1])) || n != 2 + (size_t)in[0] + (size_t)in[1])
        return olmo_error("skip-step window state: %zu values do not hold a window of at most %d losses and gradient "
                          "norms (train.rolling_interval_length + 1)",
                          n, w->cap);
    for (size_t i = 2; i < n; i++)
        if (!isfinite(in[i])) return olmo_error("skip-step window state: value %zu is not finite", i - 2);
    w->n_loss = (int)in[0];
    w->n_norm = (int)in[1];
    memcpy(w->loss, in + 2, sizeof(double) * (size_t)w->n_loss);
    memcpy(w->norm, in + 2 + w->n_loss, sizeof(double) * (size_t)w->n_norm);
    return 0;
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

float olmo_clip_scale(double norm, double max_norm) {
    if (max_norm <= 0) return 1.0f;
    const double coef = max_norm / (norm + 1e-6);
    return coef < 1.0 ? (float)coef : 1.0f;
}

int olmo_clip_grads(struct olmo_model *m, double norm, double max_norm) {
    const float scale = olmo_clip_scale(norm, max_norm);
    return scale != 1.0f ? m->be->scale(m->be, m->grads, m->n_floats, scale) : 0;
}

int olmo_optimizer_step(struct olmo_optimizer *opt, struct olmo_model *m, const struct olmo_train_config *t,
                         double lr) {
    opt->step++;
    const long bias_step = olmo_optimizer_bias_step(opt, t);
    for (int i = 0; i < m->n_tensors; i++) {
        const struct olmo_param *p = &m->params[i];
        /* the part of this tensor inside the shard */
        size_t lo = p->offset > opt->lo ? p->offset : opt->lo;
        size_t hi = p->offset + p->numel < opt->hi ? p->offset + p->numel : opt->hi;
        if (lo >= hi) continue;
        double wd = p->is_embedding ? t->embedding_weight_decay : t->weight_decay;
        if (m->be->adamw(m->be, m->weights + lo, m->grads + lo, opt->m + (lo - opt->lo), opt->v + (lo - opt->lo),
                         hi - lo, lr, (float)t->beta1, (float)t->beta2, (float)t->eps, wd, bias_step))
            return -1;
    }
    return 0;
}

int olmo_optimizer_clip_step(struct olmo_optimizer *opt, struct olmo_model *m, const struct olmo_train_config *t,
                             double lr, double norm, bool with_compute, bool *synced) {
    const struct olmo_backend *be = m->be;
    *synced = false;
    /* the one range of the other weight decay: the embedding tensor */
    const struct olmo_param *emb = NULL;
    int n_emb = 0;
    for (int i = 0; i < m->n_tensors; i++)
        if (m->params[i].is_embedding) emb = &m->params[i], n_emb++;
    if (!be->adamw_flat || opt->master || n_emb > 1 || opt->hi <= opt->lo)
        return olmo_clip_grads(m, norm, t->clip_grad_norm) || olmo_optimizer_step(opt, m, t, lr) ? -1 : 0;
    const float scale = olmo_clip_scale(norm, t->clip_grad_norm); /* x * 1.0f == x: no clipping */
    opt->step++;
    const long bias_step = olmo_optimizer_bias_step(opt, t);
    struct olmo_adamw_flat f = {.weight_decay = t->weight_decay, .weight_decay2 = t->embedding_weight_decay,
                                .grad_scale = scale};
    if (emb) { /* its part of the shard, shard-relative */
        const size_t lo = emb->offset > opt->lo ? emb->offset : opt->lo;
        const size_t hi = emb->offset + emb->numel < opt->hi ? emb->offset + emb->numel : opt->hi;
        if (lo < hi) f.wd2_lo = lo - opt->lo, f.wd2_hi = hi - opt->lo;
    }
    if (with_compute && m->compute.numel && m->compute.dtype == OLMO_BF16)
        f.compute = (char *)m->compute.data + opt->lo * olmo_float_type_size(OLMO_BF16);
    if (be->adamw_flat(be, m->weights + opt->lo, m->grads + opt->lo, opt->m, opt->v, opt->hi - opt->lo, lr,
                       (float)t->beta1, (float)t->beta2, (float)t->eps, &f, bias_step))
        return -1;
    *synced = f.compute != NULL;
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
