/*
 * Stand-in for CUDA's <cuda_runtime.h>, used only by `make -C nccl_patch abi-check`.
 *
 * Why: abi_check.c includes the real nccl.h (from the nvidia-nccl-cu12 wheel) to compare its enum
 * values and version macros with nbx_nccl_abi.h, on machines that have no CUDA toolkit. nccl.h
 * includes CUDA headers only for host-side type names in its prototypes; these files declare just
 * those names. Never use them to build anything that runs.
 */
#ifndef NBX_CUDA_HOST_TYPES_RUNTIME_H
#define NBX_CUDA_HOST_TYPES_RUNTIME_H

/* The real header pulls in size_t (and friends), which nccl.h uses without including them. */
#include <stddef.h>
#include <stdint.h>

/* nccl.h tests CUDART_VERSION before including cuda_bf16.h / cuda_fp8.h. */
#define CUDART_VERSION 12080

/* The only CUDA type nccl.h's prototypes mention: an opaque stream pointer. */
typedef struct CUstream_st *cudaStream_t;

#endif
