#ifndef NBX_RIG_KERNELS_H
#define NBX_RIG_KERNELS_H

#include <stddef.h>

/* Runs one launch of an NCCL 2.28.9 device kernel on the calling thread. name: the kernel's (mangled) symbol name as cuModuleGetFunction received it; args/argsBytes: the launch's parameter buffer (a copy the caller owns); gridX, blockX: the launch dims. Returns 0, or -1 with a one-line cause (no newline) written to err. */
int nbxRigRunKernel(const char *name, const void *args, size_t argsBytes, unsigned gridX, unsigned blockX, char *err, size_t errLen);

/* Notes: a NULL name is taken to be one of NCCL's ncclDevKernel_* kernels. When NCCL's abort
 * flag is raised mid-kernel, the launch stops early and returns 0 (as the GPU kernel simply
 * ends), leaving a note in err. NBX_RIG_KERNEL_TIMEOUT_S (default 120) bounds any single wait
 * for a peer; past it the call returns -1 naming channel, peer, collective and step. */

#endif
