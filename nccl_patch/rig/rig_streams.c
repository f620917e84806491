/* Streams as host threads: each runs its queued operations (kernels, host functions, copies,
 * fills, event records, waits on other streams' events) in order, as a GPU stream does. A kernel
 * is NCCL's device code as CPU code (rig_kernels.c).
 *
 * Lifetimes, as the driver's: destroying a stream or an event returns at once, whatever is still
 * queued. A destroyed stream's thread ends once its queue is empty, and its struct is never freed
 * (events and other streams' waits may still name it; NCCL makes a handful per communicator), so
 * a late wait on it finds its work done. An event is freed by whichever comes last: its destroy or
 * the last of its queued records. The legacy default stream synchronizes with every blocking
 * stream, both ways. */
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
    struct { CUevent event; uint64_t seq; } record;
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

/* Events: their (stream, seq) pair, pending records and destroyed flag, under one lock. */
static pthread_mutex_t eventLock = PTHREAD_MUTEX_INITIALIZER;

static void eventRecorded(struct nbxStream *s, CUevent e, uint64_t seq) {
  double now = nowMs();
  pthread_mutex_lock(&eventLock);
  if (e->stream == s && e->seq == seq) e->timeMs = now; /* a later record on it has taken over otherwise */
  int last = --e->pendingRecords == 0 && e->destroyed;
  pthread_mutex_unlock(&eventLock);
  if (last) free(e);
}

void nbxEventDestroy(CUevent e) {
  pthread_mutex_lock(&eventLock);
  e->destroyed = 1;
  int now = e->pendingRecords == 0;
  pthread_mutex_unlock(&eventLock);
  if (now) free(e);
}

/* The event's last record: where and at which sequence number it completes. */
static struct nbxStream *eventTarget(CUevent e, uint64_t *seq) {
  pthread_mutex_lock(&eventLock);
  struct nbxStream *s = e->stream;
  *seq = e->seq;
  pthread_mutex_unlock(&eventLock);
  return s;
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
    if (op->u.fill.elemBytes == 1) memset(d, (int)op->u.fill.value, op->u.fill.count);
    else
      for (size_t i = 0; i < op->u.fill.count; i++)
        memcpy(d + i * op->u.fill.elemBytes, &op->u.fill.value, op->u.fill.elemBytes);
    break;
  }
  case OP_RECORD: eventRecorded(s, op->u.record.event, op->u.record.seq); break;
  case OP_WAIT: waitForSeq(op->u.wait.stream, op->u.wait.seq); break;
  }
}

static void freeOp(struct nbxOp *op) {
  if (op->kind == OP_KERNEL) free(op->u.kernel.args);
  if (op->kind == OP_COPY) free(op->u.copy.staged);
  free(op);
}

static void unlist(struct nbxStream *s) {
  pthread_mutex_lock(&liveLock);
  struct nbxStream **link = &live;
  while (*link != NULL && *link != s) link = &(*link)->nextLive;
  if (*link == s) *link = s->nextLive;
  pthread_mutex_unlock(&liveLock);
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
  unlist(s); /* destroyed, and its queue drained */
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
  pthread_detach(s->thread);
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

static void append(struct nbxStream *s, struct nbxOp *op) {
  op->next = NULL;
  if (s->tail) s->tail->next = op;
  else s->head = op;
  s->tail = op;
  ++s->submitted;
  pthread_cond_broadcast(&s->changed);
}

/* Where `to` must first wait for `from`'s work so far (nothing if it is all done). */
static void waitOnPending(struct nbxStream *to, struct nbxStream *from) {
  pthread_mutex_lock(&from->lock);
  uint64_t target = from->submitted;
  int pending = from->completed < target;
  pthread_mutex_unlock(&from->lock);
  if (!pending) return;
  struct nbxOp *op = calloc(1, sizeof(*op));
  if (op == NULL) {
    waitForSeq(from, target); /* no memory for the op: wait here instead, which orders it as well */
    return;
  }
  op->kind = OP_WAIT;
  op->u.wait.stream = from;
  op->u.wait.seq = target;
  pthread_mutex_lock(&to->lock);
  append(to, op);
  pthread_mutex_unlock(&to->lock);
}

#define CU_STREAM_NON_BLOCKING 0x1

/* The legacy default stream's implicit synchronization: work on it waits for every blocking
 * stream's earlier work, and work on a blocking stream waits for the default stream's. */
static void orderWithDefault(struct nbxStream *s) {
  nbxStreamResolve(NULL);
  if (s != defaultStream) {
    if (!(s->flags & CU_STREAM_NON_BLOCKING)) waitOnPending(s, defaultStream);
    return;
  }
  pthread_mutex_lock(&liveLock);
  for (struct nbxStream *o = live; o != NULL; o = o->nextLive)
    if (o != s && !(o->flags & CU_STREAM_NON_BLOCKING)) waitOnPending(s, o);
  pthread_mutex_unlock(&liveLock);
}

/* Returns the sequence number the op will complete at. */
static uint64_t enqueue(struct nbxStream *s, struct nbxOp *op) {
  orderWithDefault(s);
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
  /* As on a GPU, work already queued still runs (and a context synchronize still waits for
   * it); the thread ends after it and takes the stream off the live list. The struct stays. */
  pthread_mutex_lock(&s->lock);
  s->closing = 1;
  pthread_cond_broadcast(&s->changed);
  pthread_mutex_unlock(&s->lock);
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
  /* An earlier fault is sticky: the launch fails with it, as the driver's does. The check comes
   * before the enqueue, so this kernel's own fault (the stream thread may run it before this call
   * returns) is reported where CUDA reports it: at the next synchronization. */
  CUresult sticky = nbxStickyError();
  if (sticky != CUDA_SUCCESS) return sticky;
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
  return CUDA_SUCCESS;
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
  orderWithDefault(s);
  /* The record op and the event's target are one sequence number: set both under the locks. */
  pthread_mutex_lock(&eventLock);
  pthread_mutex_lock(&s->lock);
  append(s, op);
  op->u.record.seq = s->submitted;
  e->stream = s;
  e->seq = s->submitted;
  e->pendingRecords++;
  pthread_mutex_unlock(&s->lock);
  pthread_mutex_unlock(&eventLock);
  return CUDA_SUCCESS;
}

static int eventDone(CUevent e) {
  uint64_t seq;
  struct nbxStream *s = eventTarget(e, &seq);
  if (s == NULL) return 1;
  pthread_mutex_lock(&s->lock);
  int done = s->completed >= seq;
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
  uint64_t seq;
  struct nbxStream *s = eventTarget(e, &seq);
  if (s) waitForSeq(s, seq);
  return nbxStickyError();
}

#define CU_EVENT_DISABLE_TIMING 0x2

CUresult nbxEventElapsed(float *ms, CUevent start, CUevent end) {
  if (ms == NULL || start == NULL || end == NULL) return CUDA_ERROR_INVALID_VALUE;
  uint64_t seq;
  if (eventTarget(start, &seq) == NULL || eventTarget(end, &seq) == NULL) return CUDA_ERROR_INVALID_HANDLE;
  if ((start->flags | end->flags) & CU_EVENT_DISABLE_TIMING) return CUDA_ERROR_INVALID_HANDLE;
  if (!eventDone(start) || !eventDone(end)) return CUDA_ERROR_NOT_READY;
  *ms = (float)(end->timeMs - start->timeMs);
  return CUDA_SUCCESS;
}

CUresult nbxStreamWaitEvent(CUstream handle, CUevent e) {
  if (e == NULL) return CUDA_ERROR_INVALID_HANDLE;
  uint64_t seq;
  struct nbxStream *target = eventTarget(e, &seq);
  if (target == NULL) return CUDA_SUCCESS; /* never recorded: nothing to wait for */
  struct nbxStream *s = nbxStreamResolve(handle);
  if (target == s) return CUDA_SUCCESS; /* in order already */
  struct nbxOp *op = newOp(OP_WAIT);
  if (op == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  op->u.wait.stream = target;
  op->u.wait.seq = seq;
  enqueue(s, op);
  return CUDA_SUCCESS;
}

/* A context synchronize: every live stream drained up to what was queued when it was called.
 * Streams are never freed, so the snapshot stays valid while it waits without the lock. */
CUresult nbxSynchronizeAll(void) {
  nbxStreamResolve(NULL);
  struct nbxStream *snapshot[256];
  uint64_t targets[256];
  size_t n = 0;
  pthread_mutex_lock(&liveLock);
  int more = 0;
  for (struct nbxStream *s = live; s != NULL; s = s->nextLive) {
    if (n == 256) {
      more++;
      continue;
    }
    snapshot[n] = s;
    pthread_mutex_lock(&s->lock);
    targets[n++] = s->submitted;
    pthread_mutex_unlock(&s->lock);
  }
  pthread_mutex_unlock(&liveLock);
  for (size_t i = 0; i < n; i++) waitForSeq(snapshot[i], targets[i]);
  if (more) nbxLog("a context synchronize drained 256 streams; %d more were not waited for", more);
  return nbxStickyError();
}

unsigned long long nbxStreamId(CUstream s) { return nbxStreamResolve(s)->id; }
unsigned nbxStreamFlags(CUstream s) { return nbxStreamResolve(s)->flags; }
int nbxStreamPriority(CUstream s) { return nbxStreamResolve(s)->priority; }
