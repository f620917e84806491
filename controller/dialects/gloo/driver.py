"""The socket side of the Gloo dialect: one loop, one listener, many pairs.

The controller dials real ranks (its listener address compares larger, see
`wire.dialer_is_local`) and also accepts, routing incoming sockets by the
8-byte sequence number the dialer writes first. Nothing here knows schedules.

The loop is the engine's native core (`Core.wait`): it reads every pair socket
in C++, hands each frame of a collective its book runs to that book natively,
writes what the book sends and runs the release timers (epoll to within 1.5 ms
of one, then a busy poll). It comes back to Python only with what Python must
see (frames of collectives whose shape is not known yet, point-to-point traffic,
a closed pair) or when Python's own epoll, nested in the core's, is readable:
the listener, the wake-up socket of `call_soon`, the observer link, sockets
still naming their pair, and the timers Python keeps (`call_at`).

Any local process can connect to the listener, so an accepted socket becomes a
pair only for a sequence number the controller expects (`expect`), once; one that
may still come to be expected (`accept_router`: a real rank that dialed before the
controller read its record) waits for it up to HANDSHAKE_TIMEOUT_S without being
read. Anything else (an unknown or repeated number, a handshake not complete in
time) is dropped with one line on stderr, and never ends or stalls the run.
"""

from __future__ import annotations

import heapq
import itertools
import json
import select
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

from ...book import Core
from ...engine import Engine
from ...groups import Conn
from ...net import listener
from .wire import SEQ

HANDSHAKE_TIMEOUT_S = 5.0  # a dialer writes its 8-byte sequence number as it connects
ADOPT_PUT_OFF_MAX = 8  # loop turns in a row that may put adoption off for Python's events (a note)
TURN_LOG_MAX = 1_000_000  # loop turns a turn log keeps (NEURONABOX_TURN_LOG); later ones are not logged


class Poller:
    """A thin epoll: selectors' bookkeeping costs a few microseconds per event, and the
    controller handles every boundary message. Same calls, (data, mask) results."""

    READ, WRITE = select.EPOLLIN, select.EPOLLOUT

    def __init__(self) -> None:
        self._ep = select.epoll()
        self._data: dict[int, tuple[object, object]] = {}

    def register(self, fileobj, events: int, data: object) -> None:
        fd = fileobj.fileno()
        self._ep.register(fd, events)
        self._data[fd] = (fileobj, data)

    def modify(self, fileobj, events: int, data: object) -> None:
        fd = fileobj.fileno()
        self._ep.modify(fd, events)
        self._data[fd] = (fileobj, data)

    def unregister(self, fileobj) -> None:
        fd = fileobj.fileno()
        if self._data.pop(fd, None) is None:
            raise KeyError(fd)
        self._ep.unregister(fd)

    def fileno(self) -> int:
        return self._ep.fileno()

    def select(self, timeout: float) -> list[tuple[object, object, int]]:
        data = self._data
        return [(*data[fd], ev) for fd, ev in self._ep.poll(timeout) if fd in data]

    def close(self) -> None:
        self._ep.close()


class Adoption:
    """When the loop adopts the books its core started natively (engine.adopt_started):
    before the frames no book took, else once the core has nothing more pressing (its busy
    window over), not in a turn that served Python's events alone, as a call's note that
    started an instance: Python's turn there (30-40 us a book) would hold its frames. At
    most ADOPT_PUT_OFF_MAX such turns in a row. The notes the core read on the observers'
    note links (engine.notes) go to Python every turn: one of a shape the core was not told
    of wakes Python, which arms it before the core serves the frames behind it."""

    def __init__(self, adopt: Callable[[], None], notes: Callable[[], None] = lambda: None) -> None:
        self.adopt, self.notes, self.put_off = adopt, notes, 0

    def turn(self, frames: bool, python: bool) -> None:
        self.notes()
        if frames or not python or self.put_off >= ADOPT_PUT_OFF_MAX:
            self.adopt()
            self.put_off = 0
        else:
            self.put_off += 1


class Timers:
    """The timers Python keeps (`call_at`): a heap of (when, sequence, fn), run in order."""

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, Callable[[], None]]] = []
        self.seq = itertools.count()

    def at(self, when: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self.heap, (when, next(self.seq), fn))

    def first(self) -> float:
        return self.heap[0][0] if self.heap else float("inf")

    def run(self) -> None:
        """The timers due by now (the clock read only when there are any: every loop turn asks)."""
        heap = self.heap
        if not heap:
            return
        now = time.monotonic()
        while heap and heap[0][0] <= now:
            heapq.heappop(heap)[2]()


class LoopPolls(NamedTuple):
    """For `busy` s after a pair event the loop polls rather than sleeps and puts its idle
    work off; for `spin` s it polls on, idle work done: for a controller on a core of its
    own. `hold`: idle work also waits while a collective is in flight (Core.wait)."""

    busy: float = 0.0
    spin: float = 0.0
    hold: bool = True


class TurnLog:
    """The loop's Python turns (began, ended: monotonic s; whether idle work ran), written to
    a file as the loop ends: a developer aid (NEURONABOX_TURN_LOG), which
    scripts/bench_loop_turns.py lays against the real rank's calls. At most TURN_LOG_MAX."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.turns: list[tuple[float, float, bool]] = []

    def add(self, began: float, ended: float, idle: bool) -> None:
        if len(self.turns) < TURN_LOG_MAX:
            self.turns.append((began, ended, idle))

    def write(self, log: Callable[[str], None]) -> None:
        try:
            with open(self.path, "w") as f:
                json.dump(self.turns, f)
        except OSError as exc:
            log(f"neuronabox controller: the turn log {self.path} was not written: {exc}")


class _Sock:
    __slots__ = ("sock", "fd", "conn", "seq_needed", "inbuf", "peer", "seq")

    def __init__(self, sock: socket.socket, conn: Conn | None, peer: str = "") -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.conn = conn  # set: a pair, which the core's loop reads; None: Python reads it
        self.seq_needed = conn is None  # accepted sockets start with the dialer's seq
        self.inbuf = b""
        self.peer = peer  # an accepted socket's remote address, for the log
        self.seq: int | None = None  # an accepted pair's sequence number, taken while it is open


def _label(conn: Conn) -> str:
    return f"real rank {conn.real} <-> emulated rank {conn.emu} of group {conn.group.name!r}"


class GlooDriver:
    """Runs the loop; other threads talk to it only through `call_soon`."""

    def __init__(
        self, engine_factory: Callable[[GlooDriver], Engine], listen_host: str, polls: LoopPolls | None = None
    ) -> None:
        """`polls`: when the loop polls rather than sleeps, and holds its idle work off (`Core.wait`)."""
        self.polls = polls or LoopPolls()
        self.turn_log: TurnLog | None = None  # set: the loop's Python turns are logged (a developer aid)
        self.sel = Poller()
        self.listener = listener(listen_host)
        self.address = self.listener.getsockname()
        self.sel.register(self.listener, Poller.READ, None)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self.sel.register(self._wake_r, Poller.READ, "wake")
        self._calls: deque[Callable[[], None]] = deque()
        self._lock = threading.Lock()
        self.socks: dict[Conn, _Sock] = {}
        # May a real rank still come to be expected with this sequence number (its record not read yet)?
        self.accept_router: Callable[[int], bool] | None = None
        self._expected: dict[int, Conn] = {}  # sequence number -> the pair a real rank dials in for
        self._taken: set[int] = set()  # sequence numbers whose pair is open: each is taken once
        self._parked: dict[int, _Sock] = {}  # complete handshakes that wait for `expect`
        self.log: Callable[[str], None] = lambda what: print(what, file=sys.stderr, flush=True)
        self.extra: dict[object, Callable[[int], None]] = {}  # fileobj -> handler(mask)
        self.engine = engine_factory(self)
        self.core: Core = getattr(self.engine, "core", None) or Core(done=lambda owner: None, emit=self.write)
        adopt = getattr(self.engine, "adopt_started", None)
        self._adoption = Adoption(adopt, lambda: self.engine.notes()) if adopt is not None else None
        self.core.also(self.sel.fileno())
        self.running = True
        self.error: BaseException | None = None
        self.on_open: Callable[[Conn], None] | None = None
        self.on_close: Callable[[Conn], None] | None = None  # a pair's socket closed (the loop's own stop aside)
        self.periodic: Callable[[], None] | None = None
        # Work put off for a turn with nothing to read (the engine's finished records):
        # `idle_work()` does one piece and says whether more remain; `idle_pending()` asks.
        self.idle_work: Callable[[], bool] | None = None
        self.idle_pending: Callable[[], bool] = lambda: False
        self._next_periodic = 0.0
        self._dirty: list[_Sock] = []
        self._dirty_set: set[_Sock] = set()
        self._timers = Timers()

    def register_extra(self, fileobj: object, handler: Callable[[int], None]) -> None:
        """Serve another socket (the observer link) from the same loop."""
        self.extra[fileobj] = handler
        self.sel.register(fileobj, Poller.READ, "extra")

    def unregister_extra(self, fileobj: object) -> None:
        if self.extra.pop(fileobj, None) is not None:
            try:
                self.sel.unregister(fileobj)
            except (KeyError, ValueError):
                pass

    # -- cross-thread --------------------------------------------------------------
    def call_soon(self, fn: Callable[[], None]) -> None:
        with self._lock:
            self._calls.append(fn)
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def call_at(self, when: float, fn: Callable[[], None]) -> None:
        """Run `fn` in the loop at monotonic time `when` (loop thread only)."""
        self._timers.at(when, fn)

    def _until(self) -> float:
        """When the loop must come back to Python: its first timer, or the periodic turn."""
        until = self._next_periodic if self.periodic is not None else time.monotonic() + 0.5
        return min(until, self._timers.first())

    # -- pairs --------------------------------------------------------------------
    def dial(self, conn: Conn, host: str, port: int, seq: int) -> None:
        s = socket.create_connection((host, port), timeout=10)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.setblocking(False)
        entry = _Sock(s, conn)
        self.socks[conn] = entry
        conn.pair.fd = entry.fd  # a native book writes it directly
        self.core.watch(entry.fd, conn, _label(conn))
        conn.pair.raw(SEQ.pack(seq))
        self.write(conn)
        if self.on_open:
            self.on_open(conn)

    def expect(self, seq: int, conn: Conn) -> None:
        """A real rank dials in for `conn`, writing `seq` (loop thread)."""
        entry = self._parked.pop(seq, None)
        if entry is not None:
            self._open_accepted(entry, seq, conn)
        elif seq not in self._taken:
            self._expected[seq] = conn

    def write(self, conn: Conn) -> None:
        """`conn`'s pair has frames queued: every socket written to in one loop turn is
        flushed once, with one sendmsg for all its frames (a ring step answers several
        frames at a time), payloads straight from the buffers they were received into."""
        entry = self.socks.get(conn)
        if entry is None:
            raise ConnectionError(f"no connection from emulated rank {conn.emu} to real rank {conn.real}")
        if entry not in self._dirty_set:
            self._dirty_set.add(entry)
            self._dirty.append(entry)

    def _flush_dirty(self) -> None:
        dirty, self._dirty = self._dirty, []
        self._dirty_set.clear()
        for entry in dirty:
            self._flush(entry)

    def close_all(self) -> None:
        for entry in list(self.socks.values()):
            self._drop(entry)
        for fobj in list(self.extra):
            try:
                self.sel.unregister(fobj)
            except (KeyError, ValueError):
                pass
        self.extra.clear()
        for s in (self.listener, self._wake_r, self._wake_w):
            try:
                self.sel.unregister(s)
            except (KeyError, ValueError):
                pass
            s.close()
        self.sel.close()

    def _drop(self, entry: _Sock) -> None:
        if not self.core.unwatch(entry.fd):
            try:
                self.sel.unregister(entry.sock)
            except (KeyError, ValueError):
                pass
        try:
            entry.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        except OSError:
            pass
        entry.sock.close()
        if entry.seq is not None:  # the pair is gone: a rank that joins again dials with the same number
            self._taken.discard(entry.seq)
        if entry.conn is not None and self.socks.get(entry.conn) is entry:
            del self.socks[entry.conn]
            entry.conn.pair.fd = -1
            if self.on_close is not None and self.running:
                self.on_close(entry.conn)

    # -- loop -----------------------------------------------------------------------
    def run(self) -> None:
        try:
            while self.running:
                behind = self.idle_work is not None and self.idle_pending()
                frames, python = self.core.wait(self._until(), behind, *self.polls)
                back = time.monotonic() if self.turn_log is not None else 0.0
                if python:  # first: a call's note starts its instance (observer_link), ahead of its frames
                    for fileobj, data, mask in self.sel.select(0):
                        if data.__class__ is _Sock:  # not a pair yet: its sequence number, or parked
                            self._read(data)
                        elif data is None:
                            self._accept()
                        elif data == "wake":
                            self._drain_wake()
                        else:
                            self.extra[fileobj](mask)
                if self._adoption is not None:
                    self._adoption.turn(bool(frames), python)
                if behind and not frames and not python:  # nothing ready: the loop's idle turn
                    self.idle_work()
                for conn, events in frames:
                    self._frames(conn, events)
                self._drain_calls()
                self._timers.run()
                if self._dirty:
                    self._flush_dirty()
                now = time.monotonic()
                if self.turn_log is not None:
                    self.turn_log.add(back, now, behind and not frames and not python)
                if self.periodic is not None and now >= self._next_periodic:
                    self._next_periodic = now + 0.5
                    self.periodic()
        except BaseException as exc:  # noqa: BLE001 - reported by the controller
            self.error = exc
        finally:
            self.running = False
            if self.turn_log is not None:
                self.turn_log.write(self.log)

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass

    def _drain_calls(self) -> None:
        while self._calls:
            with self._lock:
                if not self._calls:
                    return
                fn = self._calls.popleft()
            fn()

    def _accept(self) -> None:
        try:
            s, peer = self.listener.accept()
        except BlockingIOError:
            return
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.setblocking(False)
        entry = _Sock(s, None, f"{peer[0]}:{peer[1]}")
        self.sel.register(s, Poller.READ, entry)
        self.call_at(time.monotonic() + HANDSHAKE_TIMEOUT_S, lambda: self._handshake_due(entry))

    def _handshake_due(self, entry: _Sock) -> None:
        if entry.conn is None and entry.sock.fileno() != -1:  # neither a pair nor dropped yet
            if entry.seq_needed:
                self._refuse(entry, f"no sequence number within {HANDSHAKE_TIMEOUT_S:g} s")
            else:
                seq = SEQ.unpack(entry.inbuf)[0]
                self._refuse(entry, f"no pair came to expect sequence number {seq} within {HANDSHAKE_TIMEOUT_S:g} s")

    def _refuse(self, entry: _Sock, why: str) -> None:
        """An accepted socket that is no pair of the run: dropped, one line on stderr."""
        if not entry.seq_needed:
            seq = SEQ.unpack(entry.inbuf)[0]
            if self._parked.get(seq) is entry:
                del self._parked[seq]
        self.log(f"Gloo listener: dropped the connection from {entry.peer}: {why}")
        self._drop(entry)

    def _flush(self, entry: _Sock) -> None:
        try:
            done = entry.conn.pair.flush(entry.fd)
        except OSError:
            self._drop(entry)
            return
        if not done:  # the core's loop writes the rest when the socket can take it
            self.core.write_wanted(entry.fd)

    def _frames(self, conn: Conn, events: list | None) -> None:
        """What the core's loop read on a pair and no book took (None: the socket closed)."""
        if events is None:
            entry = self.socks.get(conn)
            if entry is not None:
                self._drop(entry)
            return
        engine = self.engine
        for ev in events:
            engine.on_event(conn, ev)

    def _read(self, entry: _Sock) -> None:
        """An accepted socket that names no pair yet."""
        if entry.seq_needed:
            self._read_seq(entry)
        else:  # parked (not read): the dialer hung up or reset
            self._refuse(entry, "closed while waiting for its pair")

    def _read_seq(self, entry: _Sock) -> None:
        """An accepted socket's first 8 bytes: the dialer's sequence number names its pair."""
        try:
            data = entry.sock.recv(SEQ.size - len(entry.inbuf))
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._refuse(entry, "closed before its sequence number")
            return
        entry.inbuf += data
        if len(entry.inbuf) < SEQ.size:
            return
        entry.seq_needed = False
        (seq,) = SEQ.unpack(entry.inbuf)
        conn = self._expected.pop(seq, None)
        if conn is not None:
            self._open_accepted(entry, seq, conn)
        elif seq in self._taken or seq in self._parked:
            self._refuse(entry, f"sequence number {seq} is taken (its pair is open, or another connection holds it)")
        elif self.accept_router is not None and self.accept_router(seq):
            self._parked[seq] = entry  # not read until its pair is expected, or the deadline drops it
            self.sel.modify(entry.sock, 0, entry)
        else:
            self._refuse(entry, f"sequence number {seq} names no pair the controller expects")

    def _open_accepted(self, entry: _Sock, seq: int, conn: Conn) -> None:
        self._taken.add(seq)
        entry.seq = seq
        entry.conn = conn
        self.socks[conn] = entry
        conn.pair.fd = entry.fd
        self.sel.unregister(entry.sock)
        self.core.watch(entry.fd, conn, _label(conn))
        if self.on_open:
            self.on_open(conn)


def raise_fd_limit() -> None:
    """Every emulated pair is one socket; lift the soft limit to the hard one."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass


__all__ = ["GlooDriver", "raise_fd_limit"]
