/* The peak FLOP/s that MFU is measured against (train/peak.h). */
#include "train/peak.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "util/clock.h"

double olmo_measure_peak_flops(const struct olmo_backend *be) {
    const int n = 2048; /* 1024^3 products, timed right after start-up, came out at half the speed on 2 cores */
    const size_t bytes = sizeof(float) * (size_t)n * n;
    float *a = be->alloc(be, bytes), *b = be->alloc(be, bytes), *c = be->alloc(be, bytes);
    double best = 0.0;
    /* a failed product leaves best at 0: the caller then has no measured peak */
#define PRODUCT()                                                                                              \
    (be->gemm(be, false, false, n, n, n, 1.0f, a, OLMO_F32, n, b, OLMO_F32, n, 0.0f, c, n) == 0 &&              \
     (!be->synchronize || be->synchronize(be) == 0)) /* a device only queues the product */
    if (a && b && c && PRODUCT()) { /* warm-up */
        for (int rep = 0; rep < 3; rep++) {
            const double t0 = olmo_now_seconds();
            if (!PRODUCT()) break;
            const double dt = olmo_now_seconds() - t0;
            if (dt > 0 && 2.0 * n * n * (double)n / dt > best) best = 2.0 * n * n * (double)n / dt;
        }
    }
#undef PRODUCT
    be->free(be, a);
    be->free(be, b);
    be->free(be, c);
    return best;
}

/* NVIDIA's datasheets, dense (the sparsity figures halved), TFLOP/s per GPU. */
static const struct {
    const char *family, *variant; /* both in the name (case ignored); variant NULL: any other */
    const char *label;
    double bf16, tf32, fp32;
} datasheet[] = {
    {"H100", "PCIe", "H100 PCIe", 756.0, 378.0, 51.2},
    {"H100", "NVL", "H100 NVL", 835.5, 417.5, 60.0},
    {"H100", NULL, "H100 SXM", 989.4, 494.7, 66.9},
    {"H200", "NVL", "H200 NVL", 835.5, 417.5, 60.0},
    {"H200", NULL, "H200 SXM", 989.4, 494.7, 66.9},
    {"A100", NULL, "A100", 312.0, 156.0, 19.5},
};

double olmo_datasheet_peak_flops(const char *device, const char *backend_name, char *what, size_t n) {
    if (!device) return 0.0;
    for (size_t i = 0; i < sizeof datasheet / sizeof datasheet[0]; i++) {
        if (!strcasestr(device, datasheet[i].family)) continue;
        if (datasheet[i].variant && !strcasestr(device, datasheet[i].variant)) continue;
        const bool bf16 = backend_name && strstr(backend_name, "bf16"),
                   tf32 = backend_name && strstr(backend_name, "tf32");
        const char *precision = bf16 ? "bf16" : tf32 ? "tf32" : "fp32";
        snprintf(what, n, "datasheet %s dense peak of %s", precision, datasheet[i].label);
        return 1e12 * (bf16 ? datasheet[i].bf16 : tf32 ? datasheet[i].tf32 : datasheet[i].fp32);
    }
    return 0.0;
}
