"""c10d's TCPStore, spoken without torch: its requests as bytes, a blocking client and a
server.

Importing torch costs a process about 1.2 s of CPU, and the controller took it only for
the run's store: a client of node 0's agent's store, or, when node 0 is emulated, the
store's server itself. The wire is torch's (TCPStoreBackend.hpp's `QueryType`, read off
torch 2.13's own client and server): a hello (VALIDATE and its magic number), then one
request after another, each a query byte and its fields. Strings and byte values are a
little-endian u64 length and the bytes; counts are u64; ADD's delta and its answer are
i64; a WAIT is answered with STOP_WAITING once every key is set, or WAIT_CANCELED after
the client's CANCEL_WAIT. The client puts "/" before every user key, as torch's does.
"""

from __future__ import annotations

import enum
import itertools
import selectors
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from neuronabox.errors import NeuronaBoxError

MAGIC = 0x3C85F7CE  # c10d::detail::validationMagicNumber
MAX_FIELD = 64 << 20  # the longest key or value either side takes (a world's records go in batches)
MAX_KEYS = 1 << 20  # the most keys one request names
READ_CHUNK = 1 << 16


class Query(enum.IntEnum):
    """c10d::detail::QueryType, in its order."""

    VALIDATE = 0
    SET = 1
    COMPARE_SET = 2
    GET = 3
    ADD = 4
    CHECK = 5
    WAIT = 6
    GETNUMKEYS = 7
    DELETE_KEY = 8
    APPEND = 9
    MULTI_GET = 10
    MULTI_SET = 11
    CANCEL_WAIT = 12
    PING = 13
    QUEUE_PUSH = 14
    QUEUE_POP = 15
    QUEUE_LEN = 16
    LIST_KEYS = 17
    BARRIER = 18


READY, NOT_READY = b"\x00", b"\x01"  # CheckResponseType
STOP_WAITING, WAIT_CANCELED = b"\x00", b"\x01"  # WaitResponseType


class StoreError(NeuronaBoxError):
    """The run's store failed us: the process that hosts it is gone, or is no store."""


class StoreTimeout(StoreError, TimeoutError):
    """A wait whose keys were not all set in time (torch's DistStoreError), or a store
    that did not answer."""


class StoreClosed(StoreError, ConnectionError):
    """The other side of a store connection closed it, or broke the protocol."""


def field_bytes(data: bytes) -> bytes:
    return struct.pack("<Q", len(data)) + data


def user_key(key: str) -> bytes:
    """A key as the server holds it: torch's client puts "/" before every user key."""
    return ("/" + key).encode()


def as_bytes(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


# --- requests as bytes (what a client sends) -------------------------------------------


def hello() -> bytes:
    return struct.pack("<BI", Query.VALIDATE, MAGIC)


def request(query: Query, *fields: bytes, keys: Sequence[bytes] | None = None, tail: bytes = b"") -> bytes:
    """`query`, then a counted list of `keys` if given, then each of `fields` as a
    length and its bytes, then `tail` as it is (ADD's delta)."""
    out = bytes([query])
    if keys is not None:
        out += struct.pack("<Q", len(keys)) + b"".join(field_bytes(k) for k in keys)
    return out + b"".join(field_bytes(f) for f in fields) + tail


# --- parsing (what a server reads) -----------------------------------------------------


class _Short(NeuronaBoxError):
    """The buffer ends inside a request: wait for more bytes (never leaves the reader)."""


class _Cursor:
    def __init__(self, buf: bytearray) -> None:
        self.buf, self.at = buf, 0

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.buf):
            raise _Short
        out = bytes(self.buf[self.at : self.at + n])
        self.at += n
        return out

    def u(self, fmt: str) -> int:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def field(self) -> bytes:
        n = self.u("<Q")
        if n > MAX_FIELD:
            raise StoreClosed(f"a field of {n} bytes (at most {MAX_FIELD})")
        return self.take(n)

    def keys(self) -> list[bytes]:
        n = self.u("<Q")
        if n > MAX_KEYS:
            raise StoreClosed(f"a request naming {n} keys (at most {MAX_KEYS})")
        return [self.field() for _ in range(n)]


@dataclass(frozen=True)
class Request:
    query: Query
    keys: tuple[bytes, ...] = ()
    values: tuple[bytes, ...] = ()
    number: int = 0  # VALIDATE's magic, ADD's delta, PING's nonce


def _parse_one(c: _Cursor) -> Request:
    raw = c.u("<B")
    try:
        q = Query(raw)
    except ValueError:
        raise StoreClosed(f"query {raw}, which c10d's TCPStore does not have") from None
    if q in (Query.VALIDATE, Query.PING):
        return Request(q, number=c.u("<I"))
    if q in (Query.GET, Query.DELETE_KEY):
        return Request(q, (c.field(),))
    if q in (Query.SET, Query.APPEND):
        return Request(q, (c.field(),), (c.field(),))
    if q == Query.COMPARE_SET:
        key = c.field()
        return Request(q, (key,), (c.field(), c.field()))
    if q == Query.ADD:
        key = c.field()
        return Request(q, (key,), number=c.u("<q"))
    if q in (Query.CHECK, Query.WAIT, Query.MULTI_GET):
        return Request(q, tuple(c.keys()))
    if q == Query.MULTI_SET:
        n = c.u("<Q")
        if n > MAX_KEYS:
            raise StoreClosed(f"a request naming {n} keys (at most {MAX_KEYS})")
        pairs = [(c.field(), c.field()) for _ in range(n)]
        return Request(q, tuple(k for k, _ in pairs), tuple(v for _, v in pairs))
    if q in (Query.GETNUMKEYS, Query.CANCEL_WAIT):
        return Request(q)
    raise StoreClosed(f"{q.name}, which this store does not serve (neither the controller nor torchrun asks it)")


class RequestReader:
    """Bytes in, requests out: one connection's side of the wire, with no socket."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.validated = False

    def feed(self, data: bytes) -> list[Request]:
        self.buf += data
        out = []
        while self.buf:
            c = _Cursor(self.buf)
            try:
                req = _parse_one(c)
            except _Short:
                if len(self.buf) > 2 * MAX_FIELD + 64:
                    raise StoreClosed("a request longer than the store takes") from None
                break
            del self.buf[: c.at]
            if not self.validated:
                if req.query != Query.VALIDATE or req.number != MAGIC:
                    raise StoreClosed("a connection that did not begin with TCPStore's hello")
                self.validated = True
                continue
            out.append(req)
        return out


# --- the table a server keeps ----------------------------------------------------------


@dataclass
class _Waiter:
    conn: object
    keys: set[bytes]


@dataclass
class StoreTable:
    """The keys and the waits on them; each request's answer as bytes."""

    data: dict[bytes, bytes] = field(default_factory=dict)
    waiters: list[_Waiter] = field(default_factory=list)

    def serve(self, conn: object, req: Request) -> list[tuple[object, bytes]]:
        """(connection, bytes) to send: the answer, and any waits this request settled."""
        q, d = req.query, self.data
        if q == Query.PING:
            return [(conn, struct.pack("<I", req.number))]
        if q == Query.GET:
            return [(conn, field_bytes(d.get(req.keys[0], b"")))]
        if q == Query.MULTI_GET:
            return [(conn, b"".join(field_bytes(d.get(k, b"")) for k in req.keys))]
        if q == Query.CHECK:
            return [(conn, READY if all(k in d for k in req.keys) else NOT_READY)]
        if q == Query.GETNUMKEYS:
            return [(conn, struct.pack("<q", len(d)))]
        if q == Query.DELETE_KEY:
            return [(conn, struct.pack("<q", int(d.pop(req.keys[0], None) is not None)))]
        if q == Query.WAIT:
            if all(k in d for k in req.keys):
                return [(conn, STOP_WAITING)]
            self.waiters.append(_Waiter(conn, {k for k in req.keys if k not in d}))
            return []
        if q == Query.CANCEL_WAIT:
            self.drop(conn)
            return [(conn, WAIT_CANCELED)]
        out: list[tuple[object, bytes]] = []
        if q == Query.SET or q == Query.MULTI_SET:
            d.update(zip(req.keys, req.values, strict=True))
        elif q == Query.APPEND:
            d[req.keys[0]] = d.get(req.keys[0], b"") + req.values[0]
        elif q == Query.ADD:
            try:
                total = int(d.get(req.keys[0], b"0") or b"0") + req.number
            except ValueError:
                raise StoreClosed(f"ADD to {req.keys[0]!r}, whose value is not a number") from None
            d[req.keys[0]] = str(total).encode()
            out.append((conn, struct.pack("<q", total)))
        elif q == Query.COMPARE_SET:
            key, (expected, desired) = req.keys[0], req.values
            now = d.get(key)
            if now == expected or (now is None and not expected):
                d[key] = now = desired
            out.append((conn, field_bytes(expected if now is None else now)))
        return out + self._settled()

    def _settled(self) -> list[tuple[object, bytes]]:
        """The waits whose keys are all set now (a failed COMPARE_SET sets nothing)."""
        done = []
        for w in self.waiters:
            w.keys = {k for k in w.keys if k not in self.data}
            if not w.keys:
                done.append(w)
        if done:
            self.waiters = [w for w in self.waiters if w.keys]
        return [(w.conn, STOP_WAITING) for w in done]

    def drop(self, conn: object) -> None:
        """Forget `conn`'s waits (it cancelled, or closed)."""
        self.waiters = [w for w in self.waiters if w.conn is not conn]


# --- the server ------------------------------------------------------------------------


@dataclass(eq=False)
class _Conn:
    """One client of the server: its socket, its reader, what it asked that is not served
    yet (while its answers wait to be read), and the answers not sent yet."""

    sock: socket.socket
    reader: RequestReader = field(default_factory=RequestReader)
    queued: deque[Request] = field(default_factory=deque)
    out: bytearray = field(default_factory=bytearray)


class StoreServer:
    """The run's store, served by a thread of this process on `listener` (already bound,
    to the run's address only). Connections are bounded by `max_conns`; one that breaks
    the protocol is closed and named by `log`. A client's requests are served only while
    fewer than HIGH_WATER bytes of its answers wait to be sent, and it is not read while any
    wait to be served: for a client that does not read its answers, the server holds at
    most that and one answer, and what one read brought."""

    HIGH_WATER = 1 << 20

    def __init__(self, listener: socket.socket, log: Callable[[str], None] = lambda _m: None, max_conns: int = 65536):
        self.listener, self.log, self.max_conns = listener, log, max_conns
        self.table = StoreTable()
        self.sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._conns: set[_Conn] = set()
        self._stopping = False
        listener.setblocking(False)
        self.sel.register(listener, selectors.EVENT_READ, "accept")
        self.sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self.thread = threading.Thread(target=self._serve, name="store-server", daemon=True)
        self.thread.start()

    @property
    def address(self) -> tuple[str, int]:
        return self.listener.getsockname()[:2]

    def held(self) -> tuple[int, int]:
        """What the server holds for its clients, all of them: bytes of answers not sent,
        and requests read but not served (a client that does not read its answers)."""
        conns = list(self._conns)
        return sum(len(c.out) for c in conns), sum(len(c.queued) for c in conns)

    def close(self) -> None:
        """Stop serving and close every socket (idempotent)."""
        if self._stopping:
            return
        self._stopping = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self.thread.join(5)
        self._wake_w.close()

    def _serve(self) -> None:
        try:
            while not self._stopping:
                for key, events in self.sel.select(1.0):
                    if key.data == "accept":
                        self._accept()
                    elif key.data != "wake" and key.data in self._conns:
                        try:
                            self._io(key.data, events)
                        except Exception as exc:  # noqa: BLE001  # a fault of ours ends that client, not the store
                            self.log(f"store: closed a connection from {_peer(key.data.sock)}: {exc!r}")
                            self._drop(key.data)
        finally:
            for c in list(self._conns):
                self._drop(c)
            self.sel.unregister(self.listener)
            self.sel.unregister(self._wake_r)
            self.listener.close()
            self._wake_r.close()
            self.sel.close()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors: the client retries its connect
                self.log(f"store: accept failed: {exc}")
                return
            if len(self._conns) >= self.max_conns:
                sock.close()
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            c = _Conn(sock)
            self._conns.add(c)
            self.sel.register(sock, selectors.EVENT_READ, c)

    def _io(self, c: _Conn, events: int) -> None:
        if events & selectors.EVENT_READ and not c.queued:
            try:
                data = c.sock.recv(READ_CHUNK)
            except (BlockingIOError, InterruptedError):
                data = None
            except OSError:
                data = b""
            if data == b"":
                self._drop(c)
                return
            try:
                c.queued.extend(c.reader.feed(data or b""))
            except StoreClosed as exc:
                self.log(f"store: closed a connection from {_peer(c.sock)}: {exc}")
                self._drop(c)
                return
        while True:
            while c.queued and len(c.out) < self.HIGH_WATER:
                try:
                    replies = self.table.serve(c, c.queued.popleft())
                except StoreClosed as exc:
                    self.log(f"store: closed a connection from {_peer(c.sock)}: {exc}")
                    self._drop(c)
                    return
                for to, reply in replies:
                    to.out += reply
                    if to is not c:
                        self._flush(to)
            self._flush(c)
            if not c.queued or c.out or c not in self._conns:  # else the socket took it all: serve on
                return

    def _flush(self, c: _Conn) -> None:
        if c not in self._conns:
            return
        try:
            sent = c.sock.send(c.out) if c.out else 0
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._drop(c)
            return
        del c.out[:sent]
        reads = not c.queued and len(c.out) < self.HIGH_WATER
        mask = (selectors.EVENT_READ if reads else 0) | (selectors.EVENT_WRITE if c.out else 0)
        self.sel.modify(c.sock, mask or selectors.EVENT_WRITE, c)  # modify without data would drop it

    def _drop(self, c: _Conn) -> None:
        self.table.drop(c)
        self._conns.discard(c)
        try:
            self.sel.unregister(c.sock)
        except (KeyError, ValueError):
            pass
        c.sock.close()


def _peer(conn: socket.socket) -> str:
    try:
        host, port = conn.getpeername()[:2]
        return f"{host}:{port}"
    except OSError:
        return "a closed peer"


# --- the client ------------------------------------------------------------------------


class StoreClient:
    """One connection to a TCPStore, used by one thread at a time, with torch's client's
    calls. Every call but `wait` is bounded by `timeout_s`; a wait by its own timeout."""

    _nonces = itertools.count(1)

    def __init__(self, host: str, port: int, timeout_s: float, connect_every_s: float = 0.02) -> None:
        self.timeout_s = timeout_s
        deadline = time.monotonic() + timeout_s
        while True:  # the store's host may not listen yet, as torch's client retries
            try:
                self.sock = socket.create_connection((host, port), timeout=max(0.1, deadline - time.monotonic()))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(connect_every_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.settimeout(timeout_s)
        nonce = next(self._nonces) & 0xFFFFFFFF
        self._send(hello() + struct.pack("<BI", Query.PING, nonce))
        if struct.unpack("<I", self._recv(4))[0] != nonce:
            raise StoreClosed(f"{host}:{port} answered a ping with another number: not a TCPStore")

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> StoreClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except TimeoutError:
            raise StoreTimeout(f"the store took nothing within {self.timeout_s:g} s") from None
        except ConnectionError as exc:  # reset, or a broken pipe: it is gone
            raise StoreClosed(f"the store closed the connection ({exc.strerror or exc})") from None

    def _recv(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            try:
                chunk = self.sock.recv(n - len(data))
            except TimeoutError:
                raise StoreTimeout(f"the store did not answer within {self.timeout_s:g} s") from None
            except ConnectionError as exc:  # reset: it closed with our request unread
                raise StoreClosed(f"the store closed the connection ({exc.strerror or exc})") from None
            if not chunk:
                raise StoreClosed("the store closed the connection")
            data += chunk
        return data

    def _field(self) -> bytes:
        (n,) = struct.unpack("<Q", self._recv(8))
        if n > MAX_FIELD:
            raise StoreClosed(f"the store answered a field of {n} bytes (at most {MAX_FIELD})")
        return self._recv(n)

    def set(self, key: str, value: str | bytes) -> None:
        self._send(request(Query.SET, user_key(key), as_bytes(value)))

    def multi_set(self, keys: Sequence[str], values: Sequence[str | bytes]) -> None:
        body = b"".join(field_bytes(user_key(k)) + field_bytes(as_bytes(v)) for k, v in zip(keys, values, strict=True))
        self._send(bytes([Query.MULTI_SET]) + struct.pack("<Q", len(keys)) + body)

    def get(self, key: str) -> bytes:
        """`key`'s value, once it is set (within the client's timeout)."""
        self.wait([key])
        self._send(request(Query.GET, user_key(key)))
        return self._field()

    def add(self, key: str, delta: int) -> int:
        return self.add_raw(user_key(key), delta)

    def add_raw(self, key: bytes, delta: int) -> int:
        """ADD on a key as the server holds it (c10d's `init/` has no "/")."""
        self._send(request(Query.ADD, key, tail=struct.pack("<q", delta)))
        return struct.unpack("<q", self._recv(8))[0]

    def check(self, keys: Sequence[str]) -> bool:
        self._send(request(Query.CHECK, keys=[user_key(k) for k in keys]))
        return self._recv(1) == READY

    def wait(self, keys: Sequence[str], timeout_s: float | None = None) -> None:
        """Until every key is set; StoreTimeout after `timeout_s` (the client's by default),
        the wait cancelled on the server first, as torch's client does."""
        self._send(request(Query.WAIT, keys=[user_key(k) for k in keys]))
        self.sock.settimeout(self.timeout_s if timeout_s is None else timeout_s)
        try:
            answer = self._recv(1)
        except StoreTimeout:
            answer = None
        finally:
            self.sock.settimeout(self.timeout_s)
        if answer == STOP_WAITING:
            return
        if answer is not None:
            raise StoreClosed(f"the store answered a wait with {answer!r}")
        self._send(bytes([Query.CANCEL_WAIT]))
        if self._recv(1) == STOP_WAITING:  # set just before the cancel: its answer comes after
            self._recv(1)
        waited = self.timeout_s if timeout_s is None else timeout_s
        raise StoreTimeout(f"wait timeout after {waited:g} s, keys: {list(keys)}")
