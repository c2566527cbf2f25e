/* Backend parity, whole models: two tiny models trained for a few steps on the CPU reference and on the
 * backend under test (test_backend_parity.c runs the ops); losses, gradients and parameters compared. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_parity.h"
#include "model/model.h"
#include "train/trainer.h"
#include "util/error.h"

static double model_buffer_err(struct olmo_model *mr, struct olmo_model *md, const float *r, const float *d,
                               const char **worst_name) {
    float *hr = xmalloc(mr->n_floats * sizeof(float)), *hd = xmalloc(md->n_floats * sizeof(float));
    ref->to_host(ref, hr, r, mr->n_floats * sizeof(float));
    dut->to_host(dut, hd, d, md->n_floats * sizeof(float));
    double worst = 0.0;
    for (int i = 0; i < mr->n_tensors; i++) {
        const struct olmo_param *p = &mr->params[i];
        double e = rel_err_host(hr + p->offset, hd + p->offset, p->numel);
        if (!(e <= worst)) {
            worst = e;
            *worst_name = p->name;
        }
    }
    free(hr);
    free(hd);
    return worst;
}

/* A trainer on `be` with the same seeded initial weights on every backend. */
static int make_trainer(const struct olmo_config *cfg, const struct olmo_backend *be, struct olmo_trainer *tr) {
    if (olmo_trainer_init(tr, cfg, be)) return -1;
    olmo_model_init_weights(&tr->model, 1234);
    return 0;
}

void test_model(const char *label, const struct olmo_config *cfg, int steps) {
    const struct olmo_train_config *t = &cfg->train;
    const size_t per_step = (size_t)t->grad_accum * t->micro_batch * t->seq_len;
    int32_t *data = xmalloc(per_step * (size_t)steps * sizeof(int32_t));
    for (size_t i = 0; i < per_step * (size_t)steps; i++)
        data[i] = olmo_rng_uniform(&rng) < 0.05 ? cfg->model.eos_token_id
                                                  : (int32_t)(olmo_rng_next(&rng) % (uint64_t)cfg->model.vocab_size);
    struct olmo_trainer tr_r, tr_d, tr_d2;
    bool twice = check_determinism;
    if (make_trainer(cfg, ref, &tr_r) || make_trainer(cfg, dut, &tr_d) || (twice && make_trainer(cfg, dut, &tr_d2))) {
        fprintf(stderr, "test_backend_parity: %s\n", olmo_last_error());
        exit(1);
    }
    char name[160];
    double worst_loss = 0.0, grad_err_first = 0.0, grad_err_last = 0.0;
    const char *grad_name_first = "-", *grad_name_last = "-";
    bool reproducible = true;
    for (int s = 0; s < steps; s++) {
        const int32_t *batch = data + per_step * (size_t)s;
        struct olmo_step_result rr, rd, rd2;
        if (olmo_trainer_accumulate(&tr_r, batch, &rr) || olmo_trainer_accumulate(&tr_d, batch, &rd) ||
            (twice && olmo_trainer_accumulate(&tr_d2, batch, &rd2))) {
            fprintf(stderr, "test_backend_parity: %s\n", olmo_last_error());
            exit(1);
        }
        double e[3] = {fabs(rd.ce_loss - rr.ce_loss) / fabs(rr.ce_loss),
                       fabs(rd.z_loss - rr.z_loss) / fabs(rr.z_loss),
                       fabs(rd.grad_norm - rr.grad_norm) / fabs(rr.grad_norm)};
        for (int i = 0; i < 3; i++)
            if (!(e[i] <= worst_loss)) worst_loss = e[i];
        printf("     %s step %d: ce %.7f / %.7f  z %.4e / %.4e  grad norm %.6f / %.6f (%s / %s)\n", label, s + 1,
               rr.ce_loss, rd.ce_loss, rr.z_loss, rd.z_loss, rr.grad_norm, rd.grad_norm, ref->name, dut->name);
        if (s == 0 || s == steps - 1) { /* step 1: same weights on both; last: after the updates */
            const char *gname = "-";
            double ge = model_buffer_err(&tr_r.model, &tr_d.model, tr_r.model.grads, tr_d.model.grads, &gname);
            if (s == 0) {
                grad_err_first = ge;
                grad_name_first = gname;
            } else {
                grad_err_last = ge;
                grad_name_last = gname;
            }
        }
        if (twice) {
            reproducible = reproducible && rd.ce_loss == rd2.ce_loss && rd.z_loss == rd2.z_loss &&
                           rd.grad_norm == rd2.grad_norm;
            olmo_trainer_update(&tr_d2, &rd2);
        }
        olmo_trainer_update(&tr_r, &rr);
        olmo_trainer_update(&tr_d, &rd);
    }
    snprintf(name, sizeof name, "model %s: losses and grad norms, %d steps", label, steps);
    report(name, worst_loss, tol.model_loss);
    snprintf(name, sizeof name, "model %s: gradients at step 1 (worst %.40s)", label, grad_name_first);
    report(name, grad_err_first, tol.model_grad1 > 0 ? tol.model_grad1 : tol.model_grad);
    if (steps > 1) {
        snprintf(name, sizeof name, "model %s: gradients at step %d (worst %.40s)", label, steps, grad_name_last);
        report(name, grad_err_last, tol.model_grad);
    }
    const char *pname = "-";
    double pe = model_buffer_err(&tr_r.model, &tr_d.model, tr_r.model.weights, tr_d.model.weights, &pname);
    snprintf(name, sizeof name, "model %s: parameters after %d steps (worst %.40s)", label, steps, pname);
    report(name, pe, tol.model_param);
    if (twice) {
        snprintf(name, sizeof name, "model %s: training determinism (weights)", label);
        expect_same_bits(name, tr_d.model.weights, tr_d2.model.weights, tr_d.model.n_floats);
        checks++;
        if (!reproducible) failures++;
        snprintf(name, sizeof name, "model %s: training determinism (losses)", label);
        printf("%s %-44s %s\n", reproducible ? "ok  " : "FAIL", name,
               reproducible ? "bitwise reproducible" : "differs between runs");
        olmo_trainer_destroy(&tr_d2);
    }
    olmo_trainer_destroy(&tr_r);
    olmo_trainer_destroy(&tr_d);
    free(data);
}

/* A bf16 device backend against cpu-bf16 (instead of fp32 cpu): both round the same values to bf16 (every
 * GEMM operand, attention's products, the saved GEMM operands; backend.h), so what is left is summation
 * order and expf, whose fp32-level differences move a value across a bf16 rounding boundary now and
 * then.  Only where cpu-bf16's attention multiplies bf16 pairs too (AVX512-BF16); the reason is printed
 * otherwise.  Emulated cuda-bf16, models A / B: losses 1.8e-3 / 1.1e-4, step-1 gradients 8.5e-3 /
 * 9.2e-3, last-step gradients 4.1e-2 / 1.9e-2, parameters 9.2e-3 / 7.9e-3 (against fp32 cpu: 2.5e-3 /
 * 3.5e-4, 3.3e-2 / 1.7e-2, 7.0e-2 / 2.3e-2, 1.6e-2 / 1.7e-2, under the tolerances 1e-2, 2e-1, 1e-1). */
void test_model_vs_cpu_bf16(const char *label, const struct olmo_config *cfg, int steps) {
    if (dut->compute_dtype != OLMO_BF16 || dut->host_memory) return;
    if (!olmo_cpu_attention_bf16_products()) {
        printf("note: model %s not compared with cpu-bf16: its attention multiplies fp32 products on this "
               "processor (no AVX512-BF16), %s's bf16 ones\n", label, dut->name);
        return;
    }
    struct olmo_backend *saved_ref = ref, *ref16 = olmo_backend_create("cpu-bf16");
    if (!ref16) {
        fprintf(stderr, "test_backend_parity: %s\n", olmo_last_error());
        exit(1);
    }
    const double loss = tol.model_loss, grad = tol.model_grad, param = tol.model_param;
    tol.model_loss = tol16.model_loss;
    tol.model_grad = tol16.model_grad;
    tol.model_grad1 = tol16.model_grad1;
    tol.model_param = tol16.model_param;
    ref = ref16;
    check_determinism = false; /* checked against fp32 cpu already: one run of the device here */
    char name[160];
    snprintf(name, sizeof name, "%s vs cpu-bf16", label);
    test_model(name, cfg, steps);
    check_determinism = true;
    ref = saved_ref;
    tol.model_loss = loss;
    tol.model_grad = grad;
    tol.model_grad1 = 0;
    tol.model_param = param;
    olmo_backend_destroy(ref16);
}

void base_config(struct olmo_config *c) {
    olmo_config_defaults(c);
    c->model.rope_theta = 500000;
    c->model.full_attention_every = 4;
    c->model.full_attention_last = true;
    c->model.rms_norm_eps = 1e-6;
    c->model.init_std = 0.05;
    c->model.eos_token_id = 1;
    c->model.pad_token_id = 0;
    /* AdamW's eps = 1e-8 turns gradients at the 1e-8 rounding-noise level into full +-lr
     * updates whose sign is noise, so parameters would diverge at the lr scale after one
     * step on any two correct backends.  eps = 1e-4 keeps the update Lipschitz in the
     * gradient; the AdamW op itself is compared at eps = 1e-8 above. */
    c->train.eps = 1e-4;
    c->train.z_loss = 1e-4;
    c->train.clip_grad_norm = 1.0;
    c->train.lr = 3e-3;
    c->train.warmup_steps = 2;
    c->train.schedule = OLMO_SCHED_COSINE;
    c->train.alpha_f = 0.1;
}

/* The chunked loss (model/head.c) against the one-pass loss on the backend under test: the logits a
 * chunk of `rows` rows at a time (uneven: the last chunk shorter) must leave the logits the evaluation
 * reads, the validation loss's sums, the training losses, gradients and weights bit-identical. */
void test_model_logits_chunks(const char *label, const struct olmo_config *cfg, int steps, int rows) {
    if (!dut->cross_entropy_bf16) {
        printf("note: %s has no cross_entropy_bf16: the model keeps the logits of the whole micro-batch\n",
               dut->name);
        return;
    }
    const struct olmo_train_config *t = &cfg->train;
    const size_t N = (size_t)t->micro_batch * t->seq_len, V = (size_t)cfg->model.vocab_size;
    const size_t per_step = (size_t)t->grad_accum * N;
    int32_t *data = xmalloc((per_step * (size_t)steps + 1) * sizeof(int32_t));
    for (size_t i = 0; i < per_step * (size_t)steps + 1; i++)
        data[i] = (int32_t)(olmo_rng_next(&rng) % (uint64_t)V);
    struct olmo_trainer one, chunked;
    if (make_trainer(cfg, dut, &one) || make_trainer(cfg, dut, &chunked) ||
        olmo_model_set_logits_chunk(&chunked.model, rows)) {
        fprintf(stderr, "test_backend_parity: %s\n", olmo_last_error());
        exit(1);
    }
    char name[160];
    snprintf(name, sizeof name, "chunked loss %s: %d-row chunks of %zu rows", label, chunked.model.logits_chunk, N);
    report(name, one.model.logits_chunk == 0 && chunked.model.logits_chunk == rows ? 0.0 : 1.0, 0.0);
    /* the logits the evaluation reads, then the validation loss (sums returned to the host) */
    float *la = xmalloc(N * V * sizeof(float)), *lc = xmalloc(N * V * sizeof(float));
    double ce[2], z[2];
    struct olmo_model *ms[2] = {&one.model, &chunked.model};
    for (int k = 0; k < 2; k++)
        if (olmo_model_forward(ms[k], data, false) || olmo_model_logits_rows(ms[k], 0, (int)N, k ? lc : la) ||
            olmo_model_loss(ms[k], data + 1, 0.0f, 0.0f, &ce[k], &z[k])) {
            fprintf(stderr, "test_backend_parity: %s\n", olmo_last_error());
            exit(1);
        }
    snprintf(name, sizeof name, "chunked loss %s: logits", label);
    report(name, memcmp(la, lc, N * V * sizeof(float)) ? 1.0 : 0.0, 0.0);
    snprintf(name, sizeof name, "chunked loss %s: validation loss sums", label);
    report(name, ce[0] == ce[1] && z[0] == z[1] ? 0.0 : 1.0, 0.0);
    free(la);
    free(lc);
    bool same = true;
    for (int s = 0; s < steps; s++) {
        struct olmo_step_result ra, rc;
        if (olmo_trainer_accumulate(&one, data + per_step * (size_t)s, &ra) ||
            olmo_trainer_accumulate(&chunked, data + per_step * (size_t)s, &rc)) {
            fprintf(stderr, "test_backend_parity: %s\n", olmo_last_error());
            exit(1);
        }
        same = same && ra.ce_loss == rc.ce_loss && ra.z_loss == rc.z_loss && ra.grad_norm == rc.grad_norm;
        if (s == 0) {
            snprintf(name, sizeof name, "chunked loss %s: gradients at step 1", label);
            expect_same_bits(name, one.model.grads, chunked.model.grads, one.model.n_floats);
        }
        olmo_trainer_update(&one, &ra);
        olmo_trainer_update(&chunked, &rc);
    }
    snprintf(name, sizeof name, "chunked loss %s: losses, %d steps", label, steps);
    report(name, same ? 0.0 : 1.0, 0.0);
    snprintf(name, sizeof name, "chunked loss %s: weights after %d steps", label, steps);
    expect_same_bits(name, one.model.weights, chunked.model.weights, one.model.n_floats);
    olmo_trainer_destroy(&one);
    olmo_trainer_destroy(&chunked);
    free(data);
}
