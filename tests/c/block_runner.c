/* Test driver for tests/python/test_7b_block.py: one forward and backward
 * pass of the model in CONFIG.yaml (model: section; train.seq_len,
 * train.activation_checkpointing, train.block_every) over one sequence of
 * TOKENS (safetensors "tokens" and "targets", int32 [seq_len]) with the loss
 * sum(ce) / seq_len, and writes to OUT.safetensors:
 *   block_out   the last layer's output (the final norm's input) [T, D]
 *   d_block_in  the gradient w.r.t. the first layer's input (the embedding
 *               output) [T, D]
 *   grad.NAME   the gradient of each parameter named in GRADS (comma-separated
 *               Hugging Face names)
 * and the seconds the forward and the backward pass took on stdout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "model/model.h"
#include "model/weights.h"
#include "util/clock.h"
#include "util/error.h"

static int run(const char *config_path, const char *weights_path, const char *tokens_path, const char *out_path,
               const char *grads, const char *backend) {
    struct olmo_config cfg;
    olmo_config_defaults(&cfg);
    if (olmo_config_load(&cfg, config_path) || olmo_config_validate(&cfg)) return -1;
    const int T = cfg.train.seq_len, D = cfg.model.d_model;
    struct olmo_backend *be = olmo_backend_create(backend); /* the process's: freed at exit */
    struct olmo_model m;
    if (!be || olmo_model_create(&m, &cfg.model, be) ||
        olmo_model_set_checkpointing(&m, cfg.train.activation_checkpointing, cfg.train.block_every) ||
        olmo_model_reserve(&m, 1, T) || olmo_weights_load(&m, weights_path))
        return -1;
    struct olmo_st_file tf;
    if (olmo_st_open(&tf, tokens_path)) return -1;
    const struct olmo_st_tensor *tok = olmo_st_find(&tf, "tokens"), *tgt = olmo_st_find(&tf, "targets");
    if (!tok || !tgt || olmo_st_numel(tok) != (size_t)T || olmo_st_numel(tgt) != (size_t)T)
        return olmo_error("'%s' needs int32 'tokens' and 'targets' of %d", tokens_path, T);
    int32_t *tokens = malloc(sizeof(int32_t) * (size_t)T), *targets = malloc(sizeof(int32_t) * (size_t)T);
    float *host = malloc(sizeof(float) * (size_t)T * D);
    if (!tokens || !targets || !host || olmo_st_read_i32(&tf, tok, tokens) || olmo_st_read_i32(&tf, tgt, targets))
        return olmo_error("reading '%s'", tokens_path);

    struct olmo_st_writer w = {0};
    int64_t shape[2] = {T, D};
    double t0 = olmo_now_seconds();
    if (olmo_model_forward(&m, tokens, false)) return -1;
    double t1 = olmo_now_seconds();
    if (be->to_host(be, host, m.x_final, sizeof(float) * (size_t)T * D) ||
        olmo_st_writer_add(&w, "block_out", OLMO_ST_F32, 2, shape, host))
        return -1;
    double ce, z;
    double t2 = olmo_now_seconds();
    if (olmo_model_loss(&m, targets, 1.0f / (float)T, 0.0f, &ce, &z) || olmo_model_backward(&m)) return -1;
    double t3 = olmo_now_seconds();
    if (be->to_host(be, host, m.dx, sizeof(float) * (size_t)T * D) ||
        olmo_st_writer_add(&w, "d_block_in", OLMO_ST_F32, 2, shape, host))
        return -1;
    printf("forward %.1f s, loss + backward %.1f s, loss %.6f\n", t1 - t0, t3 - t2, ce / T);
    const size_t len = strlen(grads);
    char *list = malloc(len + 1);
    if (!list) return olmo_error("out of memory");
    memcpy(list, grads, len + 1);
    for (char *name = strtok(list, ","); name; name = strtok(NULL, ",")) {
        const struct olmo_param *p = olmo_model_find_param(&m, name);
        if (!p) return olmo_error("no parameter '%s'", name);
        float *g = malloc(sizeof(float) * p->numel);
        char key[200];
        int64_t pshape[2] = {p->rows, p->cols};
        snprintf(key, sizeof key, "grad.%s", name);
        if (!g || be->to_host(be, g, m.grads + p->offset, sizeof(float) * p->numel) ||
            olmo_st_writer_add(&w, key, OLMO_ST_F32, p->cols == 1 ? 1 : 2, pshape, g))
            return -1;
        free(g);
    }
    free(list);
    int rc = olmo_st_writer_save(&w, out_path);
    olmo_st_writer_free(&w);
    olmo_st_close(&tf);
    free(tokens);
    free(targets);
    free(host);
    olmo_model_destroy(&m);
    olmo_backend_destroy(be);
    return rc;
}

int main(int argc, char **argv) {
    if (argc != 6 && argc != 7) {
        fprintf(stderr, "usage: block_runner CONFIG.yaml WEIGHTS.safetensors TOKENS.safetensors OUT.safetensors "
                        "GRADS [BACKEND]\n");
        return 2;
    }
    if (run(argv[1], argv[2], argv[3], argv[4], argv[5], argc == 7 ? argv[6] : "cpu")) {
        fprintf(stderr, "block_runner: %s\n", olmo_last_error());
        return 1;
    }
    return 0;
}
