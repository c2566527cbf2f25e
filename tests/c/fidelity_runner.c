/* Test driver for the PyTorch fidelity tests (tests/python/test_fidelity.py):
 * loads a config, weights and a token batch, then writes to one safetensors
 * file everything the Python side compares: logits of the first micro-batch,
 * step-1 losses and every parameter gradient (before clipping), the losses
 * of each step, the parameters after the last AdamW step, and the bytes of
 * saved activations the model reserved (act_bytes).  An optional sixth
 * argument names the backend (default cpu); a seventh, the type of the
 * GEMM-operand activations it saves (f32 or bf16; default: the backend's). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "model/weights.h"
#include "train/trainer.h"
#include "util/error.h"

static int run(const char *config_path, const char *weights_path, const char *batch_path, int steps,
               const char *out_path, const char *backend, const char *saved_type) {
    struct olmo_config cfg;
    olmo_config_defaults(&cfg);
    if (olmo_config_load(&cfg, config_path) || olmo_config_validate(&cfg)) return -1;
    struct olmo_trainer tr;
    struct olmo_backend *be = olmo_backend_create(backend); /* the process's: freed at exit */
    if (!be || olmo_trainer_init(&tr, &cfg, be) || olmo_weights_load(&tr.model, weights_path)) return -1;
    struct olmo_model *m = &tr.model;
    const struct olmo_train_config *t = &cfg.train;
    if (saved_type && (olmo_model_set_saved_type(m, strcmp(saved_type, "bf16") ? OLMO_F32 : OLMO_BF16) ||
                       olmo_model_reserve(m, t->micro_batch, t->seq_len)))
        return -1;
    const size_t rows = (size_t)t->grad_accum * t->micro_batch, per_step = rows * t->seq_len;

    struct olmo_st_file bf;
    if (olmo_st_open(&bf, batch_path)) return -1;
    const struct olmo_st_tensor *tok = olmo_st_find(&bf, "tokens");
    if (!tok || olmo_st_numel(tok) != per_step * (size_t)steps)
        return olmo_error("'%s' needs 'tokens' of %d x %zu x %d", batch_path, steps, rows, t->seq_len);
    int32_t *tokens = malloc(olmo_st_numel(tok) * sizeof(int32_t));
    if (!tokens || olmo_st_read_i32(&bf, tok, tokens)) return -1;

    struct olmo_st_writer w = {0};
    const size_t N = (size_t)t->micro_batch * t->seq_len, V = (size_t)cfg.model.vocab_size;
    /* logits of the first micro-batch at the initial weights */
    for (size_t i = 0; i < N; i++) tr.inputs[i] = tokens[i];
    if (olmo_model_forward(m, tr.inputs, t->intra_doc_masking)) return -1;
    float *logits = malloc(N * V * sizeof(float));
    if (olmo_model_logits_rows(m, 0, (int)N, logits)) return -1;
    int64_t lshape[3] = {t->micro_batch, t->seq_len, (int64_t)V};
    if (olmo_st_writer_add(&w, "logits", OLMO_ST_F32, 3, lshape, logits)) return -1;
    free(logits);

    double *losses = malloc(sizeof(double) * 3 * (size_t)steps); /* ce, z, grad norm per step */
    float *host = malloc(m->n_floats * sizeof(float));
    for (int s = 0; s < steps; s++) {
        struct olmo_step_result res;
        if (olmo_trainer_accumulate(&tr, tokens + (size_t)s * per_step, &res)) return -1;
        if (s == 0) {
            m->be->to_host(m->be, host, m->grads, m->n_floats * sizeof(float));
            for (int i = 0; i < m->n_tensors; i++) {
                const struct olmo_param *p = &m->params[i];
                char name[200];
                int64_t shape[2] = {p->rows, p->cols};
                snprintf(name, sizeof name, "grad.%s", p->name);
                if (olmo_st_writer_add(&w, name, OLMO_ST_F32, p->cols == 1 ? 1 : 2, shape, host + p->offset)) return -1;
            }
        }
        losses[3 * s] = res.ce_loss;
        losses[3 * s + 1] = res.z_loss;
        losses[3 * s + 2] = res.grad_norm;
        if (olmo_trainer_update(&tr, &res)) return -1;
    }
    const double act_bytes = (double)m->act_bytes;
    int64_t ashape[1] = {1};
    if (olmo_st_writer_add(&w, "act_bytes", OLMO_ST_F64, 1, ashape, &act_bytes)) return -1;
    int64_t sshape[2] = {steps, 3};
    if (olmo_st_writer_add(&w, "losses", OLMO_ST_F64, 2, sshape, losses)) return -1;
    m->be->to_host(m->be, host, m->weights, m->n_floats * sizeof(float));
    for (int i = 0; i < m->n_tensors; i++) {
        const struct olmo_param *p = &m->params[i];
        char name[200];
        int64_t shape[2] = {p->rows, p->cols};
        snprintf(name, sizeof name, "final.%s", p->name);
        if (olmo_st_writer_add(&w, name, OLMO_ST_F32, p->cols == 1 ? 1 : 2, shape, host + p->offset)) return -1;
    }
    int rc = olmo_st_writer_save(&w, out_path);
    olmo_st_writer_free(&w);
    olmo_st_close(&bf);
    free(host);
    free(losses);
    free(tokens);
    olmo_trainer_destroy(&tr);
    olmo_backend_destroy(be);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 6 || argc > 8 || (argc == 8 && strcmp(argv[7], "f32") && strcmp(argv[7], "bf16"))) {
        fprintf(stderr, "usage: fidelity_runner CONFIG.yaml WEIGHTS.safetensors BATCH.safetensors STEPS OUT.safetensors "
                        "[BACKEND [f32|bf16]]\n");
        return 2;
    }
    if (run(argv[1], argv[2], argv[3], atoi(argv[4]), argv[5], argc >= 7 ? argv[6] : "cpu", argc == 8 ? argv[7] : NULL)) {
        fprintf(stderr, "fidelity_runner: %s\n", olmo_last_error());
        return 1;
    }
    return 0;
}
