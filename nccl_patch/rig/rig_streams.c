/* Streams as host threads: each runs its queued operations (kernels, host functions, copies,
 * fills, event records, waits on other streams' events) in order, as a GPU stream does. A kernel
 * is NCCL's device code as CPU code (rig_kernels.c). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rig_internal.h"
#include "rig_kernels.h"

enum nbxOpKind { OP_KERNEL, OP_HOST_FN, OP_COPY, OP_FILL, OP_RECORD, OP_WAIT };

struct nbxOp {
  enum nbxOpKind kind;
  struct nbxOp *next;
  union {
    struct { struct nbxFunction *fn; void *args; size_t argsBytes; unsigned gridX, blockX; } kernel;
    struct { CUhostFn fn; void *data; } host;
    struct { void *dst; const void *src; size_t bytes; void *staged; } copy;
    struct { void *dst; uint32_t value; size_t elemBytes, count; } fill;
    struct { CUevent event; } record;
    struct { struct nbxStream *stream; uint64_t seq; } wait;
  } u;
};

struct nbxStream {
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t changed; /* an op queued, an op finished, or the stream is closing */
  struct nbxOp *head, *tail;
  uint64_t submitted, completed;
  unsigned long long id;
  unsigned flags;
  int priority;
  int closing;
  struct nbxStream *nextLive; /* in the list of live streams a context synchronize drains */
};

static pthread_mutex_t liveLock = PTHREAD_MUTEX_INITIALIZER;
static struct nbxStream *live;

static pthread_mutex_t stickyLock = PTHREAD_MUTEX_INITIALIZER;
static char stickyCause[512];
static int sticky;

CUresult nbxStickyError(void) { return __atomic_load_n(&sticky, __ATOMIC_ACQUIRE) ? CUDA_ERROR_LAUNCH_FAILED : CUDA_SUCCESS; }

void nbxSetStickyError(const char *cause) {
  pthread_mutex_lock(&stickyLock);
  if (!sticky) {
    snprintf(stickyCause, sizeof(stickyCause), "%s", cause);
    __atomic_store_n(&sticky, 1, __ATOMIC_RELEASE);
    nbxLog("%s", cause);
  }
  pthread_mutex_unlock(&stickyLock);
}

static double nowMs(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void waitForSeq(struct nbxStream *s, uint64_t seq) {
  pthread_mutex_lock(&s->lock);
  while (s->completed < seq) pthread_cond_wait(&s->changed, &s->lock);
  pthread_mutex_unlock(&s->lock);
}

static void runOp(struct nbxStream *s, struct nbxOp *op) {
  switch (op->kind) {
  case OP_KERNEL: {
    if (nbxStickyError() != CUDA_SUCCESS) break; /* a failed stream runs no more kernels */
    char err[400] = "";
    if (nbxRigRunKernel(op->u.kernel.fn->name, op->u.kernel.args, op->u.kernel.argsBytes, op->u.kernel.gridX,
                        op->u.kernel.blockX, err, sizeof(err)) != 0) {
      char line[512];
      snprintf(line, sizeof(line), "kernel failed on stream %llu: %s", s->id, err);
      nbxSetStickyError(line);
    }
    break;
  }
  case OP_HOST_FN: op->u.host.fn(op->u.host.data); break;
  case OP_COPY: memmove(op->u.copy.dst, op->u.copy.src, op->u.copy.bytes); break;
  case OP_FILL: {
    char *d = op->u.fill.dst;
    for (size_t i = 0; i < op->u.fill.count; i++) memcpy(d + i * op->u.fill.elemBytes, &op->u.fill.value, op->u.fill.elemBytes);
    break;
  }
  case OP_RECORD: op->u.record.event->timeMs = nowMs(); break;
  case OP_WAIT: waitForSeq(op->u.wait.stream, op->u.wait.seq); break;
  }
}

static void freeOp(struct nbxOp *op) {
  if (op->kind == OP_KERNEL) free(op->u.kernel.args);
  if (op->kind == OP_COPY) free(op->u.copy.staged);
  free(op);
}

static void *streamMain(void *arg) {
  struct nbxStream *s = arg;
  pthread_mutex_lock(&s->lock);
  for (;;) {
    while (s->head == NULL && !s->closing) pthread_cond_wait(&s->changed, &s->lock);
    if (s->head == NULL) break;
    struct nbxOp *op = s->head;
    pthread_mutex_unlock(&s->lock);
    runOp(s, op);
    pthread_mutex_lock(&s->lock);
    s->head = op->next;
    if (s->head == NULL) s->tail = NULL;
    s->completed++;
    freeOp(op);
    pthread_cond_broadcast(&s->changed);
  }
  pthread_mutex_unlock(&s->lock);
  return NULL;
}

static unsigned long long nextStreamId = 1;

static struct nbxStream *streamNew(unsigned flags, int priority) {
  struct nbxStream *s = calloc(1, sizeof(*s));
  if (s == NULL) return NULL;
  pthread_mutex_init(&s->lock, NULL);
  pthread_cond_init(&s->changed, NULL);
  s->flags = flags;
  s->priority = priority;
  s->id = __atomic_fetch_add(&nextStreamId, 1, __ATOMIC_RELAXED);
  if (pthread_create(&s->thread, NULL, streamMain, s) != 0) {
    free(s);
    return NULL;
  }
  pthread_mutex_lock(&liveLock);
  s->nextLive = live;
  live = s;
  pthread_mutex_unlock(&liveLock);
  return s;
}

static pthread_once_t defaultOnce = PTHREAD_ONCE_INIT;
static struct nbxStream *defaultStream;
static void makeDefault(void) { defaultStream = streamNew(0, 0); }

/* The NULL, legacy and per-thread streams are one default stream here. */
struct nbxStream *nbxStreamResolve(CUstream s) {
  if (s == NULL || s == NBX_CU_STREAM_LEGACY || s == NBX_CU_STREAM_PER_THREAD) {
    pthread_once(&defaultOnce, makeDefault);
    return defaultStream;
  }
  return s;
}

CUresult nbxStreamCreate(CUstream *out, unsigned flags, int priority) {
  if (out == NULL) return CUDA_ERROR_INVALID_VALUE;
  struct nbxStream *s = streamNew(flags, priority);
  if (s == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  *out = s;
  return CUDA_SUCCESS;
}

/* Returns the sequence number the op will complete at. */
static uint64_t enqueue(struct nbxStream *s, struct nbxOp *op) {
  op->next = NULL;
  pthread_mutex_lock(&s->lock);
  if (s->tail) s->tail->next = op;
  else s->head = op;
  s->tail = op;
  uint64_t seq = ++s->submitted;
  pthread_cond_broadcast(&s->changed);
  pthread_mutex_unlock(&s->lock);
  return seq;
}

CUresult nbxStreamDestroy(CUstream handle) {
  struct nbxStream *s = nbxStreamResolve(handle);
  if (s == defaultStream) return CUDA_SUCCESS;
  pthread_mutex_lock(&liveLock);
  struct nbxStream **link = &live;
  while (*link != NULL && *link != s) link = &(*link)->nextLive;
  if (*link == s) *link = s->nextLive;
  pthread_mutex_unlock(&liveLock);
  /* As on a GPU, work already queued still runs; the thread ends after it. */
  pthread_mutex_lock(&s->lock);
  s->closing = 1;
  pthread_cond_broadcast(&s->changed);
  pthread_mutex_unlock(&s->lock);
  pthread_join(s->thread, NULL);
  pthread_cond_destroy(&s->changed);
  pthread_mutex_destroy(&s->lock);
  free(s);
  return CUDA_SUCCESS;
}

CUresult nbxStreamSynchronize(CUstream handle) {
  struct nbxStream *s = nbxStreamResolve(handle);
  pthread_mutex_lock(&s->lock);
  uint64_t target = s->submitted;
  pthread_mutex_unlock(&s->lock);
  waitForSeq(s, target);
  return nbxStickyError();
}

CUresult nbxStreamQuery(CUstream handle) {
  struct nbxStream *s = nbxStreamResolve(handle);
  CUresult sticky = nbxStickyError();
  if (sticky != CUDA_SUCCESS) return sticky;
  pthread_mutex_lock(&s->lock);
  int idle = s->completed == s->submitted;
  pthread_mutex_unlock(&s->lock);
  return idle ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

static struct nbxOp *newOp(enum nbxOpKind kind) {
  struct nbxOp *op = calloc(1, sizeof(*op));
  if (op) op->kind = kind;
  return op;
}

CUresult nbxStreamLaunch(CUstream handle, struct nbxFunction *f, const void *args, size_t argsBytes, unsigned gridX,
                         unsigned blockX) {
  struct nbxOp *op = newOp(OP_KERNEL);
  if (op == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  /* A launch copies its parameters at the call, as the driver does. */
  op->u.kernel.args = malloc(argsBytes ? argsBytes : 1);
  if (op->u.kernel.args == NULL) {
    free(op);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  memcpy(op->u.kernel.args, args, argsBytes);
  op->u.kernel.fn = f;
  op->u.kernel.argsBytes = argsBytes;
  op->u.kernel.gridX = gridX;
  op->u.kernel.blockX = blockX;
  enqueue(nbxStreamResolve(handle), op);
  return nbxStickyError();
}

CUresult nbxStreamHostFn(CUstream handle, CUhostFn fn, void *data) {
  struct nbxOp *op = newOp(OP_HOST_FN);
  if (op == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  op->u.host.fn = fn;
  op->u.host.data = data;
  enqueue(nbxStreamResolve(handle), op);
  return CUDA_SUCCESS;
}

/* An asynchronous copy behaves as the driver's does with pageable host memory (memory the rig did
 * not allocate or register): a pageable source is read at the call (NCCL copies from its own stack
 * this way), and the call returns only once a pageable destination holds the bytes. */
CUresult nbxStreamCopy(CUstream handle, void *dst, const void *src, size_t bytes) {
  struct nbxOp *op = newOp(OP_COPY);
  if (op == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  op->u.copy.dst = dst;
  op->u.copy.src = src;
  op->u.copy.bytes = bytes;
  if (bytes > 0 && !nbxMemLookup(src, NULL, NULL, NULL, NULL)) {
    op->u.copy.staged = malloc(bytes);
    if (op->u.copy.staged == NULL) {
      free(op);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    memcpy(op->u.copy.staged, src, bytes);
    op->u.copy.src = op->u.copy.staged;
  }
  int pageableDst = bytes > 0 && !nbxMemLookup(dst, NULL, NULL, NULL, NULL);
  struct nbxStream *s = nbxStreamResolve(handle);
  uint64_t seq = enqueue(s, op);
  if (pageableDst) waitForSeq(s, seq);
  return CUDA_SUCCESS;
}

CUresult nbxStreamFill(CUstream handle, void *dst, uint32_t value, size_t elemBytes, size_t count) {
  struct nbxOp *op = newOp(OP_FILL);
  if (op == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  op->u.fill.dst = dst;
  op->u.fill.value = value;
  op->u.fill.elemBytes = elemBytes;
  op->u.fill.count = count;
  enqueue(nbxStreamResolve(handle), op);
  return CUDA_SUCCESS;
}

CUresult nbxEventRecord(CUevent e, CUstream handle) {
  if (e == NULL) return CUDA_ERROR_INVALID_HANDLE;
  struct nbxStream *s = nbxStreamResolve(handle);
  struct nbxOp *op = newOp(OP_RECORD);
  if (op == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  op->u.record.event = e;
  /* The record op and the event's target are the same sequence number: set both under the lock. */
  op->next = NULL;
  pthread_mutex_lock(&s->lock);
  if (s->tail) s->tail->next = op;
  else s->head = op;
  s->tail = op;
  e->stream = s;
  e->seq = ++s->submitted;
  pthread_cond_broadcast(&s->changed);
  pthread_mutex_unlock(&s->lock);
  return CUDA_SUCCESS;
}

static int eventDone(CUevent e) {
  struct nbxStream *s = e->stream;
  if (s == NULL) return 1;
  pthread_mutex_lock(&s->lock);
  int done = s->completed >= e->seq;
  pthread_mutex_unlock(&s->lock);
  return done;
}

CUresult nbxEventQuery(CUevent e) {
  if (e == NULL) return CUDA_ERROR_INVALID_HANDLE;
  CUresult sticky = nbxStickyError();
  if (sticky != CUDA_SUCCESS) return sticky;
  return eventDone(e) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult nbxEventSynchronize(CUevent e) {
  if (e == NULL) return CUDA_ERROR_INVALID_HANDLE;
  if (e->stream) waitForSeq(e->stream, e->seq);
  return nbxStickyError();
}

CUresult nbxEventElapsed(float *ms, CUevent start, CUevent end) {
  if (ms == NULL || start == NULL || end == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (!eventDone(start) || !eventDone(end)) return CUDA_ERROR_NOT_READY;
  *ms = (float)(end->timeMs - start->timeMs);
  return CUDA_SUCCESS;
}

CUresult nbxStreamWaitEvent(CUstream handle, CUevent e) {
  if (e == NULL) return CUDA_ERROR_INVALID_HANDLE;
  if (e->stream == NULL) return CUDA_SUCCESS;
  struct nbxStream *s = nbxStreamResolve(handle);
  if (e->stream == s) return CUDA_SUCCESS; /* in order already */
  struct nbxOp *op = newOp(OP_WAIT);
  if (op == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  op->u.wait.stream = e->stream;
  op->u.wait.seq = e->seq;
  enqueue(s, op);
  return CUDA_SUCCESS;
}

/* A context synchronize: every live stream drained up to what was queued when it was called. */
CUresult nbxSynchronizeAll(void) {
  nbxStreamResolve(NULL);
  pthread_mutex_lock(&liveLock);
  size_t n = 0;
  for (struct nbxStream *s = live; s != NULL; s = s->nextLive) n++;
  struct nbxStream **all = calloc(n ? n : 1, sizeof(*all));
  uint64_t *targets = calloc(n ? n : 1, sizeof(*targets));
  if (all == NULL || targets == NULL) {
    pthread_mutex_unlock(&liveLock);
    free(all);
    free(targets);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  n = 0;
  for (struct nbxStream *s = live; s != NULL; s = s->nextLive, n++) {
    all[n] = s;
    pthread_mutex_lock(&s->lock);
    targets[n] = s->submitted;
    pthread_mutex_unlock(&s->lock);
  }
  pthread_mutex_unlock(&liveLock);
  /* A stream destroyed meanwhile finished its work first (nbxStreamDestroy joins its thread), but its
   * memory is gone: synchronize only streams still live, under the lock, one at a time. */
  for (size_t i = 0; i < n; i++) {
    pthread_mutex_lock(&liveLock);
    int stillLive = 0;
    for (struct nbxStream *s = live; s != NULL; s = s->nextLive) stillLive |= s == all[i];
    if (stillLive) waitForSeq(all[i], targets[i]);
    pthread_mutex_unlock(&liveLock);
  }
  free(all);
  free(targets);
  return nbxStickyError();
}

unsigned long long nbxStreamId(CUstream s) { return nbxStreamResolve(s)->id; }
unsigned nbxStreamFlags(CUstream s) { return nbxStreamResolve(s)->flags; }
int nbxStreamPriority(CUstream s) { return nbxStreamResolve(s)->priority; }
