/* The rig's substitute CUDA driver (libcuda.so.1): the CUDA runtime linked into the wheel's
 * unmodified libnccl loads it with dlopen, asks cuGetProcAddress for every entry point, and
 * fetches the runtime's private export tables with cuGetExportTable. One device, answered from
 * the CPU: see rig_internal.h. Entry points the rig does not implement answer through a stub that
 * names itself on stderr and returns CUDA_ERROR_NOT_SUPPORTED, never a crash or a hang. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include "rig_internal.h"

/* ---- logging ---- */

void nbxLog(const char *fmt, ...) {
  char line[1024];
  int n = snprintf(line, sizeof(line), "nbx-rig[%d]: ", (int)getpid());
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(line + n, sizeof(line) - n - 1, fmt, ap);
  va_end(ap);
  size_t len = (size_t)n + (m < 0 ? 0 : ((size_t)m < sizeof(line) - n - 1 ? (size_t)m : sizeof(line) - n - 2));
  line[len++] = '\n';
  ssize_t w = write(2, line, len);
  (void)w;
}

int nbxDebug(void) {
  static int level = -1;
  if (level < 0) {
    const char *v = getenv("NBX_RIG_DEBUG");
    level = v != NULL && v[0] != '\0' && v[0] != '0';
  }
  return level;
}

/* A crash inside the rig (or NCCL's host code) names itself and where, then ends the process
 * as the signal would have. */
static void crashed(int sig, siginfo_t *info, void *context) {
  (void)context;
  nbxLog("signal %d at address %p; the call stack follows", sig, info->si_addr);
  void *frames[48];
  int n = backtrace(frames, 48);
  backtrace_symbols_fd(frames, n, 2);
  signal(sig, SIG_DFL);
  raise(sig);
}

__attribute__((constructor)) static void installCrashReport(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_sigaction = crashed;
  sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
  const int signals[] = {SIGSEGV, SIGBUS, SIGABRT};
  for (size_t i = 0; i < sizeof(signals) / sizeof(signals[0]); i++) {
    struct sigaction old;
    if (sigaction(signals[i], NULL, &old) == 0 && old.sa_handler == SIG_DFL) sigaction(signals[i], &sa, NULL);
  }
}

/* ---- the one device ---- */

struct nbxContext nbxPrimaryContext = {.device = 0};
static __thread CUcontext currentContext;
static int initialized;

#define DEVICE_NAME "NeuronaBox rig (CPU)"
#define DEVICE_MEMORY (80ull << 30)
/* An A100-like device: sm_80, so NCCL takes no sm_90 path (clusters, NVLS). */
#define COMPUTE_MAJOR 8
#define COMPUTE_MINOR 0
#define PCI_BUS 0x01

static CUresult checkDevice(CUdevice d) { return d == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE; }

static CUresult cuInit_(unsigned flags) {
  (void)flags;
  initialized = 1;
  return CUDA_SUCCESS;
}

static CUresult cuDriverGetVersion_(int *v) {
  if (v == NULL) return CUDA_ERROR_INVALID_VALUE;
  *v = NBX_DRIVER_VERSION;
  return CUDA_SUCCESS;
}

static CUresult cuDeviceGet_(CUdevice *d, int ordinal) {
  if (d == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
  *d = 0;
  return CUDA_SUCCESS;
}

static CUresult cuDeviceGetCount_(int *n) {
  if (n == NULL) return CUDA_ERROR_INVALID_VALUE;
  *n = 1;
  return CUDA_SUCCESS;
}

static CUresult cuDeviceGetName_(char *name, int len, CUdevice d) {
  if (name == NULL || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  snprintf(name, (size_t)len, "%s", DEVICE_NAME);
  return checkDevice(d);
}

static CUresult cuDeviceGetUuid_(CUuuid *uuid, CUdevice d) {
  if (uuid == NULL) return CUDA_ERROR_INVALID_VALUE;
  /* Distinct per process, so two rig ranks never look like one GPU. */
  memset(uuid, 0, sizeof(*uuid));
  memcpy(uuid->bytes, "nbxrig", 6);
  pid_t pid = getpid();
  memcpy(uuid->bytes + 8, &pid, sizeof(pid));
  return checkDevice(d);
}

static CUresult cuDeviceTotalMem_(size_t *bytes, CUdevice d) {
  if (bytes == NULL) return CUDA_ERROR_INVALID_VALUE;
  *bytes = DEVICE_MEMORY;
  return checkDevice(d);
}

static int attributeValue(int attr) {
  switch (attr) {
  case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: return 1024;
  case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: return 1024;
  case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: return 1024;
  case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: return 64;
  case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: return 2147483647;
  case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: return 65535;
  case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: return 65535;
  case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: return 48 * 1024;
  case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: return 64 * 1024;
  case CU_DEVICE_ATTRIBUTE_WARP_SIZE: return 32;
  case CU_DEVICE_ATTRIBUTE_MAX_PITCH: return 2147483647;
  case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: return 65536;
  case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: return 1410000;
  case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: return 512;
  case CU_DEVICE_ATTRIBUTE_GPU_OVERLAP: return 1;
  case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: return 108;
  case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: return 1;
  case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: return 1;
  case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: return PCI_BUS;
  case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: return 0;
  case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: return 1215000;
  case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: return 5120;
  case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: return 40 * 1024 * 1024;
  case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: return 2048;
  case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: return 2;
  case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: return 1;
  case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: return 0;
  case CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT: return 32;
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: return COMPUTE_MAJOR;
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: return COMPUTE_MINOR;
  case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED: return 1;
  case CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED: return 1;
  case CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED: return 1;
  case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: return 164 * 1024;
  case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: return 65536;
  case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: return 0;
  case CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED: return 0;
  case CU_DEVICE_ATTRIBUTE_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO: return 2;
  case CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED: return 1;
  case CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM: return 1;
  case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: return 1;
  case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: return 163 * 1024;
  case CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED: return 1;
  case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: return 32;
  case CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK: return 1024;
  default: return 0; /* no VMM, no GPUDirect RDMA, no IPC handles, no fabric, no multicast */
  }
}

static CUresult cuDeviceGetAttribute_(int *value, int attr, CUdevice d) {
  if (value == NULL) return CUDA_ERROR_INVALID_VALUE;
  *value = attributeValue(attr);
  if (nbxDebug()) nbxLog("cuDeviceGetAttribute(%d) = %d", attr, *value);
  return checkDevice(d);
}

static CUresult cuDeviceGetPCIBusId_(char *id, int len, CUdevice d) {
  if (id == NULL || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  snprintf(id, (size_t)len, "00000000:%02X:00.0", PCI_BUS);
  return checkDevice(d);
}

static CUresult cuDeviceGetByPCIBusId_(CUdevice *d, const char *id) {
  if (d == NULL || id == NULL) return CUDA_ERROR_INVALID_VALUE;
  *d = 0;
  return CUDA_SUCCESS;
}

static CUresult cuDeviceCanAccessPeer_(int *can, CUdevice d, CUdevice peer) {
  (void)d;
  (void)peer;
  if (can == NULL) return CUDA_ERROR_INVALID_VALUE;
  *can = 0;
  return CUDA_SUCCESS;
}

static CUresult cuDeviceGetP2PAttribute_(int *value, int attr, CUdevice a, CUdevice b) {
  (void)attr;
  (void)a;
  (void)b;
  if (value == NULL) return CUDA_ERROR_INVALID_VALUE;
  *value = 0;
  return CUDA_SUCCESS;
}

/* ---- contexts: one primary context, current per thread ---- */

static CUresult cuDevicePrimaryCtxRetain_(CUcontext *ctx, CUdevice d) {
  if (ctx == NULL) return CUDA_ERROR_INVALID_VALUE;
  nbxPrimaryContext.active = 1;
  *ctx = &nbxPrimaryContext;
  return checkDevice(d);
}

static CUresult cuDevicePrimaryCtxRelease_(CUdevice d) { return checkDevice(d); }
static CUresult cuDevicePrimaryCtxReset_(CUdevice d) { return checkDevice(d); }

static CUresult cuDevicePrimaryCtxGetState_(CUdevice d, unsigned *flags, int *active) {
  if (flags) *flags = nbxPrimaryContext.flags;
  if (active) *active = nbxPrimaryContext.active;
  return checkDevice(d);
}

static CUresult cuDevicePrimaryCtxSetFlags_(CUdevice d, unsigned flags) {
  nbxPrimaryContext.flags = flags;
  return checkDevice(d);
}

static CUresult cuCtxGetCurrent_(CUcontext *ctx) {
  if (ctx == NULL) return CUDA_ERROR_INVALID_VALUE;
  *ctx = currentContext;
  return CUDA_SUCCESS;
}

static CUresult cuCtxSetCurrent_(CUcontext ctx) {
  currentContext = ctx;
  return CUDA_SUCCESS;
}

/* Each thread's context stack; its top is the current context. */
static __thread CUcontext pushed[16];
static __thread int nPushed;

static CUresult cuCtxPushCurrent_(CUcontext ctx) {
  if (nPushed == (int)(sizeof(pushed) / sizeof(pushed[0]))) return CUDA_ERROR_INVALID_VALUE;
  pushed[nPushed++] = currentContext;
  currentContext = ctx;
  return CUDA_SUCCESS;
}

static CUresult cuCtxPopCurrent_(CUcontext *ctx) {
  if (currentContext == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  if (ctx) *ctx = currentContext;
  currentContext = nPushed > 0 ? pushed[--nPushed] : NULL;
  return CUDA_SUCCESS;
}

static CUresult cuCtxGetDevice_(CUdevice *d) {
  if (d == NULL) return CUDA_ERROR_INVALID_VALUE;
  *d = 0;
  return CUDA_SUCCESS;
}

static CUresult cuCtxGetFlags_(unsigned *flags) {
  if (flags == NULL) return CUDA_ERROR_INVALID_VALUE;
  *flags = nbxPrimaryContext.flags;
  return CUDA_SUCCESS;
}

static CUresult cuCtxGetApiVersion_(CUcontext ctx, unsigned *version) {
  (void)ctx;
  if (version == NULL) return CUDA_ERROR_INVALID_VALUE;
  *version = 3020;
  return CUDA_SUCCESS;
}

static CUresult cuCtxSynchronize_(void) { return nbxSynchronizeAll(); }

static CUresult cuCtxGetLimit_(size_t *value, int limit) {
  if (value == NULL) return CUDA_ERROR_INVALID_VALUE;
  static const size_t limits[] = {1024, 1 << 20, 8 << 20, 2, 2048, 0, 32};
  *value = limit >= 0 && limit < (int)(sizeof(limits) / sizeof(limits[0])) ? limits[limit] : 0;
  return CUDA_SUCCESS;
}

static CUresult cuCtxSetLimit_(int limit, size_t value) {
  (void)limit;
  (void)value;
  return CUDA_SUCCESS;
}

static CUresult cuCtxGetStreamPriorityRange_(int *least, int *greatest) {
  if (least) *least = 0;
  if (greatest) *greatest = -5;
  return CUDA_SUCCESS;
}

static CUresult cuCtxGetCacheConfig_(int *config) {
  if (config) *config = 0;
  return CUDA_SUCCESS;
}

static CUresult cuCtxSetCacheConfig_(int config) {
  (void)config;
  return CUDA_SUCCESS;
}

static CUresult cuCtxGetSharedMemConfig_(int *config) {
  if (config) *config = 0;
  return CUDA_SUCCESS;
}

static CUresult cuCtxGetId_(CUcontext ctx, unsigned long long *id) {
  (void)ctx;
  if (id == NULL) return CUDA_ERROR_INVALID_VALUE;
  *id = 1;
  return CUDA_SUCCESS;
}

/* ---- memory ---- */

static CUresult cuMemAlloc_(CUdeviceptr *dptr, size_t bytes) {
  if (dptr == NULL) return CUDA_ERROR_INVALID_VALUE;
  void *p = nbxMemAllocate(bytes, NBX_MEM_DEVICE);
  if (p == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  *dptr = (CUdeviceptr)(uintptr_t)p;
  return CUDA_SUCCESS;
}

static CUresult cuMemFree_(CUdeviceptr dptr) {
  if (dptr == 0) return CUDA_SUCCESS;
  nbxSynchronizeAll(); /* as cudaFree: no queued kernel may still touch the pages */
  return nbxMemRelease((void *)(uintptr_t)dptr, NBX_MEM_DEVICE) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static CUresult cuMemAllocAsync_(CUdeviceptr *dptr, size_t bytes, CUstream s) {
  (void)s;
  return cuMemAlloc_(dptr, bytes);
}

static CUresult cuMemFreeAsync_(CUdeviceptr dptr, CUstream s) {
  /* The free must not overtake work queued before it on the stream. */
  CUresult r = nbxStreamSynchronize(s);
  CUresult freed = cuMemFree_(dptr);
  return r != CUDA_SUCCESS ? r : freed;
}

/* Memory pools: a pool is a name for "device memory"; its allocations are ordinary ones. */
struct nbxMemPool { unsigned long long releaseThreshold; };
static CUresult cuMemPoolCreate_(struct nbxMemPool **pool, const void *props) {
  (void)props;
  if (pool == NULL) return CUDA_ERROR_INVALID_VALUE;
  *pool = calloc(1, sizeof(**pool));
  return *pool ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
static CUresult cuMemPoolDestroy_(struct nbxMemPool *pool) {
  free(pool);
  return CUDA_SUCCESS;
}
static CUresult cuMemPoolSetAttribute_(struct nbxMemPool *pool, int attr, void *value) {
  (void)attr;
  if (pool == NULL || value == NULL) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}
static CUresult cuMemPoolGetAttribute_(struct nbxMemPool *pool, int attr, void *value) {
  if (pool == NULL || value == NULL) return CUDA_ERROR_INVALID_VALUE;
  /* The reuse policies (1-3) are ints; the threshold and the byte counters (4-8) are 64-bit. */
  memset(value, 0, attr >= 1 && attr <= 3 ? sizeof(int) : sizeof(unsigned long long));
  return CUDA_SUCCESS;
}
static CUresult cuMemPoolTrimTo_(struct nbxMemPool *pool, size_t keep) {
  (void)pool;
  (void)keep;
  return CUDA_SUCCESS;
}
static CUresult cuMemAllocFromPoolAsync_(CUdeviceptr *dptr, size_t bytes, struct nbxMemPool *pool, CUstream s) {
  (void)pool;
  return cuMemAllocAsync_(dptr, bytes, s);
}

static CUresult cuMemGetAllocationGranularity_(size_t *granularity, const void *prop, int option) {
  (void)prop;
  (void)option;
  if (granularity == NULL) return CUDA_ERROR_INVALID_VALUE;
  *granularity = 2 << 20; /* a GPU's large page */
  return CUDA_SUCCESS;
}

static CUresult cuMemHostAlloc_(void **pp, size_t bytes, unsigned flags) {
  (void)flags;
  if (pp == NULL) return CUDA_ERROR_INVALID_VALUE;
  *pp = nbxMemAllocate(bytes, NBX_MEM_HOST_ALLOC);
  return *pp ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult cuMemAllocHost_(void **pp, size_t bytes) { return cuMemHostAlloc_(pp, bytes, 0); }

static CUresult cuMemFreeHost_(void *p) {
  nbxSynchronizeAll(); /* as cudaFreeHost */
  return nbxMemRelease(p, NBX_MEM_HOST_ALLOC) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static CUresult cuMemHostGetDevicePointer_(CUdeviceptr *dptr, void *p, unsigned flags) {
  (void)flags;
  if (dptr == NULL) return CUDA_ERROR_INVALID_VALUE;
  *dptr = (CUdeviceptr)(uintptr_t)p; /* mapped host memory: one address for both sides */
  return CUDA_SUCCESS;
}

static CUresult cuMemHostGetFlags_(unsigned *flags, void *p) {
  (void)p;
  if (flags) *flags = 0;
  return CUDA_SUCCESS;
}

static CUresult cuMemHostRegister_(void *p, size_t bytes, unsigned flags) {
  (void)flags;
  return nbxMemRegister(p, bytes) == 0 ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult cuMemHostUnregister_(void *p) {
  return nbxMemRelease(p, NBX_MEM_HOST_REGISTERED) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static CUresult cuMemGetInfo_(size_t *freeBytes, size_t *total) {
  if (freeBytes) *freeBytes = DEVICE_MEMORY - (1ull << 30);
  if (total) *total = DEVICE_MEMORY;
  return CUDA_SUCCESS;
}

static CUresult cuMemGetAddressRange_(CUdeviceptr *base, size_t *bytes, CUdeviceptr dptr) {
  void *b;
  size_t n;
  if (!nbxMemLookup((void *)(uintptr_t)dptr, &b, &n, NULL, NULL)) return CUDA_ERROR_NOT_FOUND;
  if (base) *base = (CUdeviceptr)(uintptr_t)b;
  if (bytes) *bytes = n;
  return CUDA_SUCCESS;
}

static CUresult pointerAttribute(void *data, int attr, CUdeviceptr ptr) {
  void *base = NULL;
  size_t bytes = 0;
  enum nbxMemKind kind = 0;
  uint64_t id = 0;
  int known = nbxMemLookup((void *)(uintptr_t)ptr, &base, &bytes, &kind, &id);
  switch (attr) {
  case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext *)data = known ? &nbxPrimaryContext : NULL; break;
  case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
    if (!known) return CUDA_ERROR_INVALID_VALUE;
    *(unsigned *)data = kind == NBX_MEM_DEVICE ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
    break;
  case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
  case CU_POINTER_ATTRIBUTE_HOST_POINTER: *(CUdeviceptr *)data = known ? ptr : 0; break;
  case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS: *(int *)data = 1; break;
  case CU_POINTER_ATTRIBUTE_BUFFER_ID: *(unsigned long long *)data = id; break;
  case CU_POINTER_ATTRIBUTE_IS_MANAGED: *(int *)data = 0; break;
  case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data = known ? 0 : -2; break;
  case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr *)data = (CUdeviceptr)(uintptr_t)base; break;
  case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)data = bytes; break;
  case CU_POINTER_ATTRIBUTE_MAPPED: *(int *)data = known; break;
  default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

/* How wide each pointer attribute's value is (the driver API's types). */
static size_t pointerAttributeBytes(int attr) {
  switch (attr) {
  case 2: case 6: case 8: case 9: case 10: case 13: case 15: case 16: case 21: return sizeof(int);
  case 5: return 2 * sizeof(unsigned long long); /* CUDA_POINTER_ATTRIBUTE_P2P_TOKENS */
  default: return sizeof(unsigned long long);   /* pointers, sizes, ids, handle masks */
  }
}

static CUresult cuPointerGetAttribute_(void *data, int attr, CUdeviceptr ptr) {
  if (data == NULL) return CUDA_ERROR_INVALID_VALUE;
  return pointerAttribute(data, attr, ptr);
}

static CUresult cuPointerGetAttributes_(unsigned n, int *attrs, void **data, CUdeviceptr ptr) {
  if (attrs == NULL || data == NULL) return CUDA_ERROR_INVALID_VALUE;
  for (unsigned i = 0; i < n; i++) {
    if (data[i] == NULL) continue;
    /* An attribute about unknown memory answers "not ours" rather than failing the whole query. */
    if (pointerAttribute(data[i], attrs[i], ptr) != CUDA_SUCCESS) memset(data[i], 0, pointerAttributeBytes(attrs[i]));
  }
  return CUDA_SUCCESS;
}

/* Synchronous copies and fills run on the legacy default stream, which orders them after every
 * blocking stream's work, and return once done. */
static CUresult syncCopy(void *dst, const void *src, size_t bytes) {
  CUresult r = nbxStreamCopy(NULL, dst, src, bytes);
  if (r != CUDA_SUCCESS) return r;
  return nbxStreamSynchronize(NULL);
}

#define PTR(x) ((void *)(uintptr_t)(x))
static CUresult cuMemcpy_(CUdeviceptr dst, CUdeviceptr src, size_t n) { return syncCopy(PTR(dst), PTR(src), n); }
static CUresult cuMemcpyHtoD_(CUdeviceptr dst, const void *src, size_t n) { return syncCopy(PTR(dst), src, n); }
static CUresult cuMemcpyDtoH_(void *dst, CUdeviceptr src, size_t n) { return syncCopy(dst, PTR(src), n); }
static CUresult cuMemcpyDtoD_(CUdeviceptr dst, CUdeviceptr src, size_t n) { return syncCopy(PTR(dst), PTR(src), n); }
static CUresult cuMemcpyAsync_(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  return nbxStreamCopy(s, PTR(dst), PTR(src), n);
}
static CUresult cuMemcpyHtoDAsync_(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
  return nbxStreamCopy(s, PTR(dst), src, n);
}
static CUresult cuMemcpyDtoHAsync_(void *dst, CUdeviceptr src, size_t n, CUstream s) {
  return nbxStreamCopy(s, dst, PTR(src), n);
}
static CUresult cuMemcpyDtoDAsync_(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  return nbxStreamCopy(s, PTR(dst), PTR(src), n);
}
static CUresult cuMemcpyPeer_(CUdeviceptr dst, CUcontext dc, CUdeviceptr src, CUcontext sc, size_t n) {
  (void)dc;
  (void)sc;
  return syncCopy(PTR(dst), PTR(src), n);
}
static CUresult cuMemcpyPeerAsync_(CUdeviceptr dst, CUcontext dc, CUdeviceptr src, CUcontext sc, size_t n,
                                   CUstream s) {
  (void)dc;
  (void)sc;
  return nbxStreamCopy(s, PTR(dst), PTR(src), n);
}

static CUresult syncFill(CUdeviceptr dst, uint32_t value, size_t elemBytes, size_t count) {
  CUresult r = nbxStreamFill(NULL, PTR(dst), value, elemBytes, count);
  if (r != CUDA_SUCCESS) return r;
  return nbxStreamSynchronize(NULL);
}

static CUresult cuMemsetD8_(CUdeviceptr d, unsigned char v, size_t n) { return syncFill(d, v, 1, n); }
static CUresult cuMemsetD16_(CUdeviceptr d, unsigned short v, size_t n) { return syncFill(d, v, 2, n); }
static CUresult cuMemsetD32_(CUdeviceptr d, unsigned v, size_t n) { return syncFill(d, v, 4, n); }
static CUresult cuMemsetD8Async_(CUdeviceptr d, unsigned char v, size_t n, CUstream s) {
  return nbxStreamFill(s, PTR(d), v, 1, n);
}
static CUresult cuMemsetD16Async_(CUdeviceptr d, unsigned short v, size_t n, CUstream s) {
  return nbxStreamFill(s, PTR(d), v, 2, n);
}
static CUresult cuMemsetD32Async_(CUdeviceptr d, unsigned v, size_t n, CUstream s) {
  return nbxStreamFill(s, PTR(d), v, 4, n);
}

/* ---- streams and events ---- */

static CUresult cuStreamCreate_(CUstream *s, unsigned flags) { return nbxStreamCreate(s, flags, 0); }
static CUresult cuStreamCreateWithPriority_(CUstream *s, unsigned flags, int priority) {
  return nbxStreamCreate(s, flags, priority);
}
static CUresult cuStreamDestroy_(CUstream s) { return nbxStreamDestroy(s); }
static CUresult cuStreamSynchronize_(CUstream s) { return nbxStreamSynchronize(s); }
static CUresult cuStreamQuery_(CUstream s) { return nbxStreamQuery(s); }
static CUresult cuStreamWaitEvent_(CUstream s, CUevent e, unsigned flags) {
  (void)flags;
  return nbxStreamWaitEvent(s, e);
}
static CUresult cuStreamGetFlags_(CUstream s, unsigned *flags) {
  if (flags == NULL) return CUDA_ERROR_INVALID_VALUE;
  *flags = nbxStreamFlags(s);
  return CUDA_SUCCESS;
}
static CUresult cuStreamGetPriority_(CUstream s, int *priority) {
  if (priority == NULL) return CUDA_ERROR_INVALID_VALUE;
  *priority = nbxStreamPriority(s);
  return CUDA_SUCCESS;
}
static CUresult cuStreamGetId_(CUstream s, unsigned long long *id) {
  if (id == NULL) return CUDA_ERROR_INVALID_VALUE;
  *id = nbxStreamId(s);
  return CUDA_SUCCESS;
}
static CUresult cuStreamGetCtx_(CUstream s, CUcontext *ctx) {
  (void)s;
  if (ctx == NULL) return CUDA_ERROR_INVALID_VALUE;
  *ctx = &nbxPrimaryContext;
  return CUDA_SUCCESS;
}
static CUresult cuStreamGetCtx_v2_(CUstream s, CUcontext *ctx, void **greenCtx) {
  if (greenCtx) *greenCtx = NULL; /* no green contexts */
  return cuStreamGetCtx_(s, ctx);
}
static CUresult cuStreamGetDevice_(CUstream s, CUdevice *d) {
  (void)s;
  if (d == NULL) return CUDA_ERROR_INVALID_VALUE;
  *d = 0;
  return CUDA_SUCCESS;
}

/* Stream capture (CUDA graphs) is not emulated: no stream is ever capturing. */
static CUresult cuStreamIsCapturing_(CUstream s, int *status) {
  (void)s;
  if (status == NULL) return CUDA_ERROR_INVALID_VALUE;
  *status = 0;
  return CUDA_SUCCESS;
}
static CUresult cuStreamGetCaptureInfo_v1_(CUstream s, int *status, unsigned long long *id) {
  (void)s;
  if (status) *status = 0;
  if (id) *id = 0;
  return CUDA_SUCCESS;
}
static CUresult cuStreamGetCaptureInfo_v2_(CUstream s, int *status, unsigned long long *id, void **graph,
                                           const void **deps, size_t *numDeps) {
  (void)s;
  if (status) *status = 0;
  if (id) *id = 0;
  if (graph) *graph = NULL;
  if (deps) *deps = NULL;
  if (numDeps) *numDeps = 0;
  return CUDA_SUCCESS;
}
static CUresult cuStreamGetCaptureInfo_v3_(CUstream s, int *status, unsigned long long *id, void **graph,
                                           const void **deps, const void **edges, size_t *numDeps) {
  if (edges) *edges = NULL;
  return cuStreamGetCaptureInfo_v2_(s, status, id, graph, deps, numDeps);
}
static __thread int captureMode; /* CU_STREAM_CAPTURE_MODE_GLOBAL */
static CUresult cuThreadExchangeStreamCaptureMode_(int *mode) {
  if (mode == NULL) return CUDA_ERROR_INVALID_VALUE;
  int old = captureMode;
  captureMode = *mode;
  *mode = old;
  return CUDA_SUCCESS;
}

static CUresult cuLaunchHostFunc_(CUstream s, CUhostFn fn, void *data) { return nbxStreamHostFn(s, fn, data); }

struct callbackCall { CUstreamCallback fn; CUstream stream; void *data; };
static void runCallback(void *arg) {
  struct callbackCall *c = arg;
  c->fn(c->stream, nbxStickyError(), c->data);
  free(c);
}
static CUresult cuStreamAddCallback_(CUstream s, CUstreamCallback fn, void *data, unsigned flags) {
  (void)flags;
  struct callbackCall *c = malloc(sizeof(*c));
  if (c == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  c->fn = fn;
  c->stream = s;
  c->data = data;
  return nbxStreamHostFn(s, runCallback, c);
}

static CUresult cuEventCreate_(CUevent *e, unsigned flags) {
  if (e == NULL) return CUDA_ERROR_INVALID_VALUE;
  *e = calloc(1, sizeof(struct nbxEvent));
  if (*e == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  (*e)->flags = flags;
  return CUDA_SUCCESS;
}
static CUresult cuEventDestroy_(CUevent e) {
  /* At once, as the driver: a record still queued frees the event when it runs. */
  if (e == NULL) return CUDA_ERROR_INVALID_HANDLE;
  nbxEventDestroy(e);
  return CUDA_SUCCESS;
}
static CUresult cuEventRecord_(CUevent e, CUstream s) { return nbxEventRecord(e, s); }
static CUresult cuEventRecordWithFlags_(CUevent e, CUstream s, unsigned flags) {
  (void)flags;
  return nbxEventRecord(e, s);
}
static CUresult cuEventQuery_(CUevent e) { return nbxEventQuery(e); }
static CUresult cuEventSynchronize_(CUevent e) { return nbxEventSynchronize(e); }
static CUresult cuEventElapsedTime_(float *ms, CUevent a, CUevent b) { return nbxEventElapsed(ms, a, b); }

/* ---- modules, libraries, functions, launches ---- */

static struct nbxModule *moduleNew(void) {
  struct nbxModule *m = calloc(1, sizeof(*m));
  if (m) pthread_mutex_init(&m->lock, NULL);
  return m;
}

static CUresult moduleFunction(CUfunction *out, struct nbxModule *m, const char *name) {
  if (out == NULL || m == NULL || name == NULL) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&m->lock);
  struct nbxFunction *f = m->functions;
  while (f != NULL && strcmp(f->name, name) != 0) f = f->next;
  if (f == NULL) {
    f = calloc(1, sizeof(*f));
    if (f != NULL) {
      f->name = strdup(name);
      f->next = m->functions;
      m->functions = f;
    }
  }
  pthread_mutex_unlock(&m->lock);
  if (f == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  if (nbxDebug()) nbxLog("function %s", name);
  *out = f;
  return CUDA_SUCCESS;
}

/* A module's __device__ variables: zeroed host memory, one block per name. The fatbin is not
 * parsed, so the size is a bound large enough for NCCL's globals. */
#define GLOBAL_BYTES (64 * 1024)
static CUresult moduleGlobal(CUdeviceptr *dptr, size_t *bytes, struct nbxModule *m, const char *name) {
  if (m == NULL || name == NULL) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&m->lock);
  struct nbxGlobal *g = m->globals;
  while (g != NULL && strcmp(g->name, name) != 0) g = g->next;
  if (g == NULL) {
    g = calloc(1, sizeof(*g));
    if (g != NULL) {
      g->name = strdup(name);
      g->ptr = nbxMemAllocate(GLOBAL_BYTES, NBX_MEM_DEVICE);
      g->bytes = GLOBAL_BYTES;
      g->next = m->globals;
      m->globals = g;
    }
  }
  pthread_mutex_unlock(&m->lock);
  if (g == NULL || g->ptr == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  if (nbxDebug()) nbxLog("global %s", name);
  if (dptr) *dptr = (CUdeviceptr)(uintptr_t)g->ptr;
  if (bytes) *bytes = g->bytes;
  return CUDA_SUCCESS;
}

static CUresult cuModuleLoadData_(CUmodule *m, const void *image) {
  (void)image;
  if (m == NULL) return CUDA_ERROR_INVALID_VALUE;
  *m = moduleNew();
  return *m ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
static CUresult cuModuleUnload_(CUmodule m) {
  (void)m; /* functions may still be referenced by queued launches; a process loads few modules */
  return CUDA_SUCCESS;
}
static CUresult cuModuleGetFunction_(CUfunction *f, CUmodule m, const char *name) { return moduleFunction(f, m, name); }
static CUresult cuModuleGetGlobal_(CUdeviceptr *d, size_t *bytes, CUmodule m, const char *name) {
  return moduleGlobal(d, bytes, m, name);
}
static CUresult cuModuleGetLoadingMode_(int *mode) {
  if (mode == NULL) return CUDA_ERROR_INVALID_VALUE;
  *mode = 1; /* CU_MODULE_EAGER_LOADING */
  return CUDA_SUCCESS;
}

/* A library is a module here. */
static CUresult cuLibraryLoadData_(CUlibrary *lib, const void *code, void *jitOptions, void **jitValues, unsigned nJit,
                                   void *libOptions, void **libValues, unsigned nLib) {
  (void)code;
  (void)jitOptions;
  (void)jitValues;
  (void)nJit;
  (void)libOptions;
  (void)libValues;
  (void)nLib;
  if (lib == NULL) return CUDA_ERROR_INVALID_VALUE;
  *lib = (CUlibrary)moduleNew();
  return *lib ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
static CUresult cuLibraryUnload_(CUlibrary lib) {
  (void)lib;
  return CUDA_SUCCESS;
}
static CUresult cuLibraryGetKernel_(CUkernel *k, CUlibrary lib, const char *name) {
  return moduleFunction(k, (struct nbxModule *)lib, name);
}
static CUresult cuLibraryGetModule_(CUmodule *m, CUlibrary lib) {
  if (m == NULL) return CUDA_ERROR_INVALID_VALUE;
  *m = (CUmodule)lib;
  return CUDA_SUCCESS;
}
static CUresult cuLibraryGetGlobal_(CUdeviceptr *d, size_t *bytes, CUlibrary lib, const char *name) {
  return moduleGlobal(d, bytes, (struct nbxModule *)lib, name);
}
static CUresult cuKernelGetFunction_(CUfunction *f, CUkernel k) {
  if (f == NULL || k == NULL) return CUDA_ERROR_INVALID_VALUE;
  *f = k;
  return CUDA_SUCCESS;
}

static CUresult functionAttribute(int *value, int attr, struct nbxFunction *f) {
  if (value == NULL || f == NULL) return CUDA_ERROR_INVALID_VALUE;
  switch (attr) {
  case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *value = 1024; break;
  case CU_FUNC_ATTRIBUTE_NUM_REGS: *value = 64; break;
  case CU_FUNC_ATTRIBUTE_PTX_VERSION:
  case CU_FUNC_ATTRIBUTE_BINARY_VERSION: *value = COMPUTE_MAJOR * 10 + COMPUTE_MINOR; break;
  case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *value = f->maxDynamicSharedBytes; break;
  default: *value = 0; break;
  }
  return CUDA_SUCCESS;
}
static CUresult cuFuncGetAttribute_(int *value, int attr, CUfunction f) { return functionAttribute(value, attr, f); }
static CUresult cuKernelGetAttribute_(int *value, int attr, CUkernel k, CUdevice d) {
  (void)d;
  return functionAttribute(value, attr, k);
}
static CUresult cuFuncSetAttribute_(CUfunction f, int attr, int value) {
  if (f == NULL) return CUDA_ERROR_INVALID_HANDLE;
  if (attr == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) f->maxDynamicSharedBytes = value;
  return CUDA_SUCCESS;
}
static CUresult cuKernelSetAttribute_(int attr, int value, CUkernel k, CUdevice d) {
  (void)d;
  return cuFuncSetAttribute_(k, attr, value);
}
static CUresult cuFuncSetCacheConfig_(CUfunction f, int config) {
  (void)f;
  (void)config;
  return CUDA_SUCCESS;
}
static CUresult cuKernelSetCacheConfig_(CUkernel k, int config, CUdevice d) {
  (void)k;
  (void)config;
  (void)d;
  return CUDA_SUCCESS;
}
static CUresult cuFuncGetName_(const char **name, CUfunction f) {
  if (name == NULL || f == NULL) return CUDA_ERROR_INVALID_VALUE;
  *name = f->name;
  return CUDA_SUCCESS;
}
static CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags_(int *n, CUfunction f, int block, size_t smem,
                                                                      unsigned flags) {
  (void)f;
  (void)block;
  (void)smem;
  (void)flags;
  if (n == NULL) return CUDA_ERROR_INVALID_VALUE;
  *n = 1;
  return CUDA_SUCCESS;
}

/* The parameters of a launch: NCCL passes one buffer through extra[]; kernelParams (one pointer
 * per parameter) is accepted for a single-parameter kernel whose size extra[] does not give. */
static CUresult launchArgs(void **params, void **extra, const void **args, size_t *bytes) {
  *args = NULL;
  *bytes = 0;
  for (int i = 0; extra != NULL && extra[i] != NBX_CU_LAUNCH_PARAM_END; i += 2) {
    if (extra[i] == NBX_CU_LAUNCH_PARAM_BUFFER_POINTER) *args = extra[i + 1];
    else if (extra[i] == NBX_CU_LAUNCH_PARAM_BUFFER_SIZE) *bytes = *(size_t *)extra[i + 1];
    else return CUDA_ERROR_INVALID_VALUE;
  }
  if (*args == NULL && params != NULL) {
    nbxLog("a launch passed kernelParams without extra[]; the rig needs the parameter buffer's size");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  return CUDA_SUCCESS;
}

static CUresult launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                       CUstream s, void **params, void **extra) {
  if (f == NULL) return CUDA_ERROR_INVALID_HANDLE;
  if (gy != 1 || gz != 1 || by != 1 || bz != 1) {
    nbxLog("kernel %s: a %ux%ux%u grid of %ux%ux%u blocks; the rig runs one-dimensional launches only", f->name, gx, gy,
           gz, bx, by, bz);
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  const void *args;
  size_t bytes;
  CUresult r = launchArgs(params, extra, &args, &bytes);
  if (r != CUDA_SUCCESS) return r;
  if (nbxDebug()) nbxLog("launch %s grid %u block %u args %zu", f->name, gx, bx, bytes);
  return nbxStreamLaunch(s, f, args, bytes, gx, bx);
}

static CUresult cuLaunchKernel_(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                unsigned bz, unsigned smem, CUstream s, void **params, void **extra) {
  (void)smem;
  return launch(f, gx, gy, gz, bx, by, bz, s, params, extra);
}

static CUresult cuLaunchKernelEx_(const CUlaunchConfig *config, CUfunction f, void **params, void **extra) {
  if (config == NULL) return CUDA_ERROR_INVALID_VALUE;
  /* Attributes (cluster shape, memory sync domain, completion events) change nothing on a CPU. */
  return launch(f, config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX, config->blockDimY,
                config->blockDimZ, config->hStream, params, extra);
}

/* ---- errors ---- */

static const struct { CUresult code; const char *name, *text; } errorTexts[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "the rig's CPU kernel failed (see the nbx-rig line)"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "not supported by the NeuronaBox rig (see the nbx-rig line)"},
};

static CUresult cuGetErrorName_(CUresult code, const char **name) {
  if (name == NULL) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < sizeof(errorTexts) / sizeof(errorTexts[0]); i++)
    if (errorTexts[i].code == code) {
      *name = errorTexts[i].name;
      return CUDA_SUCCESS;
    }
  *name = "CUDA_ERROR_UNKNOWN";
  return CUDA_SUCCESS;
}

static CUresult cuGetErrorString_(CUresult code, const char **text) {
  if (text == NULL) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < sizeof(errorTexts) / sizeof(errorTexts[0]); i++)
    if (errorTexts[i].code == code) {
      *text = errorTexts[i].text;
      return CUDA_SUCCESS;
    }
  *text = "unknown error";
  return CUDA_SUCCESS;
}

/* ---- the private export tables (see rig_export_tables.c) ---- */
CUresult nbxGetExportTable(const void **table, const CUuuid *id);
static CUresult cuGetExportTable_(const void **table, const CUuuid *id) { return nbxGetExportTable(table, id); }

/* ---- entry points: name, the lowest CUDA version whose ABI the implementation has, the function ---- */

struct nbxProc { const char *name; int version; void *fn; };

#define P(name, version, fn) {name, version, (void *)fn}
static CUresult cuGetProcAddress_v2_(const char *symbol, void **pfn, int version, unsigned long long flags,
                                     int *status);
static CUresult cuGetProcAddress_v1_(const char *symbol, void **pfn, int version, unsigned long long flags);

static const struct nbxProc procs[] = {
    P("cuInit", 2000, cuInit_),
    P("cuDriverGetVersion", 2020, cuDriverGetVersion_),
    P("cuGetProcAddress", 11030, cuGetProcAddress_v1_),
    P("cuGetProcAddress", 12000, cuGetProcAddress_v2_),
    P("cuGetExportTable", 3000, cuGetExportTable_),
    P("cuGetErrorName", 6000, cuGetErrorName_),
    P("cuGetErrorString", 6000, cuGetErrorString_),
    P("cuDeviceGet", 2000, cuDeviceGet_),
    P("cuDeviceGetCount", 2000, cuDeviceGetCount_),
    P("cuDeviceGetName", 2000, cuDeviceGetName_),
    P("cuDeviceGetUuid", 9020, cuDeviceGetUuid_),
    P("cuDeviceGetUuid", 11040, cuDeviceGetUuid_),
    P("cuDeviceTotalMem", 3020, cuDeviceTotalMem_),
    P("cuDeviceGetAttribute", 2000, cuDeviceGetAttribute_),
    P("cuDeviceGetPCIBusId", 4010, cuDeviceGetPCIBusId_),
    P("cuDeviceGetByPCIBusId", 4010, cuDeviceGetByPCIBusId_),
    P("cuDeviceCanAccessPeer", 4000, cuDeviceCanAccessPeer_),
    P("cuDeviceGetP2PAttribute", 8000, cuDeviceGetP2PAttribute_),
    P("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain_),
    P("cuDevicePrimaryCtxRelease", 7000, cuDevicePrimaryCtxRelease_),
    P("cuDevicePrimaryCtxReset", 7000, cuDevicePrimaryCtxReset_),
    P("cuDevicePrimaryCtxGetState", 7000, cuDevicePrimaryCtxGetState_),
    P("cuDevicePrimaryCtxSetFlags", 7000, cuDevicePrimaryCtxSetFlags_),
    P("cuCtxGetCurrent", 4000, cuCtxGetCurrent_),
    P("cuCtxSetCurrent", 4000, cuCtxSetCurrent_),
    P("cuCtxPushCurrent", 4000, cuCtxPushCurrent_),
    P("cuCtxPopCurrent", 4000, cuCtxPopCurrent_),
    P("cuCtxGetDevice", 2000, cuCtxGetDevice_),
    P("cuCtxGetFlags", 7000, cuCtxGetFlags_),
    P("cuCtxGetApiVersion", 3020, cuCtxGetApiVersion_),
    P("cuCtxSynchronize", 2000, cuCtxSynchronize_),
    P("cuCtxGetLimit", 3010, cuCtxGetLimit_),
    P("cuCtxSetLimit", 3010, cuCtxSetLimit_),
    P("cuCtxGetStreamPriorityRange", 5050, cuCtxGetStreamPriorityRange_),
    P("cuCtxGetCacheConfig", 3020, cuCtxGetCacheConfig_),
    P("cuCtxSetCacheConfig", 3020, cuCtxSetCacheConfig_),
    P("cuCtxGetSharedMemConfig", 4020, cuCtxGetSharedMemConfig_),
    P("cuCtxGetId", 12000, cuCtxGetId_),
    P("cuMemAlloc", 3020, cuMemAlloc_),
    P("cuMemFree", 3020, cuMemFree_),
    P("cuMemAllocAsync", 11020, cuMemAllocAsync_),
    P("cuMemFreeAsync", 11020, cuMemFreeAsync_),
    P("cuMemHostAlloc", 2020, cuMemHostAlloc_),
    P("cuMemGetAllocationGranularity", 10020, cuMemGetAllocationGranularity_),
    P("cuMemPoolCreate", 11020, cuMemPoolCreate_),
    P("cuMemPoolDestroy", 11020, cuMemPoolDestroy_),
    P("cuMemPoolSetAttribute", 11020, cuMemPoolSetAttribute_),
    P("cuMemPoolGetAttribute", 11020, cuMemPoolGetAttribute_),
    P("cuMemPoolTrimTo", 11020, cuMemPoolTrimTo_),
    P("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync_),
    P("cuMemAllocHost", 3020, cuMemAllocHost_),
    P("cuMemFreeHost", 2000, cuMemFreeHost_),
    P("cuMemHostGetDevicePointer", 3020, cuMemHostGetDevicePointer_),
    P("cuMemHostGetFlags", 2030, cuMemHostGetFlags_),
    P("cuMemHostRegister", 6050, cuMemHostRegister_),
    P("cuMemHostUnregister", 4000, cuMemHostUnregister_),
    P("cuMemGetInfo", 3020, cuMemGetInfo_),
    P("cuMemGetAddressRange", 3020, cuMemGetAddressRange_),
    P("cuPointerGetAttribute", 4000, cuPointerGetAttribute_),
    P("cuPointerGetAttributes", 7000, cuPointerGetAttributes_),
    P("cuMemcpy", 4000, cuMemcpy_),
    P("cuMemcpyHtoD", 3020, cuMemcpyHtoD_),
    P("cuMemcpyDtoH", 3020, cuMemcpyDtoH_),
    P("cuMemcpyDtoD", 3020, cuMemcpyDtoD_),
    P("cuMemcpyAsync", 4000, cuMemcpyAsync_),
    P("cuMemcpyHtoDAsync", 3020, cuMemcpyHtoDAsync_),
    P("cuMemcpyDtoHAsync", 3020, cuMemcpyDtoHAsync_),
    P("cuMemcpyDtoDAsync", 3020, cuMemcpyDtoDAsync_),
    P("cuMemcpyPeer", 4000, cuMemcpyPeer_),
    P("cuMemcpyPeerAsync", 4000, cuMemcpyPeerAsync_),
    P("cuMemsetD8", 3020, cuMemsetD8_),
    P("cuMemsetD16", 3020, cuMemsetD16_),
    P("cuMemsetD32", 3020, cuMemsetD32_),
    P("cuMemsetD8Async", 3020, cuMemsetD8Async_),
    P("cuMemsetD16Async", 3020, cuMemsetD16Async_),
    P("cuMemsetD32Async", 3020, cuMemsetD32Async_),
    P("cuStreamCreate", 2000, cuStreamCreate_),
    P("cuStreamCreateWithPriority", 5050, cuStreamCreateWithPriority_),
    P("cuStreamDestroy", 4000, cuStreamDestroy_),
    P("cuStreamSynchronize", 2000, cuStreamSynchronize_),
    P("cuStreamQuery", 2000, cuStreamQuery_),
    P("cuStreamWaitEvent", 3020, cuStreamWaitEvent_),
    P("cuStreamGetFlags", 5050, cuStreamGetFlags_),
    P("cuStreamGetPriority", 5050, cuStreamGetPriority_),
    P("cuStreamGetId", 12000, cuStreamGetId_),
    P("cuStreamGetCtx", 9020, cuStreamGetCtx_),
    P("cuStreamGetCtx", 12050, cuStreamGetCtx_v2_),
    P("cuStreamGetDevice", 12080, cuStreamGetDevice_),
    P("cuStreamIsCapturing", 10000, cuStreamIsCapturing_),
    P("cuStreamGetCaptureInfo", 10010, cuStreamGetCaptureInfo_v1_),
    P("cuStreamGetCaptureInfo", 11030, cuStreamGetCaptureInfo_v2_),
    P("cuStreamGetCaptureInfo", 12030, cuStreamGetCaptureInfo_v3_),
    P("cuThreadExchangeStreamCaptureMode", 10010, cuThreadExchangeStreamCaptureMode_),
    P("cuLaunchHostFunc", 10000, cuLaunchHostFunc_),
    P("cuStreamAddCallback", 5000, cuStreamAddCallback_),
    P("cuEventCreate", 2000, cuEventCreate_),
    P("cuEventDestroy", 4000, cuEventDestroy_),
    P("cuEventRecord", 2000, cuEventRecord_),
    P("cuEventRecordWithFlags", 11010, cuEventRecordWithFlags_),
    P("cuEventQuery", 2000, cuEventQuery_),
    P("cuEventSynchronize", 2000, cuEventSynchronize_),
    P("cuEventElapsedTime", 2000, cuEventElapsedTime_),
    P("cuModuleLoadData", 2000, cuModuleLoadData_),
    P("cuModuleUnload", 2000, cuModuleUnload_),
    P("cuModuleGetFunction", 2000, cuModuleGetFunction_),
    P("cuModuleGetGlobal", 3020, cuModuleGetGlobal_),
    P("cuModuleGetLoadingMode", 11070, cuModuleGetLoadingMode_),
    P("cuLibraryLoadData", 12000, cuLibraryLoadData_),
    P("cuLibraryUnload", 12000, cuLibraryUnload_),
    P("cuLibraryGetKernel", 12000, cuLibraryGetKernel_),
    P("cuLibraryGetModule", 12000, cuLibraryGetModule_),
    P("cuLibraryGetGlobal", 12000, cuLibraryGetGlobal_),
    P("cuKernelGetFunction", 12000, cuKernelGetFunction_),
    P("cuKernelGetAttribute", 12000, cuKernelGetAttribute_),
    P("cuKernelSetAttribute", 12000, cuKernelSetAttribute_),
    P("cuKernelSetCacheConfig", 12000, cuKernelSetCacheConfig_),
    P("cuKernelGetName", 12030, cuFuncGetName_),
    P("cuFuncGetAttribute", 2020, cuFuncGetAttribute_),
    P("cuFuncSetAttribute", 9000, cuFuncSetAttribute_),
    P("cuFuncSetCacheConfig", 3000, cuFuncSetCacheConfig_),
    P("cuFuncGetName", 12030, cuFuncGetName_),
    P("cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags", 7000,
      cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags_),
    P("cuLaunchKernel", 4000, cuLaunchKernel_),
    P("cuLaunchKernelEx", 11060, cuLaunchKernelEx_),
};
#undef P

/* Stubs for the rest: each names itself. */
#define NBX_ENTRY(name)                                                                                               \
  static CUresult stub_##name(void) {                                                                                 \
    nbxLog("%s is not implemented by the rig's CUDA driver", #name);                                                  \
    return CUDA_ERROR_NOT_SUPPORTED;                                                                                  \
  }
#include "rig_entry_points.h"
#undef NBX_ENTRY
#define NBX_ENTRY(name) {#name, 0, (void *)stub_##name},
static const struct nbxProc stubs[] = {
#include "rig_entry_points.h"
};
#undef NBX_ENTRY

static void *lookup(const char *symbol, int version) {
  const struct nbxProc *best = NULL;
  for (size_t i = 0; i < sizeof(procs) / sizeof(procs[0]); i++)
    if (strcmp(procs[i].name, symbol) == 0 && procs[i].version <= version &&
        (best == NULL || procs[i].version > best->version))
      best = &procs[i];
  if (best == NULL) /* asked below every version the rig implements: the oldest ABI is the closest */
    for (size_t i = 0; i < sizeof(procs) / sizeof(procs[0]); i++)
      if (strcmp(procs[i].name, symbol) == 0 && (best == NULL || procs[i].version < best->version)) best = &procs[i];
  if (best != NULL) return best->fn;
  for (const struct nbxVmmEntry *e = nbxVmmEntries; e->name != NULL; e++)
    if (strcmp(e->name, symbol) == 0) return e->fn;
  for (size_t i = 0; i < sizeof(stubs) / sizeof(stubs[0]); i++)
    if (strcmp(stubs[i].name, symbol) == 0) return stubs[i].fn;
  return NULL;
}

static CUresult cuGetProcAddress_v2_(const char *symbol, void **pfn, int version, unsigned long long flags,
                                     int *status) {
  (void)flags; /* per-thread default stream or not: one default stream here */
  if (symbol == NULL || pfn == NULL) return CUDA_ERROR_INVALID_VALUE;
  *pfn = lookup(symbol, version);
  if (status) *status = *pfn ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  if (*pfn == NULL && nbxDebug()) nbxLog("cuGetProcAddress: no entry point %s (version %d)", symbol, version);
  return *pfn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

static CUresult cuGetProcAddress_v1_(const char *symbol, void **pfn, int version, unsigned long long flags) {
  return cuGetProcAddress_v2_(symbol, pfn, version, flags, NULL);
}

/* ---- the exported symbols: what dlsym finds (the runtime's first lookups, and the rig's own callers) ---- */

NBX_EXPORT CUresult cuGetProcAddress(const char *s, void **p, int v, unsigned long long f) {
  return cuGetProcAddress_v1_(s, p, v, f);
}
NBX_EXPORT CUresult cuGetProcAddress_v2(const char *s, void **p, int v, unsigned long long f, int *st) {
  return cuGetProcAddress_v2_(s, p, v, f, st);
}
NBX_EXPORT CUresult cuInit(unsigned flags) { return cuInit_(flags); }
NBX_EXPORT CUresult cuDriverGetVersion(int *v) { return cuDriverGetVersion_(v); }
NBX_EXPORT CUresult cuGetExportTable(const void **t, const CUuuid *id) { return cuGetExportTable_(t, id); }
NBX_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *d, size_t n) { return cuMemAlloc_(d, n); }
NBX_EXPORT CUresult cuMemFree_v2(CUdeviceptr d) { return cuMemFree_(d); }
NBX_EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) { return cuMemcpyHtoD_(d, s, n); }
NBX_EXPORT CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) { return cuMemcpyDtoH_(d, s, n); }
NBX_EXPORT CUresult cuStreamCreate(CUstream *s, unsigned flags) { return cuStreamCreate_(s, flags); }
NBX_EXPORT CUresult cuStreamDestroy_v2(CUstream s) { return cuStreamDestroy_(s); }
NBX_EXPORT CUresult cuStreamSynchronize(CUstream s) { return cuStreamSynchronize_(s); }
NBX_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) { return cuDevicePrimaryCtxRetain_(c, d); }
NBX_EXPORT CUresult cuCtxSetCurrent(CUcontext c) { return cuCtxSetCurrent_(c); }

CUresult nbxModuleNew(CUmodule *out);
CUresult nbxModuleNew(CUmodule *out) { return cuModuleLoadData_(out, NULL); }

/* What the runtime's integrity check mixes in about the device. */
CUresult nbxDeviceFacts(CUuuid *uuid, int *domain, int *bus, int *device);
CUresult nbxDeviceFacts(CUuuid *uuid, int *domain, int *bus, int *device) {
  CUresult r = cuDeviceGetUuid_(uuid, 0);
  if (r == CUDA_SUCCESS) r = cuDeviceGetAttribute_(domain, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, 0);
  if (r == CUDA_SUCCESS) r = cuDeviceGetAttribute_(bus, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 0);
  if (r == CUDA_SUCCESS) r = cuDeviceGetAttribute_(device, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, 0);
  return r;
}
