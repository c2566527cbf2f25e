/* The CPU backend's tiled flash attention, forward and backward, compiled
 * once per instruction set by the file that includes it:
 *   cpu_attention.c       with the build's flags (-march): AVX-512 kernels
 *                         where the build targets AVX-512, AVX2+FMA kernels
 *                         where it targets AVX2, else OpenBLAS tiles;
 *   cpu_attention_avx2.c  with -mavx2 -mfma -mno-avx512f (x86-64 builds):
 *                         the AVX2+FMA kernels, chosen at run time on a
 *                         processor without AVX-512 kernels in the build, or
 *                         forced with OLMOC_CPU_ISA=avx2 (cpu_attention.c).
 * Everything here is static: each including file gets its own copy, built
 * for its instruction set, and wraps attention_fwd and attention_bwd.
 * Within one copy the result is deterministic and the same for any thread
 * count; different copies may differ in the last bits (their elementwise
 * loops are vectorised at different widths).
 *
 * By concern, included here in this order:
 *   cpu_attention_parts.h   time by part (OLMOC_ATTN_PARTS: studying the kernels)
 *   cpu_attention_blocks.h  the plan: tiles, block sizes, visible keys
 *   cpu_attention_tile.h    tile products (AVX-512, AVX2+FMA, OpenBLAS) and epilogues
 *   cpu_attention_pack.h    operand copies (bf16, transposed), softmax rows, thread tiles
 *   cpu_attention_fwd.h     the forward: schedule and attention_fwd
 *   cpu_attention_bwd.h     the backward: schedule, tiles and attention_bwd */
#ifndef OLMOC_CPU_ATTENTION_KERNELS_H
#define OLMOC_CPU_ATTENTION_KERNELS_H

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_simd.h"

#include "backend/cpu/cpu_attention_parts.h"
#include "backend/cpu/cpu_attention_blocks.h"
#include "backend/cpu/cpu_attention_tile.h"
#include "backend/cpu/cpu_attention_pack.h"
#include "backend/cpu/cpu_attention_fwd.h"
#include "backend/cpu/cpu_attention_bwd.h"

#endif
