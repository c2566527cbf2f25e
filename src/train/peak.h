/* The peak FLOP/s that MFU is measured against (train/run.c). */
#ifndef OLMOC_TRAIN_PEAK_H
#define OLMOC_TRAIN_PEAK_H

#include <stddef.h>

#include "backend/backend.h"

/* Peak FLOP/s of the backend's SGEMM: best of a few 2048^3 products, each
 * timed until the backend has finished it (synchronize).  0 when it cannot
 * allocate. */
double olmo_measure_peak_flops(const struct olmo_backend *be);

/* The datasheet's dense peak (no sparsity) of a GPU by its name (CUDA's
 * cudaDeviceProp.name: "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA
 * H100 NVL", "NVIDIA H200", "NVIDIA A100-SXM4-80GB", ...) for the precision
 * the backend multiplies in (its name: "bf16" -> bf16 tensor cores, "tf32"
 * -> TF32 tensor cores, else fp32), as OLMo-core and MaxText report MFU.
 * Writes what it is, e.g. "datasheet bf16 dense peak of H100 SXM", to what.
 * 0 when the device is not in the table (or device is NULL). */
double olmo_datasheet_peak_flops(const char *device, const char *backend_name, char *what, size_t n);

#endif
