"""The NCCL plugins in nccl_patch/, driven through their real exported vtables (CPU only).

The .so files are built with `make -C nccl_patch`, dlopened with ctypes, and called exactly as NCCL's
proxy would call them: ncclNetPlugin_v8 over real loopback sockets, ncclProfiler_v5 with v5 event
descriptors. The wire format checked here is the one nccl_patch/README.md specifies for the controller.
"""

from __future__ import annotations

import ctypes as C
import importlib.util
import json
import os
import random
import socket
import struct
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PATCH = ROOT / "nccl_patch"
NET_SO = PATCH / "build" / "libnccl-net-neuronabox.so"
PROF_SO = PATCH / "build" / "libnccl-profiler-neuronabox.so"

MAGIC = 0x4E42584E45543031
OK, SYSTEM_ERROR, INTERNAL_ERROR, INVALID_ARGUMENT, INVALID_USAGE, REMOTE_ERROR = 0, 2, 3, 4, 5, 6
LOG_WARN, LOG_INFO = 2, 3
PTR_HOST, PTR_CUDA = 1, 2
MAX_REQUESTS = 32
PROF_GROUP, PROF_COLL, PROF_PROXY_OP = 1, 2, 8
POOL_EVENTS = 1024

# ---- ctypes mirror of nccl_patch/nbx_nccl_abi.h ------------------------------------------------------------------
# The plugins format every message themselves and call the logger as logger(level, flags, file, line, "%s", msg).
LOGGER = C.CFUNCTYPE(None, C.c_int, C.c_ulong, C.c_char_p, C.c_int, C.c_char_p, C.c_char_p)
VP = C.c_void_p
PVP = C.POINTER(C.c_void_p)
PI = C.POINTER(C.c_int)


class NetProps(C.Structure):
    _fields_ = [
        ("name", C.c_char_p), ("pciPath", C.c_char_p), ("guid", C.c_uint64), ("ptrSupport", C.c_int),
        ("regIsGlobal", C.c_int), ("speed", C.c_int), ("port", C.c_int), ("latency", C.c_float),
        ("maxComms", C.c_int), ("maxRecvs", C.c_int), ("netDeviceType", C.c_int), ("netDeviceVersion", C.c_int),
    ]


class NetV8(C.Structure):
    _fields_ = [
        ("name", C.c_char_p),
        ("init", C.CFUNCTYPE(C.c_int, LOGGER)),
        ("devices", C.CFUNCTYPE(C.c_int, PI)),
        ("getProperties", C.CFUNCTYPE(C.c_int, C.c_int, C.POINTER(NetProps))),
        ("listen", C.CFUNCTYPE(C.c_int, C.c_int, VP, PVP)),
        ("connect", C.CFUNCTYPE(C.c_int, C.c_int, VP, PVP, PVP)),
        ("accept", C.CFUNCTYPE(C.c_int, VP, PVP, PVP)),
        ("regMr", C.CFUNCTYPE(C.c_int, VP, VP, C.c_size_t, C.c_int, PVP)),
        ("regMrDmaBuf", C.CFUNCTYPE(C.c_int, VP, VP, C.c_size_t, C.c_int, C.c_uint64, C.c_int, PVP)),
        ("deregMr", C.CFUNCTYPE(C.c_int, VP, VP)),
        ("isend", C.CFUNCTYPE(C.c_int, VP, VP, C.c_int, C.c_int, VP, PVP)),
        ("irecv", C.CFUNCTYPE(C.c_int, VP, C.c_int, PVP, PI, PI, PVP, PVP)),
        ("iflush", C.CFUNCTYPE(C.c_int, VP, C.c_int, PVP, PI, PVP, PVP)),
        ("test", C.CFUNCTYPE(C.c_int, VP, PI, PI)),
        ("closeSend", C.CFUNCTYPE(C.c_int, VP)),
        ("closeRecv", C.CFUNCTYPE(C.c_int, VP)),
        ("closeListen", C.CFUNCTYPE(C.c_int, VP)),
        ("getDeviceMr", VP),
        ("irecvConsumed", VP),
    ]


class CollPart(C.Structure):
    _fields_ = [
        ("seqNumber", C.c_uint64), ("func", C.c_char_p), ("sendBuff", VP), ("recvBuff", VP), ("count", C.c_size_t),
        ("root", C.c_int), ("datatype", C.c_char_p), ("nChannels", C.c_uint8), ("nWarps", C.c_uint8),
        ("algo", C.c_char_p), ("proto", C.c_char_p), ("parentGroup", VP),
    ]


class ProxyOpPart(C.Structure):
    _fields_ = [
        ("pid", C.c_int), ("channelId", C.c_uint8), ("peer", C.c_int), ("nSteps", C.c_int), ("chunkSize", C.c_int),
        ("isSend", C.c_int),
    ]


class DescrUnion(C.Union):
    _fields_ = [("coll", CollPart), ("proxyOp", ProxyOpPart)]


class Descr(C.Structure):
    _fields_ = [("type", C.c_uint64), ("parentObj", VP), ("rank", C.c_int), ("u", DescrUnion)]


class ProfilerV5(C.Structure):
    _fields_ = [
        ("name", C.c_char_p),
        ("init", C.CFUNCTYPE(C.c_int, PVP, C.c_uint64, PI, C.c_char_p, C.c_int, C.c_int, C.c_int, LOGGER)),
        ("startEvent", C.CFUNCTYPE(C.c_int, VP, PVP, C.POINTER(Descr))),
        ("stopEvent", C.CFUNCTYPE(C.c_int, VP)),
        ("recordEventState", C.CFUNCTYPE(C.c_int, VP, C.c_int, VP)),
        ("finalize", C.CFUNCTYPE(C.c_int, VP)),
    ]


LOG: list[tuple[int, str]] = []


def _log(level, flags, file, line, fmt, msg):
    LOG.append((level, msg.decode(errors="replace") if msg else ""))


LOGGER_CB = LOGGER(_log)  # module lifetime: the plugins keep the pointer


def warnings_since(mark: int) -> list[str]:
    return [m for lvl, m in LOG[mark:] if lvl == LOG_WARN]


# ---- build ---------------------------------------------------------------------------------------------------------
def _nccl_include() -> Path:
    spec = importlib.util.find_spec("nvidia.nccl")
    assert spec is not None and spec.submodule_search_locations, (
        "nvidia-nccl-cu12 is not installed (it is in the dev extra)"
    )
    inc = Path(next(iter(spec.submodule_search_locations))) / "include"
    assert (inc / "nccl.h").is_file(), f"no nccl.h under {inc}"
    return inc


def _make(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-C", str(PATCH), *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def built():
    r = _make()
    assert r.returncode == 0, r.stdout + r.stderr
    assert NET_SO.is_file() and PROF_SO.is_file()


@pytest.fixture(scope="module")
def net(built):
    lib = C.CDLL(str(NET_SO))
    table = NetV8.in_dll(lib, "ncclNetPlugin_v8")
    assert table.init(LOGGER_CB) == OK
    yield Net(lib, table)


@pytest.fixture(scope="module")
def prof(built):
    lib = C.CDLL(str(PROF_SO))
    yield lib, ProfilerV5.in_dll(lib, "ncclProfiler_v5")


def test_abi_check_against_real_nccl_h(built):
    r = _make("abi-check", f"NCCL_INCLUDE={_nccl_include()}")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "agrees with" in r.stdout


@pytest.mark.parametrize(
    ("edits", "expect"),
    [
        ([("ncclInProgress              =  7", "ncclInProgress              =  9")], "nbxInProgress"),
        ([("#define NCCL_MINOR 28", "#define NCCL_MINOR 31"), ("NCCL_VERSION_CODE 22809", "NCCL_VERSION_CODE 23109")],
         "newer than"),
        ([("#define NCCL_MINOR 28", "#define NCCL_MINOR 27"), ("NCCL_VERSION_CODE 22809", "NCCL_VERSION_CODE 22709")],
         "older than"),
    ],
)
def test_abi_check_catches_a_mismatch(built, tmp_path, edits, expect):
    text = (_nccl_include() / "nccl.h").read_text()
    for old, new in edits:
        assert old in text, "the real nccl.h changed: update this test's edit"
        text = text.replace(old, new)
    (tmp_path / "nccl.h").write_text(text)
    r = _make("abi-check", f"NCCL_INCLUDE={tmp_path}")
    assert r.returncode != 0
    assert expect in r.stderr
    assert "version macros agree" not in r.stderr


def test_only_plugin_symbols_are_exported(built):
    net_lib, prof_lib = C.CDLL(str(NET_SO)), C.CDLL(str(PROF_SO))
    NetV8.in_dll(net_lib, "ncclNetPlugin_v8")
    ProfilerV5.in_dll(prof_lib, "ncclProfiler_v5")
    for lib, hidden in ((net_lib, ("nbx_init", "nbx_isend", "progress", "g_log")), (prof_lib, ("prof_init", "emit"))):
        for name in hidden:
            with pytest.raises(AttributeError):
                getattr(lib, name)


# ---- net plugin ------------------------------------------------------------------------------------------------------
class Net:
    def __init__(self, lib, t: NetV8):
        self.lib, self.t = lib, t

    def listen(self):
        handle = C.create_string_buffer(128)
        lc = VP()
        assert self.t.listen(0, handle, C.byref(lc)) == OK and lc.value
        return lc, handle

    def connect_step(self, handle):
        sc = VP()
        dev = VP()
        rc = self.t.connect(0, handle, C.byref(sc), C.byref(dev))
        assert dev.value is None
        return rc, sc

    def accept_step(self, lc):
        rc_ = VP()
        dev = VP()
        rc = self.t.accept(lc, C.byref(rc_), C.byref(dev))
        assert dev.value is None
        return rc, rc_

    def pair(self, timeout=5.0):
        lc, handle = self.listen()
        sc = rcomm = None
        deadline = time.monotonic() + timeout
        while (sc is None or rcomm is None) and time.monotonic() < deadline:
            if sc is None:
                rc, c = self.connect_step(handle)
                assert rc == OK
                sc = c if c.value else None
            if rcomm is None:
                rc, c = self.accept_step(lc)
                assert rc == OK
                rcomm = c if c.value else None
        assert sc is not None and rcomm is not None, "connect/accept did not finish"
        return lc, sc, rcomm

    def isend(self, sc, buf, size, tag):
        req = VP()
        rc = self.t.isend(sc, buf, size, tag, None, C.byref(req))
        return rc, req

    def irecv(self, rcomm, buf, size, tag):
        req = VP()
        data = (VP * 1)(C.cast(buf, VP) if buf is not None else None)
        sizes = (C.c_int * 1)(size)
        tags = (C.c_int * 1)(tag)
        mh = (VP * 1)(None)
        rc = self.t.irecv(rcomm, 1, data, sizes, tags, mh, C.byref(req))
        return rc, req

    def test(self, req):
        done = C.c_int(-1)
        size = C.c_int(-1)
        rc = self.t.test(req, C.byref(done), C.byref(size))
        return rc, done.value, size.value

    def drive(self, reqs, timeout=5.0):
        """Test every request until all are done; returns {index: (rc, size)}. Never blocks in test()."""
        results = {}
        deadline = time.monotonic() + timeout
        while len(results) < len(reqs):
            pending = sorted(set(range(len(reqs))) - set(results))
            assert time.monotonic() < deadline, f"requests still pending: {pending}"
            for i, req in enumerate(reqs):
                if i in results:
                    continue
                rc, done, size = self.test(req)
                if rc != OK or done:
                    results[i] = (rc, size)
        return results

    def close(self, lc=None, sc=None, rcomm=None):
        if sc is not None:
            assert self.t.closeSend(sc) == OK
        if rcomm is not None:
            assert self.t.closeRecv(rcomm) == OK
        if lc is not None:
            assert self.t.closeListen(lc) == OK


def _handle_addr(handle) -> tuple[str, int]:
    raw = handle.raw
    family, port = struct.unpack_from("<H", raw, 8)[0], struct.unpack_from(">H", raw, 10)[0]
    assert family == socket.AF_INET
    return socket.inet_ntoa(raw[12:16]), port


def _token(handle) -> int:
    return struct.unpack_from("<Q", handle.raw, 24)[0]


def _raw_connect(handle, token=None, magic=MAGIC) -> socket.socket:
    s = socket.create_connection(_handle_addr(handle), timeout=5)
    s.sendall(struct.pack("<QQ", magic, _token(handle) if token is None else token))
    return s


def _accept_until(net, lc, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rc, c = net.accept_step(lc)
        assert rc == OK
        if c.value:
            return c
    return None


def test_table_and_properties(net, monkeypatch):
    t = net.t
    assert t.name == b"NeuronaBox"
    assert t.getDeviceMr is None and t.irecvConsumed is None
    n = C.c_int(0)
    assert t.devices(C.byref(n)) == OK and n.value == 1
    p = NetProps()
    assert t.getProperties(0, C.byref(p)) == OK
    assert (p.name, p.pciPath, p.guid, p.ptrSupport, p.regIsGlobal) == (b"nbx0", None, 0, PTR_HOST, 0)
    assert (p.speed, p.port, p.latency, p.maxComms, p.maxRecvs) == (100000, 0, 0.0, 65536, 1)
    assert (p.netDeviceType, p.netDeviceVersion) == (0, 0)
    assert t.getProperties(1, C.byref(p)) == INVALID_ARGUMENT

    monkeypatch.setenv("NEURONABOX_NCCL_NET_SPEED_MBPS", "12345")
    assert t.init(LOGGER_CB) == OK
    assert t.getProperties(0, C.byref(p)) == OK and p.speed == 12345
    mark = len(LOG)
    monkeypatch.setenv("NEURONABOX_NCCL_NET_SPEED_MBPS", "fast")
    assert t.init(LOGGER_CB) == INVALID_ARGUMENT
    assert any("NEURONABOX_NCCL_NET_SPEED_MBPS=fast" in w for w in warnings_since(mark))
    monkeypatch.setenv("NEURONABOX_NCCL_NET_SPEED_MBPS", "100000")
    monkeypatch.setenv("NEURONABOX_NCCL_NET_ADDR", "not-an-ip")
    assert t.init(LOGGER_CB) == INVALID_ARGUMENT
    monkeypatch.delenv("NEURONABOX_NCCL_NET_ADDR")
    assert t.init(LOGGER_CB) == OK


def test_listen_handle_layout(net):
    lc1, h1 = net.listen()
    lc2, h2 = net.listen()
    raw = h1.raw
    assert struct.unpack_from("<Q", raw, 0)[0] == MAGIC and raw[:8] == b"10TENXBN"
    ip, port = _handle_addr(h1)
    assert ip == "127.0.0.1" and port != 0
    assert raw[16:24] == bytes(8)  # sockaddr_in padding
    assert _token(h1) != 0 and _token(h1) != _token(h2)
    assert raw[32:] == bytes(96)
    # the port really listens
    with socket.create_connection((ip, port), timeout=5):
        pass
    net.close(lc=lc1)
    net.close(lc=lc2)


def test_transfer_sizes_tags_and_fifo(net):
    lc, sc, rcomm = net.pair()
    rng = random.Random(7)
    sizes = [0, 1, 7, 4096, 1 << 20, 0, 65537, 3]
    payloads = [rng.randbytes(s) for s in sizes]
    tag = 3
    send_bufs = [C.create_string_buffer(p, max(len(p), 1)) for p in payloads]
    recv_bufs = [C.create_string_buffer(s + 100) for s in sizes]  # posted sizes are larger than the messages
    recvs, sends = [], []
    for i, s in enumerate(sizes):  # all 8 outstanding on both sides at once
        rc, r = net.irecv(rcomm, recv_bufs[i], s + 100, tag)
        assert rc == OK and r.value
        recvs.append(r)
    for i, s in enumerate(sizes):
        rc, r = net.isend(sc, send_bufs[i], s, tag)
        assert rc == OK and r.value
        sends.append(r)
    res = net.drive(sends + recvs, timeout=10)
    for i, s in enumerate(sizes):
        assert res[i] == (OK, s), f"send {i}"
        assert res[len(sizes) + i] == (OK, s), f"recv {i}"
        assert recv_bufs[i].raw[:s] == payloads[i], f"payload {i}"
        assert recv_bufs[i].raw[s:] == bytes(100), f"bytes past message {i} were written"
    net.close(lc, sc, rcomm)


def test_wire_format_seen_by_a_python_peer(net):
    """The controller's view: it listens, NCCL's proxy connects with a hello, then sends frames."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    token = 0x1122334455667788
    handle = C.create_string_buffer(128)
    struct.pack_into("<Q", handle, 0, MAGIC)
    handle[8:24] = struct.pack("<H", socket.AF_INET) + struct.pack(">H", srv.getsockname()[1]) + socket.inet_aton(
        "127.0.0.1") + bytes(8)
    struct.pack_into("<Q", handle, 24, token)
    sc = None
    deadline = time.monotonic() + 5
    while sc is None and time.monotonic() < deadline:
        rc, c = net.connect_step(handle)
        assert rc == OK
        sc = c if c.value else None
    assert sc is not None
    assert handle.raw[120:] == bytes(8), "connect scratch must be cleared when done"
    peer, _ = srv.accept()
    peer.settimeout(5)
    hello = b""
    while len(hello) < 16:
        hello += peer.recv(16 - len(hello))
    assert struct.unpack("<QQ", hello) == (MAGIC, token)
    msg = b"hello controller"
    buf = C.create_string_buffer(msg, len(msg))
    rc, req = net.isend(sc, buf, len(msg), -2)
    assert rc == OK
    assert net.drive([req]) == {0: (OK, len(msg))}
    got = b""
    while len(got) < 8 + len(msg):
        got += peer.recv(64)
    assert got == struct.pack("<Ii", len(msg), -2) + msg
    net.close(sc=sc)
    assert peer.recv(1) == b""  # closeSend closes the socket
    peer.close()
    srv.close()


def test_oversize_message_is_invalid_usage(net):
    lc, sc, rcomm = net.pair()
    src = C.create_string_buffer(b"x" * 100, 100)
    dst = C.create_string_buffer(50)
    mark = len(LOG)
    _, rreq = net.irecv(rcomm, dst, 50, 0)
    _, sreq = net.isend(sc, src, 100, 0)
    res = net.drive([rreq])
    assert res[0][0] == INVALID_USAGE
    w = warnings_since(mark)
    assert any("127.0.0.1:" in m and "100 bytes" in m and "50 bytes" in m for m in w), w
    # the failure is sticky: the stream position is lost
    rc, _ = net.irecv(rcomm, dst, 50, 0)
    assert rc == INVALID_USAGE
    net.drive([sreq])
    net.close(lc, sc, rcomm)


def test_tag_mismatch_is_invalid_usage(net):
    lc, sc, rcomm = net.pair()
    src = C.create_string_buffer(8)
    dst = C.create_string_buffer(8)
    mark = len(LOG)
    _, rreq = net.irecv(rcomm, dst, 8, 5)
    _, sreq = net.isend(sc, src, 8, 6)
    assert net.drive([rreq])[0][0] == INVALID_USAGE
    assert any("tag 6" in w and "tag 5" in w for w in warnings_since(mark))
    net.drive([sreq])
    net.close(lc, sc, rcomm)


@pytest.mark.parametrize("bad", ["token", "magic"])
def test_bad_hello_is_rejected_then_good_one_accepted(net, bad):
    lc, handle = net.listen()
    mark = len(LOG)
    if bad == "token":
        intruder = _raw_connect(handle, token=_token(handle) ^ 1)
    else:
        intruder = _raw_connect(handle, magic=MAGIC ^ 1)
    intruder_port = intruder.getsockname()[1]
    assert _accept_until(net, lc, timeout=0.5) is None
    w = warnings_since(mark)
    assert any(f"127.0.0.1:{intruder_port}" in m and "rejected" in m for m in w), w
    intruder.settimeout(5)
    assert intruder.recv(1) == b""  # the plugin closed it
    intruder.close()
    # a correct peer (a Python "controller") is then accepted on the same listen comm, and can send
    good = _raw_connect(handle)
    rcomm = _accept_until(net, lc)
    assert rcomm is not None
    dst = C.create_string_buffer(16)
    _, rreq = net.irecv(rcomm, dst, 16, 9)
    good.sendall(struct.pack("<Ii", 5, 9) + b"abcde")
    assert net.drive([rreq]) == {0: (OK, 5)}
    assert dst.raw[:5] == b"abcde"
    good.close()
    net.close(lc=lc, rcomm=rcomm)


def test_half_hello_then_close_is_dropped(net):
    lc, handle = net.listen()
    s = socket.create_connection(_handle_addr(handle), timeout=5)
    s.sendall(struct.pack("<Q", MAGIC))
    s.close()
    mark = len(LOG)
    assert _accept_until(net, lc, timeout=0.5) is None
    assert any("went away" in w for w in warnings_since(mark))
    net.close(lc=lc)


def test_peer_closing_mid_frame_is_remote_error(net):
    lc, handle = net.listen()
    peer = _raw_connect(handle)
    rcomm = _accept_until(net, lc)
    assert rcomm is not None
    dst = C.create_string_buffer(1000)
    _, rreq = net.irecv(rcomm, dst, 1000, 1)
    # nothing arrived yet: test() returns at once with done=0
    t0 = time.monotonic()
    for _ in range(100):
        assert net.test(rreq)[:2] == (OK, 0)
    assert time.monotonic() - t0 < 1.0
    mark = len(LOG)
    peer.sendall(struct.pack("<Ii", 100, 1) + b"0123456789")
    peer.close()
    res = net.drive([rreq], timeout=5)
    assert res[0][0] == REMOTE_ERROR
    w = warnings_since(mark)
    assert any("closed" in m and "127.0.0.1:" in m and "18 of 108" in m for m in w), w
    net.close(lc=lc, rcomm=rcomm)


def test_send_to_closed_peer_fails_not_hangs(net):
    lc, sc, rcomm = net.pair()
    net.close(rcomm=rcomm)
    big = C.create_string_buffer(1 << 20)
    rc = OK
    deadline = time.monotonic() + 5
    while rc == OK and time.monotonic() < deadline:  # the first sends may still fit in socket buffers
        rc, req = net.isend(sc, big, 1 << 20, 0)
        if rc == OK and req.value:
            rc = net.drive([req])[0][0]
    assert rc in (REMOTE_ERROR, SYSTEM_ERROR)
    net.close(lc=lc, sc=sc)


def test_request_pool_is_bounded(net):
    lc, sc, rcomm = net.pair()
    bufs = [C.create_string_buffer(4) for _ in range(MAX_REQUESTS + 1)]
    reqs = []
    for i in range(MAX_REQUESTS):
        rc, r = net.irecv(rcomm, bufs[i], 4, 0)
        assert rc == OK and r.value, i
        reqs.append(r)
    assert len({r.value for r in reqs}) == MAX_REQUESTS
    rc, r = net.irecv(rcomm, bufs[-1], 4, 0)
    assert rc == OK and r.value is None  # "try again later"
    src = C.create_string_buffer(b"abcd", 4)
    _, s = net.isend(sc, src, 4, 0)
    assert net.drive([reqs[0], s]) == {0: (OK, 4), 1: (OK, 4)}
    rc, r = net.irecv(rcomm, bufs[-1], 4, 0)
    assert rc == OK and r.value  # a slot came back
    net.close(lc, sc, rcomm)


def test_memory_registration_and_flush(net):
    lc, sc, rcomm = net.pair()
    buf = C.create_string_buffer(64)
    mh = VP()
    assert net.t.regMr(sc, buf, 64, PTR_HOST, C.byref(mh)) == OK and mh.value
    assert net.t.deregMr(sc, mh) == OK
    assert net.t.regMr(rcomm, buf, 64, PTR_CUDA, C.byref(mh)) != OK
    assert net.t.regMrDmaBuf(rcomm, buf, 64, PTR_CUDA, 0, 3, C.byref(mh)) == INTERNAL_ERROR
    req = VP()
    data = (VP * 1)(C.cast(buf, VP))
    sizes = (C.c_int * 1)(64)
    mhs = (VP * 1)(None)
    assert net.t.iflush(rcomm, 1, data, sizes, mhs, C.byref(req)) == OK and req.value
    done = C.c_int(0)
    assert net.t.test(req, C.byref(done), None) == OK and done.value == 1
    # grouped receives are refused (maxRecvs is 1)
    tags = (C.c_int * 2)(0, 0)
    assert net.t.irecv(rcomm, 2, (VP * 2)(), (C.c_int * 2)(1, 1), tags, (VP * 2)(), C.byref(req)) == INVALID_ARGUMENT
    net.close(lc, sc, rcomm)


# ---- profiler plugin -------------------------------------------------------------------------------------------------
def test_descriptor_layout_matches_header():
    assert C.sizeof(NetProps) == 64 and C.sizeof(NetV8) == 19 * 8 and C.sizeof(ProfilerV5) == 6 * 8
    assert Descr.u.offset == 24
    assert [getattr(CollPart, f).offset + 24 for f in ("seqNumber", "count", "root", "datatype", "nChannels",
                                                        "nWarps", "algo", "proto")] == [24, 56, 64, 72, 80, 81, 88, 96]
    assert [getattr(ProxyOpPart, f).offset + 24 for f in ("pid", "channelId", "peer", "nSteps", "chunkSize",
                                                           "isSend")] == [24, 28, 32, 36, 40, 44]


def _coll(seq, func, count, root, dtype, algo, proto, channels, warps, rank=0) -> Descr:
    d = Descr()
    d.type = PROF_COLL
    d.rank = rank
    c = d.u.coll
    c.seqNumber, c.func, c.count, c.root, c.datatype = seq, func, count, root, dtype
    c.algo, c.proto, c.nChannels, c.nWarps = algo, proto, channels, warps
    return d


def _init(t, comm_id=0xDEADBEEF01, name=b"default_pg", nnodes=4, nranks=16, rank=3):
    ctx = VP()
    mask = C.c_int(-1)
    rc = t.init(C.byref(ctx), comm_id, C.byref(mask), name, nnodes, nranks, rank, LOGGER_CB)
    return rc, ctx, mask.value


def _start(t, ctx, d):
    h = VP()
    assert t.startEvent(ctx, C.byref(h), C.byref(d)) == OK
    return h


def test_profiler_inert_without_env(prof, monkeypatch, tmp_path):
    _, t = prof
    assert t.name == b"NeuronaBox"
    monkeypatch.delenv("NEURONABOX_NCCL_TRACE", raising=False)
    monkeypatch.chdir(tmp_path)
    rc, ctx, mask = _init(t)
    assert rc == OK and mask == 0
    d = _coll(0, b"AllReduce", 1, 0, b"ncclFloat32", b"RING", b"SIMPLE", 1, 8)
    assert _start(t, ctx, d).value is None
    assert t.finalize(ctx) == OK
    assert list(tmp_path.iterdir()) == []


def test_profiler_coll_lines(prof, monkeypatch, tmp_path):
    _, t = prof
    trace = tmp_path / "trace.jsonl"
    monkeypatch.setenv("NEURONABOX_NCCL_TRACE", str(trace))
    monkeypatch.delenv("NEURONABOX_NCCL_TRACE_PROXY", raising=False)
    rc, ctx, mask = _init(t, comm_id=0xABCDEF0123456789, name=b'pg "0"\\\n', nranks=16, rank=3)
    assert rc == OK and mask == PROF_COLL
    t_before = time.monotonic_ns()
    d1 = _coll(7, b"AllReduce", 1 << 20, 0, b"ncclFloat32", b"RING", b"SIMPLE", 2, 16, rank=3)
    d2 = _coll(2**40, b"Broad\"cast", 5, 9, b"ncclBfloat16", b"TREE", b"LL128", 255, 4, rank=3)
    h1 = _start(t, ctx, d1)
    h2 = _start(t, ctx, d2)
    assert h1.value and h2.value and h1.value != h2.value
    # events the plugin did not ask for get no handle
    g = Descr()
    g.type = PROF_GROUP
    assert _start(t, ctx, g).value is None
    p = Descr()
    p.type = PROF_PROXY_OP
    assert _start(t, ctx, p).value is None
    assert t.recordEventState(h1, 9, None) == OK
    assert t.stopEvent(h2) == OK
    assert t.stopEvent(h1) == OK
    t_after = time.monotonic_ns()
    assert t.finalize(ctx) == OK
    lines = trace.read_text().splitlines()
    assert len(lines) == 2
    recs = [json.loads(x) for x in lines]
    common = {"nccl": "coll", "comm": "abcdef0123456789", "rank": 3, "nranks": 16, "nnodes": 4,
              "name": 'pg "0"\\\n', "pid": os.getpid()}
    want = [
        {**common, "seq": 2**40, "func": 'Broad"cast', "count": 5, "root": 9, "dtype": "ncclBfloat16",
         "algo": "TREE", "proto": "LL128", "channels": 255, "warps": 4},
        {**common, "seq": 7, "func": "AllReduce", "count": 1 << 20, "root": 0, "dtype": "ncclFloat32",
         "algo": "RING", "proto": "SIMPLE", "channels": 2, "warps": 16},
    ]
    for rec, exp in zip(recs, want, strict=True):
        times = {k: rec.pop(k) for k in ("start_ns", "stop_ns")}
        assert rec == exp
        assert t_before <= times["start_ns"] <= times["stop_ns"] <= t_after


def test_profiler_proxyop_lines(prof, monkeypatch, tmp_path):
    _, t = prof
    trace = tmp_path / "trace.jsonl"
    monkeypatch.setenv("NEURONABOX_NCCL_TRACE", str(trace))
    monkeypatch.setenv("NEURONABOX_NCCL_TRACE_PROXY", "1")
    rc, ctx, mask = _init(t, comm_id=1, name=None, nranks=2, rank=0)
    assert rc == OK and mask == PROF_COLL | PROF_PROXY_OP
    d = Descr()
    d.type = PROF_PROXY_OP
    d.rank = 0
    d.u.proxyOp.pid, d.u.proxyOp.channelId, d.u.proxyOp.peer = 4242, 3, 1
    d.u.proxyOp.nSteps, d.u.proxyOp.chunkSize, d.u.proxyOp.isSend = 12, 524288, 1
    h = _start(t, ctx, d)
    assert h.value
    assert t.stopEvent(h) == OK
    assert t.finalize(ctx) == OK
    (rec,) = [json.loads(x) for x in trace.read_text().splitlines()]
    assert rec.pop("start_ns") <= rec.pop("stop_ns")
    assert rec == {"nccl": "proxyop", "comm": "0000000000000001", "rank": 0, "nranks": 2, "nnodes": 4,
                   "name": None, "pid": 4242, "channel": 3, "peer": 1, "nSteps": 12, "chunkSize": 524288,
                   "isSend": 1}


def test_profiler_pool_exhaustion_and_shared_file(prof, monkeypatch, tmp_path):
    _, t = prof
    trace = tmp_path / "trace.jsonl"
    monkeypatch.setenv("NEURONABOX_NCCL_TRACE", str(trace))
    monkeypatch.delenv("NEURONABOX_NCCL_TRACE_PROXY", raising=False)
    _, ctx_a, _ = _init(t, comm_id=0xA, rank=0)
    _, ctx_b, _ = _init(t, comm_id=0xB, rank=1)
    d = _coll(0, b"AllGather", 8, 0, b"ncclInt8", b"RING", b"SIMPLE", 1, 8)
    handles = [_start(t, ctx_a, d) for _ in range(POOL_EVENTS)]
    assert all(h.value for h in handles) and len({h.value for h in handles}) == POOL_EVENTS
    assert _start(t, ctx_a, d).value is None  # pool exhausted: NULL handle, not an error
    assert _start(t, ctx_b, d).value  # pools are per context
    for i, h in enumerate(handles[:10]):
        if i % 2:
            assert t.stopEvent(h) == OK
            hb = _start(t, ctx_b, d)
            assert t.stopEvent(hb) == OK
    again = _start(t, ctx_a, d)
    assert again.value  # a freed slot is reused
    assert t.stopEvent(again) == OK
    assert t.finalize(ctx_a) == OK and t.finalize(ctx_b) == OK
    recs = [json.loads(x) for x in trace.read_text().splitlines()]
    assert [r["comm"][-1] for r in recs] == ["a", "b"] * 5 + ["a"]


def test_profiler_unwritable_trace_warns(prof, monkeypatch, tmp_path):
    _, t = prof
    monkeypatch.setenv("NEURONABOX_NCCL_TRACE", str(tmp_path / "missing-dir" / "trace.jsonl"))
    mark = len(LOG)
    rc, ctx, mask = _init(t)
    assert rc == SYSTEM_ERROR and mask == 0
    assert any("missing-dir" in w for w in warnings_since(mark))
    assert t.finalize(ctx) == OK
