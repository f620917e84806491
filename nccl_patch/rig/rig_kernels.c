/*
 * rig_kernels.c -- NCCL 2.28.9's collective device kernels, run on the CPU.
 *
 * The rig runs the unmodified libnccl.so.2 (nvidia-nccl-cu12 2.28.9) on a machine without a
 * GPU. Our substitute CUDA driver gives NCCL host memory for device memory and, when NCCL
 * launches one of its device kernels, calls nbxRigRunKernel() on the stream's host thread.
 * This file does on the CPU what NCCL's device code does for the configuration the launcher
 * pins: algorithm Ring, protocol Simple, NET transport (NCCL's own proxy thread and Socket net
 * plugin move the bytes between ranks).
 *
 * It restates, in our own code, the device-side logic of NCCL 2.28.9 (NVIDIA's NCCL is
 * BSD-licensed; the facts below were read from its sources at tag v2.28.9-1, the code is ours):
 *   - src/include/device.h: the layouts of the kernel arguments, work batches, work items,
 *     the kernel's view of the communicator and channels; ncclCollCbdPart;
 *   - src/device/common.h: ncclKernelMain / loadWorkBatchToShmem / RunWorkBatch / profiler;
 *   - src/device/prims_simple.h: the Simple primitives (genericOp, waitPeer, postPeer,
 *     loadRecvConn / loadSendConn, the destructor);
 *   - src/device/{all_reduce,all_gather,reduce_scatter,broadcast,reduce}.h: the ring loops;
 *   - src/device/reduce_kernel.h, common_kernel.h: the element operations and their order;
 *   - src/device/generate.py: the function id numbering (see gen_funcs.py).
 * Anything else (another algorithm, protocol, work type, registered buffers, device net
 * offload) is refused with a one-line cause instead of being guessed at.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "rig_kernels.h"
#include "rig_funcs.h"

#include <sched.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

/* ------------------------------------------------------------------------------------------
 * NCCL 2.28.9 constants (src/include/device.h, collectives.h, nccl_common.h, nccl_tuner.h).
 * ------------------------------------------------------------------------------------------ */

#define RIG_STEPS 8               /* NCCL_STEPS: slots per connection */
#define RIG_MAXCHANNELS 64        /* MAXCHANNELS */
#define RIG_NUM_PROTOCOLS 3       /* LL, LL128, SIMPLE */
#define RIG_MAX_CONNS 2           /* NCCL_MAX_CONNS */
#define RIG_PROFILER_SLOTS 64     /* MAX_PROFILER_EVENTS_PER_CHANNEL */
#define RIG_BATCH_WORK_BYTES 1024 /* NCCL_MAX_DEV_WORK_BATCH_BYTES: the kernel's work storage */
#define RIG_SIMPLE_GRAIN 512      /* ncclProtoGrainSize(NCCL_PROTO_SIMPLE) */

enum { RIG_PROTO_SIMPLE = 2 };
enum { RIG_ALGO_RING = 1 };
enum {
  RIG_COLL_BROADCAST = 0, RIG_COLL_REDUCE = 1, RIG_COLL_ALLGATHER = 2,
  RIG_COLL_REDUCESCATTER = 3, RIG_COLL_ALLREDUCE = 4, RIG_COLL_SENDRECV = 5
};
/* ncclDevRedOp_t, plus our own marker for the copy-only collectives (FuncCopy). */
enum {
  RIG_OP_SUM = 0, RIG_OP_PROD = 1, RIG_OP_MINMAX = 2, RIG_OP_PREMULSUM = 3,
  RIG_OP_SUMPOSTDIV = 4, RIG_OP_COPY = 100
};
/* ncclDataType_t */
enum {
  RIG_T_I8 = 0, RIG_T_U8, RIG_T_I32, RIG_T_U32, RIG_T_I64, RIG_T_U64,
  RIG_T_F16, RIG_T_F32, RIG_T_F64, RIG_T_BF16, RIG_T_F8E4M3, RIG_T_F8E5M2
};
enum { RIG_WORK_P2P = 0, RIG_WORK_COLL = 1, RIG_WORK_COLLREG = 2 };    /* ncclDevWorkType */
enum { RIG_STORE_ARGS = 0, RIG_STORE_FIFO = 1, RIG_STORE_PERSISTENT = 2 }; /* ncclDevWorkStorageType */
enum { RIG_FIFO_MODE_OFFSET = 1 };                                       /* NCCL_MODE_OFFSET */
enum { RIG_NET_DEVICE_HOST = 0 };                                        /* NCCL_NET_DEVICE_HOST */

/* Chunk and slice steps of the ring collectives under Simple (src/include/collectives.h):
 * ALLREDUCE/ALLGATHER/REDUCESCATTER chunk NCCL_STEPS/2 = 4, slice NCCL_STEPS/4 = 2;
 * BROADCAST and REDUCE chunk 1, slice 1. The primitives get SlicePerChunk = chunk/slice and
 * StepPerSlice = slice. */
#define RIG_RING_SLICES_PER_CHUNK 2
#define RIG_RING_STEPS_PER_SLICE 2

/* ------------------------------------------------------------------------------------------
 * Memory layouts the kernel reads (restated from src/include/device.h and collectives.h;
 * offsets checked with g++ against NCCL's own headers, asserted below).
 * ------------------------------------------------------------------------------------------ */

struct rigConnFifo {             /* struct ncclConnFifo: one per step slot, shared with the proxy */
  int mode;                      /* NCCL_MODE_NORMAL or NCCL_MODE_OFFSET */
  int offset;                    /* buffer offset of the slot in offset mode */
  int64_t size;                  /* bytes of the step (sender writes; proxy resets to -1) */
  void *ptr;
};

struct rigNetDeviceHandle {      /* ncclNetDeviceHandle_v11_t */
  int netDeviceType;
  int netDeviceVersion;
  void *handle;
  size_t size;
  int needsProxyProgress;
};

struct rigConnInfo {             /* struct ncclConnInfo */
  char *buffs[RIG_NUM_PROTOCOLS];  /* local for recv, remote for send */
  void *mhandles[RIG_NUM_PROTOCOLS];
  uint64_t *tail;                /* written by the producer of data */
  uint64_t *head;                /* written by the consumer of data (credits) */
  int flags;
  int shared;
  int stepSize;                  /* bytes of one Simple step slot */
  void **ptrExchange;
  uint64_t *redOpArgExchange;
  struct rigConnFifo *connFifo;
  uint64_t step;                 /* where the connection stands between kernels */
  uint64_t llLastCleaning;
  struct rigNetDeviceHandle netDeviceHandle;
};

struct rigDevChannelPeer {       /* struct ncclDevChannelPeer */
  struct rigConnInfo send[RIG_MAX_CONNS];
  struct rigConnInfo recv[RIG_MAX_CONNS];
};

struct rigRing {                 /* struct ncclRing */
  int prev;
  int next;
  int *userRanks;                /* ring order starting from this rank */
  int index;                     /* this rank's position in the ring */
};

struct rigDevChannel {           /* struct ncclDevChannel (alignas 16) */
  struct rigDevChannelPeer **peers;   /* indexed by rank */
  struct rigRing ring;
  unsigned char otherTopologies[312]; /* tree, collnetChain, collnetDirect, nvls: unused here */
  uint32_t *workFifoDone;
  uint64_t workCounter;               /* profiler work counter, kept across kernels */
} __attribute__((aligned(16)));

struct rigDevProfiler {          /* struct ncclDevProfiler */
  struct {
    uint64_t counter;
    uint64_t timestamp;
  } data[RIG_PROFILER_SLOTS];
};

struct rigKernelComm {           /* struct ncclKernelComm */
  int rank;
  int nRanks;
  int node;
  int nNodes;
  int buffSizes[RIG_NUM_PROTOCOLS];
  int p2pChunkSize;
  int isAllNvlink;
  int *collNetDenseToUserRank;
  volatile uint32_t *abortFlag;
  struct rigDevChannel *channels;
  int *rankToLocalRank;
  struct rigDevProfiler *workStarted;    /* [MAXCHANNELS] */
  struct rigDevProfiler *workCompleted;  /* [MAXCHANNELS] */
};

struct rigKernelCommAndChannels { /* struct ncclKernelCommAndChannels: what args.comm points at */
  struct rigKernelComm comm;
  struct rigDevChannel channels[RIG_MAXCHANNELS];
} __attribute__((aligned(16)));

struct rigKernelArgs {           /* struct ncclDevKernelArgs (alignas 16), batches follow it */
  struct rigKernelCommAndChannels *comm;
  uint64_t channelMask;
  uint8_t workStorageType;
  uint32_t workMask;
  void *workBuf;
} __attribute__((aligned(16)));

struct rigWorkBatch {            /* struct ncclDevWorkBatch (alignas 16) */
  uint32_t flags;                /* nextJump:14, nextExtends:1, workType:2, funcId:15 (low bits first) */
  uint32_t offsetBase;           /* where this batch's work items begin */
  uint64_t offsetBitset;         /* bit i: a work item at offsetBase + i*workSize */
};
#define RIG_BATCH_NEXT_JUMP(f) ((f) & 0x3fffu)
#define RIG_BATCH_NEXT_EXTENDS(f) (((f) >> 14) & 1u)
#define RIG_BATCH_WORK_TYPE(f) (((f) >> 15) & 3u)
#define RIG_BATCH_FUNC_ID(f) ((f) >> 17)

struct rigWorkColl {             /* struct ncclDevWorkColl (alignas 16) */
  uint32_t bits;                 /* channelLo:8, channelHi:8, nWarps:8, redOpArgIsPtr:1, regUsed:1,
                                    netRegUsed:1, oneNode:1, direct:2, isOneRPN:1, profilerEnabled:1 */
  uint32_t root;
  void *recvbuff;
  void *sendbuff;
  uintptr_t sendbuffOffset;
  uintptr_t recvbuffOffset;
  uintptr_t *sendbuffRmtAddrs;
  uintptr_t *recvbuffRmtAddrs;
  size_t countLo, countMid, countHi;  /* the cbd member of the union (collnet uses the other) */
  uint64_t chunkGrains;          /* chunkGrainsLo:21, chunkGrainsMid:21, chunkGrainsHi:21 */
  uint64_t redOpArg;
};
#define RIG_WORK_CHANNEL_LO(w) ((int)((w)->bits & 0xffu))
#define RIG_WORK_CHANNEL_HI(w) ((int)(((w)->bits >> 8) & 0xffu))
#define RIG_WORK_NWARPS(w) ((int)(((w)->bits >> 16) & 0xffu))
#define RIG_WORK_REDOPARG_IS_PTR(w) (((w)->bits >> 24) & 1u)
#define RIG_WORK_REG_USED(w) (((w)->bits >> 25) & 1u)
#define RIG_WORK_NET_REG_USED(w) (((w)->bits >> 26) & 1u)
#define RIG_WORK_PROFILER_ENABLED(w) (((w)->bits >> 31) & 1u)
#define RIG_GRAINS_LO(w) ((w)->chunkGrains & 0x1fffffu)
#define RIG_GRAINS_MID(w) (((w)->chunkGrains >> 21) & 0x1fffffu)
#define RIG_GRAINS_HI(w) (((w)->chunkGrains >> 42) & 0x1fffffu)

/* sizeof(ncclDevWorkP2p), sizeof(ncclDevWorkColl), sizeof(ncclDevWorkCollReg) */
#define RIG_WORK_P2P_BYTES 48
#define RIG_WORK_COLL_BYTES 96
#define RIG_WORK_COLLREG_BYTES 288

/* A layout slip must fail the build: these are the numbers g++ gave for NCCL 2.28.9's own
 * headers on x86_64 (LP64). */
_Static_assert(sizeof(struct rigConnFifo) == 24, "ncclConnFifo size");
_Static_assert(offsetof(struct rigConnFifo, offset) == 4, "ncclConnFifo.offset");
_Static_assert(offsetof(struct rigConnFifo, size) == 8, "ncclConnFifo.size");
_Static_assert(sizeof(struct rigNetDeviceHandle) == 32, "ncclNetDeviceHandle size");
_Static_assert(sizeof(struct rigConnInfo) == 152, "ncclConnInfo size");
_Static_assert(offsetof(struct rigConnInfo, tail) == 48, "ncclConnInfo.tail");
_Static_assert(offsetof(struct rigConnInfo, head) == 56, "ncclConnInfo.head");
_Static_assert(offsetof(struct rigConnInfo, flags) == 64, "ncclConnInfo.flags");
_Static_assert(offsetof(struct rigConnInfo, stepSize) == 72, "ncclConnInfo.stepSize");
_Static_assert(offsetof(struct rigConnInfo, connFifo) == 96, "ncclConnInfo.connFifo");
_Static_assert(offsetof(struct rigConnInfo, step) == 104, "ncclConnInfo.step");
_Static_assert(offsetof(struct rigConnInfo, netDeviceHandle) == 120, "ncclConnInfo.netDeviceHandle");
_Static_assert(sizeof(struct rigDevChannelPeer) == 608, "ncclDevChannelPeer size");
_Static_assert(offsetof(struct rigDevChannelPeer, recv) == 304, "ncclDevChannelPeer.recv");
_Static_assert(sizeof(struct rigRing) == 24, "ncclRing size");
_Static_assert(offsetof(struct rigRing, userRanks) == 8, "ncclRing.userRanks");
_Static_assert(offsetof(struct rigRing, index) == 16, "ncclRing.index");
_Static_assert(sizeof(struct rigDevChannel) == 368, "ncclDevChannel size");
_Static_assert(offsetof(struct rigDevChannel, ring) == 8, "ncclDevChannel.ring");
_Static_assert(offsetof(struct rigDevChannel, workFifoDone) == 344, "ncclDevChannel.workFifoDone");
_Static_assert(offsetof(struct rigDevChannel, workCounter) == 352, "ncclDevChannel.workCounter");
_Static_assert(sizeof(struct rigDevProfiler) == 1024, "ncclDevProfiler size");
_Static_assert(sizeof(struct rigKernelComm) == 88, "ncclKernelComm size");
_Static_assert(offsetof(struct rigKernelComm, buffSizes) == 16, "ncclKernelComm.buffSizes");
_Static_assert(offsetof(struct rigKernelComm, abortFlag) == 48, "ncclKernelComm.abortFlag");
_Static_assert(offsetof(struct rigKernelComm, channels) == 56, "ncclKernelComm.channels");
_Static_assert(offsetof(struct rigKernelComm, workStarted) == 72, "ncclKernelComm.workStarted");
_Static_assert(offsetof(struct rigKernelComm, workCompleted) == 80, "ncclKernelComm.workCompleted");
_Static_assert(offsetof(struct rigKernelCommAndChannels, channels) == 96, "ncclKernelCommAndChannels.channels");
_Static_assert(sizeof(struct rigKernelCommAndChannels) == 23648, "ncclKernelCommAndChannels size");
_Static_assert(sizeof(struct rigKernelArgs) == 32, "ncclDevKernelArgs size");
_Static_assert(offsetof(struct rigKernelArgs, channelMask) == 8, "ncclDevKernelArgs.channelMask");
_Static_assert(offsetof(struct rigKernelArgs, workStorageType) == 16, "ncclDevKernelArgs.workStorageType");
_Static_assert(offsetof(struct rigKernelArgs, workMask) == 20, "ncclDevKernelArgs.workMask");
_Static_assert(offsetof(struct rigKernelArgs, workBuf) == 24, "ncclDevKernelArgs.workBuf");
_Static_assert(sizeof(struct rigWorkBatch) == 16, "ncclDevWorkBatch size");
_Static_assert(sizeof(struct rigWorkColl) == RIG_WORK_COLL_BYTES, "ncclDevWorkColl size");
_Static_assert(offsetof(struct rigWorkColl, recvbuff) == 8, "ncclDevWorkColl.recvbuff");
_Static_assert(offsetof(struct rigWorkColl, sendbuff) == 16, "ncclDevWorkColl.sendbuff");
_Static_assert(offsetof(struct rigWorkColl, countLo) == 56, "ncclDevWorkColl.cbd.countLo");
_Static_assert(offsetof(struct rigWorkColl, chunkGrains) == 80, "ncclDevWorkColl.cbd chunk grains");
_Static_assert(offsetof(struct rigWorkColl, redOpArg) == 88, "ncclDevWorkColl.redOpArg");
_Static_assert(NBX_RIG_FUNC_COUNT == 670, "NCCL 2.28.9 has 670 device functions (gen_funcs.py)");

/* ------------------------------------------------------------------------------------------
 * Launch and block state.
 * ------------------------------------------------------------------------------------------ */

enum { RIG_OK = 0, RIG_ABORTED = 1, RIG_FAILED = -1 };

struct rigLaunch {
  const unsigned char *args;     /* the parameter buffer: ncclDevKernelArgs then the batches */
  size_t argsBytes;
  const struct rigKernelArgs *ka;
  char *err;
  size_t errLen;
  double timeoutS;
};

/* One thread block = one channel; mirrors the parts of ncclShmem the algorithms use. */
struct rigBlock {
  struct rigLaunch *launch;
  int blockIdx;
  int channelId;
  struct rigKernelComm comm;     /* copy of the communicator, like ncclShmem.comm */
  struct rigDevChannel chan;     /* copy of this channel, like ncclShmem.channel */
  struct rigDevChannel *chanDev; /* the channel in device memory */
  uint64_t workCounter;
  int aborted;
  /* The batch being run (ncclShmem.batchIx etc.). */
  int nextBatchIx;
  int funcId;
  int workType;
  int nWorks;
  int workSize;
  unsigned char works[RIG_BATCH_WORK_BYTES] __attribute__((aligned(16)));
};

static int rigFail(struct rigLaunch *launch, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int rigFail(struct rigLaunch *launch, const char *fmt, ...) {
  if (launch->err && launch->errLen > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(launch->err, launch->errLen, fmt, ap);
    va_end(ap);
    for (char *c = launch->err; *c; c++)
      if (*c == '\n' || *c == '\r') *c = ' ';
  }
  return RIG_FAILED;
}

static double rigNow(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The device's %globaltimer is nanoseconds; the closest host clock is wall time in ns. */
static uint64_t rigTimestampNs(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static double rigTimeoutFromEnv(void) {
  const char *s = getenv("NBX_RIG_KERNEL_TIMEOUT_S");
  if (s && *s) {
    char *end = NULL;
    double v = strtod(s, &end);
    if (end != s && v > 0) return v;
  }
  return 120.0;
}

static int rigAbortRaised(struct rigBlock *b) {
  if (b->aborted) return 1;
  if (b->comm.abortFlag && __atomic_load_n(b->comm.abortFlag, __ATOMIC_RELAXED) != 0) b->aborted = 1;
  return b->aborted;
}

/* Backing off politely: the machine has few cores shared by every rank and its proxy thread.
 * A few hundred pause-spins, then yields, then sleeps that lengthen with the time waited. */
static void rigBackoff(unsigned spins, double waited) {
  if (spins < 256) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
    return;
  }
  if (spins < 1024) {
    sched_yield();
    return;
  }
  long ns = waited < 0.01 ? 10000L : waited < 1.0 ? 50000L : 500000L;
  struct timespec ts = {0, ns};
  nanosleep(&ts, NULL);
}

/* ------------------------------------------------------------------------------------------
 * Number formats: half and bfloat16 conversions, round to nearest even, written out here.
 * ------------------------------------------------------------------------------------------ */

static inline uint32_t rigF32Bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float rigF32From(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint64_t rigF64Bits(double d) { uint64_t u; memcpy(&u, &d, 8); return u; }

static inline float rigHalfToFloat(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return rigF32From(sign | 0x7f800000u | (man << 13)); /* inf, NaN */
  if (exp != 0) return rigF32From(sign | ((exp + 112u) << 23) | (man << 13)); /* bias 15 -> 127 */
  float mag = (float)man * 0x1p-24f; /* zero or subnormal: man units of 2^-24, exact */
  return sign ? -mag : mag;
}

static inline uint16_t rigFloatToHalf(float f) {
  uint32_t u = rigF32Bits(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t mag = u & 0x7fffffffu;
  if (mag > 0x7f800000u) return 0x7fff;                   /* NaN: the canonical half NaN */
  if (mag >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to infinity */
  if (mag < 0x38800000u) {
    /* Below 2^-14: a subnormal half (or zero). Adding 0.5 makes the float's last mantissa bit
     * worth 2^-24, the half subnormal unit, so the float adder rounds to nearest even for us. */
    float shifted = rigF32From(mag) + 0.5f;
    return (uint16_t)(sign | (rigF32Bits(shifted) - 0x3f000000u));
  }
  /* Normal: rebias the exponent and drop 13 mantissa bits, rounding to nearest, ties to even
   * (a carry out of the mantissa correctly bumps the exponent). */
  uint32_t odd = (mag >> 13) & 1u;
  mag += ((uint32_t)(15 - 127) << 23) + 0xfffu + odd;
  return (uint16_t)(sign | (mag >> 13));
}

static inline float rigBf16ToFloat(uint16_t h) { return rigF32From((uint32_t)h << 16); }

static inline uint16_t rigFloatToBf16(float f) {
  uint32_t u = rigF32Bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;    /* NaN: canonical */
  u += 0x7fffu + ((u >> 16) & 1u);                        /* nearest, ties to even */
  return (uint16_t)(u >> 16);
}

/* Min/max as the GPU's fminf/fmaxf (and __hmin/__hmax): a NaN loses to a number, two NaNs give
 * the canonical NaN (returned as 2), -0 is below +0. Returns 0 to keep x, 1 to keep y. */
static inline int rigPickF32(float x, float y, int isMin) {
  if (x != x) return (y != y) ? 2 : 1;
  if (y != y) return 0;
  if (x < y) return isMin ? 0 : 1;
  if (y < x) return isMin ? 1 : 0;
  int xNeg = (rigF32Bits(x) >> 31) != 0;
  return isMin ? (xNeg ? 0 : 1) : (xNeg ? 1 : 0);
}
static inline int rigPickF64(double x, double y, int isMin) {
  if (x != x) return (y != y) ? 2 : 1;
  if (y != y) return 0;
  if (x < y) return isMin ? 0 : 1;
  if (y < x) return isMin ? 1 : 0;
  int xNeg = (rigF64Bits(x) >> 63) != 0;
  return isMin ? (xNeg ? 0 : 1) : (xNeg ? 1 : 0);
}

/* ------------------------------------------------------------------------------------------
 * Element operations (src/device/reduce_kernel.h) and reduceCopy's order
 * (src/device/common_kernel.h): acc = preOp(src0) [pre-op only on the user's input];
 * acc = op(acc, src1); acc = postOp(acc) when asked; acc stored to every destination.
 * ------------------------------------------------------------------------------------------ */

struct rigRed {
  int op;          /* RIG_OP_* */
  int type;        /* RIG_T_*; signed integers run as their unsigned twin, like NCCL */
  int eltSize;
  uint64_t arg;    /* the work's redOpArg (already loaded if it was a pointer) */
};

struct rigOpCtx {  /* per-call constants derived from the op's argument */
  int isMin;                 /* MinMax on floats: (arg & 1) == 0 */
  uint64_t xorMask;          /* MinMax on integers: compare (x ^ mask) as unsigned */
  uint64_t uScalar;          /* PreMulSum on integers */
  float fScalar;             /* PreMulSum on f32, f16, bf16 (the latter two exact in float) */
  double dScalar;            /* PreMulSum on f64 */
  uint32_t divisor;          /* SumPostDiv: arg >> 1 (31 bits) */
  int divSigned;             /* SumPostDiv: arg & 1 */
};

/* Integer element ops for one unsigned width T (U: a name suffix). */
#define RIG_UINT_OPS(U, T, TOPBIT)                                                              \
  static inline T rigSum_##U(const struct rigOpCtx *c, T x, T y) { (void)c; return (T)(x + y); } \
  static inline T rigProd_##U(const struct rigOpCtx *c, T x, T y) { (void)c; return (T)(x * y); } \
  static inline T rigMinMax_##U(const struct rigOpCtx *c, T x, T y) {                         \
    T m = (T)c->xorMask;                                                                      \
    return (T)(x ^ m) < (T)(y ^ m) ? x : y;                                                   \
  }                                                                                           \
  static inline T rigNoPre_##U(const struct rigOpCtx *c, T x) { (void)c; return x; }          \
  static inline T rigMulPre_##U(const struct rigOpCtx *c, T x) { return (T)(x * (T)c->uScalar); } \
  static inline T rigNoPost_##U(const struct rigOpCtx *c, T x) { (void)c; return x; }         \
  static inline T rigDivPost_##U(const struct rigOpCtx *c, T x) {                             \
    if (c->divisor == 0) return x;                                                            \
    int neg = c->divSigned && (x & (T)(TOPBIT));                                              \
    T mag = neg ? (T)(-x) : x;                                                                \
    T q = (T)(mag / c->divisor);                                                              \
    return neg ? (T)(-q) : q;                                                                 \
  }
RIG_UINT_OPS(u8, uint8_t, 0x80u)
RIG_UINT_OPS(u32, uint32_t, 0x80000000u)
RIG_UINT_OPS(u64, uint64_t, 0x8000000000000000ull)

/* f32: results are rounded by the CPU's IEEE single arithmetic (as the GPU's, no FTZ); a NaN
 * result is the canonical 0x7fffffff as the GPU produces. */
static inline uint32_t rigCanonF32(float r) { return r != r ? 0x7fffffffu : rigF32Bits(r); }
static inline uint32_t rigSum_f32(const struct rigOpCtx *c, uint32_t x, uint32_t y) {
  (void)c; return rigCanonF32(rigF32From(x) + rigF32From(y));
}
static inline uint32_t rigProd_f32(const struct rigOpCtx *c, uint32_t x, uint32_t y) {
  (void)c; return rigCanonF32(rigF32From(x) * rigF32From(y));
}
static inline uint32_t rigMinMax_f32(const struct rigOpCtx *c, uint32_t x, uint32_t y) {
  int pick = rigPickF32(rigF32From(x), rigF32From(y), c->isMin);
  return pick == 0 ? x : pick == 1 ? y : 0x7fffffffu;
}
static inline uint32_t rigNoPre_f32(const struct rigOpCtx *c, uint32_t x) { (void)c; return x; }
static inline uint32_t rigMulPre_f32(const struct rigOpCtx *c, uint32_t x) {
  return rigCanonF32(rigF32From(x) * c->fScalar);
}
static inline uint32_t rigNoPost_f32(const struct rigOpCtx *c, uint32_t x) { (void)c; return x; }

/* f64: IEEE double arithmetic. */
static inline double rigF64From(uint64_t u) { double d; memcpy(&d, &u, 8); return d; }
static inline uint64_t rigSum_f64(const struct rigOpCtx *c, uint64_t x, uint64_t y) {
  (void)c; return rigF64Bits(rigF64From(x) + rigF64From(y));
}
static inline uint64_t rigProd_f64(const struct rigOpCtx *c, uint64_t x, uint64_t y) {
  (void)c; return rigF64Bits(rigF64From(x) * rigF64From(y));
}
static inline uint64_t rigMinMax_f64(const struct rigOpCtx *c, uint64_t x, uint64_t y) {
  int pick = rigPickF64(rigF64From(x), rigF64From(y), c->isMin);
  return pick == 0 ? x : pick == 1 ? y : 0x7fffffffffffffffull;
}
static inline uint64_t rigNoPre_f64(const struct rigOpCtx *c, uint64_t x) { (void)c; return x; }
static inline uint64_t rigMulPre_f64(const struct rigOpCtx *c, uint64_t x) {
  return rigF64Bits(rigF64From(x) * c->dScalar);
}
static inline uint64_t rigNoPost_f64(const struct rigOpCtx *c, uint64_t x) { (void)c; return x; }

/* f16 and bf16: one operation in float then one rounding to nearest even. For +, * of two
 * halves (or bfloat16s) float carries enough bits that this equals the GPU's native
 * __hadd/__hmul (single rounding); min/max just keep one of the inputs. */
#define RIG_SHORT_FLOAT_OPS(U, TOF, FROMF)                                                      \
  static inline uint16_t rigSum_##U(const struct rigOpCtx *c, uint16_t x, uint16_t y) {      \
    (void)c; return FROMF(TOF(x) + TOF(y));                                                   \
  }                                                                                           \
  static inline uint16_t rigProd_##U(const struct rigOpCtx *c, uint16_t x, uint16_t y) {     \
    (void)c; return FROMF(TOF(x) * TOF(y));                                                   \
  }                                                                                           \
  static inline uint16_t rigMinMax_##U(const struct rigOpCtx *c, uint16_t x, uint16_t y) {   \
    int pick = rigPickF32(TOF(x), TOF(y), c->isMin);                                          \
    return pick == 0 ? x : pick == 1 ? y : (uint16_t)0x7fff;                                  \
  }                                                                                           \
  static inline uint16_t rigNoPre_##U(const struct rigOpCtx *c, uint16_t x) { (void)c; return x; } \
  static inline uint16_t rigMulPre_##U(const struct rigOpCtx *c, uint16_t x) {               \
    return FROMF(TOF(x) * c->fScalar);                                                        \
  }                                                                                           \
  static inline uint16_t rigNoPost_##U(const struct rigOpCtx *c, uint16_t x) { (void)c; return x; }
RIG_SHORT_FLOAT_OPS(f16, rigHalfToFloat, rigFloatToHalf)
RIG_SHORT_FLOAT_OPS(bf16, rigBf16ToFloat, rigFloatToBf16)

/* One element loop: dst[i] = POST(RED(PRE(src0[i]), src1[i])) with the optional parts off. */
#define RIG_LOOP(T, PRE, RED, POST)                                                            \
  do {                                                                                        \
    const T *s0 = (const T *)srcs[0];                                                         \
    const T *s1 = nSrcs > 1 ? (const T *)srcs[1] : NULL;                                      \
    T *d0 = (T *)dsts[0];                                                                     \
    T *d1 = nDsts > 1 ? (T *)dsts[1] : NULL;                                                  \
    for (size_t i = 0; i < n; i++) {                                                          \
      T v = s0[i];                                                                            \
      if (preOp) v = PRE(c, v);                                                               \
      if (s1) v = RED(c, v, s1[i]);                                                           \
      if (postOp) v = POST(c, v);                                                             \
      d0[i] = v;                                                                              \
      if (d1) d1[i] = v;                                                                      \
    }                                                                                         \
  } while (0)

/* All the ops of one element type U/T. PreMulSum reduces with Sum; SumPostDiv too. */
#define RIG_TYPE_DISPATCH(U, T, POSTDIV)                                                        \
  static void rigElementwise_##U(const struct rigOpCtx *c, int op, char *const *srcs, int nSrcs, \
                                 int preOp, int postOp, char *const *dsts, int nDsts, size_t n) { \
    switch (op) {                                                                             \
    case RIG_OP_SUM: RIG_LOOP(T, rigNoPre_##U, rigSum_##U, rigNoPost_##U); break;             \
    case RIG_OP_PROD: RIG_LOOP(T, rigNoPre_##U, rigProd_##U, rigNoPost_##U); break;           \
    case RIG_OP_MINMAX: RIG_LOOP(T, rigNoPre_##U, rigMinMax_##U, rigNoPost_##U); break;       \
    case RIG_OP_PREMULSUM: RIG_LOOP(T, rigMulPre_##U, rigSum_##U, rigNoPost_##U); break;      \
    default: RIG_LOOP(T, rigNoPre_##U, rigSum_##U, POSTDIV); break; /* SumPostDiv */           \
    }                                                                                         \
  }
RIG_TYPE_DISPATCH(u8, uint8_t, rigDivPost_u8)
RIG_TYPE_DISPATCH(u32, uint32_t, rigDivPost_u32)
RIG_TYPE_DISPATCH(u64, uint64_t, rigDivPost_u64)
RIG_TYPE_DISPATCH(f32, uint32_t, rigNoPost_f32)
RIG_TYPE_DISPATCH(f64, uint64_t, rigNoPost_f64)
RIG_TYPE_DISPATCH(f16, uint16_t, rigNoPost_f16)
RIG_TYPE_DISPATCH(bf16, uint16_t, rigNoPost_bf16)

static void rigOpCtxInit(struct rigOpCtx *c, const struct rigRed *r) {
  memset(c, 0, sizeof(*c));
  uint64_t a = r->arg;
  c->isMin = (a & 1) == 0;
  c->xorMask = a;
  c->uScalar = a;
  c->divisor = (uint32_t)((a >> 1) & 0x7fffffffu);
  c->divSigned = (int)(a & 1);
  switch (r->type) {
  case RIG_T_F32: c->fScalar = rigF32From((uint32_t)a); break;
  case RIG_T_F16: c->fScalar = rigHalfToFloat((uint16_t)a); break;
  case RIG_T_BF16: c->fScalar = rigBf16ToFloat((uint16_t)a); break;
  case RIG_T_F64: c->dScalar = rigF64From(a); break;
  default: break;
  }
}

/* reduceCopy of n elements. preOp: srcs[0] is the user's input (PreOpSrcs = 1 in genericOp). */
static void rigReduceCopy(const struct rigRed *r, char *const *srcs, int nSrcs, int preOp,
                          int postOp, char *const *dsts, int nDsts, size_t n) {
  if (n == 0 || nDsts == 0) return;
  preOp = preOp && r->op == RIG_OP_PREMULSUM;   /* the other ops' pre-op is the identity */
  postOp = postOp && r->op == RIG_OP_SUMPOSTDIV; /* and so is their post-op */
  if (r->op == RIG_OP_COPY || (nSrcs == 1 && !preOp && !postOp)) {
    size_t bytes = n * (size_t)r->eltSize;
    for (int d = 0; d < nDsts; d++)
      if (dsts[d] != srcs[0]) memmove(dsts[d], srcs[0], bytes);
    return;
  }
  struct rigOpCtx c;
  rigOpCtxInit(&c, r);
  switch (r->type) {
  case RIG_T_I8: case RIG_T_U8: rigElementwise_u8(&c, r->op, srcs, nSrcs, preOp, postOp, dsts, nDsts, n); break;
  case RIG_T_I32: case RIG_T_U32: rigElementwise_u32(&c, r->op, srcs, nSrcs, preOp, postOp, dsts, nDsts, n); break;
  case RIG_T_I64: case RIG_T_U64: rigElementwise_u64(&c, r->op, srcs, nSrcs, preOp, postOp, dsts, nDsts, n); break;
  case RIG_T_F32: rigElementwise_f32(&c, r->op, srcs, nSrcs, preOp, postOp, dsts, nDsts, n); break;
  case RIG_T_F64: rigElementwise_f64(&c, r->op, srcs, nSrcs, preOp, postOp, dsts, nDsts, n); break;
  case RIG_T_F16: rigElementwise_f16(&c, r->op, srcs, nSrcs, preOp, postOp, dsts, nDsts, n); break;
  case RIG_T_BF16: rigElementwise_bf16(&c, r->op, srcs, nSrcs, preOp, postOp, dsts, nDsts, n); break;
  default: break; /* refused before the kernel starts (rigCheckFunc) */
  }
}

static int rigTypeSize(int type) {
  switch (type) {
  case RIG_T_I8: case RIG_T_U8: case RIG_T_F8E4M3: case RIG_T_F8E5M2: return 1;
  case RIG_T_F16: case RIG_T_BF16: return 2;
  case RIG_T_I32: case RIG_T_U32: case RIG_T_F32: return 4;
  case RIG_T_I64: case RIG_T_U64: case RIG_T_F64: return 8;
  default: return -1;
  }
}

/* ------------------------------------------------------------------------------------------
 * The Simple primitives for a ring (src/device/prims_simple.h), one CPU thread playing every
 * role: wait-recv (poll the recv tail), wait-send (poll the send head for credit), the data
 * workers, post-recv (return credit on the recv head) and post-send (publish on the send tail).
 * On the GPU each role is its own thread with its own copy of `step`; they advance in
 * lockstep, so one counter per direction stands for both.
 * ------------------------------------------------------------------------------------------ */

enum { RIG_BUF_NONE = -1, RIG_BUF_INPUT = 0, RIG_BUF_OUTPUT = 1 };

struct rigDir {                  /* the connection to one ring neighbour in one direction */
  struct rigConnInfo *conn;
  int peer;                      /* rank of the neighbour */
  uint64_t step;
  uint64_t seen;                 /* last value read from the counter we wait on (connStepCache) */
  int64_t slotBytes;             /* (conn->stepSize / sizeof(T)) * sizeof(T) */
};

struct rigPrims {
  struct rigBlock *b;
  const struct nbxRigFuncDesc *fn;
  int workIx;
  long opIx;                     /* primitive calls so far in this work, for error messages */
  int slicePerChunk;
  int stepPerSlice;
  int eltSize;
  int64_t stepElts;              /* comm.buffSizes[SIMPLE]/NCCL_STEPS/sizeof(T) */
  struct rigRed red;
  char *input;                   /* work->sendbuff */
  char *output;                  /* work->recvbuff */
  struct rigDir recv;
  struct rigDir send;
};

static int rigDirFail(struct rigPrims *p, struct rigDir *d, int isSend, int slice, const char *what) {
  return rigFail(p->b->launch,
                 "rig kernel: channel %d, %s rank %d: %s (%s, work %d, primitive op %ld, slice %d, step %llu)",
                 p->b->channelId, isSend ? "send to" : "recv from", d->peer, what, p->fn->name,
                 p->workIx, p->opIx, slice, (unsigned long long)d->step);
}

/* Polls the counter the GPU's wait role polls until the step is available:
 * recv: tail >= step + StepPerSlice; send: head + NCCL_STEPS >= step + StepPerSlice. */
static int rigWait(struct rigPrims *p, struct rigDir *d, int isSend, int slice) {
  uint64_t need = d->step + (uint64_t)p->stepPerSlice;
  uint64_t window = isSend ? RIG_STEPS : 0;
  uint64_t *counter = isSend ? d->conn->head : d->conn->tail;
  if (d->seen + window >= need) return RIG_OK;
  double start = 0, waited = 0;
  for (unsigned spins = 0;; spins++) {
    d->seen = __atomic_load_n(counter, __ATOMIC_ACQUIRE);
    if (d->seen + window >= need) return RIG_OK;
    if ((spins & 63) == 63 || spins >= 256) {
      if (rigAbortRaised(p->b)) return RIG_ABORTED;
      double now = rigNow();
      if (start == 0) start = now;
      waited = now - start;
      if (waited > p->b->launch->timeoutS) {
        char what[160];
        snprintf(what, sizeof(what), "gave up after %.0f s waiting for %s (%s %llu, needs %s%llu)",
                 p->b->launch->timeoutS, isSend ? "credit" : "data", isSend ? "head" : "tail",
                 (unsigned long long)d->seen, isSend ? "head + 8 >= " : ">= ",
                 (unsigned long long)need);
        return rigDirFail(p, d, isSend, slice, what);
      }
    }
    rigBackoff(spins, waited);
  }
}

/* The slot of the current step (waitPeer's pointer choice without registered buffers). */
static char *rigSlot(struct rigPrims *p, struct rigDir *d) {
  int slot = (int)(d->step % RIG_STEPS);
  char *base = d->conn->buffs[RIG_PROTO_SIMPLE];
  struct rigConnFifo *fifo = d->conn->connFifo;
  if (fifo && __atomic_load_n(&fifo[slot].mode, __ATOMIC_RELAXED) == RIG_FIFO_MODE_OFFSET) {
    int off = __atomic_load_n(&fifo[slot].offset, __ATOMIC_RELAXED);
    return base + (int64_t)(off / p->eltSize) * p->eltSize;
  }
  return base + (int64_t)slot * d->slotBytes;
}

static int rigDirOpen(struct rigPrims *p, struct rigDir *d, int peer, int isSend) {
  struct rigBlock *b = p->b;
  d->peer = peer;
  d->conn = NULL;
  if (peer < 0 || peer >= b->comm.nRanks || b->chan.peers == NULL || b->chan.peers[peer] == NULL)
    return rigFail(b->launch, "rig kernel: channel %d has no %s connection to rank %d (%s)",
                   b->channelId, isSend ? "send" : "recv", peer, p->fn->name);
  struct rigDevChannelPeer *cp = b->chan.peers[peer];
  struct rigConnInfo *conn = isSend ? &cp->send[0] : &cp->recv[0];
  d->step = conn->step;
  if (conn->netDeviceHandle.netDeviceType != RIG_NET_DEVICE_HOST)
    return rigDirFail(p, d, isSend, 0, "device-side net offload (netDeviceType != HOST) is not implemented");
  if (!conn->buffs[RIG_PROTO_SIMPLE] || !conn->tail || !conn->head || conn->stepSize <= 0)
    return rigDirFail(p, d, isSend, 0, "connection has no Simple buffer, head, tail or step size");
  d->conn = conn; /* from here on the destructor saves this direction's step */
  /* step rounds up to a whole chunk, as the proxy's base does. */
  uint64_t chunkSteps = (uint64_t)(p->slicePerChunk * p->stepPerSlice);
  d->step = (conn->step + chunkSteps - 1) / chunkSteps * chunkSteps;
  d->slotBytes = (int64_t)(conn->stepSize / p->eltSize) * p->eltSize;
  if (isSend) {
    d->seen = __atomic_load_n(conn->head, __ATOMIC_ACQUIRE);
  } else {
    /* The post-recv role hands back credits for the steps skipped by rounding up. */
    __atomic_store_n(conn->head, d->step, __ATOMIC_RELEASE);
    d->seen = __atomic_load_n(conn->tail, __ATOMIC_ACQUIRE);
  }
  return RIG_OK;
}

/* Primitives constructor for the ring: recv from ring.prev, send to ring.next (connIndex 0). */
static int rigPrimsOpen(struct rigPrims *p, struct rigBlock *b, const struct nbxRigFuncDesc *fn,
                        int workIx, const struct rigWorkColl *w, const struct rigRed *red,
                        int slicePerChunk, int stepPerSlice) {
  memset(p, 0, sizeof(*p));
  p->b = b;
  p->fn = fn;
  p->workIx = workIx;
  p->slicePerChunk = slicePerChunk;
  p->stepPerSlice = stepPerSlice;
  p->red = *red;
  p->eltSize = red->eltSize;
  p->stepElts = b->comm.buffSizes[RIG_PROTO_SIMPLE] / RIG_STEPS / red->eltSize;
  p->input = (char *)w->sendbuff;
  p->output = (char *)w->recvbuff;
  int rc = rigDirOpen(p, &p->recv, b->chan.ring.prev, 0);
  if (rc != RIG_OK) return rc;
  return rigDirOpen(p, &p->send, b->chan.ring.next, 1);
}

/* Primitives destructor: the post roles save their step for the next kernel. */
static void rigPrimsClose(struct rigPrims *p) {
  if (p->recv.conn) p->recv.conn->step = p->recv.step;
  if (p->send.conn) p->send.conn->step = p->send.step;
}

static char *rigUserBuf(struct rigPrims *p, int which) {
  return which == RIG_BUF_INPUT ? p->input : p->output;
}

/* genericOp: move nelem elements through SlicePerChunk slices. Every slice waits, fills and
 * posts a step even when it is empty (a 0-byte message on the wire). */
static int rigOp(struct rigPrims *p, int recv, int send, int srcBuf, int dstBuf, int64_t srcIx,
                 int64_t dstIx, int64_t nelem, int postOp) {
  p->opIx++;
  if (nelem < 0) nelem = 0;
  int64_t sliceSize = p->stepElts * p->stepPerSlice;
  int64_t even = (nelem + 16 * p->slicePerChunk - 1) / (16 * p->slicePerChunk) * 16;
  sliceSize = even > sliceSize / 32 ? even : sliceSize / 32;
  int64_t offset = 0;
  for (int slice = 0; slice < p->slicePerChunk; slice++) {
    int64_t n = nelem - offset < sliceSize ? nelem - offset : sliceSize;
    int rc;
    if (recv && (rc = rigWait(p, &p->recv, 0, slice)) != RIG_OK) return rc;
    if (send && (rc = rigWait(p, &p->send, 1, slice)) != RIG_OK) return rc;
    char *recvSlot = NULL, *sendSlot = NULL;
    if (recv) {
      recvSlot = rigSlot(p, &p->recv);
      p->recv.step += (uint64_t)p->stepPerSlice;
    }
    if (send) {
      struct rigConnFifo *fifo = p->send.conn->connFifo;
      if (fifo) /* the size the proxy will put on the wire for this step */
        __atomic_store_n(&fifo[p->send.step % RIG_STEPS].size, n * p->eltSize, __ATOMIC_RELAXED);
      sendSlot = rigSlot(p, &p->send);
      p->send.step += (uint64_t)p->stepPerSlice;
    }
    if (n > 0) {
      char *srcs[2], *dsts[2];
      int nSrcs = 0, nDsts = 0;
      if (srcBuf != RIG_BUF_NONE) srcs[nSrcs++] = rigUserBuf(p, srcBuf) + (srcIx + offset) * p->eltSize;
      if (recv) srcs[nSrcs++] = recvSlot;
      if (dstBuf != RIG_BUF_NONE) dsts[nDsts++] = rigUserBuf(p, dstBuf) + (dstIx + offset) * p->eltSize;
      if (send) dsts[nDsts++] = sendSlot;
      rigReduceCopy(&p->red, srcs, nSrcs, srcBuf == RIG_BUF_INPUT, postOp, dsts, nDsts, (size_t)n);
    }
    if (recv) __atomic_store_n(p->recv.conn->head, p->recv.step, __ATOMIC_RELEASE);
    if (send) __atomic_store_n(p->send.conn->tail, p->send.step, __ATOMIC_RELEASE);
    offset += n;
  }
  return RIG_OK;
}

/* The named primitives the ring algorithms call (no registered buffers, so the "direct"
 * variants move data exactly as the plain ones). */
static int rigSend(struct rigPrims *p, int64_t inIx, int64_t n) {
  return rigOp(p, 0, 1, RIG_BUF_INPUT, RIG_BUF_NONE, inIx, -1, n, 0);
}
static int rigCopySend(struct rigPrims *p, int64_t inIx, int64_t outIx, int64_t n) {
  return rigOp(p, 0, 1, RIG_BUF_INPUT, RIG_BUF_OUTPUT, inIx, outIx, n, 0);
}
static int rigRecv(struct rigPrims *p, int64_t outIx, int64_t n) {
  return rigOp(p, 1, 0, RIG_BUF_NONE, RIG_BUF_OUTPUT, -1, outIx, n, 0);
}
static int rigRecvCopySend(struct rigPrims *p, int64_t outIx, int64_t n) {
  return rigOp(p, 1, 1, RIG_BUF_NONE, RIG_BUF_OUTPUT, -1, outIx, n, 0);
}
static int rigRecvReduceSend(struct rigPrims *p, int64_t inIx, int64_t n) {
  return rigOp(p, 1, 1, RIG_BUF_INPUT, RIG_BUF_NONE, inIx, -1, n, 0);
}
static int rigRecvReduceCopy(struct rigPrims *p, int64_t inIx, int64_t outIx, int64_t n, int postOp) {
  return rigOp(p, 1, 0, RIG_BUF_INPUT, RIG_BUF_OUTPUT, inIx, outIx, n, postOp);
}
static int rigRecvReduceCopySend(struct rigPrims *p, int64_t inIx, int64_t outIx, int64_t n, int postOp) {
  return rigOp(p, 1, 1, RIG_BUF_INPUT, RIG_BUF_OUTPUT, inIx, outIx, n, postOp);
}

/* ------------------------------------------------------------------------------------------
 * The ring collectives (src/device/{all_reduce,...}.h, RunWorkColl<..., NCCL_ALGO_RING, NCCL_PROTO_SIMPLE>).
 * ------------------------------------------------------------------------------------------ */

struct rigPart {                 /* ncclCollCbdPart for this channel */
  int64_t count;                 /* total count of the collective */
  int64_t offset;                /* where this channel's part starts */
  int64_t partCount;
  int64_t chunkCount;
};

static int rigCbdPart(struct rigBlock *b, const struct rigWorkColl *w, int eltSize,
                      const struct nbxRigFuncDesc *fn, struct rigPart *part) {
  int lo = RIG_WORK_CHANNEL_LO(w), hi = RIG_WORK_CHANNEL_HI(w), ch = b->channelId;
  if (ch < lo || ch > hi)
    return rigFail(b->launch, "rig kernel: channel %d runs a %s work for channels %d..%d", ch, fn->name, lo, hi);
  int64_t eltPerGrain = RIG_SIMPLE_GRAIN / eltSize;
  int64_t nMid = (int64_t)hi - lo - 1; /* may be -1, then countMid is 0 */
  part->count = (int64_t)w->countLo + (int64_t)w->countMid * nMid + (int64_t)w->countHi;
  if (ch == lo) {
    part->offset = 0;
    part->partCount = (int64_t)w->countLo;
    part->chunkCount = (int64_t)RIG_GRAINS_LO(w) * eltPerGrain;
  } else if (ch == hi) {
    part->offset = (int64_t)w->countLo + nMid * (int64_t)w->countMid;
    part->partCount = (int64_t)w->countHi;
    part->chunkCount = (int64_t)RIG_GRAINS_HI(w) * eltPerGrain;
  } else {
    int64_t mid = ch - lo - 1;
    part->offset = (int64_t)w->countLo + mid * (int64_t)w->countMid;
    part->partCount = (int64_t)w->countMid;
    part->chunkCount = (int64_t)RIG_GRAINS_MID(w) * eltPerGrain;
  }
  if (part->partCount > 0 && part->chunkCount <= 0)
    return rigFail(b->launch, "rig kernel: channel %d: %s work has a zero chunk size", ch, fn->name);
  return RIG_OK;
}

static inline int64_t rigMin64(int64_t a, int64_t b) { return a < b ? a : b; }

/* all_reduce.h runRing: reduce-scatter then allgather around the ring, nranks chunks a loop. */
static int rigAllReduce(struct rigPrims *p, const struct rigPart *part) {
  struct rigBlock *b = p->b;
  const int nranks = b->comm.nRanks;
  const int ringIx = b->chan.ring.index;
  int64_t chunkCount = part->chunkCount;
  const int64_t loopCount = nranks * chunkCount;
  const int64_t align = 16 / p->eltSize;
  int rc = RIG_OK;
#define RIG_MODR(r) ((r) >= nranks ? (r) - nranks : (r))
  for (int64_t elemOffset = 0; elemOffset < part->partCount && rc == RIG_OK; elemOffset += loopCount) {
    int64_t remCount = part->partCount - elemOffset;
    if (remCount < loopCount) chunkCount = ((remCount + nranks - 1) / nranks + align - 1) / align * align;
    int64_t base = part->offset + elemOffset;
#define RIG_AR_CHUNK(c, off, nel)                                                  \
    int64_t off = base + (int64_t)(c) * chunkCount;                                \
    int64_t nel = rigMin64(chunkCount, remCount - (int64_t)(c) * chunkCount)
    { RIG_AR_CHUNK(RIG_MODR(ringIx + nranks - 1), off, nel);
      rc = rigSend(p, off, nel); }                                   /* directSend */
    for (int j = 2; j < nranks && rc == RIG_OK; j++) {
      RIG_AR_CHUNK(RIG_MODR(ringIx + nranks - j), off, nel);
      rc = rigRecvReduceSend(p, off, nel);                           /* directRecvReduceDirectSend */
    }
    if (rc == RIG_OK) {
      RIG_AR_CHUNK(ringIx, off, nel);
      rc = rigRecvReduceCopySend(p, off, off, nel, 1);               /* directRecvReduceCopyDirectSend */
    }
    for (int j = 1; j < nranks - 1 && rc == RIG_OK; j++) {
      RIG_AR_CHUNK(RIG_MODR(ringIx + nranks - j), off, nel);
      rc = rigRecvCopySend(p, off, nel);                             /* directRecvCopyDirectSend */
    }
    if (rc == RIG_OK) {
      RIG_AR_CHUNK(RIG_MODR(ringIx + 1), off, nel);
      rc = rigRecv(p, off, nel);                                     /* directRecv */
    }
#undef RIG_AR_CHUNK
  }
#undef RIG_MODR
  return rc;
}

/* all_gather.h runRing: the own block out, nranks-2 forwards, the last block in. Counts are
 * bytes (NCCL runs AllGather on int8). */
static int rigAllGather(struct rigPrims *p, const struct rigPart *part) {
  struct rigBlock *b = p->b;
  const int nranks = b->comm.nRanks;
  const int *ringRanks = b->chan.ring.userRanks;
  int rc = RIG_OK;
  for (int64_t elemOffset = 0; elemOffset < part->partCount && rc == RIG_OK; elemOffset += part->chunkCount) {
    int64_t nelem = rigMin64(part->chunkCount, part->partCount - elemOffset);
    int64_t dataOffset = part->offset + elemOffset;
    int64_t offset = dataOffset + (int64_t)ringRanks[0] * part->count;
    if (p->input + dataOffset * p->eltSize == p->output + offset * p->eltSize)
      rc = rigSend(p, dataOffset, nelem);                           /* in place: directSend */
    else
      rc = rigCopySend(p, dataOffset, offset, nelem);               /* directCopySend */
    for (int j = 1; j < nranks - 1 && rc == RIG_OK; j++) {
      offset = dataOffset + (int64_t)ringRanks[nranks - j] * part->count;
      rc = rigRecvCopySend(p, offset, nelem);                       /* directRecvCopyDirectSend */
    }
    if (rc == RIG_OK) {
      offset = dataOffset + (int64_t)ringRanks[1] * part->count;
      rc = rigRecv(p, offset, nelem);                               /* directRecv */
    }
  }
  return rc;
}

/* reduce_scatter.h runRing: block of ring rank n-1 out, reduce-and-forward, own block last. */
static int rigReduceScatter(struct rigPrims *p, const struct rigPart *part) {
  struct rigBlock *b = p->b;
  const int nranks = b->comm.nRanks;
  const int *ringRanks = b->chan.ring.userRanks;
  int rc = RIG_OK;
  for (int64_t elemOffset = 0; elemOffset < part->partCount && rc == RIG_OK; elemOffset += part->chunkCount) {
    int64_t nelem = rigMin64(part->chunkCount, part->partCount - elemOffset);
    int64_t dataOffset = part->offset + elemOffset;
    int64_t offset = dataOffset + (int64_t)ringRanks[nranks - 1] * part->count;
    rc = rigSend(p, offset, nelem);                                 /* send */
    for (int j = 2; j < nranks && rc == RIG_OK; j++) {
      offset = dataOffset + (int64_t)ringRanks[nranks - j] * part->count;
      rc = rigRecvReduceSend(p, offset, nelem);                     /* recvReduceSend */
    }
    if (rc == RIG_OK) {
      offset = dataOffset + (int64_t)ringRanks[0] * part->count;
      rc = rigRecvReduceCopy(p, offset, dataOffset, nelem, 1);      /* recvReduceCopy, postOp */
    }
  }
  return rc;
}

/* broadcast.h runRing: the root sends, the others receive and forward, root's predecessor only
 * receives. Counts are bytes. */
static int rigBroadcast(struct rigPrims *p, const struct rigPart *part, int root) {
  struct rigBlock *b = p->b;
  const int rank = b->chan.ring.userRanks[0];
  const int nextRank = b->chan.ring.userRanks[1];
  int rc = RIG_OK;
  for (int64_t elemOffset = 0; elemOffset < part->partCount && rc == RIG_OK; elemOffset += part->chunkCount) {
    int64_t offset = part->offset + elemOffset;
    int64_t nelem = rigMin64(part->chunkCount, part->partCount - elemOffset);
    if (rank == root) {
      if (p->input == p->output) rc = rigSend(p, offset, nelem);    /* directSend */
      else rc = rigCopySend(p, offset, offset, nelem);              /* directCopySend */
    } else if (nextRank == root) {
      rc = rigRecv(p, offset, nelem);                               /* directRecv */
    } else {
      rc = rigRecvCopySend(p, offset, nelem);                       /* directRecvCopyDirectSend */
    }
  }
  return rc;
}

/* reduce.h runRing: the root's successor starts, the others reduce and forward, the root ends. */
static int rigReduce(struct rigPrims *p, const struct rigPart *part, int root) {
  struct rigBlock *b = p->b;
  const int nranks = b->comm.nRanks;
  const int rank = b->comm.rank;
  const int prevRank = b->chan.ring.userRanks[nranks - 1];
  int rc = RIG_OK;
  for (int64_t elemOffset = 0; elemOffset < part->partCount && rc == RIG_OK; elemOffset += part->chunkCount) {
    int64_t offset = part->offset + elemOffset;
    int64_t nelem = rigMin64(part->chunkCount, part->partCount - elemOffset);
    if (prevRank == root) rc = rigSend(p, offset, nelem);                    /* send */
    else if (rank == root) rc = rigRecvReduceCopy(p, offset, offset, nelem, 1); /* recvReduceCopy */
    else rc = rigRecvReduceSend(p, offset, nelem);                           /* recvReduceSend */
  }
  return rc;
}

/* ------------------------------------------------------------------------------------------
 * Function ids: what is implemented.
 * ------------------------------------------------------------------------------------------ */

/* Returns RIG_OK when funcId with workType can run here, else fails naming it. */
static int rigCheckFunc(struct rigLaunch *launch, int funcId, int workType) {
  if (funcId < 0 || funcId >= NBX_RIG_FUNC_COUNT)
    return rigFail(launch, "rig kernel: funcId %d is outside NCCL 2.28.9's %d device functions",
                   funcId, NBX_RIG_FUNC_COUNT);
  const struct nbxRigFuncDesc *fn = &nbxRigFuncs[funcId];
  if (workType == RIG_WORK_P2P || fn->coll == RIG_COLL_SENDRECV)
    return rigFail(launch, "rig kernel: %s (P2P work) is not implemented (funcId %d)", fn->name, funcId);
  if (workType == RIG_WORK_COLLREG)
    return rigFail(launch, "rig kernel: %s with registered buffers (CollReg work) is not implemented (funcId %d)",
                   fn->name, funcId);
  if (workType != RIG_WORK_COLL)
    return rigFail(launch, "rig kernel: work type %d is not implemented (funcId %d, %s)", workType, funcId, fn->name);
  int collOk = fn->coll == RIG_COLL_ALLREDUCE || fn->coll == RIG_COLL_ALLGATHER ||
               fn->coll == RIG_COLL_REDUCESCATTER || fn->coll == RIG_COLL_BROADCAST ||
               fn->coll == RIG_COLL_REDUCE;
  int typeOk = fn->type < 0 || (rigTypeSize(fn->type) > 0 && fn->type != RIG_T_F8E4M3 && fn->type != RIG_T_F8E5M2);
  int opOk = fn->redop < 0 || (fn->redop >= RIG_OP_SUM && fn->redop <= RIG_OP_SUMPOSTDIV);
  if (!collOk || !typeOk || !opOk || fn->algo != RIG_ALGO_RING || fn->proto != RIG_PROTO_SIMPLE)
    return rigFail(launch, "rig kernel: %s is not implemented (funcId %d)", fn->name, funcId);
  return RIG_OK;
}

/* Refuses, before anything moves, a work item this implementation cannot run on this channel:
 * registered buffers, a one-rank communicator, a channel outside the work's range or a ring
 * neighbour without a host-driven connection. */
static int rigCheckWork(struct rigBlock *b, const struct rigWorkColl *w) {
  struct rigLaunch *launch = b->launch;
  const struct nbxRigFuncDesc *fn = &nbxRigFuncs[b->funcId];
  if (RIG_WORK_REG_USED(w) || RIG_WORK_NET_REG_USED(w))
    return rigFail(launch, "rig kernel: channel %d: %s with registered buffers (regUsed %u, netRegUsed %u) is not implemented (funcId %d)",
                   b->channelId, fn->name, RIG_WORK_REG_USED(w), RIG_WORK_NET_REG_USED(w), b->funcId);
  if (b->comm.nRanks < 2)
    return rigFail(launch, "rig kernel: %s on a %d-rank communicator is not implemented", fn->name, b->comm.nRanks);
  struct rigPart part;
  if (rigCbdPart(b, w, fn->type < 0 ? 1 : rigTypeSize(fn->type), fn, &part) != RIG_OK) return RIG_FAILED;
  const int peers[2] = {b->chan.ring.prev, b->chan.ring.next};
  for (int s = 0; s < 2; s++) {
    int peer = peers[s];
    if (peer < 0 || peer >= b->comm.nRanks || !b->chan.peers || !b->chan.peers[peer])
      return rigFail(launch, "rig kernel: channel %d has no %s connection to rank %d (%s)", b->channelId,
                     s ? "send" : "recv", peer, fn->name);
    const struct rigConnInfo *conn = s ? &b->chan.peers[peer]->send[0] : &b->chan.peers[peer]->recv[0];
    if (conn->netDeviceHandle.netDeviceType != RIG_NET_DEVICE_HOST)
      return rigFail(launch, "rig kernel: channel %d, %s rank %d: device-side net offload (netDeviceType %d) is not implemented (%s)",
                     b->channelId, s ? "send to" : "recv from", peer, conn->netDeviceHandle.netDeviceType, fn->name);
  }
  return RIG_OK;
}

/* Runs one collective work item on this block's channel. */
static int rigRunColl(struct rigBlock *b, int workIx, struct rigWorkColl *w) {
  const struct nbxRigFuncDesc *fn = &nbxRigFuncs[b->funcId];
  struct rigRed red;
  red.type = fn->type < 0 ? RIG_T_I8 : fn->type;   /* AllGather/Broadcast: int8 with FuncCopy */
  red.op = fn->redop < 0 ? RIG_OP_COPY : fn->redop;
  red.eltSize = rigTypeSize(red.type);
  red.arg = w->redOpArg;

  struct rigPart part = {0, 0, 0, 0};
  int rc = rigCbdPart(b, w, red.eltSize, fn, &part);
  if (rc != RIG_OK) return rc;

  int slicePerChunk = RIG_RING_SLICES_PER_CHUNK, stepPerSlice = RIG_RING_STEPS_PER_SLICE;
  if (fn->coll == RIG_COLL_BROADCAST || fn->coll == RIG_COLL_REDUCE) slicePerChunk = stepPerSlice = 1;

  struct rigPrims p;
  rc = rigPrimsOpen(&p, b, fn, workIx, w, &red, slicePerChunk, stepPerSlice);
  if (rc == RIG_OK) {
    switch (fn->coll) {
    case RIG_COLL_ALLREDUCE: rc = rigAllReduce(&p, &part); break;
    case RIG_COLL_ALLGATHER: rc = rigAllGather(&p, &part); break;
    case RIG_COLL_REDUCESCATTER: rc = rigReduceScatter(&p, &part); break;
    case RIG_COLL_BROADCAST: rc = rigBroadcast(&p, &part, (int)w->root); break;
    default: rc = rigReduce(&p, &part, (int)w->root); break;
    }
  }
  rigPrimsClose(&p);
  return rc;
}

/* RunWorkBatch for collectives: load pointer-held op arguments, then run the works in order. */
static int rigRunBatch(struct rigBlock *b) {
  const struct nbxRigFuncDesc *fn = &nbxRigFuncs[b->funcId];
  int argUsed = fn->redop == RIG_OP_MINMAX || fn->redop == RIG_OP_PREMULSUM || fn->redop == RIG_OP_SUMPOSTDIV;
  for (int i = 0; i < b->nWorks; i++) {
    struct rigWorkColl *w = (struct rigWorkColl *)(b->works + (size_t)i * (size_t)b->workSize);
    if (argUsed && RIG_WORK_REDOPARG_IS_PTR(w)) {
      const void *src = (const void *)(uintptr_t)w->redOpArg;
      uint64_t v = 0;
      /* RedOpArg<...>::loadArg: one element for MinMax/PreMulSum, 8 bytes for SumPostDiv. */
      size_t bytes = fn->redop == RIG_OP_SUMPOSTDIV ? 8 : (size_t)rigTypeSize(fn->type);
      memcpy(&v, src, bytes);
      w->redOpArg = v;
    }
  }
  for (int i = 0; i < b->nWorks; i++) {
    struct rigWorkColl *w = (struct rigWorkColl *)(b->works + (size_t)i * (size_t)b->workSize);
    int rc = rigRunColl(b, i, w);
    if (rc != RIG_OK) return rc;
  }
  return RIG_OK;
}

/* ------------------------------------------------------------------------------------------
 * Work batches (loadWorkBatchToShmem) and the kernel's main loop (ncclKernelMain).
 * ------------------------------------------------------------------------------------------ */

static int rigWorkBytes(int workType) {
  return workType == RIG_WORK_P2P ? RIG_WORK_P2P_BYTES
       : workType == RIG_WORK_COLL ? RIG_WORK_COLL_BYTES : RIG_WORK_COLLREG_BYTES;
}

/* Copies 16 bytes of work at byte position pos (already offsetBase-relative) as the kernel does:
 * from the args for Args storage, else from workBuf with the position masked by workMask. */
static int rigFetchPack(struct rigLaunch *launch, uint32_t pos, unsigned char *dst) {
  const struct rigKernelArgs *ka = launch->ka;
  if (ka->workStorageType == RIG_STORE_ARGS) {
    if ((size_t)pos + 16 > launch->argsBytes)
      return rigFail(launch, "rig kernel: work item at args offset %u lies past the %zu argument bytes",
                     pos, launch->argsBytes);
    memcpy(dst, launch->args + pos, 16);
  } else {
    if (!ka->workBuf)
      return rigFail(launch, "rig kernel: work storage type %u without a work buffer", ka->workStorageType);
    memcpy(dst, (const unsigned char *)ka->workBuf + (pos & ka->workMask), 16);
  }
  return RIG_OK;
}

/* Loads batch batchIx and any batches it extends into b->works. */
static int rigLoadBatch(struct rigBlock *b, int batchIx) {
  struct rigLaunch *launch = b->launch;
  int cursor = 0;
  for (;;) {
    size_t at = sizeof(struct rigKernelArgs) + (size_t)batchIx * sizeof(struct rigWorkBatch);
    if (batchIx < 0 || at + sizeof(struct rigWorkBatch) > launch->argsBytes)
      return rigFail(launch, "rig kernel: channel %d: work batch %d lies past the %zu argument bytes",
                     b->channelId, batchIx, launch->argsBytes);
    struct rigWorkBatch batch;
    memcpy(&batch, launch->args + at, sizeof(batch));
    int workType = (int)RIG_BATCH_WORK_TYPE(batch.flags);
    int workSize = rigWorkBytes(workType);
    int nWorks = __builtin_popcountll(batch.offsetBitset);
    if ((cursor + nWorks) * workSize > RIG_BATCH_WORK_BYTES)
      return rigFail(launch, "rig kernel: channel %d: work batch %d holds more than %d bytes of work",
                     b->channelId, batchIx, RIG_BATCH_WORK_BYTES);
    int n = 0;
    for (int bit = 0; bit < 64; bit++) {
      if (!((batch.offsetBitset >> bit) & 1)) continue;
      unsigned char *dst = b->works + (size_t)(cursor + n) * (size_t)workSize;
      for (int pack = 0; pack < workSize / 16; pack++) {
        uint32_t pos = batch.offsetBase + (uint32_t)(bit * workSize + pack * 16);
        if (rigFetchPack(launch, pos, dst + pack * 16) != RIG_OK) return RIG_FAILED;
      }
      n++;
    }
    cursor += nWorks;
    b->workSize = workSize;
    if (RIG_BATCH_NEXT_EXTENDS(batch.flags)) {
      batchIx += (int)RIG_BATCH_NEXT_JUMP(batch.flags);
      continue;
    }
    uint32_t jump = RIG_BATCH_NEXT_JUMP(batch.flags);
    b->nextBatchIx = jump == 0 ? -1 : batchIx + (int)jump;
    b->workType = workType;
    b->nWorks = cursor;
    b->funcId = (int)RIG_BATCH_FUNC_ID(batch.flags);
    return RIG_OK;
  }
}

/* The profiler hooks of ncclKernelMain: the proxy's profiler progress polls these counters. */
enum { RIG_PROF_START, RIG_PROF_STOP, RIG_PROF_FINI };
static void rigProfiler(struct rigBlock *b, int action) {
  struct rigDevProfiler *table = action == RIG_PROF_START ? b->comm.workStarted : b->comm.workCompleted;
  for (int idx = 0; idx < b->nWorks; idx++) {
    uint64_t wc = b->workCounter + 1 + (uint64_t)idx;
    const struct rigWorkColl *w = (const struct rigWorkColl *)(b->works + (size_t)idx * (size_t)b->workSize);
    if (b->workType != RIG_WORK_COLL || !RIG_WORK_PROFILER_ENABLED(w) || !table) continue;
    struct rigDevProfiler *prof = &table[b->channelId];
    prof->data[wc % RIG_PROFILER_SLOTS].timestamp = rigTimestampNs();
    __atomic_store_n(&prof->data[wc % RIG_PROFILER_SLOTS].counter, wc, __ATOMIC_RELEASE);
  }
  if (action != RIG_PROF_START) {
    b->workCounter += (uint64_t)b->nWorks;
    if (action == RIG_PROF_FINI) b->chanDev->workCounter = b->workCounter;
  }
}

static int rigBlockInit(struct rigBlock *b, struct rigLaunch *launch, int blockIdx) {
  memset(b, 0, offsetof(struct rigBlock, works));
  b->launch = launch;
  b->blockIdx = blockIdx;
  uint64_t mask = launch->ka->channelMask;
  int seen = 0;
  b->channelId = -1;
  for (int c = 0; c < RIG_MAXCHANNELS; c++) {
    if (!((mask >> c) & 1)) continue;
    if (seen++ == blockIdx) { b->channelId = c; break; }
  }
  if (b->channelId < 0)
    return rigFail(launch, "rig kernel: block %d has no channel in channelMask %#llx",
                   blockIdx, (unsigned long long)mask);
  struct rigKernelCommAndChannels *cc = launch->ka->comm;
  b->comm = cc->comm;
  b->chanDev = &cc->channels[b->channelId];
  b->chan = *b->chanDev;
  b->workCounter = b->chanDev->workCounter;
  return RIG_OK;
}

/* Walks a block's batch list without running it, refusing anything not implemented. */
static int rigValidateBlock(struct rigBlock *b) {
  int batchIx = b->blockIdx;
  for (int guard = 0; guard < 1 << 16; guard++) {
    if (rigLoadBatch(b, batchIx) != RIG_OK) return RIG_FAILED;
    if (rigCheckFunc(b->launch, b->funcId, b->workType) != RIG_OK) return RIG_FAILED;
    for (int i = 0; i < b->nWorks; i++) {
      const struct rigWorkColl *w = (const struct rigWorkColl *)(b->works + (size_t)i * (size_t)b->workSize);
      if (rigCheckWork(b, w) != RIG_OK) return RIG_FAILED;
    }
    if (b->nextBatchIx == -1) return RIG_OK;
    batchIx = b->nextBatchIx;
  }
  return rigFail(b->launch, "rig kernel: channel %d: work batch list does not end", b->channelId);
}

/* ncclKernelMain for one block. */
static int rigRunBlock(struct rigBlock *b) {
  int rc = rigLoadBatch(b, b->blockIdx);
  if (rc != RIG_OK) return rc;
  for (;;) {
    if (rigAbortRaised(b)) { rc = RIG_ABORTED; break; }
    rigProfiler(b, RIG_PROF_START);
    rc = rigRunBatch(b);
    if (rc != RIG_OK) break;
    if (b->nextBatchIx == -1) break;
    int next = b->nextBatchIx;
    rigProfiler(b, RIG_PROF_STOP);
    rc = rigLoadBatch(b, next);
    if (rc != RIG_OK) return rc;
  }
  if (rc == RIG_FAILED) return rc;
  rigProfiler(b, RIG_PROF_FINI);
  return rc;
}

/* ------------------------------------------------------------------------------------------
 * Entry point.
 * ------------------------------------------------------------------------------------------ */

int nbxRigRunKernel(const char *name, const void *args, size_t argsBytes, unsigned gridX,
                    unsigned blockX, char *err, size_t errLen) {
  struct rigLaunch launch;
  struct rigKernelArgs kaCopy; /* the caller's buffer need not be aligned: read a copy */
  memset(&launch, 0, sizeof(launch));
  launch.args = (const unsigned char *)args;
  launch.argsBytes = argsBytes;
  launch.ka = &kaCopy;
  launch.err = err;
  launch.errLen = errLen;
  launch.timeoutS = rigTimeoutFromEnv();
  if (err && errLen) err[0] = '\0';
  (void)blockX; /* the thread count only shapes the GPU's work split, not what moves */

  if (name && !strstr(name, "ncclDevKernel_"))
    return rigFail(&launch, "rig kernel: kernel %s is not implemented (only NCCL's ncclDevKernel_* collectives)", name);
  if (!args || argsBytes < sizeof(struct rigKernelArgs))
    return rigFail(&launch, "rig kernel: %zu argument bytes, fewer than ncclDevKernelArgs' %zu",
                   argsBytes, sizeof(struct rigKernelArgs));
  memcpy(&kaCopy, args, sizeof(kaCopy));
  const struct rigKernelArgs *ka = launch.ka;
  if (!ka->comm) return rigFail(&launch, "rig kernel: kernel arguments carry no communicator");
  if (ka->workStorageType > RIG_STORE_PERSISTENT)
    return rigFail(&launch, "rig kernel: unknown work storage type %u", ka->workStorageType);
  int nChannels = __builtin_popcountll(ka->channelMask);
  if ((unsigned)nChannels != gridX)
    return rigFail(&launch, "rig kernel: grid of %u blocks for %d channels (channelMask %#llx)", gridX,
                   nChannels, (unsigned long long)ka->channelMask);

  /* The block state is large (its work storage); one, reused for every block. */
  struct rigBlock *b = (struct rigBlock *)aligned_alloc(16, sizeof(struct rigBlock));
  if (!b) return rigFail(&launch, "rig kernel: out of memory");

  int rc = RIG_OK;
  /* First refuse what is not implemented, before touching any connection. */
  for (unsigned blk = 0; blk < gridX && rc == RIG_OK; blk++) {
    rc = rigBlockInit(b, &launch, (int)blk);
    if (rc == RIG_OK) rc = rigValidateBlock(b);
  }
  /* Then run the blocks in channel order; every rank does the same, so the rings advance. */
  for (unsigned blk = 0; blk < gridX && rc == RIG_OK; blk++) {
    rc = rigBlockInit(b, &launch, (int)blk);
    if (rc == RIG_OK) rc = rigRunBlock(b);
  }
  int aborted = rc == RIG_ABORTED;
  int channel = b->channelId;
  free(b);
  if (aborted) {
    rigFail(&launch, "rig kernel: stopped on channel %d because NCCL raised its abort flag", channel);
    return 0;
  }
  return rc == RIG_OK ? 0 : -1;
}
