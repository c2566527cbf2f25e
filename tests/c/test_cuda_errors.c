/* The CUDA backend's error paths, on the emulated runtime (tests/c/cuda_emu,
 * argument: cuda or cuda-bf16): a failed device allocation, kernel launch or
 * cuBLAS call inside an op (injected with cuda_emu_inject) makes the op return
 * -1 with a message that names what failed, instead of aborting the process;
 * allocation and launch failures are not sticky, so the same op then runs and
 * gives the right result. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "cuda_emu_inject.h"
#include "util/error.h"

static int failures, checks;

static void check(int ok, const char *what) {
    checks++;
    if (!ok) failures++;
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
}

/* rc is -1 and the error names `want`; the injection is cancelled whatever happened. */
static void failed_with(int rc, const char *want, enum cuda_emu_fault kind, const char *what) {
    cuda_emu_inject(kind, 0);
    char line[512];
    const char *msg = olmo_last_error();
    snprintf(line, sizeof line, "%s: -1 with \"%s\" (got %d: %s)", what, want, rc, msg ? msg : "(none)");
    check(rc == -1 && msg && strstr(msg, want), line);
    olmo_error("%s", ""); /* the next check sees only its own message */
}

int main(int argc, char **argv) {
    const char *name = argc > 1 ? argv[1] : "cuda";
    struct olmo_backend *be = olmo_backend_create(name);
    if (!be) {
        printf("%s: %s\n", name, olmo_last_error());
        return 1;
    }
    const bool bf16 = be->compute_dtype == OLMO_BF16;
    enum { N = 64 };
    float host[N * N];
    for (int i = 0; i < N * N; i++) host[i] = (float)(i % 7) - 3.0f;
    double want_ss = 0.0;
    for (int i = 0; i < N * N; i++) want_ss += (double)host[i] * host[i];

    /* alloc: NULL with the error set */
    cuda_emu_inject(CUDA_EMU_FAIL_MALLOC, 1);
    void *none = be->alloc(be, 1000);
    failed_with(none ? 0 : -1, "cannot allocate", CUDA_EMU_FAIL_MALLOC, "alloc when cudaMalloc fails");

    float *x = be->alloc(be, sizeof host), *y = be->alloc(be, sizeof host), *z = be->alloc(be, sizeof host);
    if (!x || !y || !z || be->to_device(be, x, host, sizeof host) || be->to_device(be, y, host, sizeof host)) {
        printf("setup: %s\n", olmo_last_error());
        return 1;
    }

    /* scratch growth inside an op (sum_squares' first call allocates its partial sums) */
    double ss = 0.0;
    cuda_emu_inject(CUDA_EMU_FAIL_MALLOC, 1);
    failed_with(be->sum_squares(be, x, N * N, &ss), "scratch", CUDA_EMU_FAIL_MALLOC,
                "sum_squares when its scratch allocation fails");
    check(be->sum_squares(be, x, N * N, &ss) == 0 && ss == want_ss, "sum_squares then runs (not sticky)");

    /* a kernel launch */
    cuda_emu_inject(CUDA_EMU_FAIL_LAUNCH, 1);
    failed_with(be->add(be, z, x, y, N * N), "add_kernel", CUDA_EMU_FAIL_LAUNCH, "add when its launch fails");
    float out[N * N];
    int ok = be->add(be, z, x, y, N * N) == 0 && be->to_host(be, out, z, sizeof out) == 0;
    for (int i = 0; ok && i < N * N; i++) ok = out[i] == 2.0f * host[i];
    check(ok, "add then runs");

    /* cuBLAS: the GEMM (fp32 operands: cuda-bf16 rounds them into scratch first) */
    cuda_emu_inject(CUDA_EMU_FAIL_BLAS, 1);
    failed_with(be->gemm(be, false, false, N, N, N, 1.0f, x, OLMO_F32, N, y, OLMO_F32, N, 0.0f, z, N),
                bf16 ? "cublasGemmEx" : "cublasSgemm", CUDA_EMU_FAIL_BLAS, "gemm when cuBLAS fails");
    check(be->gemm(be, false, false, N, N, N, 1.0f, x, OLMO_F32, N, y, OLMO_F32, N, 0.0f, z, N) == 0,
          "gemm then runs");
    /* a GEMM operand's conversion (cuda: a bf16 operand widened; cuda-bf16: an fp32 one rounded) */
    const enum olmo_float_type conv = bf16 ? OLMO_F32 : OLMO_BF16;
    cuda_emu_inject(CUDA_EMU_FAIL_LAUNCH, 1);
    failed_with(be->gemm(be, false, false, N, N, N, 1.0f, x, conv, N, y, OLMO_F32, N, 0.0f, z, N),
                bf16 ? "f32_to_bf16_kernel" : "bf16_to_f32_kernel", CUDA_EMU_FAIL_LAUNCH,
                "gemm when its operand's conversion fails");

    /* the host part of embedding backward (its buffers freed on the way out: see the ASan build) */
    int32_t tokens_host[N];
    for (int i = 0; i < N; i++) tokens_host[i] = (i * 5) % 11;
    int32_t *tokens = be->alloc(be, sizeof tokens_host);
    if (!tokens || be->to_device(be, tokens, tokens_host, sizeof tokens_host)) return 1;
    cuda_emu_inject(CUDA_EMU_FAIL_MALLOC, 1);
    failed_with(be->embedding_bwd(be, z, x, tokens, N, N), "scratch", CUDA_EMU_FAIL_MALLOC,
                "embedding_bwd when its index's scratch fails");
    check(be->embedding_bwd(be, z, x, tokens, N, N) == 0, "embedding_bwd then runs");

    /* rmsnorm backward's partial sums */
    cuda_emu_inject(CUDA_EMU_FAIL_MALLOC, 1);
    failed_with(be->rmsnorm_bwd(be, z, y, x, x, y, x, N, N), "scratch", CUDA_EMU_FAIL_MALLOC,
                "rmsnorm_bwd when its scratch fails");

    /* attention: the forward's launch, the backward's delta (scratch) */
    const struct olmo_attn_shape s = {1, N, 2, 1, 16, 0, 0.25f}; /* q [64][2*16], k, v [64][16] */
    float *lse = be->alloc(be, sizeof(float) * 2 * N);
    if (!lse) return 1;
    /* cuda-bf16 through cuDNN (OLMOC_CUDNN unset): its first launch rounds q to bf16 */
    const bool cudnn = be->describe && strstr(be->describe(be), "fused SDPA");
    cuda_emu_inject(CUDA_EMU_FAIL_LAUNCH, 1);
    failed_with(be->attention_fwd(be, z, lse, x, y, y, NULL, &s),
                cudnn ? "f32_to_bf16_kernel" : bf16 ? "tc_fwd_kernel" : "att_fwd_kernel", CUDA_EMU_FAIL_LAUNCH,
                "attention_fwd when its launch fails");
    check(be->attention_fwd(be, z, lse, x, y, y, NULL, &s) == 0, "attention_fwd then runs");
    float *dq = be->alloc(be, sizeof host), *dk = be->alloc(be, sizeof host), *dv = be->alloc(be, sizeof host);
    if (!dq || !dk || !dv) return 1;
    cuda_emu_inject(CUDA_EMU_FAIL_MALLOC, 1);
    failed_with(be->attention_bwd(be, dq, dk, dv, x, z, lse, x, y, y, NULL, &s), "scratch", CUDA_EMU_FAIL_MALLOC,
                "attention_bwd when its delta's scratch fails");
    check(be->attention_bwd(be, dq, dk, dv, x, z, lse, x, y, y, NULL, &s) == 0, "attention_bwd then runs");

    /* a shape the capability query refuses, passed anyway: refused again, no abort */
    const struct olmo_attn_shape wide = {1, N, 1, 1, 256, 0, 0.0625f};
    const int rc_wide = be->attention_fwd(be, z, lse, x, y, y, NULL, &wide);
    failed_with(rc_wide, "head_dim", CUDA_EMU_FAIL_LAUNCH, "attention_fwd on a refused shape");

    void *bufs[] = {x, y, z, tokens, lse, dq, dk, dv};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->free(be, bufs[i]);
    olmo_backend_destroy(be);
    printf("%s: %d/%d checks passed\n", name, checks - failures, checks);
    return failures ? 1 : 0;
}
