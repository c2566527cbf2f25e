#include "model/sample.h"

#include <stdlib.h>

#include "model/generate.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/rng.h"

int olmo_generate_tokens(struct olmo_model *m, int32_t *ids, int n_prompt, const struct olmo_sample_options *o,
                         struct olmo_sample_result *r) {
    r->n_new = 0;
    r->prefill_s = r->decode_s = 0;
    const int total = n_prompt + o->max_new_tokens, vocab = m->cfg.vocab_size;
    struct olmo_gen gen = {0};
    float *logits = olmo_malloc(sizeof(float) * (size_t)vocab, "logits");
    if (!logits || olmo_gen_create(&gen, m, total, 64)) goto fail;
    struct olmo_rng rng;
    olmo_rng_seed(&rng, o->seed);
    const double t0 = olmo_now_seconds();
    for (int p = 0; p < n_prompt; p += gen.chunk) { /* prefill */
        int n = n_prompt - p < gen.chunk ? n_prompt - p : gen.chunk;
        if (olmo_gen_feed(&gen, ids + p, n, logits)) goto fail;
    }
    const double t1 = olmo_now_seconds();
    int len = n_prompt;
    while (len < total) {
        int32_t next = olmo_sample_token(logits, vocab, o->temperature, o->top_p, &rng);
        ids[len++] = next;
        if (!o->ignore_eos && next == o->eos_id) break;
        if (len < total && olmo_gen_feed(&gen, &next, 1, logits)) goto fail;
    }
    r->n_new = len - n_prompt;
    r->prefill_s = t1 - t0;
    r->decode_s = olmo_now_seconds() - t1;
    olmo_gen_destroy(&gen);
    free(logits);
    return 0;
fail:
    olmo_gen_destroy(&gen);
    free(logits);
    return -1;
}
