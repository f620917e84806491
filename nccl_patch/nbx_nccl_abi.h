/*
 * nbx_nccl_abi.h - the slice of NCCL's plugin ABI that NeuronaBox's plugins speak.
 *
 * Written from the published ABI facts (NCCL 2.28.9 sources, plugin headers net v8 and
 * profiler v5); no NCCL code is used. Only what is ABI is kept exact: enum values, the order and
 * types of struct members, function-pointer signatures and the two exported symbol names. The
 * typedef and member names are ours (member names follow NCCL's where that helps a reader).
 *
 * Plain C11, LP64 (x86_64 / aarch64 Linux). The layout asserts at the bottom pin every offset the
 * plugins rely on; abi_check.c compares the result codes with the real nccl.h.
 *
 * Version windows: net ABI v8 is loaded by NCCL 2.21 .. 2.30; profiler ABI v5 by NCCL 2.28 ..
 * 2.30 (2.29/2.30 prefer v6 but still accept v5).
 */
#ifndef NBX_NCCL_ABI_H
#define NBX_NCCL_ABI_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Oldest and newest NCCL_VERSION_CODE (X*10000 + Y*100 + Z) whose loader accepts both plugins. */
#define NBX_NCCL_VERSION_MIN 22800
#define NBX_NCCL_VERSION_MAX 23099

/* ---- result codes (same numbering as ncclResult_t) ---------------------------------------- */
typedef enum {
    nbxSuccess = 0,
    nbxUnhandledCudaError = 1,
    nbxSystemError = 2,
    nbxInternalError = 3,
    nbxInvalidArgument = 4,
    nbxInvalidUsage = 5,
    nbxRemoteError = 6,
    nbxInProgress = 7,
    nbxNumResults = 8
} nbx_result_t;

/* ---- logging ------------------------------------------------------------------------------ */
typedef enum {
    NBX_LOG_NONE = 0,
    NBX_LOG_VERSION = 1,
    NBX_LOG_WARN = 2,
    NBX_LOG_INFO = 3,
    NBX_LOG_ABORT = 4,
    NBX_LOG_TRACE = 5
} nbx_log_level_t;

/* Subsystem bits passed as the logger's `flags`. */
#define NBX_SUBSYS_INIT 0x1UL
#define NBX_SUBSYS_NET 0x10UL
#define NBX_SUBSYS_PROFILE 0x4000UL

/* NCCL's logger: printf-like, `file` is a source name or function name used only for display. */
typedef void (*nbx_logger_t)(nbx_log_level_t level, unsigned long flags, const char *file, int line,
                             const char *fmt, ...);

/* ---- net plugin, ABI v8 ------------------------------------------------------------------- */
#define NBX_NET_HANDLE_BYTES 128 /* NCCL_NET_HANDLE_MAXSIZE: the opaque listen handle */
#define NBX_PTR_HOST 0x1         /* NCCL_PTR_HOST */
#define NBX_PTR_CUDA 0x2         /* NCCL_PTR_CUDA */
#define NBX_PTR_DMABUF 0x4       /* NCCL_PTR_DMABUF */
/* NCCL_NET_MAX_REQUESTS for ABI v7 and later (v6 had 8): outstanding requests per comm. */
#define NBX_NET_MAX_REQUESTS 32

/* ncclNetDeviceType (an int-sized enum). Only "host" is used: no device-side offload. */
typedef enum {
    NBX_NET_DEVICE_HOST = 0,
    NBX_NET_DEVICE_UNPACK = 1
} nbx_net_device_type_t;

/* ncclNetDeviceHandle_v8_t (same as v7). Only pointers to it cross the ABI; we never create one. */
typedef struct {
    nbx_net_device_type_t netDeviceType;
    int netDeviceVersion;
    void *handle;
    size_t size;
    int needsProxyProgress;
} nbx_net_device_handle_v8_t;

/* ncclNetProperties_v8_t */
typedef struct {
    char *name;                          /* shown in logs */
    char *pciPath;                       /* sysfs path of the NIC; NULL = not on a PCI switch */
    uint64_t guid;                       /* identifies the physical NIC */
    int ptrSupport;                      /* NBX_PTR_* bits */
    int regIsGlobal;                     /* 1: a registration is valid for every comm */
    int speed;                           /* Mb/s */
    int port;
    float latency;                       /* microseconds */
    int maxComms;
    int maxRecvs;                        /* grouped receives per irecv */
    nbx_net_device_type_t netDeviceType;
    int netDeviceVersion;
} nbx_net_properties_v8_t;

/* ncclNet_v8_t: the table NCCL finds under the symbol ncclNetPlugin_v8. Member order is ABI. */
typedef struct {
    const char *name;
    nbx_result_t (*init)(nbx_logger_t logger);
    nbx_result_t (*devices)(int *ndev);
    nbx_result_t (*getProperties)(int dev, nbx_net_properties_v8_t *props);
    nbx_result_t (*listen)(int dev, void *handle, void **listenComm);
    nbx_result_t (*connect)(int dev, void *handle, void **sendComm, nbx_net_device_handle_v8_t **sendDevComm);
    nbx_result_t (*accept)(void *listenComm, void **recvComm, nbx_net_device_handle_v8_t **recvDevComm);
    nbx_result_t (*regMr)(void *comm, void *data, size_t size, int type, void **mhandle);
    nbx_result_t (*regMrDmaBuf)(void *comm, void *data, size_t size, int type, uint64_t offset, int fd,
                                void **mhandle);
    nbx_result_t (*deregMr)(void *comm, void *mhandle);
    nbx_result_t (*isend)(void *sendComm, void *data, int size, int tag, void *mhandle, void **request);
    nbx_result_t (*irecv)(void *recvComm, int n, void **data, int *sizes, int *tags, void **mhandles,
                          void **request);
    nbx_result_t (*iflush)(void *recvComm, int n, void **data, int *sizes, void **mhandles, void **request);
    nbx_result_t (*test)(void *request, int *done, int *sizes);
    nbx_result_t (*closeSend)(void *sendComm);
    nbx_result_t (*closeRecv)(void *recvComm);
    nbx_result_t (*closeListen)(void *listenComm);
    nbx_result_t (*getDeviceMr)(void *comm, void *mhandle, void **dptr_mhandle);
    nbx_result_t (*irecvConsumed)(void *recvComm, int n, void *request);
} nbx_net_v8_t;

/* ---- profiler plugin, ABI v5 -------------------------------------------------------------- */
/* Event type bits (descriptor `type` and the activation mask). */
#define NBX_PROF_GROUP (1 << 0)
#define NBX_PROF_COLL (1 << 1)
#define NBX_PROF_P2P (1 << 2)
#define NBX_PROF_PROXY_OP (1 << 3)
#define NBX_PROF_PROXY_STEP (1 << 4)
#define NBX_PROF_PROXY_CTRL (1 << 5)
#define NBX_PROF_KERNEL_CH (1 << 6)
#define NBX_PROF_NET_PLUGIN (1 << 7)
#define NBX_PROF_GROUP_API (1 << 8)
#define NBX_PROF_COLL_API (1 << 9)
#define NBX_PROF_P2P_API (1 << 10)
#define NBX_PROF_KERNEL_LAUNCH (1 << 11)

/* ncclProfilerEventState_t: an int-sized enum; the plugin ignores states, a few are named. */
typedef enum {
    NBX_PSTATE_PROXY_STEP_SEND_GPU_WAIT = 8,
    NBX_PSTATE_PROXY_STEP_SEND_WAIT = 9,
    NBX_PSTATE_PROXY_STEP_RECV_WAIT = 10,
    NBX_PSTATE_PROXY_CTRL_IDLE = 13,
    NBX_PSTATE_KERNEL_CH_STOP = 22,
    NBX_PSTATE_GROUP_END_API_START = 24
} nbx_prof_state_t;

/* ncclProfilerEventDescr_v5_t. NCCL builds it (zeroed) and passes a pointer to startEvent. */
typedef struct {
    uint64_t type;    /* one NBX_PROF_* bit */
    void *parentObj;  /* handle of the parent event (or NULL) */
    int rank;         /* rank that produced the event */
    union {
        struct {
            _Bool graphCaptured;
            int groupDepth;
        } groupApi;
        struct {
            const char *func;
            size_t count;
            const char *datatype;
            int root;
            void *stream;
            _Bool graphCaptured;
        } collApi;
        struct {
            const char *func;
            size_t count;
            const char *datatype;
            void *stream;
            _Bool graphCaptured;
        } p2pApi;
        struct {
            void *stream;
        } kernelLaunch;
        struct {
            uint64_t seqNumber;    /* per-function sequence number within the comm */
            const char *func;      /* "AllReduce", ... */
            const void *sendBuff;
            void *recvBuff;
            size_t count;          /* elements */
            int root;
            const char *datatype;  /* "ncclFloat32", ... */
            uint8_t nChannels;
            uint8_t nWarps;
            const char *algo;      /* "RING", ... */
            const char *proto;     /* "SIMPLE", ... */
            void *parentGroup;
        } coll;
        struct {
            const char *func;
            void *buff;
            const char *datatype;
            size_t count;
            int peer;
            uint8_t nChannels;
            void *parentGroup;
        } p2p;
        struct {
            pid_t pid;             /* process that posted the op */
            uint8_t channelId;
            int peer;
            int nSteps;
            int chunkSize;         /* bytes per network transfer */
            int isSend;
        } proxyOp;
        struct {
            int step;
        } proxyStep;
        struct {
            uint8_t channelId;
            uint64_t pTimer;
        } kernelCh;
        struct {
            int64_t id;
            void *data;
        } netPlugin;
    } u;
} nbx_prof_descr_v5_t;

/* ncclProfilerEventStateArgs_v5_t */
typedef union {
    struct { size_t transSize; } proxyStep;
    struct { int appendedProxyOps; } proxyCtrl;
    struct { void *data; } netPlugin;
    struct { uint64_t pTimer; } kernelCh;
} nbx_prof_state_args_v5_t;

/* ncclProfiler_v5_t: the table NCCL finds under the symbol ncclProfiler_v5. */
typedef struct {
    const char *name;
    nbx_result_t (*init)(void **context, uint64_t commId, int *eActivationMask, const char *commName,
                         int nNodes, int nranks, int rank, nbx_logger_t logger);
    nbx_result_t (*startEvent)(void *context, void **eHandle, nbx_prof_descr_v5_t *descr);
    nbx_result_t (*stopEvent)(void *eHandle);
    nbx_result_t (*recordEventState)(void *eHandle, nbx_prof_state_t state, nbx_prof_state_args_v5_t *args);
    nbx_result_t (*finalize)(void *context);
} nbx_profiler_v5_t;

/* ---- layout pins (LP64) ------------------------------------------------------------------- */
#if defined(__LP64__)
_Static_assert(sizeof(nbx_result_t) == 4, "ncclResult_t is int-sized");
_Static_assert(sizeof(nbx_net_device_handle_v8_t) == 32, "device handle v8");
_Static_assert(offsetof(nbx_net_properties_v8_t, guid) == 16, "props.guid");
_Static_assert(offsetof(nbx_net_properties_v8_t, ptrSupport) == 24, "props.ptrSupport");
_Static_assert(offsetof(nbx_net_properties_v8_t, regIsGlobal) == 28, "props.regIsGlobal");
_Static_assert(offsetof(nbx_net_properties_v8_t, speed) == 32, "props.speed");
_Static_assert(offsetof(nbx_net_properties_v8_t, port) == 36, "props.port");
_Static_assert(offsetof(nbx_net_properties_v8_t, latency) == 40, "props.latency");
_Static_assert(offsetof(nbx_net_properties_v8_t, maxComms) == 44, "props.maxComms");
_Static_assert(offsetof(nbx_net_properties_v8_t, maxRecvs) == 48, "props.maxRecvs");
_Static_assert(offsetof(nbx_net_properties_v8_t, netDeviceType) == 52, "props.netDeviceType");
_Static_assert(offsetof(nbx_net_properties_v8_t, netDeviceVersion) == 56, "props.netDeviceVersion");
_Static_assert(sizeof(nbx_net_properties_v8_t) == 64, "props size");
_Static_assert(offsetof(nbx_net_v8_t, listen) == 4 * 8, "net.listen");
_Static_assert(offsetof(nbx_net_v8_t, isend) == 10 * 8, "net.isend");
_Static_assert(offsetof(nbx_net_v8_t, test) == 13 * 8, "net.test");
_Static_assert(sizeof(nbx_net_v8_t) == 19 * 8, "net v8 table: name + 18 functions");

_Static_assert(offsetof(nbx_prof_descr_v5_t, parentObj) == 8, "descr.parentObj");
_Static_assert(offsetof(nbx_prof_descr_v5_t, rank) == 16, "descr.rank");
_Static_assert(offsetof(nbx_prof_descr_v5_t, u) == 24, "descr union");
_Static_assert(offsetof(nbx_prof_descr_v5_t, u.coll.seqNumber) == 24, "coll.seqNumber");
_Static_assert(offsetof(nbx_prof_descr_v5_t, u.coll.func) == 32, "coll.func");
_Static_assert(offsetof(nbx_prof_descr_v5_t, u.coll.sendBuff) == 40, "coll.sendBuff");
_Static_assert(offsetof(nbx_prof_descr_v5_t, u.coll.recvBuff) == 48, "coll.recvBuff");
_Static_assert(offsetof(nbx_prof_descr_v5_t, u.coll.count) == 56, "coll.count");
_Static_assert(offsetof(nbx_prof_descr_v5_t, u.coll.root) == 64, "coll.root");
_Static_assert(offsetof(nbx_prof_descr_v5_t, u.coll.datatype) == 72, "coll.datatype");
_Static_assert(offsetof(nbx_prof_descr_v5_t, u.coll.nChannels) == 80, "coll.nChannels");
_Static_assert(offsetof(nbx_prof_descr_v5_t, u.coll.nWarps) == 81, "coll.nWarps");
_Static_assert(offsetof(nbx_prof_descr_v5_t, u.coll.algo) == 88, "coll.algo");
_Static_assert(offsetof(nbx_prof_descr_v5_t, u.coll.proto) == 96, "coll.proto");
_Static_assert(offsetof(nbx_prof_descr_v5_t, u.coll.parentGroup) == 104, "coll.parentGroup");
_Static_assert(offsetof(nbx_prof_descr_v5_t, u.proxyOp.pid) == 24, "proxyOp.pid");
_Static_assert(offsetof(nbx_prof_descr_v5_t, u.proxyOp.channelId) == 28, "proxyOp.channelId");
_Static_assert(offsetof(nbx_prof_descr_v5_t, u.proxyOp.peer) == 32, "proxyOp.peer");
_Static_assert(offsetof(nbx_prof_descr_v5_t, u.proxyOp.nSteps) == 36, "proxyOp.nSteps");
_Static_assert(offsetof(nbx_prof_descr_v5_t, u.proxyOp.chunkSize) == 40, "proxyOp.chunkSize");
_Static_assert(offsetof(nbx_prof_descr_v5_t, u.proxyOp.isSend) == 44, "proxyOp.isSend");
_Static_assert(sizeof(nbx_prof_descr_v5_t) == 112, "descr v5 size");
_Static_assert(sizeof(nbx_prof_state_args_v5_t) == 8, "state args v5");
_Static_assert(sizeof(nbx_profiler_v5_t) == 6 * 8, "profiler v5 table");
#endif

#endif /* NBX_NCCL_ABI_H */
