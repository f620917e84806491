/*
 * profiler_plugin.c - "NeuronaBox" ncclProfiler (ABI v5): appends one JSON line per collective
 * (and, on request, per proxy operation) to the file named by NEURONABOX_NCCL_TRACE.
 * Line format: nccl_patch/README.md "Trace lines".
 *
 * Each line goes out in a single write() on an O_APPEND descriptor, so several ranks/processes
 * can share one file. Events live in a fixed pool per context (per communicator); an exhausted
 * pool yields a NULL handle, which NCCL treats as "not tracked". Coll events are started and
 * stopped on the application thread and ProxyOp events on the proxy thread, so slots are claimed
 * with an atomic exchange.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nbx_nccl_abi.h"

#define NBX_EXPORT __attribute__((visibility("default")))
#define POOL_EVENTS 1024
#define LINE_MAX_BYTES 1024

struct prof_ctx;

struct prof_event {
    atomic_int used;
    struct prof_ctx *ctx;
    uint64_t type;
    int rank;
    int64_t start_ns;
    /* Coll */
    uint64_t seq;
    uint64_t count;
    int root;
    int channels, warps;
    char func[32], dtype[32], algo[24], proto[24];
    /* ProxyOp */
    int pid, channel, peer, n_steps, chunk_size, is_send;
};

struct prof_ctx {
    int fd; /* -1: inert */
    int mask; /* the events this context asked NCCL for */
    int live; /* NEURONABOX_NCCL_TRACE_START=1: a line at each Coll's start too (the live controller's cue) */
    uint64_t comm_id;
    int nnodes, nranks, rank;
    char name[128];
    int has_name;
    nbx_logger_t log;
    atomic_uint hint;
    atomic_int write_warned;
    struct prof_event pool[POOL_EVENTS];
};

__attribute__((format(printf, 3, 4))) static void plog(struct prof_ctx *c, nbx_log_level_t level, const char *fmt,
                                                         ...) {
    if (!c || !c->log) return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->log(level, NBX_SUBSYS_PROFILE, "nbx_profiler", 0, "%s", msg);
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void copy_str(char *dst, size_t n, const char *src) {
    if (!src) src = "";
    size_t i = 0;
    for (; i + 1 < n && src[i]; i++) dst[i] = src[i];
    dst[i] = 0;
}

/* ---- a bounded JSON line builder --------------------------------------------------------- */
struct jline {
    char b[LINE_MAX_BYTES];
    size_t n;
    int overflow;
};

static void jraw(struct jline *j, const char *s) {
    size_t k = strlen(s);
    if (j->n + k >= sizeof j->b) {
        j->overflow = 1;
        return;
    }
    memcpy(j->b + j->n, s, k);
    j->n += k;
}

__attribute__((format(printf, 2, 3))) static void jfmt(struct jline *j, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(j->b + j->n, sizeof j->b - j->n, fmt, ap);
    va_end(ap);
    if (k < 0 || (size_t)k >= sizeof j->b - j->n) {
        j->overflow = 1;
        j->b[j->n] = 0;
        return;
    }
    j->n += (size_t)k;
}

/* ,"key":"escaped value" */
static void jstr(struct jline *j, const char *key, const char *val) {
    jfmt(j, ",\"%s\":", key);
    if (!val) {
        jraw(j, "null");
        return;
    }
    jraw(j, "\"");
    for (const unsigned char *p = (const unsigned char *)val; *p; p++) {
        char esc[8];
        switch (*p) {
        case '"': jraw(j, "\\\""); break;
        case '\\': jraw(j, "\\\\"); break;
        case '\n': jraw(j, "\\n"); break;
        case '\r': jraw(j, "\\r"); break;
        case '\t': jraw(j, "\\t"); break;
        default:
            if (*p < 0x20 || *p == 0x7f) {
                snprintf(esc, sizeof esc, "\\u%04x", *p);
            } else {
                esc[0] = (char)*p;
                esc[1] = 0;
            }
            jraw(j, esc);
        }
    }
    jraw(j, "\"");
}

static void emit(struct prof_ctx *c, struct jline *j) {
    if (j->overflow) {
        plog(c, NBX_LOG_WARN, "PROFILER/NeuronaBox: trace line longer than %d bytes dropped", LINE_MAX_BYTES);
        return;
    }
    jraw(j, "\n");
    ssize_t k;
    do {
        k = write(c->fd, j->b, j->n);
    } while (k < 0 && errno == EINTR);
    if (k != (ssize_t)j->n && atomic_exchange(&c->write_warned, 1) == 0)
        plog(c, NBX_LOG_WARN, "PROFILER/NeuronaBox: trace write failed (%zd of %zu bytes): %s", k, j->n,
             k < 0 ? strerror(errno) : "short write");
}

/* One Coll line: "coll" when it stops (stop_ns), "coll_start" when it starts (no stop_ns). */
static void emit_coll(struct prof_ctx *c, struct prof_event *e, const char *what, int64_t stop) {
    struct jline j = {.n = 0, .overflow = 0};
    jfmt(&j, "{\"nccl\":\"%s\"", what);
    jfmt(&j, ",\"comm\":\"%016" PRIx64 "\",\"rank\":%d,\"nranks\":%d,\"nnodes\":%d", c->comm_id, e->rank,
         c->nranks, c->nnodes);
    jstr(&j, "name", c->has_name ? c->name : NULL);
    jfmt(&j, ",\"pid\":%d,\"seq\":%" PRIu64, (int)getpid(), e->seq);
    jstr(&j, "func", e->func);
    jfmt(&j, ",\"count\":%" PRIu64 ",\"root\":%d", e->count, e->root);
    jstr(&j, "dtype", e->dtype);
    jstr(&j, "algo", e->algo);
    jstr(&j, "proto", e->proto);
    jfmt(&j, ",\"channels\":%d,\"warps\":%d", e->channels, e->warps);
    if (stop)
        jfmt(&j, ",\"start_ns\":%" PRId64 ",\"stop_ns\":%" PRId64 "}", e->start_ns, stop);
    else
        jfmt(&j, ",\"start_ns\":%" PRId64 "}", e->start_ns);
    emit(c, &j);
}

/* ---- the v5 entry points ----------------------------------------------------------------- */
static nbx_result_t prof_init(void **context, uint64_t commId, int *eActivationMask, const char *commName, int nNodes,
                              int nranks, int rank, nbx_logger_t logger) {
    *context = NULL;
    *eActivationMask = 0;
    struct prof_ctx *c = calloc(1, sizeof *c);
    if (!c) return nbxSystemError;
    c->fd = -1;
    c->comm_id = commId;
    c->nnodes = nNodes;
    c->nranks = nranks;
    c->rank = rank;
    c->log = logger;
    c->has_name = commName != NULL;
    copy_str(c->name, sizeof c->name, commName);
    *context = c;
    const char *path = getenv("NEURONABOX_NCCL_TRACE");
    if (!path || !*path) return nbxSuccess; /* inert */
    c->fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (c->fd < 0) {
        plog(c, NBX_LOG_WARN, "PROFILER/NeuronaBox: cannot open NEURONABOX_NCCL_TRACE=%s: %s", path, strerror(errno));
        return nbxSystemError;
    }
    int mask = NBX_PROF_COLL;
    const char *start = getenv("NEURONABOX_NCCL_TRACE_START");
    c->live = start && strcmp(start, "1") == 0;
    const char *proxy = getenv("NEURONABOX_NCCL_TRACE_PROXY");
    if (proxy && strcmp(proxy, "1") == 0) mask |= NBX_PROF_PROXY_OP;
    c->mask = mask;
    *eActivationMask = mask;
    plog(c, NBX_LOG_INFO, "PROFILER/NeuronaBox: comm %016" PRIx64 " rank %d/%d tracing to %s (mask 0x%x)", commId,
         rank, nranks, path, mask);
    return nbxSuccess;
}

static struct prof_event *claim(struct prof_ctx *c) {
    unsigned start = atomic_fetch_add(&c->hint, 1u);
    for (unsigned i = 0; i < POOL_EVENTS; i++) {
        struct prof_event *e = &c->pool[(start + i) % POOL_EVENTS];
        int expect = 0;
        if (atomic_load_explicit(&e->used, memory_order_relaxed) == 0 &&
            atomic_compare_exchange_strong(&e->used, &expect, 1))
            return e;
    }
    return NULL;
}

static nbx_result_t prof_start(void *context, void **eHandle, nbx_prof_descr_v5_t *d) {
    *eHandle = NULL;
    struct prof_ctx *c = context;
    if (!c || c->fd < 0 || !d) return nbxSuccess;
    /* NCCL also starts events we did not ask for (Group, CollApi, ...): leave them untracked. */
    if (d->type != NBX_PROF_COLL && d->type != NBX_PROF_PROXY_OP) return nbxSuccess;
    if (!(d->type & (uint64_t)c->mask)) return nbxSuccess;
    struct prof_event *e = claim(c);
    if (!e) return nbxSuccess; /* pool exhausted: this event goes untracked */
    e->ctx = c;
    e->type = d->type;
    e->rank = d->rank;
    if (d->type == NBX_PROF_COLL) {
        e->seq = d->u.coll.seqNumber;
        e->count = d->u.coll.count;
        e->root = d->u.coll.root;
        e->channels = d->u.coll.nChannels;
        e->warps = d->u.coll.nWarps;
        copy_str(e->func, sizeof e->func, d->u.coll.func);
        copy_str(e->dtype, sizeof e->dtype, d->u.coll.datatype);
        copy_str(e->algo, sizeof e->algo, d->u.coll.algo);
        copy_str(e->proto, sizeof e->proto, d->u.coll.proto);
    } else {
        e->pid = (int)d->u.proxyOp.pid;
        e->channel = d->u.proxyOp.channelId;
        e->peer = d->u.proxyOp.peer;
        e->n_steps = d->u.proxyOp.nSteps;
        e->chunk_size = d->u.proxyOp.chunkSize;
        e->is_send = d->u.proxyOp.isSend;
    }
    e->start_ns = now_ns();
    *eHandle = e;
    if (c->live && d->type == NBX_PROF_COLL) emit_coll(c, e, "coll_start", 0);
    return nbxSuccess;
}

static nbx_result_t prof_stop(void *eHandle) {
    struct prof_event *e = eHandle;
    if (!e) return nbxSuccess;
    int64_t stop = now_ns();
    struct prof_ctx *c = e->ctx;
    if (e->type == NBX_PROF_COLL) {
        emit_coll(c, e, "coll", stop);
    } else {
        struct jline j = {.n = 0, .overflow = 0};
        jraw(&j, "{\"nccl\":\"proxyop\"");
        jfmt(&j, ",\"comm\":\"%016" PRIx64 "\",\"rank\":%d,\"nranks\":%d,\"nnodes\":%d", c->comm_id, e->rank,
             c->nranks, c->nnodes);
        jstr(&j, "name", c->has_name ? c->name : NULL);
        jfmt(&j, ",\"pid\":%d,\"channel\":%d,\"peer\":%d,\"nSteps\":%d,\"chunkSize\":%d,\"isSend\":%d", e->pid,
             e->channel, e->peer, e->n_steps, e->chunk_size, e->is_send);
        jfmt(&j, ",\"start_ns\":%" PRId64 ",\"stop_ns\":%" PRId64 "}", e->start_ns, stop);
        emit(c, &j);
    }
    atomic_store(&e->used, 0);
    return nbxSuccess;
}

static nbx_result_t prof_record(void *eHandle, nbx_prof_state_t state, nbx_prof_state_args_v5_t *args) {
    (void)eHandle;
    (void)state;
    (void)args;
    return nbxSuccess;
}

static nbx_result_t prof_finalize(void *context) {
    struct prof_ctx *c = context;
    if (!c) return nbxSuccess;
    if (c->fd >= 0) close(c->fd);
    free(c);
    return nbxSuccess;
}

/* Not const: NCCL reads it through a plain pointer, as its own plugins export it. */
NBX_EXPORT nbx_profiler_v5_t ncclProfiler_v5 = {
    .name = "NeuronaBox",
    .init = prof_init,
    .startEvent = prof_start,
    .stopEvent = prof_stop,
    .recordEventState = prof_record,
    .finalize = prof_finalize,
};
