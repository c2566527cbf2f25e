/* cuda-bf16 attention's cuDNN glue, compiled for the host against cuda_emu.h (cuDNN: emu_cudnn_sdpa.cpp). */
#include "backend/cuda/cuda_attention_cudnn.cu"
