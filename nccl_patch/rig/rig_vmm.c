/* Virtual memory management (cuMemCreate, cuMemAddressReserve, cuMemMap, ...), which NCCL uses
 * for its buffers when NCCL_CUMEM_ENABLE=1 (the launcher's pin). A physical allocation is a
 * memfd; a reservation is an inaccessible anonymous mapping; mapping puts the memfd's pages at
 * the reserved address. Mapped ranges join the registry as device memory. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "rig_internal.h"

typedef unsigned long long CUmemGenericAllocationHandle;

/* A handle is counted as the driver counts it: cuMemCreate, each mapping and each
 * cuMemRetainAllocationHandle take a reference; cuMemRelease and cuMemUnmap drop one (NCCL
 * retains, unmaps, then releases twice). */
struct nbxPhysical {
  int fd;
  size_t bytes;
  int references;
};

/* What the driver API's CUmemAllocationProp starts with; the rig reads none of it. */
struct nbxAllocationProp {
  int type;
  int requestedHandleTypes;
  struct { int type, id; } location;
  void *win32HandleMetaData;
  struct { unsigned char compressionType, gpuDirectRDMACapable; unsigned short usage; unsigned char reserved[4]; } allocFlags;
};

enum { CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1 };

static CUresult cuMemCreate_(CUmemGenericAllocationHandle *handle, size_t bytes, const void *prop,
                             unsigned long long flags) {
  (void)prop;
  (void)flags;
  if (handle == NULL || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  struct nbxPhysical *p = calloc(1, sizeof(*p));
  if (p == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  p->fd = memfd_create("nbx-rig-device-memory", MFD_CLOEXEC);
  if (p->fd < 0 || ftruncate(p->fd, (off_t)bytes) != 0) {
    if (p->fd >= 0) close(p->fd);
    free(p);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  p->bytes = bytes;
  p->references = 1;
  *handle = (CUmemGenericAllocationHandle)(uintptr_t)p;
  return CUDA_SUCCESS;
}

static CUresult cuMemRelease_(CUmemGenericAllocationHandle handle) {
  struct nbxPhysical *p = (struct nbxPhysical *)(uintptr_t)handle;
  if (p == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (__atomic_sub_fetch(&p->references, 1, __ATOMIC_ACQ_REL) > 0) return CUDA_SUCCESS;
  /* Pages still mapped stay valid: the mapping holds its own reference to the memfd. */
  close(p->fd);
  free(p);
  return CUDA_SUCCESS;
}

static CUresult cuMemAddressReserve_(CUdeviceptr *ptr, size_t bytes, size_t alignment, CUdeviceptr hint,
                                     unsigned long long flags) {
  (void)hint;
  (void)flags;
  if (ptr == NULL || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  if (alignment < 4096) alignment = 4096;
  size_t span = bytes + alignment;
  char *base = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  uintptr_t start = ((uintptr_t)base + alignment - 1) / alignment * alignment;
  if (start > (uintptr_t)base) munmap(base, start - (uintptr_t)base);
  size_t tail = (uintptr_t)base + span - (start + bytes);
  if (tail) munmap((char *)(start + bytes), tail);
  *ptr = (CUdeviceptr)start;
  return CUDA_SUCCESS;
}

static CUresult cuMemAddressFree_(CUdeviceptr ptr, size_t bytes) {
  return munmap((void *)(uintptr_t)ptr, bytes) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* Mapped ranges: address -> the physical allocation behind it, for cuMemRetainAllocationHandle. */
struct nbxMapping {
  uintptr_t start;
  size_t bytes;
  struct nbxPhysical *physical;
  struct nbxMapping *next;
};
static pthread_mutex_t mappingsLock = PTHREAD_MUTEX_INITIALIZER;
static struct nbxMapping *mappings;

static CUresult cuMemMap_(CUdeviceptr ptr, size_t bytes, size_t offset, CUmemGenericAllocationHandle handle,
                          unsigned long long flags) {
  (void)flags;
  struct nbxPhysical *p = (struct nbxPhysical *)(uintptr_t)handle;
  if (p == NULL || offset + bytes > p->bytes) return CUDA_ERROR_INVALID_VALUE;
  void *at = mmap((void *)(uintptr_t)ptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, p->fd, (off_t)offset);
  if (at == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  struct nbxMapping *m = calloc(1, sizeof(*m));
  if (m == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  m->start = (uintptr_t)ptr;
  m->bytes = bytes;
  m->physical = p;
  __atomic_add_fetch(&p->references, 1, __ATOMIC_ACQ_REL);
  pthread_mutex_lock(&mappingsLock);
  m->next = mappings;
  mappings = m;
  pthread_mutex_unlock(&mappingsLock);
  nbxMemRegisterKind(at, bytes, NBX_MEM_DEVICE);
  return CUDA_SUCCESS;
}

static CUresult cuMemUnmap_(CUdeviceptr ptr, size_t bytes) {
  pthread_mutex_lock(&mappingsLock);
  struct nbxMapping **link = &mappings;
  while (*link != NULL && (*link)->start != (uintptr_t)ptr) link = &(*link)->next;
  struct nbxMapping *m = *link;
  if (m != NULL) *link = m->next;
  pthread_mutex_unlock(&mappingsLock);
  if (m != NULL) cuMemRelease_((CUmemGenericAllocationHandle)(uintptr_t)m->physical);
  free(m);
  nbxMemRelease((void *)(uintptr_t)ptr, NBX_MEM_DEVICE);
  /* Back to reserved, inaccessible address space. */
  void *at = mmap((void *)(uintptr_t)ptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
                  -1, 0);
  return at == MAP_FAILED ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

static CUresult cuMemSetAccess_(CUdeviceptr ptr, size_t bytes, const void *desc, size_t count) {
  (void)ptr;
  (void)bytes;
  (void)desc;
  (void)count;
  return CUDA_SUCCESS; /* mapped pages are already readable and writable */
}

static CUresult cuMemRetainAllocationHandle_(CUmemGenericAllocationHandle *handle, void *addr) {
  if (handle == NULL) return CUDA_ERROR_INVALID_VALUE;
  CUresult r = CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mappingsLock);
  for (struct nbxMapping *m = mappings; m != NULL; m = m->next)
    if ((uintptr_t)addr >= m->start && (uintptr_t)addr < m->start + m->bytes) {
      __atomic_add_fetch(&m->physical->references, 1, __ATOMIC_ACQ_REL);
      *handle = (CUmemGenericAllocationHandle)(uintptr_t)m->physical;
      r = CUDA_SUCCESS;
      break;
    }
  pthread_mutex_unlock(&mappingsLock);
  return r;
}

static CUresult cuMemGetAllocationPropertiesFromHandle_(struct nbxAllocationProp *prop,
                                                        CUmemGenericAllocationHandle handle) {
  if (prop == NULL || handle == 0) return CUDA_ERROR_INVALID_VALUE;
  memset(prop, 0, sizeof(*prop));
  prop->type = 1;          /* pinned */
  prop->location.type = 1; /* on the device */
  prop->location.id = 0;
  return CUDA_SUCCESS;
}

static CUresult cuMemExportToShareableHandle_(void *shareable, CUmemGenericAllocationHandle handle, int type,
                                              unsigned long long flags) {
  (void)flags;
  struct nbxPhysical *p = (struct nbxPhysical *)(uintptr_t)handle;
  if (shareable == NULL || p == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    nbxLog("cuMemExportToShareableHandle: handle type %d is not supported by the rig (POSIX fds only)", type);
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  int fd = dup(p->fd);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *(int *)shareable = fd;
  return CUDA_SUCCESS;
}

const struct nbxVmmEntry nbxVmmEntries[] = {
    {"cuMemCreate", 10020, (void *)cuMemCreate_},
    {"cuMemRelease", 10020, (void *)cuMemRelease_},
    {"cuMemAddressReserve", 10020, (void *)cuMemAddressReserve_},
    {"cuMemAddressFree", 10020, (void *)cuMemAddressFree_},
    {"cuMemMap", 10020, (void *)cuMemMap_},
    {"cuMemUnmap", 10020, (void *)cuMemUnmap_},
    {"cuMemSetAccess", 10020, (void *)cuMemSetAccess_},
    {"cuMemRetainAllocationHandle", 11000, (void *)cuMemRetainAllocationHandle_},
    {"cuMemGetAllocationPropertiesFromHandle", 10020, (void *)cuMemGetAllocationPropertiesFromHandle_},
    {"cuMemExportToShareableHandle", 10020, (void *)cuMemExportToShareableHandle_},
    {NULL, 0, NULL},
};
