/* The CUDA backend's source, compiled for the host against cuda_emu.h. */
#include "backend/cuda/cuda_ops.cu"
