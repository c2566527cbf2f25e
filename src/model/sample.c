#include "model/sample.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

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
        if (o->on_token && o->on_token(o->user, next)) goto fail;
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

void olmo_text_stream_init(struct olmo_text_stream *s, const struct olmo_tokenizer *tok, FILE *out, bool skip_special) {
    memset(s, 0, sizeof *s);
    s->tok = tok;
    s->out = out;
    s->skip_special = skip_special;
}

/* Repairs pending + bytes[0, n) and writes it, keeping an incomplete final character unless final. */
static int stream_write(struct olmo_text_stream *s, const uint8_t *bytes, size_t n, bool final) {
    const size_t len = s->n_pending + n;
    uint8_t *in = olmo_malloc(len + 1, "decoded text"), *fixed = olmo_malloc(3 * len + 1, "decoded text");
    if (!in || !fixed) {
        free(in);
        free(fixed);
        return -1;
    }
    memcpy(in, s->pending, s->n_pending);
    if (n) memcpy(in + s->n_pending, bytes, n);
    size_t used = len;
    const size_t m = olmo_utf8_sanitize(in, len, fixed, final, &used, NULL);
    if (final) used = len;
    /* not final: what is left is a so-far valid start of one character (at most 3 bytes) */
    s->n_pending = len - used;
    memcpy(s->pending, in + used, s->n_pending);
    int rc = 0;
    if (m && fwrite(fixed, 1, m, s->out) != m) rc = olmo_error("writing the text failed: %s", strerror(errno));
    if (!rc && fflush(s->out)) rc = olmo_error("writing the text failed: %s", strerror(errno));
    free(in);
    free(fixed);
    return rc;
}

int olmo_text_stream_push(struct olmo_text_stream *s, uint32_t id) {
    size_t n;
    const uint8_t *b = olmo_tokenizer_token_bytes(s->tok, id, &n);
    if (!b || (s->skip_special && olmo_tokenizer_is_special(s->tok, id))) return 0;
    return stream_write(s, b, n, false);
}

int olmo_text_stream_finish(struct olmo_text_stream *s) { return s->n_pending ? stream_write(s, NULL, 0, true) : 0; }
