/*
 * net_plugin.c - "NeuronaBox" ncclNet (ABI v8): a plain TCP transport that a real NCCL rank's proxy
 * uses to talk to the NeuronaBox controller. The wire format (handle, hello, frames) is specified
 * in nccl_patch/README.md; keep the two in step.
 *
 * Threading: NCCL drives one comm from one proxy thread at a time, so comms carry no locks. The
 * only shared state is the logger and the configuration read in init().
 * Nothing in here blocks: every socket is non-blocking and progress happens in connect(),
 * accept() and test().
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "nbx_nccl_abi.h"

#define NBX_EXPORT __attribute__((visibility("default")))

/* ---- wire constants (README.md "Wire format") -------------------------------------------- */
#define NBX_MAGIC 0x4e42584e45543031ULL /* bytes of "NBXNET01" read as a big-endian number */
#define H_OFF_MAGIC 0
#define H_OFF_ADDR 8
#define H_OFF_TOKEN 24
#define H_OFF_SCRATCH 120 /* connecting side only: pointer to its in-progress connect state */
#define HELLO_BYTES 16
#define FRAME_HDR_BYTES 8
#define PENDING_ACCEPTS 16 /* half-open (hello not yet read) connections held per listen comm */
#define DEFAULT_SPEED_MBPS 100000

/* ---- configuration and logging ----------------------------------------------------------- */
static nbx_logger_t g_log;
static int g_speed = DEFAULT_SPEED_MBPS;
static struct in_addr g_bind_addr; /* network order */
static char g_dev_name[] = "nbx0";
static char g_mr_token; /* regMr hands out &g_mr_token: host memory needs no registration */

__attribute__((format(printf, 3, 4))) static void nbx_log(nbx_log_level_t level, int line, const char *fmt, ...) {
    if (!g_log) return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* Formatted here, handed over as "%s": the logger never sees our varargs. */
    g_log(level, NBX_SUBSYS_NET, "nbx_net", line, "%s", msg);
}
#define WARN(...) nbx_log(NBX_LOG_WARN, __LINE__, "NET/NeuronaBox: " __VA_ARGS__)
#define INFO(...) nbx_log(NBX_LOG_INFO, __LINE__, "NET/NeuronaBox: " __VA_ARGS__)

static void put_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint64_t get_u64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
static void put_u32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void fmt_addr(const struct sockaddr_in *sa, char *out, size_t n) {
    char ip[INET_ADDRSTRLEN] = "?";
    inet_ntop(AF_INET, &sa->sin_addr, ip, sizeof ip);
    snprintf(out, n, "%s:%u", ip, (unsigned)ntohs(sa->sin_port));
}

static uint64_t random_token(void) {
    uint64_t t = 0;
    if (getrandom(&t, sizeof t, GRND_NONBLOCK) != (ssize_t)sizeof t || t == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        t ^= ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^ ((uint64_t)getpid() << 40) ^ (uintptr_t)&ts;
        t = t ? t : 1;
    }
    return t;
}

static int set_nonblock_nodelay(int fd) {
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) return -1;
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return 0;
}

/* ---- comms and requests ------------------------------------------------------------------- */
enum req_state { RQ_FREE = 0, RQ_PENDING, RQ_DONE, RQ_FAILED };
enum comm_kind { K_SEND = 1, K_RECV = 2 };

struct nbx_comm;
struct nbx_req {
    struct nbx_comm *comm;
    int state;
    int result;          /* nbx_result_t once RQ_FAILED */
    char *data;
    int max_size;        /* send: bytes to send; recv: posted capacity */
    int size;            /* payload bytes (recv: known once the header is in) */
    int tag;
    size_t done_bytes;   /* header + payload bytes moved so far */
    unsigned char hdr[FRAME_HDR_BYTES];
};

struct nbx_comm {
    int kind;
    int fd;
    int error;                         /* sticky: first failure of the stream */
    struct sockaddr_in peer;
    char peer_str[32];
    struct nbx_req reqs[NBX_NET_MAX_REQUESTS];
    int fifo[NBX_NET_MAX_REQUESTS];    /* indexes of RQ_PENDING requests in posting order */
    int fifo_head, fifo_len;
};

struct nbx_listen {
    int fd;
    uint64_t token;
    struct sockaddr_in addr;
    char addr_str[32];
    struct {
        int fd; /* -1 = slot unused */
        struct sockaddr_in peer;
        unsigned char hello[HELLO_BYTES];
        int got;
    } pend[PENDING_ACCEPTS];
};

struct nbx_connecting {
    int fd;
    int connected;
    struct sockaddr_in peer;
    char peer_str[32];
    unsigned char hello[HELLO_BYTES];
    int sent;
};

static struct nbx_comm *comm_new(int kind, int fd, const struct sockaddr_in *peer) {
    struct nbx_comm *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->kind = kind;
    c->fd = fd;
    c->peer = *peer;
    fmt_addr(peer, c->peer_str, sizeof c->peer_str);
    for (int i = 0; i < NBX_NET_MAX_REQUESTS; i++) c->reqs[i].comm = c;
    return c;
}

static struct nbx_req *req_alloc(struct nbx_comm *c) {
    for (int i = 0; i < NBX_NET_MAX_REQUESTS; i++) {
        struct nbx_req *r = &c->reqs[i];
        if (r->state == RQ_FREE) {
            struct nbx_comm *back = r->comm;
            memset(r, 0, sizeof *r);
            r->comm = back;
            return r;
        }
    }
    return NULL;
}

static void fifo_push(struct nbx_comm *c, struct nbx_req *r) {
    c->fifo[(c->fifo_head + c->fifo_len) % NBX_NET_MAX_REQUESTS] = (int)(r - c->reqs);
    c->fifo_len++;
}

static void fail_all(struct nbx_comm *c, int result) {
    if (!c->error) c->error = result;
    while (c->fifo_len) {
        struct nbx_req *r = &c->reqs[c->fifo[c->fifo_head]];
        r->state = RQ_FAILED;
        r->result = c->error;
        c->fifo_head = (c->fifo_head + 1) % NBX_NET_MAX_REQUESTS;
        c->fifo_len--;
    }
}

/* Move bytes for the head send request. Returns 1 when it completed, 0 when the socket is full. */
static int progress_send(struct nbx_comm *c, struct nbx_req *r) {
    size_t total = FRAME_HDR_BYTES + (size_t)r->size;
    while (r->done_bytes < total) {
        struct iovec iov[2];
        int n = 0;
        if (r->done_bytes < FRAME_HDR_BYTES) {
            iov[n].iov_base = r->hdr + r->done_bytes;
            iov[n++].iov_len = FRAME_HDR_BYTES - r->done_bytes;
            if (r->size > 0) {
                iov[n].iov_base = r->data;
                iov[n++].iov_len = (size_t)r->size;
            }
        } else {
            iov[n].iov_base = r->data + (r->done_bytes - FRAME_HDR_BYTES);
            iov[n++].iov_len = total - r->done_bytes;
        }
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t k = sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
            int remote = errno == EPIPE || errno == ECONNRESET;
            WARN("send to %s failed after %zu of %zu bytes of a frame: %s", c->peer_str, r->done_bytes, total,
                 strerror(errno));
            fail_all(c, remote ? nbxRemoteError : nbxSystemError);
            return -1;
        }
        r->done_bytes += (size_t)k;
    }
    return 1;
}

/* Read into buf; returns bytes read, 0 if nothing available, -1 on error/EOF (comm failed). */
static ssize_t read_some(struct nbx_comm *c, void *buf, size_t n, size_t have, size_t total) {
    for (;;) {
        ssize_t k = recv(c->fd, buf, n, MSG_DONTWAIT);
        if (k > 0) return k;
        if (k == 0) {
            WARN("peer %s closed the connection during recv (%zu of %zu frame bytes received)", c->peer_str, have,
                 total);
            fail_all(c, nbxRemoteError);
            return -1;
        }
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
        WARN("recv from %s failed (%zu of %zu frame bytes received): %s", c->peer_str, have, total, strerror(errno));
        fail_all(c, errno == ECONNRESET ? nbxRemoteError : nbxSystemError);
        return -1;
    }
}

static int progress_recv(struct nbx_comm *c, struct nbx_req *r) {
    while (r->done_bytes < FRAME_HDR_BYTES) {
        ssize_t k = read_some(c, r->hdr + r->done_bytes, FRAME_HDR_BYTES - r->done_bytes, r->done_bytes,
                              FRAME_HDR_BYTES);
        if (k <= 0) return (int)k;
        r->done_bytes += (size_t)k;
        if (r->done_bytes == FRAME_HDR_BYTES) {
            uint32_t size = get_u32(r->hdr);
            int32_t tag = (int32_t)get_u32(r->hdr + 4);
            if (size > (uint32_t)r->max_size) {
                WARN("message from %s is %u bytes but the posted receive holds only %d bytes", c->peer_str, size,
                     r->max_size);
                fail_all(c, nbxInvalidUsage);
                return -1;
            }
            if (tag != r->tag) {
                WARN("message from %s carries tag %d but the posted receive expects tag %d", c->peer_str, (int)tag,
                     r->tag);
                fail_all(c, nbxInvalidUsage);
                return -1;
            }
            r->size = (int)size;
        }
    }
    size_t total = FRAME_HDR_BYTES + (size_t)r->size;
    while (r->done_bytes < total) {
        ssize_t k = read_some(c, r->data + (r->done_bytes - FRAME_HDR_BYTES), total - r->done_bytes, r->done_bytes,
                              total);
        if (k <= 0) return (int)k;
        r->done_bytes += (size_t)k;
    }
    return 1;
}

/* Advance the FIFO as far as the socket allows without blocking. */
static void progress(struct nbx_comm *c) {
    while (c->fifo_len && !c->error) {
        struct nbx_req *r = &c->reqs[c->fifo[c->fifo_head]];
        int rc = c->kind == K_SEND ? progress_send(c, r) : progress_recv(c, r);
        if (rc <= 0) return;
        r->state = RQ_DONE;
        c->fifo_head = (c->fifo_head + 1) % NBX_NET_MAX_REQUESTS;
        c->fifo_len--;
    }
}

/* ---- the v8 entry points ------------------------------------------------------------------ */
static nbx_result_t nbx_init(nbx_logger_t logger) {
    g_log = logger;
    const char *s = getenv("NEURONABOX_NCCL_NET_SPEED_MBPS");
    g_speed = DEFAULT_SPEED_MBPS;
    if (s && *s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (*end || v <= 0 || v > 0x7fffffffL) {
            WARN("NEURONABOX_NCCL_NET_SPEED_MBPS=%s is not a positive integer", s);
            return nbxInvalidArgument;
        }
        g_speed = (int)v;
    }
    const char *a = getenv("NEURONABOX_NCCL_NET_ADDR");
    g_bind_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (a && *a && inet_pton(AF_INET, a, &g_bind_addr) != 1) {
        WARN("NEURONABOX_NCCL_NET_ADDR=%s is not an IPv4 address", a);
        return nbxInvalidArgument;
    }
    char ip[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &g_bind_addr, ip, sizeof ip);
    INFO("TCP transport on %s, advertised speed %d Mb/s", ip, g_speed);
    return nbxSuccess;
}

static nbx_result_t nbx_devices(int *ndev) {
    *ndev = 1;
    return nbxSuccess;
}

static nbx_result_t nbx_get_properties(int dev, nbx_net_properties_v8_t *p) {
    if (dev != 0) return nbxInvalidArgument;
    memset(p, 0, sizeof *p);
    p->name = g_dev_name;
    p->pciPath = NULL;
    p->guid = 0;
    p->ptrSupport = NBX_PTR_HOST;
    p->regIsGlobal = 0;
    p->speed = g_speed;
    p->port = 0;
    p->latency = 0;
    p->maxComms = 65536;
    p->maxRecvs = 1;
    p->netDeviceType = NBX_NET_DEVICE_HOST;
    p->netDeviceVersion = 0;
    return nbxSuccess;
}

static nbx_result_t nbx_listen(int dev, void *handle, void **listenComm) {
    *listenComm = NULL;
    if (dev != 0) return nbxInvalidArgument;
    struct nbx_listen *l = calloc(1, sizeof *l);
    if (!l) return nbxSystemError;
    for (int i = 0; i < PENDING_ACCEPTS; i++) l->pend[i].fd = -1;
    l->addr.sin_family = AF_INET;
    l->addr.sin_addr = g_bind_addr;
    l->addr.sin_port = 0;
    fmt_addr(&l->addr, l->addr_str, sizeof l->addr_str);
    l->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    socklen_t len = sizeof l->addr;
    if (l->fd < 0 || bind(l->fd, (struct sockaddr *)&l->addr, sizeof l->addr) < 0 || listen(l->fd, 128) < 0 ||
        getsockname(l->fd, (struct sockaddr *)&l->addr, &len) < 0) {
        WARN("listen on %s failed: %s", l->addr_str, strerror(errno));
        if (l->fd >= 0) close(l->fd);
        free(l);
        return nbxSystemError;
    }
    fmt_addr(&l->addr, l->addr_str, sizeof l->addr_str);
    l->token = random_token();
    unsigned char *h = handle;
    memset(h, 0, NBX_NET_HANDLE_BYTES);
    put_u64(h + H_OFF_MAGIC, NBX_MAGIC);
    struct sockaddr_in wire;
    memset(&wire, 0, sizeof wire);
    wire.sin_family = AF_INET;
    wire.sin_port = l->addr.sin_port;
    wire.sin_addr = l->addr.sin_addr;
    memcpy(h + H_OFF_ADDR, &wire, sizeof wire);
    put_u64(h + H_OFF_TOKEN, l->token);
    INFO("listening on %s", l->addr_str);
    *listenComm = l;
    return nbxSuccess;
}

static void connecting_free(unsigned char *h, struct nbx_connecting *p) {
    if (p->fd >= 0) close(p->fd);
    free(p);
    memset(h + H_OFF_SCRATCH, 0, sizeof(void *));
}

static nbx_result_t nbx_connect(int dev, void *handle, void **sendComm, nbx_net_device_handle_v8_t **devComm) {
    (void)devComm; /* host transport: never offered, never written */
    *sendComm = NULL;
    if (dev != 0) return nbxInvalidArgument;
    unsigned char *h = handle;
    struct nbx_connecting *p;
    memcpy(&p, h + H_OFF_SCRATCH, sizeof p);
    if (!p) {
        if (get_u64(h + H_OFF_MAGIC) != NBX_MAGIC) {
            WARN("connect: handle does not start with the NeuronaBox magic (got 0x%016llx)",
                 (unsigned long long)get_u64(h + H_OFF_MAGIC));
            return nbxInvalidArgument;
        }
        p = calloc(1, sizeof *p);
        if (!p) return nbxSystemError;
        memcpy(&p->peer, h + H_OFF_ADDR, sizeof p->peer);
        fmt_addr(&p->peer, p->peer_str, sizeof p->peer_str);
        put_u64(p->hello, NBX_MAGIC);
        memcpy(p->hello + 8, h + H_OFF_TOKEN, 8);
        if (p->peer.sin_family != AF_INET) {
            WARN("connect: handle address family %d is not AF_INET", (int)p->peer.sin_family);
            free(p);
            return nbxInvalidArgument;
        }
        p->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (p->fd < 0) {
            WARN("connect to %s: socket() failed: %s", p->peer_str, strerror(errno));
            free(p);
            return nbxSystemError;
        }
        int one = 1;
        (void)setsockopt(p->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (connect(p->fd, (struct sockaddr *)&p->peer, sizeof p->peer) == 0) {
            p->connected = 1;
        } else if (errno != EINPROGRESS && errno != EINTR) {
            WARN("connect to %s failed: %s", p->peer_str, strerror(errno));
            close(p->fd);
            free(p);
            return nbxSystemError;
        }
        memcpy(h + H_OFF_SCRATCH, &p, sizeof p);
    }
    if (!p->connected) {
        struct pollfd pfd = {.fd = p->fd, .events = POLLOUT};
        if (poll(&pfd, 1, 0) <= 0) return nbxSuccess; /* still in progress */
        int err = 0;
        socklen_t len = sizeof err;
        if (getsockopt(p->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0) err = errno;
        if (err) {
            WARN("connect to %s failed: %s", p->peer_str, strerror(err));
            connecting_free(h, p);
            return nbxSystemError;
        }
        p->connected = 1;
    }
    while (p->sent < HELLO_BYTES) {
        ssize_t k = send(p->fd, p->hello + p->sent, (size_t)(HELLO_BYTES - p->sent), MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return nbxSuccess;
            WARN("connect to %s: sending the hello failed: %s", p->peer_str, strerror(errno));
            connecting_free(h, p);
            return nbxRemoteError;
        }
        p->sent += (int)k;
    }
    struct nbx_comm *c = comm_new(K_SEND, p->fd, &p->peer);
    if (!c) { /* NCCL aborts on an error and never calls again: release the attempt */
        WARN("connect to %s: out of memory for the send comm", p->peer_str);
        connecting_free(h, p);
        return nbxSystemError;
    }
    p->fd = -1;
    connecting_free(h, p);
    INFO("send comm connected to %s", c->peer_str);
    *sendComm = c;
    return nbxSuccess;
}

static void pend_close(struct nbx_listen *l, int i) {
    close(l->pend[i].fd);
    l->pend[i].fd = -1;
    l->pend[i].got = 0;
}

static nbx_result_t nbx_accept(void *listenComm, void **recvComm, nbx_net_device_handle_v8_t **devComm) {
    (void)devComm;
    *recvComm = NULL;
    struct nbx_listen *l = listenComm;
    if (!l) return nbxInvalidArgument;
    /* Take what the kernel has queued, as long as there are free slots. */
    for (;;) {
        int slot = -1;
        for (int i = 0; i < PENDING_ACCEPTS; i++)
            if (l->pend[i].fd < 0) {
                slot = i;
                break;
            }
        if (slot < 0) break;
        struct sockaddr_in peer;
        socklen_t len = sizeof peer;
        int fd = accept4(l->fd, (struct sockaddr *)&peer, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            WARN("accept on %s failed: %s", l->addr_str, strerror(errno));
            return nbxSystemError;
        }
        (void)set_nonblock_nodelay(fd);
        l->pend[slot].fd = fd;
        l->pend[slot].peer = peer;
        l->pend[slot].got = 0;
    }
    for (int i = 0; i < PENDING_ACCEPTS; i++) {
        if (l->pend[i].fd < 0) continue;
        char peer_str[32];
        fmt_addr(&l->pend[i].peer, peer_str, sizeof peer_str);
        while (l->pend[i].got < HELLO_BYTES) {
            ssize_t k = recv(l->pend[i].fd, l->pend[i].hello + l->pend[i].got, (size_t)(HELLO_BYTES - l->pend[i].got),
                             MSG_DONTWAIT);
            if (k > 0) {
                l->pend[i].got += (int)k;
                continue;
            }
            if (k < 0 && errno == EINTR) continue;
            if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
            WARN("accept on %s: peer %s went away before its hello (%d of %d bytes)", l->addr_str, peer_str,
                 l->pend[i].got, HELLO_BYTES);
            pend_close(l, i);
            break;
        }
        if (l->pend[i].fd < 0 || l->pend[i].got < HELLO_BYTES) continue;
        uint64_t magic = get_u64(l->pend[i].hello), token = get_u64(l->pend[i].hello + 8);
        if (magic != NBX_MAGIC || token != l->token) {
            WARN("accept on %s: rejected connection from %s: bad hello (magic 0x%016llx, token %s)", l->addr_str,
                 peer_str, (unsigned long long)magic, token == l->token ? "ok" : "mismatch");
            pend_close(l, i);
            continue;
        }
        struct nbx_comm *c = comm_new(K_RECV, l->pend[i].fd, &l->pend[i].peer);
        if (!c) return nbxSystemError;
        l->pend[i].fd = -1;
        l->pend[i].got = 0;
        INFO("recv comm on %s accepted from %s", l->addr_str, c->peer_str);
        *recvComm = c;
        return nbxSuccess;
    }
    return nbxSuccess;
}

static nbx_result_t nbx_reg_mr(void *comm, void *data, size_t size, int type, void **mhandle) {
    (void)comm;
    (void)data;
    (void)size;
    if (type != NBX_PTR_HOST) {
        WARN("regMr: only host memory is supported (type %d)", type);
        *mhandle = NULL;
        return nbxInternalError;
    }
    *mhandle = &g_mr_token;
    return nbxSuccess;
}

static nbx_result_t nbx_reg_mr_dmabuf(void *comm, void *data, size_t size, int type, uint64_t offset, int fd,
                                      void **mhandle) {
    (void)comm;
    (void)data;
    (void)size;
    (void)type;
    (void)offset;
    (void)fd;
    *mhandle = NULL;
    WARN("regMrDmaBuf: DMA-BUF registration is not supported");
    return nbxInternalError;
}

static nbx_result_t nbx_dereg_mr(void *comm, void *mhandle) {
    (void)comm;
    (void)mhandle;
    return nbxSuccess;
}

static nbx_result_t nbx_isend(void *sendComm, void *data, int size, int tag, void *mhandle, void **request) {
    (void)mhandle;
    *request = NULL;
    struct nbx_comm *c = sendComm;
    if (!c || c->kind != K_SEND || size < 0 || (size > 0 && !data)) return nbxInvalidArgument;
    if (c->error) return c->error;
    struct nbx_req *r = req_alloc(c);
    if (!r) return nbxSuccess; /* all slots busy: NCCL retries later */
    r->state = RQ_PENDING;
    r->data = data;
    r->size = r->max_size = size;
    r->tag = tag;
    put_u32(r->hdr, (uint32_t)size);
    put_u32(r->hdr + 4, (uint32_t)tag);
    fifo_push(c, r);
    progress(c);
    *request = r;
    return nbxSuccess;
}

static nbx_result_t nbx_irecv(void *recvComm, int n, void **data, int *sizes, int *tags, void **mhandles,
                              void **request) {
    (void)mhandles;
    *request = NULL;
    struct nbx_comm *c = recvComm;
    if (!c || c->kind != K_RECV) return nbxInvalidArgument;
    if (n != 1) {
        WARN("irecv from %s: %d grouped receives requested, maxRecvs is 1", c->peer_str, n);
        return nbxInvalidArgument;
    }
    if (sizes[0] < 0 || (sizes[0] > 0 && !data[0])) return nbxInvalidArgument;
    if (c->error) return c->error;
    struct nbx_req *r = req_alloc(c);
    if (!r) return nbxSuccess;
    r->state = RQ_PENDING;
    r->data = data[0];
    r->max_size = sizes[0];
    r->tag = tags[0];
    fifo_push(c, r);
    *request = r;
    return nbxSuccess;
}

static nbx_result_t nbx_iflush(void *recvComm, int n, void **data, int *sizes, void **mhandles, void **request) {
    (void)n;
    (void)data;
    (void)sizes;
    (void)mhandles;
    *request = NULL;
    struct nbx_comm *c = recvComm;
    if (!c || c->kind != K_RECV) return nbxInvalidArgument;
    struct nbx_req *r = req_alloc(c);
    if (!r) return nbxSuccess;
    r->state = RQ_DONE; /* host memory: nothing to flush */
    *request = r;
    return nbxSuccess;
}

static nbx_result_t nbx_test(void *request, int *done, int *sizes) {
    struct nbx_req *r = request;
    *done = 0;
    if (!r || r->state == RQ_FREE) return nbxInvalidArgument;
    struct nbx_comm *c = r->comm;
    if (r->state == RQ_PENDING) progress(c);
    if (r->state == RQ_FAILED) {
        int res = r->result;
        r->state = RQ_FREE;
        return res;
    }
    if (r->state == RQ_DONE) {
        *done = 1;
        if (sizes) *sizes = r->size;
        r->state = RQ_FREE;
    }
    return nbxSuccess;
}

static nbx_result_t close_comm(void *comm, int kind) {
    struct nbx_comm *c = comm;
    if (!c) return nbxSuccess;
    if (c->kind != kind) return nbxInvalidArgument;
    close(c->fd);
    free(c);
    return nbxSuccess;
}

static nbx_result_t nbx_close_send(void *sendComm) { return close_comm(sendComm, K_SEND); }
static nbx_result_t nbx_close_recv(void *recvComm) { return close_comm(recvComm, K_RECV); }

static nbx_result_t nbx_close_listen(void *listenComm) {
    struct nbx_listen *l = listenComm;
    if (!l) return nbxSuccess;
    for (int i = 0; i < PENDING_ACCEPTS; i++)
        if (l->pend[i].fd >= 0) close(l->pend[i].fd);
    close(l->fd);
    free(l);
    return nbxSuccess;
}

/* Not const: NCCL reads it through a plain pointer, as its own plugins export it. */
NBX_EXPORT nbx_net_v8_t ncclNetPlugin_v8 = {
    .name = "NeuronaBox",
    .init = nbx_init,
    .devices = nbx_devices,
    .getProperties = nbx_get_properties,
    .listen = nbx_listen,
    .connect = nbx_connect,
    .accept = nbx_accept,
    .regMr = nbx_reg_mr,
    .regMrDmaBuf = nbx_reg_mr_dmabuf,
    .deregMr = nbx_dereg_mr,
    .isend = nbx_isend,
    .irecv = nbx_irecv,
    .iflush = nbx_iflush,
    .test = nbx_test,
    .closeSend = nbx_close_send,
    .closeRecv = nbx_close_recv,
    .closeListen = nbx_close_listen,
    .getDeviceMr = NULL,
    .irecvConsumed = NULL,
};
