/*
 * Stand-in for CUDA's <cuda_fp8.h>: intentionally empty. nccl.h includes it but its prototypes use no
 * type from it. Only for `make -C nccl_patch abi-check` (see cuda_runtime.h here for why).
 */
#ifndef NBX_CUDA_HOST_TYPES_CUDA_FP8_H
#define NBX_CUDA_HOST_TYPES_CUDA_FP8_H
#endif
