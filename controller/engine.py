"""The engine: collective instances, their boundary bookkeeping, try-send / try-receive.

It is sans-IO like the dialect: events from real ranks come in through
`on_event`, frames are queued on each pair and `emit(conn)` tells the driver
that a pair has some to write, the metadata an instance may need (an
allreduce's tensor size) is asked for through `request_meta`, and time comes
from the `clock` it is given. One engine serves every process group of a run,
and it knows no dialect's frames: the `Dialect` names each slot's collective.

An instance is four parts and the bookkeeping between them: shape inference
(which schedule), frame matching (each frame against its schedule), payload
policy (what emulated messages carry) and accounting (what is left, the
record). Its own states and their transitions are `Phase` and `PHASE_MOVES`.
"""

from __future__ import annotations

import time
from collections import defaultdict, deque
from collections.abc import Callable
from enum import Enum, auto

from neuronabox.schedules import Kind
from neuronabox.schedules.gloo import Msg, RingReduce, Schedule, SendRef

from .accounting import Accounting
from .book import Book, Core, load_program, takes
from .dialect import Data, Dialect, Event, SendReady, UnsupportedCollective
from .groups import Conn, Group
from .matching import FrameMatcher, Pair
from .mirror import MirrorInput
from .outcomes import InstanceRecord, ProtocolError, StateError
from .p2p import PointToPoint
from .payloads import Content, Input, PayloadPolicy
from .release import ReleaseTiming
from .shape import Ask, Grace, ShapeInference

__all__ = ["Conn", "Engine", "Group", "Instance", "InstanceRecord", "Phase", "ProtocolError"]


class Phase(Enum):
    RESOLVING = auto()  # frames are buffered until the shape is known
    RUNNING = auto()  # the schedule is installed: frames are matched as they come
    COMPLETE = auto()  # every boundary message crossed; the record is out


PHASE_MOVES = {
    Phase.RESOLVING: {Phase.RUNNING},
    Phase.RUNNING: {Phase.COMPLETE},
    Phase.COMPLETE: set(),
}


class _PendingSend:
    """An emulated rank's send to a real rank, waiting for its dependencies."""

    __slots__ = ("conn", "msg", "missing", "content", "release", "timed")

    def __init__(self, conn: Conn, msg: Msg, content: Content) -> None:
        self.conn = conn
        self.msg = msg  # from the real rank's point of view: peer = the emulated sender
        self.missing = 0  # real sends (and the mirror input) it still waits for
        self.content = content
        self.release: float | None = None  # when it may leave (None: not asked yet)
        self.timed = False  # a driver timer is set for it


class Instance:
    """One collective call on one process group: (group, slot)."""

    def __init__(self, engine: Engine, group: Group, slot: int, kind: Kind, tag: int) -> None:
        self.engine = engine
        self.group = group
        self.slot = slot
        self.kind = kind
        self.tag = tag
        self.phase = Phase.RESOLVING
        self.schedule: Schedule | None = None
        self.shape = ShapeInference(
            self.name(), group, kind, slot, engine.request_meta, engine.call_at is not None, engine.clock
        )
        self.grace_timer = False  # a driver timer is set for the end of the shape's grace period
        self.match: FrameMatcher | None = None
        self.payloads = PayloadPolicy(engine.data)
        self.account = Accounting(engine.clock())
        self.buffered: list[tuple[Conn, Event]] = []  # frames before the shape is known
        self.waiting: defaultdict[SendRef, list[_PendingSend]] = defaultdict(list)  # real send -> sends it feeds
        self.input_waiters: list[_PendingSend] = []
        self.outq: defaultdict[Pair, deque[_PendingSend]] = defaultdict(deque)  # per pair, the real rank's order
        self.timeline = None
        self.predicted = 0.0
        self.book: Book | None = None  # the native book, when it runs the instance
        self.book_pairs: dict[Pair, int] = {}

    def _move(self, to: Phase) -> None:
        if to not in PHASE_MOVES[self.phase]:
            raise StateError(f"{self.name()}: {self.phase.name} -> {to.name}")
        self.phase = to

    def name(self) -> str:
        return f"{self.kind} #{self.tag} of group {self.group.name!r}"

    @property
    def geometry(self) -> str:
        return self.shape.geometry

    @property
    def nbytes(self) -> int:
        return self.shape.nbytes

    # -- shape ---------------------------------------------------------------------------
    def feed(self, conn: Conn, ev: Event) -> None:
        self.account.enter(conn.real, self.engine.clock)
        if self.phase is Phase.RESOLVING:
            self.buffered.append((conn, ev))
            self.shape.note(conn, ev)
            self._try_resolve()
            return
        if self.book is not None:  # a frame read before the book took its pair's frames
            self.book.on_event(self.book_pairs[(conn.real, conn.emu)], ev, self.engine.clock())
            return
        self._dispatch(conn, ev)

    def _try_resolve(self) -> None:
        if self.phase is not Phase.RESOLVING:
            return
        sched = self.shape.resolve()
        if sched is not None:
            self._install(sched)
        elif self.shape.grace is Grace.RUNNING and not self.grace_timer:
            # The timer holds the instance only until it fires: no reference cycle keeps a
            # finished instance (and the payloads it forwarded) alive for the collector.
            self.grace_timer = True
            self.engine.call_at(self.shape.grace_until, self._grace_over)

    def _grace_over(self) -> None:
        self.shape.grace_over()
        self._try_resolve()

    def on_root(self, root: int | None) -> None:
        self.shape.on_root(root)
        self._try_resolve()

    def on_meta(self, numel: int, elem: int) -> None:
        self._install(self.shape.from_meta(numel, elem))

    def meta_unavailable(self) -> None:
        self.shape.unavailable()
        self._try_resolve()

    def _install(self, sched: Schedule) -> None:
        self._move(Phase.RUNNING)
        self.schedule = sched
        self.match = FrameMatcher(self.name(), sched)
        g, eng = self.group, self.engine
        if eng.timing is not None:
            self.timeline = eng.timing.timeline(self.kind, self.nbytes, sched, g.real, self.account.start)
            self.predicted = eng.timing.predicted(self.kind, self.nbytes, sched, g.real.sorted[0])
        wants_input = self.payloads.wants_input(sched, g.real) and eng.request_input is not None
        jitter = eng.timing is not None and eng.timing.whatif.has_jitter(self.kind)
        if eng.native and takes(sched, wants_input, jitter):
            self._install_book(sched)
            return
        new = self._expect(sched.sends, sched.recvs)
        if self.payloads.wants_input(sched, g.real) and eng.request_input is not None:
            if eng.request_input(g.name, self.slot, g.global_rank(g.real.mirror)):
                self.payloads.asked()
        if isinstance(sched, RingReduce) and sched.root is None:
            self.account.expect(1, boundary=False)  # the gather to the root, counted once a frame names it
        self._post_receives(new)
        buffered, self.buffered = self.buffered, []
        for conn, ev in buffered:
            self._dispatch(conn, ev)
        if self.account.done and self.phase is Phase.RUNNING:  # nothing crossed (else the last mark completed it)
            self._complete()

    def _install_book(self, sched: Schedule) -> None:
        """The native book runs the instance from here: every frame of its pairs goes to
        it, from the pairs' reads, and it says when the last message crossed."""
        g, eng = self.group, self.engine
        self.book = book = Book(eng.core, self, self.name(), self.slot, self.timeline)
        eng.booked += 1
        self.book_pairs = load_program(book, sched, g.real)
        self.account.expect(book.boundary)
        for (r, e), i in self.book_pairs.items():
            conn = eng.conn_of(g, r, e)
            if conn is None:  # not connected yet: the book takes it when the pair opens
                eng.unposted.setdefault((g.name, r, e), []).append(lambda c, i=i: book.connect(i, c))
            else:
                book.connect(i, conn)
        buffered, self.buffered = self.buffered, []
        for conn, ev in buffered:
            self.book.on_event(self.book_pairs[(conn.real, conn.emu)], ev, eng.clock())
        if book.remaining == 0 and self.phase is Phase.RUNNING:  # nothing crossed
            self.book_done()

    def book_done(self) -> None:
        """The book's last message crossed (or it had none): the record takes its times."""
        book = self.book
        book.close()
        times = self.account.rank_times
        for r, (first, last) in book.rank_times().items():
            t = times.setdefault(r, [first, last])
            t[0], t[1] = min(t[0], first), last
        self.account.remaining = 0
        timing = self.engine.timing
        if timing is not None:
            for late in book.take_lateness():
                timing.record_lateness(late)
        self._complete()

    def _expect(self, sends, recvs) -> dict[Pair, list[Msg]]:
        new, n = self.match.expect(self.group.real, sends, recvs)
        self.account.expect(n)
        return new

    def _name_root(self, conn: Conn, ev: Event) -> bool:
        """A reduce's first gather frame names its root: add every real rank's gather."""
        sched = self.schedule
        if not isinstance(sched, RingReduce) or sched.root is not None or isinstance(ev, Data):
            return False
        self.schedule = self.match.schedule = sched = sched.with_root(
            conn.emu if isinstance(ev, SendReady) else conn.real
        )
        self.shape.geometry += f" root={sched.root}"
        new = self._expect(lambda r: sched.gather_msgs(r, False), lambda r: sched.gather_msgs(r, True))
        self.account.settle()
        self._post_receives(new)
        return True

    def settle_unrooted(self) -> None:
        """A reduce whose real ranks had no chunk to send to an emulated root never sees
        its gather: once the ring is done, a later collective on the group closes it."""
        sched = self.schedule
        if not isinstance(sched, RingReduce) or sched.root is not None or self.account.remaining != 1:
            return
        if all(sched.chunk_len(r) == 0 for r in self.group.real.sorted):  # else their gather frames will come
            self.account.settle()
            self._complete()

    # -- receives the emulated ranks post ----------------------------------------------------
    def _post_receives(self, expected: dict[Pair, list[Msg]]) -> None:
        """The emulated receivers post every receive the real ranks will send into, at
        once (zero delay): the real rank's data then flows without a round trip, and the
        notices for one pair leave in a single write."""
        for (r, e), msgs in expected.items():
            conn = self.engine.conn_of(self.group, r, e)
            if conn is None:  # not connected yet: posted when the pair opens
                self.engine.unposted.setdefault((self.group.name, r, e), []).append(
                    lambda c, msgs=msgs: self.post(c, msgs)
                )
                continue
            self.post(conn, msgs)

    def post(self, conn: Conn, msgs: list[Msg]) -> None:
        """Post receives for `msgs`; a length only the real rank's notice tells is posted
        when that notice comes."""
        posted = False
        for m in msgs:
            if (n := self.match.post_len(m)) >= 0:
                conn.pair.recv_ready(self.slot, n)
                posted = True
        if posted:
            self.engine.emit(conn)

    # -- try-receive / try-send ---------------------------------------------------
    def _dispatch(self, conn: Conn, ev: Event) -> None:
        match = self.match
        if isinstance(ev, SendReady):
            if not match.has_send(conn):
                self._name_root(conn, ev)
            m, unposted = match.send_notice(conn, ev.length)
            if unposted:  # its receive waited for this notice
                conn.pair.recv_ready(self.slot, m.nbytes)
                self.engine.emit(conn)
        elif isinstance(ev, Data):
            m = match.data_frame(conn, len(ev.payload))
            ref = (conn.real, m.step)
            self.payloads.keep(ref, ev.payload)
            now = self.engine.clock()
            if self.timeline is not None:
                self.timeline.real_sent(conn.real, m.step, now)
            self._crossed(conn.real, now)
            for p in self.waiting.pop(ref, ()):
                p.missing -= 1
                if p.missing == 0:
                    self._flush(p.conn)
        else:  # RecvReady: the real rank posted a receive from the emulated peer
            if not match.has_recv(conn):
                self._name_root(conn, ev)
            m = match.recv_notice(conn, ev.length)
            self._queue_send(conn, m)

    def _queue_send(self, conn: Conn, m: Msg) -> None:
        """The emulated peer's send for the receive the real rank posted: it waits for
        the real sends it builds on (and the mirror input), then for its release time."""
        deps, content = self.schedule.origin(conn.emu, m.step, self.group.real)
        p = _PendingSend(conn, m, content)
        for ref in deps:
            if not self.payloads.have(ref):
                p.missing += 1
                self.waiting[ref].append(p)
        if self.payloads.input is Input.ASKED:
            p.missing += 1
            self.input_waiters.append(p)
        self.outq[(conn.real, conn.emu)].append(p)
        if p.missing == 0:
            self._flush(conn)

    def on_input(self, mirror: MirrorInput | None) -> None:
        """The mirror source's input came (None: none recorded; its messages stay zeros)."""
        self.payloads.on_input(mirror)
        waiters, self.input_waiters = self.input_waiters, []
        for p in waiters:
            p.missing -= 1
            if p.missing == 0:
                self._flush(p.conn)

    def _flush(self, conn: Conn) -> None:
        """Write ready sends in the order the real rank posted the receives (FIFO per pair),
        each at its release time: a driver timer comes back for one that is early."""
        q = self.outq[(conn.real, conn.emu)]
        tl = self.timeline
        eng = self.engine
        while q and q[0].missing == 0:
            p = q[0]
            if tl is not None:
                if p.release is None:
                    p.release = tl.release(conn.emu, p.msg.step) + eng.timing.jitter(self.kind)
                now = eng.clock()
                if p.release > now:
                    if not p.timed:
                        p.timed = True
                        eng.call_at(p.release, lambda: self._flush(conn))
                    return
                if p.timed:
                    eng.timing.record_lateness(now - p.release)
            q.popleft()
            self._send(p)

    def _send(self, p: _PendingSend) -> None:
        n = p.msg.nbytes
        payload = self.payloads.payload(self.schedule, self.group.real, p.conn.emu, p.msg, p.content)
        if len(payload) != n:
            what = f"forwarded {len(payload)} bytes into a {n}-byte receive"
            raise ProtocolError(self.match.where(p.conn, what, p.msg.step))
        p.conn.pair.send(self.slot, payload)
        self.engine.emit(p.conn)
        self._crossed(p.conn.real)

    def _crossed(self, real: int, now: float | None = None) -> None:
        if self.account.crossed(real, self.engine.clock() if now is None else now):
            self._complete()

    def _complete(self) -> None:
        self._move(Phase.COMPLETE)
        self.engine.completed(self)

    def record(self, end: float) -> InstanceRecord:
        rec = self.account.record(self.group.name, self.tag, self.kind, self.nbytes, self.geometry, end, self.predicted)
        rec.world, rec.ranks = self.group.world, list(self.group.ranks)
        rec.root = getattr(self.schedule, "root", None)
        rec.numel, rec.elem = self.shape.numel, self.shape.elem
        return rec

    def summary(self) -> str:
        if self.book is not None:
            return f"{self.name()}: {self.book.remaining} of {self.book.boundary} boundary messages left"
        return self.account.summary(self.name())

    def real_ranks_entered(self) -> dict[int, float]:
        """Global rank -> its last boundary time, for each real rank that entered (the watchdog)."""
        times = {r: t[1] for r, t in self.account.rank_times.items()}
        if self.book is not None:
            times.update((r, t[1]) for r, t in self.book.rank_times().items())
        return {self.group.global_rank(r): t for r, t in times.items()}


class Engine:
    """Routes events to instances keyed by (group, slot) and keeps the counters."""

    def __init__(
        self,
        emit: Callable[[Conn], None],
        dialect: Dialect,
        request_meta: Ask | None = None,
        on_complete: Callable[[InstanceRecord], None] | None = None,
        conn_of: Callable[[Group, int, int], Conn | None] | None = None,
        timing: ReleaseTiming | None = None,
        call_at: Callable[[float, Callable[[], None]], None] | None = None,
        data: str = "zeros",
        request_input: Callable[[str, int, int], bool] | None = None,
        clock: Callable[[], float] = time.monotonic,
        native: bool = True,
        native_timers: bool = False,
        blocked: Callable[[Conn], None] | None = None,
    ) -> None:
        """`native`: the native book runs the instances it takes (controller/book.py).
        `native_timers`: its release timers wait in the native core, which the driver
        runs (`core.next_deadline`, `core.run_due`), not through `call_at`; `blocked`
        hears of a pair a native write could not finish."""
        self.emit = emit
        self.dialect = dialect
        self.clock = clock
        self.data = data  # what emulated ranks contribute: zeros, or mirror (the source's input)
        self.request_input = request_input
        if timing is not None and call_at is None:
            raise ValueError("timed releases need the driver's call_at")
        self.timing = timing
        self.call_at = call_at
        self.conn_of = conn_of or (lambda group, real, emu: None)
        self.unposted: dict[tuple[str, int, int], list[Callable[[Conn], None]]] = {}
        self.request_meta = request_meta
        self.on_complete = on_complete
        self.instances: dict[tuple[str, int], Instance] = {}
        self.p2p = PointToPoint(emit, self.conn_of, self.publish, timing, call_at, clock)
        self.native = native
        self.booked = 0  # instances the native book ran
        self.core = Core(
            done=Instance.book_done, emit=emit, blocked=blocked, call_at=None if native_timers else self._book_timer
        )

    def _book_timer(self, when: float, book: Book, pair: int) -> None:
        self.call_at(when, lambda: book.due(pair, self.clock()))

    def on_event(self, conn: Conn, ev: Event) -> None:
        key = (conn.group.name, ev.slot)
        inst = self.instances.get(key)
        if inst is None:
            try:
                kind, tag = self.dialect.classify(ev.slot)
            except UnsupportedCollective as exc:
                raise ProtocolError(
                    f"{exc} on group {conn.group.name!r} is not supported by the {self.dialect.name} dialect yet"
                ) from None
            if kind is None:  # send/recv: the slot is the user's tag
                self.p2p.on_event(conn, ev)
                return
            for other in list(self.instances.values()):
                if other.group is conn.group:
                    other.settle_unrooted()
            inst = self.instances[key] = Instance(self, conn.group, ev.slot, kind, tag)
        inst.feed(conn, ev)

    def on_connected(self, conn: Conn) -> None:
        """A pair opened: post the receives instances created before it could not."""
        for post in self.unposted.pop((conn.group.name, conn.real, conn.emu), ()):
            post(conn)

    def _resolving(self, group: str, slot: int) -> Instance | None:
        inst = self.instances.get((group, slot))
        return inst if inst is not None and inst.phase is Phase.RESOLVING else None

    def on_meta(self, group: str, slot: int, numel: int | None, elem: int = 1) -> None:
        """The observer's answer for an allreduce: its element count and size, or None."""
        if (inst := self._resolving(group, slot)) is None:
            return
        if numel is None:
            inst.meta_unavailable()
        else:
            inst.on_meta(numel, elem)

    def on_root(self, group: str, slot: int, root: int | None) -> None:
        """The observer's answer for a broadcast: the root the call named, or None."""
        if (inst := self._resolving(group, slot)) is not None:
            inst.on_root(root)

    def on_input(self, group: str, slot: int, mirror: MirrorInput | None) -> None:
        """The observer's answer for a mirrored instance's input."""
        inst = self.instances.get((group, slot))
        if inst is not None and inst.payloads.input is Input.ASKED:
            inst.on_input(mirror)

    def completed(self, inst: Instance) -> None:
        del self.instances[(inst.group.name, inst.slot)]
        self.publish(inst.record(self.clock()))

    def publish(self, rec: InstanceRecord) -> None:
        """A finished instance (or point-to-point message) goes to the controller's records."""
        if self.on_complete:
            self.on_complete(rec)

    def pending(self) -> list[str]:
        """Instances in flight, with how many boundary messages each still waits for.
        Read from other threads: list() copies the values in one step under the GIL."""
        return [i.summary() for i in list(self.instances.values())] + self.p2p.pending_summary()
