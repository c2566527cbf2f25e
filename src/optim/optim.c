#include "optim/optim.h"

#include <math.h>

#include "util/error.h"

double olmo_lr_at(const struct olmo_train_config *t, long step) {
    const double peak = t->lr, eta_min = t->lr * t->alpha_f;
    const long t_max = t->schedule_steps > 0 ? t->schedule_steps : t->steps;
    if (t->schedule == SCHED_CONSTANT) return peak;
    if (step < t->warmup_steps) return peak * (double)step / (double)t->warmup_steps;
    if (step >= t_max) return eta_min;
    double progress = (double)(step - t->warmup_steps) / (double)(t_max - t->warmup_steps);
    if (t->schedule == SCHED_COSINE) return eta_min + (peak - eta_min) * (1.0 + cos(M_PI * progress)) / 2.0;
    return peak - progress * (peak - eta_min);
}

int olmo_optimizer_create(struct olmo_optimizer *opt, const struct olmo_model *m) {
    opt->step = 0;
    opt->m = m->be->alloc(m->n_floats * sizeof(float));
    opt->v = m->be->alloc(m->n_floats * sizeof(float));
    if (!opt->m || !opt->v) return olmo_error_context("optimizer state");
    return 0;
}

void olmo_optimizer_destroy(struct olmo_optimizer *opt, const struct olmo_model *m) {
    m->be->free(opt->m);
    m->be->free(opt->v);
    opt->m = opt->v = NULL;
}

double olmo_grad_norm(const struct olmo_model *m) { return sqrt(m->be->sum_squares(m->grads, m->n_floats)); }

void olmo_clip_grads(struct olmo_model *m, double norm, double max_norm) {
    if (max_norm <= 0) return;
    double coef = max_norm / (norm + 1e-6);
    if (coef < 1.0) m->be->scale(m->grads, m->n_floats, (float)coef);
}

void olmo_optimizer_step(struct olmo_optimizer *opt, struct olmo_model *m, const struct olmo_train_config *t,
                         double lr) {
    opt->step++;
    for (int i = 0; i < m->n_tensors; i++) {
        const struct olmo_param *p = &m->params[i];
        double wd = p->is_embedding ? t->embedding_weight_decay : t->weight_decay;
        m->be->adamw(m->weights + p->offset, m->grads + p->offset, opt->m + p->offset, opt->v + p->offset,
                     p->numel, lr, (float)t->beta1, (float)t->beta2, (float)t->eps, wd, opt->step);
    }
}
