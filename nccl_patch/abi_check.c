/*
 * abi_check.c - compile-time comparison of nbx_nccl_abi.h with the real nccl.h.
 *
 * Built (never run) by `make -C nccl_patch abi-check NCCL_INCLUDE=<dir holding nccl.h>`, usually the
 * include/ directory of the nvidia-nccl-cu12 wheel. CUDA headers are replaced by the stand-ins in
 * cuda_host_types/. Every check is a _Static_assert: if this file compiles, the checks passed.
 *
 * The wheel ships nccl.h only (no plugin headers), so struct layouts are pinned by the offset
 * asserts in nbx_nccl_abi.h itself; see README.md "How the ABI is checked".
 */
#include <nccl.h>

#include "nbx_nccl_abi.h"

#define SAME(ours, theirs) _Static_assert((int)(ours) == (int)(theirs), #ours " != " #theirs)

SAME(nbxSuccess, ncclSuccess);
SAME(nbxUnhandledCudaError, ncclUnhandledCudaError);
SAME(nbxSystemError, ncclSystemError);
SAME(nbxInternalError, ncclInternalError);
SAME(nbxInvalidArgument, ncclInvalidArgument);
SAME(nbxInvalidUsage, ncclInvalidUsage);
SAME(nbxRemoteError, ncclRemoteError);
SAME(nbxInProgress, ncclInProgress);
SAME(nbxNumResults, ncclNumResults);
_Static_assert(sizeof(ncclResult_t) == sizeof(nbx_result_t), "ncclResult_t size");

_Static_assert(NCCL_VERSION_CODE == NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), "version macros agree");
_Static_assert(NCCL_VERSION_CODE >= NBX_NCCL_VERSION_MIN, "this NCCL is older than the plugin ABIs we speak");
_Static_assert(NCCL_VERSION_CODE <= NBX_NCCL_VERSION_MAX, "this NCCL is newer than the versions we checked");

/* An object file must not be empty. */
int nbx_abi_check_version = NCCL_VERSION_CODE;
