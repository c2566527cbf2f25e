#include "model/sample.h"

#include <math.h>
#include <stdlib.h>

struct prob_index {
    double p;
    int i;
};

static int cmp_prob_desc(const void *a, const void *b) {
    const struct prob_index *x = a, *y = b;
    if (x->p != y->p) return x->p < y->p ? 1 : -1;
    return (x->i > y->i) - (x->i < y->i);
}

int olmo_sample_token(const float *logits, int vocab, double temperature, double top_p, struct olmo_rng *rng) {
    int best = 0;
    for (int i = 1; i < vocab; i++)
        if (logits[i] > logits[best]) best = i;
    if (temperature <= 0) return best;
    struct prob_index *p = malloc(sizeof *p * (size_t)vocab);
    if (!p) return best; /* out of memory: fall back to greedy rather than fail mid-generation */
    double total = 0.0;
    for (int i = 0; i < vocab; i++) {
        p[i].p = exp(((double)logits[i] - logits[best]) / temperature);
        p[i].i = i;
        total += p[i].p;
    }
    int keep = vocab;
    if (top_p < 1.0) {
        qsort(p, (size_t)vocab, sizeof *p, cmp_prob_desc);
        double cum = 0.0;
        for (keep = 0; keep < vocab;) {
            cum += p[keep++].p;
            if (cum >= top_p * total) break;
        }
        total = cum;
    }
    double u = olmo_rng_uniform(rng) * total, acc = 0.0;
    int chosen = p[keep - 1].i;
    for (int k = 0; k < keep; k++) {
        acc += p[k].p;
        if (u < acc) {
            chosen = p[k].i;
            break;
        }
    }
    free(p);
    return chosen;
}
