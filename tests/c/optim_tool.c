/* Test helper for the optimizer step (driven by
 * tests/python/test_olmo_core_optim.py, which replays the same steps through
 * OLMo-core's SkipStepAdamW / torch's AdamW at test time).
 *
 *   optim_tool layout OUT [--set key=value ...]
 *       writes the flat parameter layout of the tool's tiny model, one line per
 *       tensor: NAME OFFSET NUMEL IS_EMBEDDING (the first line: N_FLOATS).
 *   optim_tool run PREFIX STEPS [--resume-at K] [--set key=value ...]
 *       reads PREFIX.weights (N float32), PREFIX.grads (STEPS x N float32) and
 *       PREFIX.losses (STEPS float64: each step's CE loss), and takes STEPS
 *       trainer steps with those gradients and losses through the trainer's own
 *       step guard (olmo_step_check), clipping, schedule and update (or skip);
 *       writes PREFIX.out (STEPS x N float32: the weights after every step) and
 *       PREFIX.steps (one line per step: SKIPPED LR GRAD_NORM BIAS_STEP).
 *       --resume-at K: after step K, carries the weights, moments, step counts
 *       and the optimizer's extra state (the skip-step window) into a freshly
 *       created trainer, as a checkpoint resume does, and continues there. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "config/config.h"
#include "train/trainer.h"
#include "util/error.h"

static int fail(const char *what) {
    fprintf(stderr, "optim_tool: %s: %s\n", what, olmo_last_error());
    return 1;
}

static void *read_all(const char *prefix, const char *ext, size_t bytes) {
    char path[4096];
    snprintf(path, sizeof path, "%s.%s", prefix, ext);
    FILE *f = fopen(path, "rb");
    void *buf = malloc(bytes ? bytes : 1);
    if (!f || !buf || fread(buf, 1, bytes, f) != bytes) {
        fprintf(stderr, "optim_tool: cannot read %zu bytes from %s\n", bytes, path);
        exit(1);
    }
    fclose(f);
    return buf;
}

/* Everything a checkpoint carries for the optimizer, into a new trainer. */
static int resume(struct olmo_trainer *tr, const struct olmo_config *cfg, const struct olmo_backend *be) {
    struct olmo_model *m = &tr->model;
    const size_t n = m->n_floats;
    float *w = malloc(n * sizeof(float)), *mm = malloc(n * sizeof(float)), *vv = malloc(n * sizeof(float));
    const size_t n_extra = olmo_optimizer_extra_count(&tr->opt);
    double *extra = malloc((n_extra + 1) * sizeof(double));
    if (!w || !mm || !vv || !extra) return olmo_error("out of memory");
    const long step = tr->opt.step, skipped = tr->skipped;
    if (m->be->to_host(m->be, w, m->weights, n * sizeof(float)) || olmo_optimizer_gather(&tr->opt, m, NULL, mm, vv))
        return -1;
    olmo_optimizer_extra_get(&tr->opt, extra);
    olmo_trainer_destroy(tr);
    if (olmo_trainer_init(tr, cfg, be)) return -1;
    m = &tr->model;
    if (m->be->to_device(m->be, m->weights, w, n * sizeof(float)) || olmo_model_sync_weights(m) ||
        olmo_optimizer_scatter(&tr->opt, m, mm, vv) || olmo_optimizer_extra_set(&tr->opt, extra, n_extra))
        return -1;
    tr->opt.step = step;
    tr->skipped = skipped;
    free(w);
    free(mm);
    free(vv);
    free(extra);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) return fprintf(stderr, "usage: optim_tool layout OUT | run PREFIX STEPS [...]\n"), 2;
    const bool run = !strcmp(argv[1], "run");
    if (!run && strcmp(argv[1], "layout")) return fprintf(stderr, "optim_tool: unknown mode '%s'\n", argv[1]), 2;
    int first_opt = 3;
    long steps = 0, resume_at = -1;
    if (run) {
        if (argc < 4) return fprintf(stderr, "optim_tool: run needs PREFIX STEPS\n"), 2;
        steps = atol(argv[3]);
        first_opt = 4;
    }
    struct olmo_config cfg;
    olmo_config_defaults(&cfg);
    cfg.model.vocab_size = 32;
    cfg.model.d_model = 8;
    cfg.model.n_layers = 2;
    cfg.model.n_heads = cfg.model.n_kv_heads = 2;
    cfg.model.mlp_hidden = 16;
    cfg.model.sliding_window = 4;
    cfg.model.eos_token_id = 0;
    cfg.model.pad_token_id = 1;
    cfg.train.seq_len = 4;
    cfg.train.warmup_steps = 3;
    for (int i = first_opt; i < argc; i += 2) {
        if (i + 1 >= argc) return fprintf(stderr, "optim_tool: '%s' needs a value\n", argv[i]), 2;
        if (!strcmp(argv[i], "--resume-at")) resume_at = atol(argv[i + 1]);
        else if (strcmp(argv[i], "--set") || olmo_config_set(&cfg, argv[i + 1])) return fail(argv[i + 1]);
    }
    if (!cfg.train.steps) cfg.train.steps = steps > 0 ? steps : 1;
    struct olmo_backend *be = olmo_backend_create("cpu");
    struct olmo_trainer tr;
    if (!be || olmo_trainer_init(&tr, &cfg, be)) return fail("init");
    const size_t n = tr.model.n_floats;
    if (!run) {
        FILE *f = fopen(argv[2], "w");
        if (!f) return fprintf(stderr, "optim_tool: cannot write %s\n", argv[2]), 1;
        fprintf(f, "%zu\n", n);
        for (int i = 0; i < tr.model.n_tensors; i++) {
            const struct olmo_param *p = &tr.model.params[i];
            fprintf(f, "%s %zu %zu %d\n", p->name, p->offset, p->numel, p->is_embedding ? 1 : 0);
        }
        fclose(f);
        olmo_trainer_destroy(&tr);
        olmo_backend_destroy(be);
        return 0;
    }
    const char *prefix = argv[2];
    float *w0 = read_all(prefix, "weights", n * sizeof(float));
    float *grads = read_all(prefix, "grads", (size_t)steps * n * sizeof(float));
    double *losses = read_all(prefix, "losses", (size_t)steps * sizeof(double));
    float *out = malloc((size_t)steps * n * sizeof(float) + 1);
    char path[4096];
    snprintf(path, sizeof path, "%s.steps", prefix);
    FILE *log = fopen(path, "w");
    if (!out || !log) return fprintf(stderr, "optim_tool: cannot write %s\n", path), 1;
    struct olmo_model *m = &tr.model;
    if (m->be->to_device(m->be, m->weights, w0, n * sizeof(float)) || olmo_model_sync_weights(m))
        return fail("weights");
    for (long s = 0; s < steps; s++) {
        m = &tr.model;
        struct olmo_step_result res = {.ce_loss = losses[s], .loss_tokens = 1};
        if (m->be->to_device(m->be, m->grads, grads + (size_t)s * n, n * sizeof(float)) ||
            olmo_grad_norm_of(m, &res.grad_norm))
            return fail("gradients");
        char why[OLMO_STEP_WHY_MAX];
        const long bias_next = tr.opt.step + 1;
        switch (olmo_step_check(&tr, &res, why, sizeof why)) {
        case OLMO_STEP_APPLY:
            if (olmo_trainer_update(&tr, &res)) return fail("update");
            break;
        case OLMO_STEP_SKIP: olmo_trainer_skip(&tr, &res); break;
        case OLMO_STEP_STOP: return fprintf(stderr, "optim_tool: step %ld: %s\n", s + 1, why), 1;
        }
        struct olmo_optimizer probe = tr.opt;
        probe.step = bias_next;
        fprintf(log, "%d %.17g %.17g %ld\n", res.skipped ? 1 : 0, res.lr, res.grad_norm,
                res.skipped ? 0 : olmo_optimizer_bias_step(&probe, &cfg.train));
        if (m->be->to_host(m->be, out + (size_t)s * n, m->weights, n * sizeof(float))) return fail("weights");
        if (s + 1 == resume_at && resume(&tr, &cfg, be)) return fail("resume");
    }
    fclose(log);
    snprintf(path, sizeof path, "%s.out", prefix);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(out, sizeof(float), (size_t)steps * n, f) != (size_t)steps * n)
        return fprintf(stderr, "optim_tool: cannot write %s\n", path), 1;
    fclose(f);
    olmo_trainer_destroy(&tr);
    olmo_backend_destroy(be);
    free(w0);
    free(grads);
    free(losses);
    free(out);
    return 0;
}
