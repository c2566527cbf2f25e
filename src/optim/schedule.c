#include "optim/schedule.h"

#include <math.h>

/* One scheduler object: what OLMo-core's get_lr(initial_lr, current, t_max) sees. */
struct sched {
    enum olmo_schedule_kind kind;
    long warmup, t_max;
    long decay; /* wsd */
};

long olmo_schedule_steps_for_tokens(long tokens, long tokens_per_step) {
    /* math.ceil(tokens_remaining / tokens_per_batch) at step 0 */
    return (long)ceil((double)tokens / (double)tokens_per_step);
}

/* _linear_warmup(initial_lr, current, warmup, warmup_min_lr = 0) */
static double linear_warmup(double lr, long current, long warmup) {
    return 0.0 + (lr - 0.0) * (double)(current < warmup ? current : warmup) / (double)warmup;
}

static double cosine_lr(double lr, double alpha_f, long current, long warmup, long t_max) {
    const double eta_min = lr * alpha_f;
    if (current < warmup) return linear_warmup(lr, current, warmup);
    if (current >= t_max) return eta_min;
    const long c = current - warmup, t = t_max - warmup;
    return eta_min + (lr - eta_min) * (1 + cos(M_PI * (double)c / (double)t)) / 2;
}

static double half_cosine_lr(double lr, double alpha_f, long current, long warmup, long t_max) {
    const double eta_min = lr * alpha_f;
    if (current < warmup) return linear_warmup(eta_min + (lr - eta_min) / 2, current, warmup);
    if (current >= t_max) return eta_min;
    long c = current - warmup, t = t_max - warmup;
    c += t;
    t *= 2;
    return eta_min + (lr - eta_min) * (1 + cos(M_PI * (double)c / (double)t)) / 2;
}

static double linear_lr(double lr, double alpha_f, long current, long warmup, long t_max) {
    const double eta_min = lr * alpha_f;
    if (current < warmup) return linear_warmup(lr, current, warmup);
    if (current >= t_max) return eta_min;
    const long c = current - warmup, t = t_max - warmup;
    return lr - (lr - eta_min) * ((double)c / (double)t);
}

static double wsd_lr(double lr, long current, long warmup, long t_max, long decay) {
    if (current <= warmup) return linear_warmup(lr, current, warmup);
    if (current >= t_max - decay) {
        const long from_end = t_max - current;
        /* _linear_decay(initial_lr, t_max - current, decay, decay_min_lr = 0) */
        return decay ? 0.0 + (lr - 0.0) * (double)(from_end < decay ? from_end : decay) / (double)decay : 0.0;
    }
    return lr;
}

static double sched_lr(const struct sched *s, const struct olmo_train_config *t, long step) {
    switch (s->kind) {
    case OLMO_SCHED_COSINE: return cosine_lr(t->lr, t->alpha_f, step, s->warmup, s->t_max);
    case OLMO_SCHED_HALF_COSINE: return half_cosine_lr(t->lr, t->alpha_f, step, s->warmup, s->t_max);
    case OLMO_SCHED_LINEAR: return linear_lr(t->lr, t->alpha_f, step, s->warmup, s->t_max);
    case OLMO_SCHED_WSD: return wsd_lr(t->lr, step, s->warmup, s->t_max, s->decay);
    default: return t->lr; /* constant */
    }
}

static long schedule_length(const struct olmo_train_config *t, long steps, long tokens, long tokens_per_step) {
    if (tokens > 0) return olmo_schedule_steps_for_tokens(tokens, tokens_per_step);
    return steps > 0 ? steps : t->steps;
}

double olmo_lr_at_batch(const struct olmo_train_config *t, long tokens_per_step, long step) {
    struct sched s;
    if (t->schedule2 != OLMO_SCHED_NONE && step > t->schedule2_after) {
        s.kind = t->schedule2;
        s.warmup = t->schedule2_warmup_steps;
        s.t_max = schedule_length(t, t->schedule2_steps, t->schedule2_tokens, tokens_per_step);
    } else {
        s.kind = t->schedule;
        s.warmup = t->warmup_steps;
        s.t_max = schedule_length(t, t->schedule_steps, t->schedule_tokens, tokens_per_step);
    }
    /* WSD's decay: `decay` steps, else round(t_max * decay_fraction) (Python rounds half to even, as rint) */
    s.decay = t->decay_steps > 0 ? t->decay_steps : (long)rint((double)s.t_max * t->decay_fraction);
    return sched_lr(&s, t, step);
}

