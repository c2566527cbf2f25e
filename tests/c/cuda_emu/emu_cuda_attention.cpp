/* The CUDA attention kernels' source, compiled for the host against cuda_emu.h. */
#include "backend/cuda/cuda_attention.cu"
