/* The LM head and the loss (model/model.h): the final norm, the logits, cross-entropy + z-loss and the
 * head's backward pass.  Where the backend has cross_entropy_bf16 and a micro-batch holds at least two
 * chunks (model/activations.h: olmo_act_logits_chunk), the loss is chunked: the forward pass stops at
 * the final norm, and olmo_model_loss computes the fp32 logits of one chunk of rows at a time and
 * writes their bf16 gradient into m->dlogits [N, V], which the head's backward GEMMs read; no fp32
 * logits of the whole micro-batch exist.  The values are those of one pass: a GEMM row depends only
 * on its own row of the operand, the gradient of a row only on that row, and the backend adds the
 * loss's per-row sums once over all the rows. */
#include <stdint.h>

#include "model/model.h"
#include "util/error.h"

#define TRY(call)                        \
    do {                                 \
        if ((call) != 0) return -1;      \
    } while (0)

/* the LM head's weights are the root unit's (fully sharded training: resident from the forward pass
 * until the optimizer step; acquiring it again changes nothing) */
#define ACQUIRE_ROOT() TRY(m->hooks ? m->hooks->acquire(m->hooks->ctx, m, OLMO_UNIT_ROOT, false) : 0)

int olmo_model_head_forward(struct olmo_model *m) {
    const struct olmo_backend *be = m->be;
    const int N = m->batch * m->seq_len, D = m->cfg.d_model, V = m->cfg.vocab_size;
    const struct olmo_buf *xn_saved = &m->bufs[OLMO_ACT_XN_FINAL];
    const bool xn16 = xn_saved->dtype == OLMO_BF16;
    float *xn = xn16 ? m->dtmp : xn_saved->data; /* saved as bf16: computed in fp32 scratch first */
    TRY(be->rmsnorm_fwd(be, xn, m->rstd_final, m->x_final, m->final_norm, N, D, (float)m->cfg.rms_norm_eps));
    m->dlogits_bf16 = false;
    m->logits_row0 = -1;
    if (!m->logits_chunk) {
        TRY(be->gemm(be, false, true, N, V, D, 1.0f, xn, OLMO_F32, D, olmo_model_weight(m, m->lm_head),
                     olmo_model_weight_type(m), D, 0.0f, m->logits, V));
        m->logits_row0 = 0;
    }
    if (xn16) TRY(be->convert(be, xn_saved->data, OLMO_BF16, xn, OLMO_F32, (size_t)N * D));
    return 0;
}

/* Rows [r0, r0 + n) of the logits into m->logits (n <= m->logits_chunk), from the final norm's saved
 * output: as bf16 where it is saved so, the value the GEMM of all the rows rounds its fp32 operand to. */
static int chunk_logits(struct olmo_model *m, int r0, int n) {
    const struct olmo_backend *be = m->be;
    const int D = m->cfg.d_model, V = m->cfg.vocab_size;
    const struct olmo_buf *xn = &m->bufs[OLMO_ACT_XN_FINAL];
    const char *a = (const char *)xn->data + (size_t)r0 * D * olmo_float_type_size(xn->dtype);
    m->logits_row0 = -1;
    TRY(be->gemm(be, false, true, n, V, D, 1.0f, a, xn->dtype, D, olmo_model_weight(m, m->lm_head),
                 olmo_model_weight_type(m), D, 0.0f, m->logits, V));
    m->logits_row0 = r0;
    return 0;
}

int olmo_model_logits_rows(struct olmo_model *m, int row, int n, float *host) {
    const struct olmo_backend *be = m->be;
    const int N = m->batch * m->seq_len, V = m->cfg.vocab_size, C = m->logits_chunk;
    if (row < 0 || n < 0 || row > N - n)
        return olmo_error("logits rows [%d, %d + %d) are outside the micro-batch's %d", row, row, n, N);
    if (!C) {
        if (m->logits_row0 != 0)
            return olmo_error("the logits are gone: the loss has overwritten them with their gradient (read them "
                              "after the forward pass, before the loss)");
        return be->to_host(be, host, m->logits + (size_t)row * V, sizeof(float) * (size_t)n * V);
    }
    if (n) ACQUIRE_ROOT();
    while (n > 0) {
        const int r0 = row / C * C, rows = N - r0 < C ? N - r0 : C, take = r0 + rows - row < n ? r0 + rows - row : n;
        if (m->logits_row0 != r0) TRY(chunk_logits(m, r0, rows));
        TRY(be->to_host(be, host, m->logits + (size_t)(row - r0) * V, sizeof(float) * (size_t)take * V));
        host += (size_t)take * V;
        row += take;
        n -= take;
    }
    return 0;
}

int olmo_model_set_logits_chunk(struct olmo_model *m, int rows) {
    if (rows < 0) return olmo_error("logits chunk: %d rows", rows);
    if (rows && !m->be->cross_entropy_bf16)
        return olmo_error("a chunked loss needs a backend with cross_entropy_bf16 (cuda-bf16); backend '%s' has none",
                          m->be->name);
    if (rows == m->logits_chunk_rows) return 0;
    m->logits_chunk_rows = rows;
    const int batch = m->batch, seq_len = m->seq_len;
    if (!batch) return 0;
    olmo_model_free_acts(m); /* sized for the old chunk */
    return olmo_model_reserve(m, batch, seq_len);
}

int olmo_model_loss(struct olmo_model *m, const int32_t *targets, float grad_scale, float z_mult,
                    double *ce_sum, double *z_sum) {
    const struct olmo_backend *be = m->be;
    const int N = m->batch * m->seq_len, V = m->cfg.vocab_size, C = m->logits_chunk;
    if (!C && m->logits_row0 != 0)
        return olmo_error("the loss needs the logits of a forward pass; the last loss has replaced them with their "
                          "gradient (run the forward pass again)");
    TRY(be->to_device(be, m->targets, targets, sizeof(int32_t) * (size_t)N));
    m->logits_row0 = -1; /* overwritten below */
    if (C) { /* chunked: each run's sums are kept by the backend until the last run (backend.h) */
        ACQUIRE_ROOT();
        for (int r0 = 0; r0 < N; r0 += C) {
            const int n = N - r0 < C ? N - r0 : C;
            TRY(chunk_logits(m, r0, n));
            m->logits_row0 = -1;
            TRY(be->cross_entropy_bf16(be, m->logits, (uint16_t *)m->dlogits + (size_t)r0 * V, (size_t)V,
                                       m->targets + r0, n, V, grad_scale, z_mult, r0, N, ce_sum, z_sum));
        }
        return 0;
    }
    if (be->cross_entropy_bf16) { /* the gradient as the LM head's bf16 GEMMs read it, in place */
        TRY(be->cross_entropy_bf16(be, m->logits, m->logits, 2 * (size_t)V, m->targets, N, V, grad_scale, z_mult, 0,
                                   N, ce_sum, z_sum));
        m->dlogits_bf16 = true;
        return 0;
    }
    return be->cross_entropy(be, m->logits, m->targets, N, V, grad_scale, z_mult, ce_sum, z_sum);
}

int olmo_model_head_backward(struct olmo_model *m, float gb) {
    const struct olmo_backend *be = m->be;
    const int N = m->batch * m->seq_len, D = m->cfg.d_model, V = m->cfg.vocab_size;
    /* the gradient of the logits: bf16 in m->dlogits (chunked), bf16 in the first half of each logits
     * row (in place), or fp32 over the logits */
    const void *dl = m->logits_chunk ? m->dlogits : (const void *)m->logits;
    const enum olmo_float_type dl_type = m->logits_chunk || m->dlogits_bf16 ? OLMO_BF16 : OLMO_F32;
    const int ld_dl = m->dlogits_bf16 ? 2 * V : V;
    TRY(be->gemm(be, false, false, N, D, V, 1.0f, dl, dl_type, ld_dl, olmo_model_weight(m, m->lm_head),
                 olmo_model_weight_type(m), D, 0.0f, m->dtmp, D));
    const struct olmo_buf *xn = &m->bufs[OLMO_ACT_XN_FINAL];
    TRY(be->gemm(be, true, false, V, D, N, 1.0f, dl, dl_type, ld_dl, xn->data, xn->dtype, D, gb, m->d_lm_head, D));
    return be->rmsnorm_bwd(be, m->dx, m->d_final_norm, m->dtmp, m->x_final, m->final_norm, m->rstd_final, N, D);
}
