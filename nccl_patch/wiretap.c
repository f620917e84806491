/*
 * wiretap.c - an LD_PRELOAD recorder of a process's TCP traffic, for the transcripts of real NCCL
 * runs (tests/fixtures/nccl/). NCCL's bootstrap, its Socket net and the c10d store all move their
 * bytes with connect/accept/send/recv on TCP sockets; this library records each of those calls, with
 * the bytes, into one file per process, so a machine without a GPU can replay what a real rank said.
 *
 * NEURONABOX_WIRETAP=<prefix>      record into <prefix>.<pid>.tap (unset: the library does nothing)
 * NEURONABOX_WIRETAP_CAP=<bytes>   bytes kept per send/recv call (default 65536; the length is always kept)
 *
 * Record (little-endian): u8 kind, u8 family, u16 reserved, i32 fd, u64 monotonic ns, u32 length,
 * u32 kept, then `kept` bytes. kind: 1 connect, 2 accept, 3 send, 4 recv, 5 close. For connect and
 * accept the bytes are "local-ip:port peer-ip:port"; for send and recv the first `kept` bytes moved.
 * Only AF_INET/AF_INET6 stream sockets are recorded. A record is one writev() under a lock, so the
 * threads of a process (NCCL's bootstrap and proxy threads) never interleave inside a record; a
 * forked child (a DataLoader worker) records into a file of its own pid, not its parent's.
 * Format: nccl_patch/README.md; reader: neuronabox/controller/dialects/nccl/transcript.py.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
enum { TAP_CONNECT = 1, TAP_ACCEPT = 2, TAP_SEND = 3, TAP_RECV = 4, TAP_CLOSE = 5 };
#define HEADER_BYTES 24
#define MAX_FDS 65536

static pthread_once_t once = PTHREAD_ONCE_INIT;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int tap_fd = -1;
static size_t cap = 65536;
static char tap_prefix[4000];
static unsigned char tracked[MAX_FDS]; /* 0: not a TCP socket we saw connect/accept; else its family */

/* tracked[] is read and written by every thread that touches a socket: relaxed atomics suffice. */
static int is_tracked(int fd) { /* the socket's family, 0 if it is not recorded */
    return fd >= 0 && fd < MAX_FDS ? __atomic_load_n(&tracked[fd], __ATOMIC_RELAXED) : 0;
}
static void set_tracked(int fd, int family) {
    if (fd >= 0 && fd < MAX_FDS) __atomic_store_n(&tracked[fd], (unsigned char)family, __ATOMIC_RELAXED);
}

static int (*real_connect)(int, const struct sockaddr *, socklen_t);
static int (*real_accept)(int, struct sockaddr *, socklen_t *);
static int (*real_accept4)(int, struct sockaddr *, socklen_t *, int);
static ssize_t (*real_send)(int, const void *, size_t, int);
static ssize_t (*real_recv)(int, void *, size_t, int);
static int (*real_close)(int);

static void open_tap(void) {
    char path[4096];
    snprintf(path, sizeof path, "%s.%d.tap", tap_prefix, (int)getpid());
    tap_fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
}

/* A forked child has the parent's fd and lock state: give it its own file and a fresh lock. */
static void reopen_in_child(void) {
    pthread_mutex_init(&lock, NULL);
    if (tap_fd >= 0) syscall(SYS_close, tap_fd);
    open_tap();
}

static void setup(void) {
    real_connect = dlsym(RTLD_NEXT, "connect");
    real_accept = dlsym(RTLD_NEXT, "accept");
    real_accept4 = dlsym(RTLD_NEXT, "accept4");
    real_send = dlsym(RTLD_NEXT, "send");
    real_recv = dlsym(RTLD_NEXT, "recv");
    real_close = dlsym(RTLD_NEXT, "close");
    const char *prefix = getenv("NEURONABOX_WIRETAP");
    const char *c = getenv("NEURONABOX_WIRETAP_CAP");
    if (c && *c) cap = (size_t)strtoull(c, NULL, 10);
    if (!prefix || !*prefix) return;
    snprintf(tap_prefix, sizeof tap_prefix, "%s", prefix);
    open_tap();
    pthread_atfork(NULL, NULL, reopen_in_child);
}

/* Header and bytes in one writev (O_APPEND: one record lands whole); a short write, rare on
 * a local file, finishes with plain writes under the same lock. */
static void write_record(const unsigned char *h, size_t hn, const void *data, size_t n) {
    struct iovec iov[2] = {{(void *)h, hn}, {(void *)data, n}};
    ssize_t w;
    do {
        w = syscall(SYS_writev, tap_fd, iov, n ? 2 : 1);
    } while (w < 0 && errno == EINTR);
    if (w < 0) return; /* a full disk loses records, never the traced program */
    size_t done = (size_t)w;
    for (int i = 0; i < 2; i++) {
        const unsigned char *p = iov[i].iov_base;
        size_t len = iov[i].iov_len;
        size_t skip = done < len ? done : len;
        done -= skip;
        p += skip;
        len -= skip;
        while (len > 0) {
            ssize_t k = syscall(SYS_write, tap_fd, p, len);
            if (k < 0 && errno == EINTR) continue;
            if (k <= 0) return;
            p += k;
            len -= (size_t)k;
        }
    }
}

static void record(int kind, int family, int fd, uint32_t length, const void *data, size_t kept) {
    if (tap_fd < 0) return;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    unsigned char h[HEADER_BYTES] = {0};
    h[0] = (unsigned char)kind;
    h[1] = (unsigned char)family;
    memcpy(h + 4, &fd, 4);
    memcpy(h + 8, &ns, 8);
    memcpy(h + 16, &length, 4);
    uint32_t k = (uint32_t)kept;
    memcpy(h + 20, &k, 4);
    int saved = errno;
    pthread_mutex_lock(&lock);
    write_record(h, sizeof h, data, kept);
    pthread_mutex_unlock(&lock);
    errno = saved;
}

static int stream_family(int fd) {
    struct sockaddr_storage ss;
    socklen_t n = sizeof ss;
    int type = 0;
    socklen_t tn = sizeof type;
    if (getsockname(fd, (struct sockaddr *)&ss, &n) != 0) return 0;
    if (ss.ss_family != AF_INET && ss.ss_family != AF_INET6) return 0;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tn) != 0 || type != SOCK_STREAM) return 0;
    return ss.ss_family;
}

static void addr_text(const struct sockaddr_storage *ss, char *out, size_t n) {
    char ip[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
        inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
        port = ntohs(a->sin_port);
        snprintf(out, n, "%s:%d", ip, port);
    } else {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
        inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip);
        port = ntohs(a->sin6_port);
        snprintf(out, n, "[%s]:%d", ip, port);
    }
}

/* The connection's two ends as "local peer"; a connect still in progress may lack its peer. */
static void note_endpoints(int kind, int fd) {
    int family = stream_family(fd);
    if (!family || fd < 0 || fd >= MAX_FDS) return;
    set_tracked(fd, family);
    struct sockaddr_storage local, peer;
    socklen_t ln = sizeof local, pn = sizeof peer;
    char a[80] = "?", b[80] = "?", both[170];
    if (getsockname(fd, (struct sockaddr *)&local, &ln) == 0) addr_text(&local, a, sizeof a);
    if (getpeername(fd, (struct sockaddr *)&peer, &pn) == 0) addr_text(&peer, b, sizeof b);
    int n = snprintf(both, sizeof both, "%s %s", a, b);
    record(kind, family, fd, (uint32_t)n, both, (size_t)n);
}

EXPORT int connect(int fd, const struct sockaddr *addr, socklen_t len) {
    pthread_once(&once, setup);
    int rc = real_connect(fd, addr, len);
    int saved = errno;
    if ((rc == 0 || errno == EINPROGRESS) && addr && (addr->sa_family == AF_INET || addr->sa_family == AF_INET6)) {
        /* the peer as dialled: getpeername fails while a non-blocking connect is in progress */
        int family = stream_family(fd);
        if (family && fd < MAX_FDS) {
            set_tracked(fd, family);
            struct sockaddr_storage local = {0}, peer = {0};
            socklen_t ln = sizeof local;
            memcpy(&peer, addr, len < sizeof peer ? len : sizeof peer);
            char a[80] = "?", b[80] = "?", both[170];
            if (getsockname(fd, (struct sockaddr *)&local, &ln) == 0) addr_text(&local, a, sizeof a);
            addr_text(&peer, b, sizeof b);
            int n = snprintf(both, sizeof both, "%s %s", a, b);
            record(TAP_CONNECT, family, fd, (uint32_t)n, both, (size_t)n);
        }
    }
    errno = saved;
    return rc;
}

EXPORT int accept(int fd, struct sockaddr *addr, socklen_t *len) {
    pthread_once(&once, setup);
    int rc = real_accept(fd, addr, len);
    if (rc >= 0) {
        int saved = errno;
        note_endpoints(TAP_ACCEPT, rc);
        errno = saved;
    }
    return rc;
}

EXPORT int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags) {
    pthread_once(&once, setup);
    int rc = real_accept4(fd, addr, len, flags);
    if (rc >= 0) {
        int saved = errno;
        note_endpoints(TAP_ACCEPT, rc);
        errno = saved;
    }
    return rc;
}

EXPORT ssize_t send(int fd, const void *buf, size_t n, int flags) {
    pthread_once(&once, setup);
    ssize_t rc = real_send(fd, buf, n, flags);
    int family = is_tracked(fd);
    if (rc > 0 && family) record(TAP_SEND, family, fd, (uint32_t)rc, buf, (size_t)rc < cap ? (size_t)rc : cap);
    return rc;
}

EXPORT ssize_t recv(int fd, void *buf, size_t n, int flags) {
    pthread_once(&once, setup);
    ssize_t rc = real_recv(fd, buf, n, flags);
    int family = is_tracked(fd);
    if (rc > 0 && family && !(flags & MSG_PEEK))
        record(TAP_RECV, family, fd, (uint32_t)rc, buf, (size_t)rc < cap ? (size_t)rc : cap);
    return rc;
}

EXPORT int close(int fd) {
    pthread_once(&once, setup);
    int family = is_tracked(fd);
    if (family) {
        record(TAP_CLOSE, family, fd, 0, NULL, 0);
        set_tracked(fd, 0);
    }
    return real_close(fd);
}
