"""The NCCL driver's sockets: one selector loop over loopback listeners, the connections
they accept or the driver dials, and a FIFO or two. It knows no NCCL: it turns readiness
into events (`accepted`, `data`, `eof`, `readable`) and buffers what the driver writes."""

from __future__ import annotations

import itertools
import os
import selectors
import socket
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum

from .errors import NcclWireError
from .wire import FrameReader, SockAddr

READ = 1 << 18
IOV_MAX = 64  # buffers one sendmsg takes


class Role(Enum):
    NODE_NEW = "an emulated rank's bootstrap connection, not yet classified"
    ROOT_REPLY = "the root's reply to an emulated rank"
    RING_NEXT = "a real rank's ring link to its emulated successor"
    RING_PREV = "the ring link to a real rank from its emulated predecessor"
    P2P_IN = "a real rank's bootstrap message to an emulated rank"
    NET_NEW = "a Socket-net connection, not yet named"
    NET_IN = "a real rank's Socket-net connection to its emulated successor"
    NET_OUT = "the Socket-net connection to a real rank from its emulated predecessor"
    ROOT_IN = "a real rank's check-in with the emulated root"
    ONE_SHOT = "a message the controller sends and closes"


# A connection learns what it is from its first bytes; these are the only moves.
BECOMES: dict[Role, frozenset[Role]] = {
    Role.NODE_NEW: frozenset({Role.ROOT_REPLY, Role.P2P_IN, Role.RING_NEXT}),
    Role.NET_NEW: frozenset({Role.NET_IN}),
}


@dataclass(eq=False)
class Conn:
    sock: socket.socket
    role: Role
    rank: int = -1  # the emulated rank (NODE_NEW, ROOT_REPLY, P2P_IN) or the real rank (the rest)
    channel: int = -1
    inbuf: bytearray = field(default_factory=bytearray)
    outq: deque = field(default_factory=deque)  # buffers still to write, in order (never copied together)
    close_after_flush: bool = False
    writing: bool = False  # the selector also watches it for writability
    reader: FrameReader | None = None
    p2p: tuple[int, int] | None = None  # (src rank, tag) once its preamble came

    def __str__(self) -> str:
        return f"{self.role.value} (rank {self.rank})"

    def become(self, role: Role, rank: int | None = None, channel: int | None = None) -> None:
        if role not in BECOMES.get(self.role, frozenset()):
            raise ValueError(f"{self} cannot become {role.value}")
        self.role = role
        self.rank = self.rank if rank is None else rank
        self.channel = self.channel if channel is None else channel


class SocketLoop:
    """Listeners on `host`, connections, watched descriptors; `poll` yields what happened."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.sel = selectors.DefaultSelector()
        self.conns: set[Conn] = set()
        self._listeners: list[socket.socket] = []
        self._fds: list[int] = []

    def listen(self, tag: object) -> SockAddr:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((self.host, 0))
        s.listen(128)
        s.setblocking(False)
        self._listeners.append(s)
        self.sel.register(s, selectors.EVENT_READ, ("listen", tag))
        return SockAddr(self.host, s.getsockname()[1])

    def watch(self, fd: int, tag: object) -> None:
        self._fds.append(fd)
        self.sel.register(fd, selectors.EVENT_READ, ("fd", tag))

    def dial(self, addr: SockAddr, role: Role, data: bytes = b"", close: bool = False, rank: int = -1,
             channel: int = -1) -> Conn:  # fmt: skip
        """Connect (loopback: the peer's backlog takes it at once), then write `data`; with
        `close`, the connection ends once it is written."""
        s = socket.create_connection((addr.host, addr.port), timeout=10)
        c = self._add(s, role, rank, channel)
        c.close_after_flush = close
        if data:
            self.write(c, data)
        return c

    def _add(self, s: socket.socket, role: Role, rank: int = -1, channel: int = -1) -> Conn:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.setblocking(False)
        c = Conn(s, role, rank, channel)
        self.conns.add(c)
        self.sel.register(s, selectors.EVENT_READ, ("conn", c))
        return c

    def poll(self, timeout: float) -> Iterator[tuple]:
        """("accepted", tag, sock) | ("data", conn, bytes) | ("eof", conn) | ("readable", tag)."""
        for key, mask in self.sel.select(timeout):
            kind, what = key.data
            if kind == "listen":
                try:
                    s, _ = key.fileobj.accept()
                except BlockingIOError:
                    continue
                yield "accepted", what, s
            elif kind == "fd":
                yield "readable", what
            else:
                c = what
                if mask & selectors.EVENT_WRITE:
                    self._flush(c)
                if not mask & selectors.EVENT_READ or c not in self.conns:
                    continue
                try:
                    data = c.sock.recv(READ)
                except (BlockingIOError, InterruptedError):
                    continue
                except ConnectionResetError:
                    data = b""
                yield ("data", c, data) if data else ("eof", c)

    def accept_as(self, s: socket.socket, role: Role, rank: int = -1) -> Conn:
        return self._add(s, role, rank)

    def write(self, c: Conn, *chunks: bytes) -> None:
        """Queue `chunks` (a frame's header and payload apart: no copy joins them) and write
        what the socket takes now."""
        was_waiting = bool(c.outq)
        c.outq.extend(memoryview(b) for b in chunks if len(b))
        if not was_waiting:
            self._flush(c)

    def _flush(self, c: Conn) -> None:
        q = c.outq
        while q:
            try:
                n = c.sock.sendmsg(list(itertools.islice(q, IOV_MAX)))
            except (BlockingIOError, InterruptedError):
                break
            except (BrokenPipeError, ConnectionResetError) as exc:
                raise NcclWireError(f"{c} closed while the controller wrote to it: {exc}") from None
            while n and n >= len(q[0]):
                n -= len(q.popleft())
            if n:
                q[0] = q[0][n:]
                break
        if c not in self.conns:
            return
        if not q and c.close_after_flush:
            self.drop(c)
            return
        if bool(q) != c.writing:  # a selector change is a system call: only when it changes
            c.writing = bool(q)
            self.sel.modify(c.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if q else 0), ("conn", c))

    def drop(self, c: Conn) -> None:
        if c not in self.conns:
            return
        self.conns.discard(c)
        self.sel.unregister(c.sock)
        c.sock.close()

    def close(self) -> None:
        for c in list(self.conns):
            self.drop(c)
        for s in self._listeners:
            self.sel.unregister(s)
            s.close()
        for fd in self._fds:
            self.sel.unregister(fd)
        self._listeners, self._fds = [], []
        self.sel.close()


def open_profile_fifo(path: str) -> tuple[int, int]:
    """Make the FIFO the profiler plugin appends to and open it (read end, non-blocking;
    plus a write end of our own, so it never reads as closed between the ranks' opens)."""
    os.mkfifo(path, 0o600)
    rfd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    wfd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    return rfd, wfd
