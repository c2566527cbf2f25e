/* What test_backend_parity.c (the ops) and backend_parity_model.c (whole models) share. */
#ifndef OLMOC_TESTS_BACKEND_PARITY_H
#define OLMOC_TESTS_BACKEND_PARITY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "config/config.h"
#include "util/rng.h"

/* Tolerances by kind of result, for the backend under test. */
struct parity_tolerances {
    double exact;      /* same expression per element (elementwise ops, AdamW, embedding) */
    double reduce;     /* fp32 results of reductions in a different order (norms, softmax, CE) */
    double gemm;       /* GEMM outputs */
    double attn;       /* attention outputs and gradients (fp32 kernels) */
    double attn_bf16;  /* the same with bf16 products (see bf16_attention) */
    double sum;        /* double-precision sums returned to the host */
    double model_loss; /* whole model: CE / z-loss / grad norm per step */
    double model_grad; /* whole model: every gradient tensor */
    double model_grad1; /* the same at step 1 (the same weights on both); 0: model_grad */
    double model_param;/* whole model: parameters after the AdamW steps */
};
/* The whole-model tolerances of a bf16 device backend against cpu-bf16 (test_model_vs_cpu_bf16). */
struct parity_tolerances16 {
    double model_loss, model_grad1, model_grad, model_param;
};

extern struct parity_tolerances tol;
extern struct parity_tolerances16 tol16;

/* tensors present on both backends */
struct dual {
    float *r, *d;
    size_t n;
};

extern struct olmo_backend *ref, *dut; /* the CPU reference and the backend under test */
/* Only device backends promise bitwise-reproducible reductions here; the CPU
 * backend's OpenMP reductions are not required to be. */
extern bool check_determinism;
extern struct olmo_rng rng;
extern int checks, failures;

struct dual_i32 {
    int32_t *r, *d;
};

void *xmalloc(size_t bytes);
void *be_alloc(const struct olmo_backend *be, size_t bytes);
struct dual dual_rand(size_t n, double scale);
struct dual dual_zero(size_t n);
struct dual dual_clone(struct dual src);
void dual_free(struct dual *x);
struct dual_i32 ints_from_host(const int32_t *h, size_t n);
void ints_free(struct dual_i32 *x);
void expect(const char *what, struct dual x, double limit);
double rel_err_host(const float *r, const float *d, size_t n);
void report(const char *what, double err, double limit);
void expect_same_bits(const char *what, const float *a, const float *b, size_t n);

/* backend_parity_fused.c: the fused ops against the unfused ones */
void test_elementwise_unaligned(void);
void test_rmsnorm_add(int n, int dim);
void test_swiglu_bf16(size_t n);
void test_swiglu_bwd_bf16(size_t n);
void test_rmsnorm_bwd_bf16(int n, int dim);
void test_cross_entropy_bf16(int n, int V);
void test_adamw_flat(void);

/* backend_parity_model.c: two tiny models trained on both backends */
void test_model(const char *label, const struct olmo_config *cfg, int steps);
void test_model_vs_cpu_bf16(const char *label, const struct olmo_config *cfg, int steps);
void test_model_logits_chunks(const char *label, const struct olmo_config *cfg, int steps, int rows);
void base_config(struct olmo_config *c);

#endif
