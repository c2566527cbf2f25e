/* The tensor-core attention kernels' source, compiled for the host against cuda_emu.h (WMMA emulated). */
#include "backend/cuda/cuda_attention_tc.cu"
