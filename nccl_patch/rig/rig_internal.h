/* The rig's substitute CUDA driver: what its parts share.
 * One device, one (primary) context; device memory is host memory; a stream is a host thread
 * that runs its queued operations in order; a kernel launch runs NCCL's kernel as CPU code
 * (rig_kernels.c) on that thread. */
#ifndef NBX_RIG_INTERNAL_H
#define NBX_RIG_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "rig_cuda.h"

#define NBX_EXPORT __attribute__((visibility("default")))
#define NBX_DRIVER_VERSION 12090 /* at least the runtime linked into libnccl 2.28.9 */

/* A line on stderr, prefixed "nbx-rig: ", in one write. */
void nbxLog(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Whether NBX_RIG_DEBUG asks for a line per driver call of interest. */
int nbxDebug(void);

/* An error inside a stream (a kernel that failed, a wait that timed out) is sticky, as on a GPU:
 * every later query and synchronize answers CUDA_ERROR_LAUNCH_FAILED. */
CUresult nbxStickyError(void);
void nbxSetStickyError(const char *cause);

struct nbxContext {
  CUdevice device;
  unsigned flags;
  int active;
  /* The runtime's context-local storage (a private export table): key -> value. */
  struct { void *key, *value; } storage[64];
  int nStorage;
};
extern struct nbxContext nbxPrimaryContext;

struct nbxFunction {
  char *name;             /* the kernel's mangled symbol, as the runtime registered it */
  int maxDynamicSharedBytes;
  struct nbxFunction *next; /* in its module's list */
};

struct nbxModule {
  struct nbxFunction *functions;
  struct nbxGlobal { char *name; void *ptr; size_t bytes; struct nbxGlobal *next; } *globals;
  pthread_mutex_t lock;
};

/* Memory: what was handed out, so pointer queries can answer. */
enum nbxMemKind { NBX_MEM_DEVICE = 1, NBX_MEM_HOST_ALLOC = 2, NBX_MEM_HOST_REGISTERED = 3 };
/* Entry points defined outside rig_driver.c, ended by a NULL name. */

extern const struct nbxVmmEntry { const char *name; int version; void *fn; } nbxVmmEntries[];
void *nbxMemAllocate(size_t bytes, enum nbxMemKind kind);
int nbxMemRelease(void *ptr, enum nbxMemKind kind);
int nbxMemRegister(void *ptr, size_t bytes);
int nbxMemRegisterKind(void *ptr, size_t bytes, enum nbxMemKind kind);
/* The allocation holding ptr: its base, size and kind; 0 if ptr is in none. */
int nbxMemLookup(const void *ptr, void **base, size_t *bytes, enum nbxMemKind *kind, uint64_t *id);

/* Streams. */
struct nbxStream *nbxStreamResolve(CUstream s);
CUresult nbxStreamCreate(CUstream *out, unsigned flags, int priority);
CUresult nbxStreamDestroy(CUstream s);
CUresult nbxStreamSynchronize(CUstream s);
CUresult nbxStreamQuery(CUstream s);
CUresult nbxStreamLaunch(CUstream s, struct nbxFunction *f, const void *args, size_t argsBytes,
                         unsigned gridX, unsigned blockX);
CUresult nbxStreamHostFn(CUstream s, CUhostFn fn, void *data);
CUresult nbxStreamCopy(CUstream s, void *dst, const void *src, size_t bytes);
CUresult nbxStreamFill(CUstream s, void *dst, uint32_t value, size_t elemBytes, size_t count);
CUresult nbxStreamWaitEvent(CUstream s, CUevent e);
CUresult nbxEventRecord(CUevent e, CUstream s);
CUresult nbxEventQuery(CUevent e);
CUresult nbxEventSynchronize(CUevent e);
CUresult nbxEventElapsed(float *ms, CUevent start, CUevent end);
void nbxEventDestroy(CUevent e);
CUresult nbxSynchronizeAll(void);
unsigned long long nbxStreamId(CUstream s);
unsigned nbxStreamFlags(CUstream s);
int nbxStreamPriority(CUstream s);

struct nbxEvent {
  struct nbxStream *stream; /* where it was last recorded; NULL: never recorded (complete) */
  uint64_t seq;             /* complete once that stream has finished this many operations */
  double timeMs;            /* when the record operation ran */
  unsigned flags;
  int pendingRecords;       /* record operations queued and not yet run */
  int destroyed;
};

#endif
