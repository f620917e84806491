"""The engine: collective instances, their boundary bookkeeping, try-send / try-receive.

It is sans-IO like the dialect: events from real ranks come in through
`on_event`, frames are queued on each pair and `emit(conn)` tells the driver
that a pair has some to write, the metadata an instance may need (an
allreduce's tensor size) is asked for through `request_meta`, and time comes
from the `clock` it is given. One engine serves every process group of a run,
and it knows no dialect's frames: the `Dialect` names each slot's collective.

An instance is shape inference (which schedule), then a native book that runs
its boundary program (controller/book.py: frame matching, dependencies, the FIFO
per pair, release, accounting, all in C++), with the payload policy (what
emulated messages carry) as its one Python hook. Its own states and their
transitions are `Phase` and `PHASE_MOVES`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import Enum, auto

from neuronabox.schedules import Kind
from neuronabox.schedules.gloo import Msg, RingAllreduce, Schedule, SendRef
from neuronabox.schedules.gloo_reduce import RingReduce

from .accounting import Accounting
from .book import INPUT, Book, Core, Pair, Program, ProgramCache, load_program
from .dialect import Data, Dialect, Event, SendReady, UnsupportedCollective
from .groups import Conn, Group
from .mirror import MirrorInput
from .outcomes import InstanceRecord, ProtocolError, StateError
from .p2p import PointToPoint
from .payloads import Input, PayloadPolicy
from .release import DrawnStart, Jittered, ReleaseTiming
from .shape import Ask, Grace, ShapeInference
from .starts import Seen, Starters, StartTemplate
from .waiting import WaitingRecords

RING_POST_WINDOW = 2  # receives a ring keeps posted per pair, as gloo::allreduce's ring does
DEFERRED_RECORDS_MAX = 64  # finished instances whose records wait for an idle loop; more: published at once

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
        self.payloads = PayloadPolicy(engine.data)
        self.account = Accounting(engine.clock())
        self.buffered: list[tuple[Conn, Event]] = []  # frames before the shape is known
        self.timeline = None
        self.predicted = 0.0
        self.lag: float | None = None  # the record's `lag` (Book.lag: past release and inputs, the latest send)
        self.turnarounds: list[float] = []  # the real ranks' (Book.take_turnarounds), for the local-work meter
        self.work: tuple[float, float] | None = None  # the measured local work its timeline charged (the trace's)
        self.book: Book | None = None  # the native book runs the instance once its shape is known
        self.program: Program | None = None  # the recorded program its book loaded (the shape's)
        self.native = self.posted_ahead = self.on_note = False  # book started natively; posted ahead; on the note
        self.ended_at: float | None = None  # when its book completed, if before the instance was made (adopt)
        self.pairs: dict[Pair, int] = {}  # (real, emulated) -> the pair's index in the book
        self._keys: list[Pair] = []  # the same, by index (for the book's hooks)

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
        """A frame the driver handed to Python: one read before the book took its pair's
        frames (or before the shape was known), or on a pair the program does not have yet."""
        self.account.enter(conn.real, self.engine.clock)
        if self.phase is Phase.RESOLVING:
            self.buffered.append((conn, ev))
            self.shape.note(conn, ev)
            self._try_resolve()
            return
        self._to_book(conn, ev)

    def _to_book(self, conn: Conn, ev: Event) -> None:
        i = self.pairs.get((conn.real, conn.emu))
        if i is None and self._name_root(conn, ev):  # a reduce's gather, on a pair of its own
            i = self.pairs.get((conn.real, conn.emu))
        if i is None:  # a pair the program lacks: the book names the frame
            i = self.pairs[(conn.real, conn.emu)] = self.book.add_pair(conn.real, conn.emu)
            self._connect((conn.real, conn.emu))
        self.book.on_event(i, ev, self.engine.clock())

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

    def on_meta(self, numel: int, elem: int, dtype: str | None = None) -> None:
        self._install(self.shape.from_meta(numel, elem, dtype))

    def meta_unavailable(self) -> None:
        self.shape.unavailable()
        self._try_resolve()

    def _install(self, sched: Schedule) -> None:
        """The shape is known: the schedule's boundary program goes into a native book,
        which runs the instance from here (controller/book.py). Every frame of its pairs
        goes to it from the pairs' reads, and it says when the last message crossed."""
        self._move(Phase.RUNNING)
        self.schedule = sched
        g, eng = self.group, self.engine
        timing = eng.timing
        if timing is not None:
            start = self.account.start
            work = timing.work_at(g.name, self.tag)
            self.timeline = timing.timeline(self.kind, self.nbytes, sched, g.real, start, g.name, self.tag, work)
            self.work = timing.measured(work)
            self.predicted = timing.predicted(self.kind, self.nbytes, sched, g.real.sorted[0], work)
            timing.within_limit(
                self.name(), self.predicted + max(timing.whatif.stragglers(self.kind).values(), default=0)
            )
        clock = self.timeline
        if clock is not None and timing.whatif.has_jitter(self.kind):
            clock = Jittered(clock, timing, self.kind)
        if self.payloads.wants_input(sched, g.real) and eng.request_input is not None:
            if eng.request_input(g.name, self.slot, g.global_rank(g.real.mirror)):
                self.payloads.asked()
        asked = self.payloads.input is Input.ASKED
        unrooted = isinstance(sched, RingReduce) and sched.root is None
        self.book = book = Book(
            eng.core,
            self,
            self.name(),
            self.slot,
            clock,
            payload=self._payload if asked else None,
            extend=self._extend if unrooted else None,
            turnarounds=timing is not None and timing.meter is not None,
        )
        self.payloads.lookup = self._received
        self._load_cached(sched)
        if unrooted:
            book.hold(1)  # the gather to the root, settled once a frame names it
        if eng.native_start and not asked and not unrooted and (frames := self.shape.settled_by()):
            eng.offer_start(self, clock, frames)
        buffered, self.buffered = self.buffered, []
        for conn, ev in buffered:
            self._to_book(conn, ev)
        if book.remaining == 0 and self.phase is Phase.RUNNING:  # nothing crossed (else the last one completed it)
            self.book_done()

    def _load_cached(self, sched: Schedule) -> None:
        """The schedule's whole program, recorded once per shape of the group and loaded
        natively into every instance of that shape (controller/book.py, ProgramCache)."""
        g = self.group
        deps = self._input_deps()
        # The geometry string names a broadcast's or rooted collective's root and a ring's
        # segments; a ring's exact boundaries (its element size) are its RingGeometry.
        key = (g.name, g.real.members, self.kind, getattr(sched, "geo", None), self.nbytes, self.geometry, deps)
        program, index = self.engine.programs.program(key, lambda prog, idx: self._record(prog, idx, sched, deps))
        self.book.load(program)
        self.program = program
        self.pairs = dict(index)
        for pair in index:
            self._connect(pair)

    def _record(self, prog: Program, index: dict, sched: Schedule, deps: tuple) -> None:
        """The schedule's program; an allreduce's ring posts its receives as Gloo's does."""
        load_program(prog, sched, self.group.real, index, sched.sends, sched.recvs, deps)
        prog.post_window = RING_POST_WINDOW if type(sched) is RingAllreduce else 0  # not a reduce's ring

    def _load(self, sends, recvs) -> None:
        """Messages of the schedule's program into the book; new pairs connect (and post
        every receive at once), known ones post what they gained."""
        known = set(self.pairs)
        grown = load_program(self.book, self.schedule, self.group.real, self.pairs, sends, recvs, self._input_deps())
        for key in grown:
            if key in known:
                self.book.post(self.pairs[key])
            else:
                self._connect(key)

    def _connect(self, key: Pair) -> None:
        r, e = key
        i = self.pairs[key]
        eng = self.engine
        conn = eng.conn_of(self.group, r, e)
        if conn is None:  # not connected yet: the book takes it when the pair opens
            eng.unposted.setdefault((self.group.name, r, e), []).append(lambda c: self.book.connect(i, c))
        else:
            self.book.connect(i, conn)

    def _input_deps(self) -> tuple:
        """What every emulated send waits for besides real sends: the mirror input, if asked."""
        return (INPUT,) if self.payloads.input is Input.ASKED else ()

    def _received(self, ref: SendRef):
        return self.book.received(*ref)

    def _payload(self, pair: int, step: int, nbytes: int):
        """An emulated send's bytes when the observer's input shapes them (mirror, an
        object's pickle); None: the book's own rule (zeros, or the real bytes it carries)."""
        if self.payloads.mirror is None:
            return None
        r, e = self._pair_of(pair)
        content = self.schedule.origin(e, step, self.group.real)[1]
        return self.payloads.payload(self.schedule, self.group.real, e, Msg(e, step, nbytes), content)

    def _pair_of(self, i: int) -> Pair:
        """The (real, emulated) pair at book index `i`: `pairs` is filled in index order."""
        if len(self._keys) != len(self.pairs):
            self._keys = list(self.pairs)
        return self._keys[i]

    def _extend(self, pair: int, send: bool) -> bool:
        """A notice on a pair whose program has nothing left that way: a reduce's gather
        frame names its root."""
        r, e = self._pair_of(pair)
        return self._name_root_from(r, e, send)

    def _name_root(self, conn: Conn, ev: Event) -> bool:
        if isinstance(ev, Data):
            return False
        return self._name_root_from(conn.real, conn.emu, isinstance(ev, SendReady))

    def _name_root_from(self, real: int, emu: int, send: bool) -> bool:
        """A reduce's first gather frame names its root: add every real rank's gather."""
        sched = self.schedule
        if not isinstance(sched, RingReduce) or sched.root is not None:
            return False
        self.schedule = sched = sched.with_root(emu if send else real)
        self.shape.geometry += f" root={sched.root}"
        self._load(lambda r: sched.gather_msgs(r, False), lambda r: sched.gather_msgs(r, True))
        self.book.settle(1, self.engine.clock())
        return True

    def settle_unrooted(self) -> None:
        """A reduce whose real ranks had no chunk to send to an emulated root never sees
        its gather: once the ring is done, a later collective on the group closes it."""
        sched = self.schedule
        if not isinstance(sched, RingReduce) or sched.root is not None or self.book.remaining != 1:
            return
        if all(sched.chunk_len(r) == 0 for r in self.group.real.sorted):  # else their gather frames will come
            self.book.settle(1, self.engine.clock())

    def on_input(self, mirror: MirrorInput | None) -> None:
        """The mirror source's input came (None: none recorded; its messages stay zeros)."""
        self.payloads.on_input(mirror)
        self.book.arrive(*INPUT, self.engine.clock())

    def book_done(self, end: float | None = None) -> None:
        """The book's last message crossed (or it had none): the record takes its times
        (`end`: when, for a book that completed before its instance was made)."""
        book = self.book
        book.close()  # its hooks, the payload policy's lookup: no cycle keeps the instance
        self.payloads.lookup = None
        times = self.account.rank_times
        for r, (first, last) in book.rank_times().items():
            t = times.setdefault(r, [first, last])
            t[0], t[1] = min(t[0], first), last
        self.account.boundary = book.boundary
        timing = self.engine.timing
        if timing is not None:
            if timing.meter is not None:
                self.turnarounds = book.take_turnarounds()
            timing.record_lateness(*book.take_lateness())
            # no emulated send to a real rank: nothing the controller released could hold one up
            lag = book.lag()
            self.lag = (0.0 if timing.active else None) if lag is None else max(0.0, lag)
            timing.ended(self.group.name, self.tag, times, self.lag or 0.0)  # --skew auto: the real rank's gap starts
        self.ended_at = end
        self._move(Phase.COMPLETE)
        self.engine.completed(self)

    def measure(self) -> None:
        """The real ranks' turnarounds in the instance, to the timing's meter of local work."""
        timing = self.engine.timing
        if timing is not None and timing.meter is not None and self.turnarounds:
            timing.observe(self.kind, self.schedule, self.turnarounds)

    def record(self, end: float) -> InstanceRecord:
        acc, cpu = self.account, self.engine.loop_cpu()
        rec = acc.record(self.group.name, self.tag, self.kind, self.nbytes, self.geometry, end, self.predicted, cpu)
        rec.world, rec.ranks = self.group.world, list(self.group.ranks)
        rec.root = getattr(self.schedule, "root", None)
        rec.numel, rec.elem, rec.dtype = self.shape.numel, self.shape.elem, self.shape.dtype
        rec.lag = self.lag
        rec.work = self.work
        rec.native, rec.posted_ahead, rec.on_note = self.native, self.posted_ahead, self.on_note
        return rec

    def summary(self) -> str:
        if self.book is not None:
            return f"{self.name()}: {self.book.remaining} of {self.book.boundary} boundary messages left"
        return f"{self.name()}: resolving its shape"

    def entries(self) -> dict[int, float]:
        """Global rank -> when it entered, for each real rank that did (the trace's gaps)."""
        times = {r: t[0] for r, t in self.account.rank_times.items()}
        if self.book is not None:
            for r, (first, _) in self.book.rank_times().items():
                times[r] = min(times.get(r, first), first)
        return {self.group.global_rank(r): t for r, t in times.items()}

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
        native_timers: bool = False,
        defer_records: bool = False,
        native_start: bool = False,
        note_start: bool = False,
    ) -> None:
        """Each instance runs in a native book once its shape is known (controller/book.py).
        `native_timers`: the books' release timers wait in the native core, which the driver
        runs (`core.wait`), not through `call_at`. `defer_records`: a finished instance's
        record (and trace line) waits for the driver's idle turn (`publish_next`), off the
        path of the next collective's frames; at most DEFERRED_RECORDS_MAX wait.
        `native_start`: an instance whose first frame matches one that alone settled an
        earlier instance's schedule starts natively, in the core, and its Python instance
        is made at the driver's next turn (`adopt_started`); only where releases are
        untimed or priced by a native timeline (under drawn skew, one each start draws),
        and emulated payloads are the book's own (controller/starts.py). `note_start`: a
        native start of a shape the call's note told begins as the note comes, not at the
        instance's first frame (`Starters.arm`)."""
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
        self.programs = ProgramCache()
        self.defer_records = defer_records
        self.native_start = native_start and getattr(dialect, "slot_pattern", None) is not None
        self.finished: WaitingRecords[Instance] = WaitingRecords()  # completed, record not yet out
        self.p2p = PointToPoint(emit, self.conn_of, self.publish, timing, call_at, clock, self.loop_cpu)
        self.core = Core(done=Instance.book_done, emit=emit, call_at=None if native_timers else self._book_timer)
        self.starters = Starters(self.core, dialect, self.conn_of, clock if note_start else None)  # starts.py
        self.core.note_starts(note_start)  # and as the core reads a note of a known shape (its note links)
        self.notes: Callable[[], None] = lambda: None  # the notes the core read, to the observer link (main.py)

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

    def on_meta(self, group: str, slot: int, numel: int | None, elem: int = 1, dtype: str | None = None) -> None:
        """The observer's answer for an allreduce: its element count, size and dtype, or None."""
        if (inst := self._resolving(group, slot)) is None:
            return
        if numel is None:
            inst.meta_unavailable()
        else:
            inst.on_meta(numel, elem, dtype)

    def on_root(self, group: str, slot: int, root: int | None) -> None:
        """The observer's answer for a broadcast: the root the call named, or None."""
        if (inst := self._resolving(group, slot)) is not None:
            inst.on_root(root)

    def on_input(self, group: str, slot: int, mirror: MirrorInput | None) -> None:
        """The observer's answer for a mirrored instance's input."""
        inst = self.instances.get((group, slot))
        if inst is not None and inst.payloads.input is Input.ASKED:
            inst.on_input(mirror)

    def _adopted(self, tpl: StartTemplate, book: Book) -> Instance:
        """The instance of a book the core started natively from `tpl`: its shape is the
        template's, its times the book's. Made at the driver's turn after the start, off
        the path of the collective's frames."""
        kind, tag = self.dialect.classify(book.slot)
        g = tpl.group
        inst = Instance(self, g, book.slot, kind, tag)
        inst.account.start = min((first for first, _ in book.rank_times().values()), default=inst.account.start)
        inst.shape.geometry, inst.shape.nbytes = tpl.geometry, tpl.nbytes
        inst.shape.numel, inst.shape.elem, inst.shape.dtype = tpl.told
        inst._move(Phase.RUNNING)
        inst.native, inst.posted_ahead, inst.on_note = True, book.posted_ahead, book.on_note
        inst.schedule, inst.book = tpl.schedule, book
        inst.pairs = {pair: i for i, pair in enumerate(tpl.pairs)}
        if self.timing is not None:
            work = self.timing.work_at(g.name, tag)
            inst.work = self.timing.measured(work)
            inst.predicted = tpl.prediction(self.timing, self.start_basis(), kind, work)
        return inst

    def offer_start(self, inst: Instance, clock: object, frames: list) -> None:
        """`inst`'s first frames alone settled its schedule: the next instance with those first
        frames starts natively, untimed or with a native timeline moved to its entry, or under
        drawn skew one it draws itself (`clock`: what its book was given; controller/starts.py)."""
        timing = self.timing
        timed = clock is not None and clock is inst.timeline and hasattr(clock, "at")
        if clock is not None and not timed:
            return
        drawn = timed and timing.skew.mode != "none"  # each start draws its own entry (release.DrawnStart)
        shape = inst.shape
        tpl = StartTemplate(inst.group, inst.schedule, inst.geometry, inst.nbytes, tuple(inst.pairs), inst.predicted,
                            (shape.numel, shape.elem, shape.dtype), self.start_basis())  # fmt: skip
        if drawn:
            clock = DrawnStart(timing, inst.kind, inst.nbytes, inst.schedule, inst.group.real, inst.group.name)
        seen = Seen(inst.slot, str(inst.kind), tuple(frames), tpl, inst.program,
                    timing is not None and timing.meter is not None, clock,
                    timing.whatif.entry_delay(inst.kind) if timed and not drawn else 0.0, drawn,
                    shape.told is not None and not shape.told.standing)  # fmt: skip
        self.starters.offer(seen, self.start_basis())

    def adopt_started(self) -> None:
        """The books the core started natively since the last turn get their instances
        (the driver's turn, before the frames no book took)."""
        started = self.starters.take()
        if not started:  # every loop turn: nothing more to do unless the core started books
            return
        for tpl, book in started:
            inst = self._adopted(tpl, book)
            for other in list(self.instances.values()):
                if other.group is inst.group:
                    other.settle_unrooted()
            self.instances[(inst.group.name, inst.slot)] = inst
            if not book.adopt(inst):  # it completed before this turn
                inst.book_done(book.done_at)
        self.starters.keep_if(self.start_basis())  # a what-if came, or the local work was refitted

    def loop_cpu(self) -> float:
        """The loop thread's CPU seconds at work: its CPU less the polls of its busy window
        that found nothing (a controller on a core of its own polls rather than sleeps)."""
        return time.thread_time() - self.core.polled()

    def start_basis(self) -> tuple:
        """What a native start's timeline depends on besides its shape and entry: the what-if
        and the charged local work (each replaced whole when it changes)."""
        timing = self.timing
        return () if timing is None else (timing.whatif, timing.work)

    def clear_starters(self) -> None:
        """No native start until instances offer starters again (a pair closed)."""
        self.starters.clear()

    def reset(self) -> None:
        """A new generation of the world (the default group made again): what the old one
        left in flight is dropped; its books take no frame and fire no timer."""
        self.publish_finished()
        self.starters.clear()
        for _, book in self.starters.take():
            book.close()
        for inst in self.instances.values():
            if inst.book is not None:
                inst.book.close()
        self.instances.clear()
        self.programs.clear()
        self.unposted.clear()
        self.p2p.reset()

    def completed(self, inst: Instance) -> None:
        del self.instances[(inst.group.name, inst.slot)]
        end = self.clock() if inst.ended_at is None else inst.ended_at
        if not self.defer_records:
            self._report(inst, end)
            return
        self.finished.push(inst, end, inst.entries())
        if len(self.finished) > DEFERRED_RECORDS_MAX:  # the loop has had no idle turn: catch up now
            self.publish_finished()

    def publish_next(self) -> bool:
        """One finished instance's record out (the driver's idle turn); whether more wait."""
        if self.finished:
            self._report(*self.finished.pop())
        return bool(self.finished)

    def _report(self, inst: Instance, end: float) -> None:
        """A finished instance: a sample of the real rank's own work (the timing's meter),
        then its record."""
        inst.measure()
        self.starters.keep_if(self.start_basis())  # the measure may have refitted the local work
        self.publish(inst.record(end))

    def publish_finished(self) -> None:
        """Every record still waiting, out (the periodic turn, a reset, the run's end)."""
        while self.publish_next():
            pass

    def publish(self, rec: InstanceRecord) -> None:
        """A finished instance (or point-to-point message) goes to the controller's records."""
        if self.on_complete:
            self.on_complete(rec)

    def open_entries(self) -> dict[int, float]:
        """Each real rank's earliest entry (global rank -> time) into an instance still in
        flight: the trace's gaps before it are not final yet."""
        marks = self.finished.earliest()  # a waiting record is open too
        for inst in self.instances.values():
            for r, t in inst.entries().items():
                marks[r] = min(marks.get(r, t), t)
        return marks

    def pending(self) -> list[str]:
        """Instances in flight, with how many boundary messages each still waits for.
        Read from other threads: list() copies the values in one step under the GIL."""
        return [i.summary() for i in list(self.instances.values())] + self.p2p.pending_summary()
