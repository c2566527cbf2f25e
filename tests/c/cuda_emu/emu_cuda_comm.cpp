/* The CUDA backend's NCCL path, compiled for the host against cuda_emu.h (NCCL done with MPI). */
#include "backend/cuda/cuda_comm.cu"
