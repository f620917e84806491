"""The engine: collective instances, boundary bitmaps, try-send / try-receive.

It is sans-IO like the dialect: events from real ranks come in through
`on_event`, frames are queued on each pair and `emit(conn)` tells the driver
that a pair has some to write, and the metadata an instance may need (an
allreduce's tensor size) is asked for through `request_meta`. One engine
serves every process group of a run.
"""

from __future__ import annotations

import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from neuronabox.schedules.gloo import (
    MAX_SEGMENT_BYTES,
    BinomialBroadcast,
    DisseminationBarrier,
    Msg,
    RealRanks,
    RingAllgather,
    RingAllreduce,
    RingGeometry,
    RingReduce,
    Schedule,
    SendRef,
    reduce_geometry,
)
from neuronabox.schedules.gloo_pairwise import PairwiseAlltoall, RootedPairwise

from .dialects.gloo.protocol import Data, Event, GlooPair, RecvReady, SendReady
from .dialects.gloo.wire import SlotPrefix, split_slot
from .mirror import MirrorInput, fold
from .outcomes import InstanceRecord, ProtocolError
from .p2p import PointToPoint
from .release import ReleaseTiming

KIND_NAMES = {p.value: p.name.lower() for p in SlotPrefix}
SUPPORTED = set(SlotPrefix)
ROOT_CANDIDATES_CHECKED = 64  # broadcast roots weighed against silent real ranks (more: the lowest is taken)
ROOT_GRACE_S = 0.02  # how long an ambiguous broadcast root waits for a silent real rank to speak
RING_KINDS = {SlotPrefix.ALLREDUCE: "all_reduce", SlotPrefix.REDUCE: "reduce"}  # flight-recorder names


@dataclass
class Group:
    """A process group as the controller sees it."""

    name: str
    world: int
    real: RealRanks  # group ranks
    ranks: tuple[int, ...] = ()  # global rank of each group rank (empty: the default group)

    def global_rank(self, r: int) -> int:
        return self.ranks[r] if self.ranks else r


@dataclass(eq=False)
class Conn:
    """One Gloo pair between real rank `real` and emulated rank `emu` of `group`."""

    group: Group
    real: int
    emu: int
    pair: GlooPair = field(default_factory=GlooPair)


class _PendingSend:
    """An emulated rank's send to a real rank, waiting for its dependencies."""

    __slots__ = ("conn", "msg", "missing", "content", "release", "timed")

    def __init__(self, conn: Conn, msg: Msg, missing: int, content: SendRef | tuple[SendRef, ...] | None) -> None:
        self.conn = conn
        self.msg = msg  # from the real rank's point of view: peer = the emulated sender
        self.missing = missing
        self.content = content
        self.release: float | None = None  # when it may leave (None: not asked yet)
        self.timed = False  # a driver timer is set for it


def _from_emulated_root(sched: Schedule, real: RealRanks) -> bool:
    return isinstance(sched, BinomialBroadcast) and sched.root not in real


class Instance:
    """One collective call on one process group: (group, slot)."""

    def __init__(self, engine: Engine, group: Group, slot: int) -> None:
        self.engine = engine
        self.group = group
        self.slot = slot
        prefix, self.tag, _ = split_slot(slot)
        self.prefix = prefix
        self.kind = KIND_NAMES.get(prefix, f"prefix{prefix}")
        self.schedule: Schedule | None = None
        self.geometry = ""
        self.nbytes = 0
        self.buffered: list[tuple[Conn, Event]] = []
        self.meta_state: str | None = None  # a question to the observer (ring size, broadcast root)
        self.root_hint: int | None = None  # a broadcast's root, as the observer knows it
        self.root_grace: str | None = None  # an ambiguous broadcast root's wait for silent real ranks
        self.first_notice: dict[int, list[tuple[Conn, Event]]] = {}
        self.expect_send: dict[tuple[int, int], deque[Msg]] = {}
        self.expect_data: defaultdict[tuple[int, int], deque[Msg]] = defaultdict(deque)
        self.expect_recv: dict[tuple[int, int], deque[Msg]] = {}
        self.received: dict[SendRef, bytes] = {}
        self.waiting: defaultdict[SendRef, list[_PendingSend]] = defaultdict(list)
        self.outq: defaultdict[tuple[int, int], deque[_PendingSend]] = defaultdict(deque)
        self.remaining = 0
        self.boundary = 0
        self.start = time.monotonic()  # the first real frame: the emulated ranks enter now
        self.rank_times: dict[int, list[float]] = {}
        self.timeline = None
        self.predicted = 0.0
        self.completed = False
        self.input_state: str | None = None  # mirror policy: "asked" until the source's input is in
        self.mirror: MirrorInput | None = None
        self.input_waiters: list[_PendingSend] = []

    # -- geometry --------------------------------------------------------------
    def feed(self, conn: Conn, ev: Event) -> None:
        if conn.real not in self.rank_times:  # a real rank's first frame: it entered the collective
            now = time.monotonic()
            self.rank_times[conn.real] = [now, now]
        if self.schedule is None:
            self.buffered.append((conn, ev))
            self.first_notice.setdefault(conn.real, []).append((conn, ev))
            self._try_resolve()
            return
        self._dispatch(conn, ev)

    def _try_resolve(self) -> None:
        g = self.group
        sched: Schedule | None = None
        if self.prefix == SlotPrefix.BARRIER:
            sched, self.geometry = DisseminationBarrier(g.world), "dissemination"
        elif self.prefix == SlotPrefix.BROADCAST:
            sched = self._resolve_broadcast()
        elif self.prefix == SlotPrefix.ALLGATHER:
            sched = self._resolve_allgather()
        elif self.prefix in RING_KINDS:
            sched = self._resolve_ring()
        elif self.prefix in (SlotPrefix.GATHER, SlotPrefix.SCATTER):
            sched = self._resolve_rooted()
        elif self.prefix == SlotPrefix.ALLTOALL:
            conn, ev = self.buffered[0]
            self.nbytes = ev.length * g.world
            sched, self.geometry = PairwiseAlltoall(g.world, ev.length), "pairwise"
        if sched is not None:
            self._install(sched)

    def _resolve_broadcast(self) -> Schedule | None:
        w = self.group.world
        cands: set[int] | None = None
        nbytes = None
        for r, evs in self.first_notice.items():
            conn, ev = evs[0]
            if isinstance(ev, Data):
                continue
            nbytes = ev.length
            d = (conn.emu - r) % w if isinstance(ev, SendReady) else (r - conn.emu) % w
            if d & (d - 1):
                raise ProtocolError(self._where(conn, "peer distance is not a power of two"))
            if isinstance(ev, SendReady):  # r sends at bit i: its vrank is below d
                c = {(r - v) % w for v in range(min(d, w))}
            else:  # r receives at bit i from r - d: its vrank is in [d, 2d)
                c = {(r - v) % w for v in range(d, min(2 * d, w))}
            cands = c if cands is None else cands & c
        if not cands or nbytes is None:
            if cands is not None:
                raise ProtocolError(f"{self.name()}: no broadcast root fits the real ranks' frames")
            return None
        if len(cands) > 1 and self.meta_state != "unavailable":
            # Ambiguous: the observer of a rank that spoke knows the root the call named.
            if self.root_hint in cands:
                cands = {self.root_hint}
            elif self.meta_state is None and self.engine.request_meta is not None:
                asked = self.group.global_rank(next(iter(self.first_notice)))
                self.meta_state = "requested"
                if self.engine.request_meta(self.group.name, self.slot, asked, "broadcast"):
                    return None
                self.meta_state = "unavailable"
            elif self.meta_state == "requested":
                return None
        silent = [r for r in self.group.real.sorted if r not in self.first_notice]
        if len(cands) > 1 and silent and len(cands) <= ROOT_CANDIDATES_CHECKED:
            # A real rank that has not spoken either has not entered yet, or, under the
            # true root, does not speak on entry (it waits on a real parent, or has no
            # boundary message). After a grace period in which no other frame came, keep
            # the roots under which every silent real rank is of the second kind.
            if self.engine.call_at is not None and self.root_grace != "over":
                if self.root_grace is None:
                    self.root_grace = "running"
                    self.engine.call_at(time.monotonic() + ROOT_GRACE_S, self._grace_over)
                return None
            sched = {c: BinomialBroadcast(w, c, nbytes) for c in cands}
            fits = {c for c in cands if not any(self._speaks_on_entry(sched[c], r) for r in silent)}
            cands = fits or cands  # none fits: a rank is merely late; the lowest root is the guess
        root = 0 if 0 in cands else min(cands)
        self.geometry = f"root={root}" + ("" if len(cands) == 1 else " (inferred)")
        self.nbytes = nbytes
        return BinomialBroadcast(w, root, nbytes)

    def _speaks_on_entry(self, sched: BinomialBroadcast, r: int) -> bool:
        """Whether real rank r sends a boundary frame as soon as it enters: a receiver
        posts its one receive first (a notice only if the parent is emulated); the root
        posts all its sends at once."""
        real = self.group.real
        first = sched.recvs(r) or sched.sends(r)
        return any(m.peer not in real for m in first)

    def on_root(self, root: int | None) -> None:
        """The observer's answer to an ambiguous broadcast: the root (group rank) or None."""
        known = root is not None and 0 <= root < self.group.world
        self.root_hint, self.meta_state = (root, "answered") if known else (None, "unavailable")
        self._try_resolve()

    def _grace_over(self) -> None:
        if self.schedule is None and not self.completed:
            self.root_grace = "over"
            self._try_resolve()

    def _resolve_allgather(self) -> Schedule | None:
        for evs in self.first_notice.values():
            sends = [e.length for _, e in evs if isinstance(e, SendReady)]
            recvs = [e.length for _, e in evs if isinstance(e, RecvReady)]
            for lens in (sends, recvs):
                if len(lens) >= 2:
                    block = lens[0] + lens[1]
                    self.nbytes = block * self.group.world
                    self.geometry = f"block={block}"
                    return RingAllgather(self.group.world, block)
        return None

    def _resolve_rooted(self) -> Schedule:
        """gather / scatter: a real rank's first frame names the root (the peer it sends
        to in a gather or receives from in a scatter, else itself)."""
        conn, ev = self.buffered[0]
        to_peer = isinstance(ev, SendReady) == (self.prefix == SlotPrefix.GATHER)
        root = conn.emu if to_peer else conn.real
        self.nbytes = ev.length * self.group.world
        self.geometry = f"root={root}"
        return RootedPairwise(self.kind, self.group.world, root, ev.length)

    def _ring_geometry(self, world: int, total: int, elem: int) -> RingGeometry:
        if self.prefix == SlotPrefix.REDUCE:
            return reduce_geometry(world, total, elem)
        return RingGeometry.for_tensor(world, total, elem)

    def _ring(self, geo: RingGeometry) -> Schedule:
        return RingReduce(geo) if self.prefix == SlotPrefix.REDUCE else RingAllreduce.of(geo)

    def _resolve_ring(self) -> Schedule | None:
        """Segmentation from the wire when it is certain, else from the observer.

        The first notice of each direction is a block-start segment, so its length
        L is a full segment. With L <= 2/3 of the maximum segment the ring has 2W
        segments (reduce: L under the maximum), and with L >= 8 bytes x 2W none of
        them is empty, so only the last segment's length is open and it is read off
        the wire when it comes. Otherwise the tensor size is not on the wire: the
        observer is asked.
        """
        if self.meta_state == "requested":
            return None  # the observer's answer installs the schedule
        lens = [e.length for evs in self.first_notice.values() for _, e in evs if not isinstance(e, Data)]
        seg = max(lens)
        w = self.group.world
        two_w = seg < MAX_SEGMENT_BYTES if self.prefix == SlotPrefix.REDUCE else seg <= MAX_SEGMENT_BYTES * 2 // 3
        certain = two_w and seg >= 8 * 2 * w
        if not certain and self.meta_state is None and self.engine.request_meta is not None:
            self.meta_state = "requested"
            asked = self.group.global_rank(self.buffered[0][0].real)  # the observer knows global ranks
            if self.engine.request_meta(self.group.name, self.slot, asked, RING_KINDS[self.prefix]):
                return None
            self.meta_state = "unavailable"
        num = 2 * w if two_w else 3 * w
        geo = RingGeometry(w, num * seg, num, seg, last_known=False)
        self.geometry = f"segments={num}x{seg} ({'wire' if certain else 'guessed from the wire'})"
        self.nbytes = geo.total
        return self._ring(geo)

    def on_meta(self, numel: int, elem: int) -> None:
        geo = self._ring_geometry(self.group.world, numel * elem, elem)
        self.geometry = f"segments={geo.num_segments}x{geo.segment_bytes} (observer)"
        self.nbytes = geo.total
        self.meta_state = "answered"
        self._install(self._ring(geo))

    def meta_unavailable(self) -> None:
        self.meta_state = "unavailable"
        self._try_resolve()

    def _install(self, sched: Schedule) -> None:
        self.schedule = sched
        g = self.group
        timing = self.engine.timing
        if timing is not None:
            self.timeline = timing.timeline(self.kind, self.nbytes, sched, g.real, self.start)
            self.predicted = timing.predicted(self.kind, self.nbytes, sched, g.real.sorted[0])
        self._expect(sched.sends, sched.recvs)
        eng = self.engine
        # Mirror asks for every input; zeros only for broadcasts from an emulated root
        # (DDP's construction broadcasts: the real ranks keep their own model).
        wants = hasattr(sched, "mirror_plan") if eng.data == "mirror" else _from_emulated_root(sched, g.real)
        if wants and eng.request_input is not None:
            if eng.request_input(g.name, self.slot, g.global_rank(g.real.mirror)):
                self.input_state = "asked"
        if isinstance(sched, RingReduce) and sched.root is None:
            self.remaining += 1  # the gather to the root, counted once a frame names the root
        self._post_receives(self.expect_send)
        buffered, self.buffered = self.buffered, []
        for conn, ev in buffered:
            self._dispatch(conn, ev)
        if self.remaining == 0 and not self.completed:  # nothing crossed (else the last _mark completed it)
            self.engine._complete(self)

    def _expect(self, sends, recvs) -> dict[tuple[int, int], list[Msg]]:
        """Queue the boundary messages of every real rank; returns the new receives of
        emulated ranks (real sends), per pair."""
        g = self.group
        new: dict[tuple[int, int], list[Msg]] = {}
        for r in g.real.sorted:
            for m in sends(r):
                if m.peer not in g.real:
                    self.expect_send.setdefault((r, m.peer), deque()).append(m)
                    new.setdefault((r, m.peer), []).append(m)
                    self.boundary += 1
                    self.remaining += 1
            for m in recvs(r):
                if m.peer not in g.real:
                    self.expect_recv.setdefault((r, m.peer), deque()).append(m)
                    self.boundary += 1
                    self.remaining += 1
        return new

    def _name_root(self, conn: Conn, ev: Event) -> bool:
        """A reduce's first gather frame names its root: add every real rank's gather."""
        sched = self.schedule
        if not isinstance(sched, RingReduce) or sched.root is not None or isinstance(ev, Data):
            return False
        self.schedule = sched = sched.with_root(conn.emu if isinstance(ev, SendReady) else conn.real)
        self.geometry += f" root={sched.root}"
        new = self._expect(lambda r: sched.gather_msgs(r, False), lambda r: sched.gather_msgs(r, True))
        self.remaining -= 1
        self._post_receives(new)
        return True

    def settle_unrooted(self) -> None:
        """A reduce whose real ranks had no chunk to send to an emulated root never sees
        its gather: once the ring is done, a later collective on the group closes it."""
        sched = self.schedule
        if not isinstance(sched, RingReduce) or sched.root is not None or self.remaining != 1:
            return
        if all(sched.chunk_len(r) == 0 for r in self.group.real.sorted):  # else their gather frames will come
            self.remaining = 0
            self.engine._complete(self)

    def _post_receives(self, expected) -> None:
        """The emulated receivers post every receive the real ranks will send into, at
        once (zero delay): the real rank's data then flows without a round trip, and the
        notices for one pair leave in a single write."""
        for (r, e), q in expected.items():
            conn = self.engine.conn_of(self.group, r, e)
            if conn is None:  # not connected yet: posted when the pair opens
                self.engine.unposted.setdefault((self.group.name, r, e), []).append((self, list(q)))
                continue
            self._post(conn, q)

    def _post(self, conn: Conn, msgs) -> None:
        """Post receives for `msgs`. An open-length ring segment gets a whole segment (a
        reduce's gather, a whole chunk); a length only the wire tells (gather, scatter,
        alltoall) is posted when the real rank's send notice tells it."""
        pair, posted = conn.pair, False
        for m in msgs:
            if (n := self._post_len(m)) >= 0:
                pair.recv_ready(self.slot, n)
                posted = True
        if posted:
            self.engine.emit(conn)

    def _post_len(self, m: Msg) -> int:
        geo = getattr(self.schedule, "geo", None)
        if m.nbytes >= 0 or geo is None:
            return m.nbytes
        if isinstance(self.schedule, RingReduce) and m.step == self.schedule.gather_step:
            return geo.per_rank * geo.segment_bytes
        return geo.segment_bytes

    # -- try-receive / try-send ---------------------------------------------------
    def _where(self, conn: Conn, what: str, step: int | None = None) -> str:
        at = "" if step is None else f" step {step}"
        return f"{self.name()} rank pair {conn.real}<->{conn.emu}{at}: {what}"

    def name(self) -> str:
        return f"{self.kind} #{self.tag} of group {self.group.name!r}"

    def _unexpected(self, conn: Conn, frame: str, length: int, way: str) -> str:
        msgs = self.schedule.sends(conn.real) if way == "send" else self.schedule.recvs(conn.real)
        steps = [m.step for m in msgs if m.peer == conn.emu]
        where = f"after its last (step {steps[-1]})" if steps else "none at all with this peer"
        return self._where(conn, f"unexpected {frame} of {length} bytes: the schedule has no {way} here, {where}")

    def _check_len(self, conn: Conn, m: Msg, length: int, verb: str) -> Msg:
        if m.nbytes < 0:  # a length the wire tells (the last ring segment, pairwise messages)
            limit = self._post_len(m)
            if 0 <= limit < length:
                raise ProtocolError(self._where(conn, f"{length} bytes exceed the {limit} posted", m.step))
            return Msg(m.peer, m.step, length)
        if length != m.nbytes:
            raise ProtocolError(
                self._where(conn, f"real rank {verb} {length} bytes, schedule expects {m.nbytes}", m.step)
            )
        return m

    def _dispatch(self, conn: Conn, ev: Event) -> None:
        key = (conn.real, conn.emu)
        if isinstance(ev, SendReady):
            q = self.expect_send.get(key)
            if not q and self._name_root(conn, ev):
                q = self.expect_send.get(key)
            if not q:
                raise ProtocolError(self._unexpected(conn, "NOTIFY_SEND_READY", ev.length, "send"))
            posted = q.popleft()
            m = self._check_len(conn, posted, ev.length, "sends")
            if posted.nbytes < 0 and self._post_len(posted) < 0:  # its receive waited for this notice
                conn.pair.recv_ready(self.slot, m.nbytes)
                self.engine.emit(conn)
            self.expect_data[key].append(m)
        elif isinstance(ev, Data):
            q = self.expect_data.get(key)
            if not q:
                raise ProtocolError(self._where(conn, "data without a matching send notice"))
            m = q.popleft()
            if len(ev.payload) != m.nbytes:
                raise ProtocolError(
                    self._where(conn, f"{len(ev.payload)} data bytes, schedule expects {m.nbytes}", m.step)
                )
            ref = (conn.real, m.step)
            self.received[ref] = ev.payload
            if self.timeline is not None:
                self.timeline.real_sent(conn.real, m.step, time.monotonic())
            self._mark(conn.real)
            for p in self.waiting.pop(ref, ()):
                p.missing -= 1
                if p.missing == 0:
                    self._flush(p.conn)
        else:  # RecvReady: the real rank posted a receive from the emulated peer
            q = self.expect_recv.get(key)
            if not q and self._name_root(conn, ev):
                q = self.expect_recv.get(key)
            if not q:
                raise ProtocolError(self._unexpected(conn, "NOTIFY_RECV_READY", ev.length, "recv"))
            m = self._check_len(conn, q.popleft(), ev.length, "receives")
            deps, content = self.schedule.origin(conn.emu, m.step, self.group.real)
            p = _PendingSend(conn, m, 0, content)
            for ref in deps:
                if ref not in self.received:
                    p.missing += 1
                    self.waiting[ref].append(p)
            if self.input_state == "asked":
                p.missing += 1
                self.input_waiters.append(p)
            self.outq[key].append(p)
            if p.missing == 0:
                self._flush(conn)

    def on_input(self, mirror: MirrorInput | None) -> None:
        """The mirror source's input came (None: none recorded; its messages stay zeros)."""
        self.mirror, self.input_state = mirror, "in"
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
        while q and q[0].missing == 0:
            p = q[0]
            if tl is not None:
                timing = self.engine.timing
                if p.release is None:
                    p.release = tl.release(conn.emu, p.msg.step) + timing.jitter(self.kind)
                now = time.monotonic()
                if p.release > now:
                    if not p.timed:
                        p.timed = True
                        self.engine.call_at(p.release, lambda: self._flush(conn))
                    return
                if p.timed:
                    timing.record_lateness(now - p.release)
            q.popleft()
            self._send(p)

    def _bytes_of(self, c: SendRef | tuple[SendRef, ...] | None, n: int) -> bytes:
        if c is None:
            return bytes(n)
        if isinstance(c[0], tuple):  # several real sends, concatenated (a reduce's chunk)
            return b"".join(self.received[ref] for ref in c)
        return self.received[c]

    def _mirrored(self, p: _PendingSend) -> bytes | None:
        plan = self.schedule.mirror_plan(p.conn.emu, p.msg.step, self.group.real)
        block = None if plan is None else self.mirror.block(plan, p.msg.nbytes)
        if block is None:
            return None
        base = None if plan.base is None else self._bytes_of(plan.base, p.msg.nbytes)
        return fold(base, block, plan.folds, self.mirror.op, self.mirror.dtype)

    def _send(self, p: _PendingSend) -> None:
        n = p.msg.nbytes
        payload = self._mirrored(p) if self.mirror is not None else None
        if payload is None:
            payload = self._bytes_of(p.content, n)
        if len(payload) != n:
            what = f"forwarded {len(payload)} bytes into a {n}-byte receive"
            raise ProtocolError(self._where(p.conn, what, p.msg.step))
        p.conn.pair.send(self.slot, payload)
        self.engine.emit(p.conn)
        self._mark(p.conn.real)

    def _mark(self, real: int) -> None:
        now = time.monotonic()
        self.rank_times[real][1] = now  # feed() saw this rank first
        self.remaining -= 1
        if self.remaining == 0:
            self.engine._complete(self)


class Engine:
    """Routes events to instances keyed by (group, slot) and keeps the counters."""

    def __init__(
        self,
        emit: Callable[[Conn], None],
        request_meta: Callable[[str, int, int, str], bool] | None = None,
        on_complete: Callable[[InstanceRecord], None] | None = None,
        conn_of: Callable[[Group, int, int], Conn | None] | None = None,
        timing: ReleaseTiming | None = None,
        call_at: Callable[[float, Callable[[], None]], None] | None = None,
        data: str = "zeros",
        request_input: Callable[[str, int, int], bool] | None = None,
    ) -> None:
        self.emit = emit
        self.data = data  # what emulated ranks contribute: zeros, or mirror (the source's input)
        self.request_input = request_input
        if timing is not None and call_at is None:
            raise ValueError("timed releases need the driver's call_at")
        self.timing = timing
        self.call_at = call_at
        self.conn_of = conn_of or (lambda group, real, emu: None)
        self.unposted: dict[tuple[str, int, int], list[tuple[Instance, list[Msg]]]] = {}
        self.request_meta = request_meta
        self.on_complete = on_complete
        self.instances: dict[tuple[str, int], Instance] = {}
        self.p2p = PointToPoint(self)

    def on_event(self, conn: Conn, ev: Event) -> None:
        key = (conn.group.name, ev.slot)
        inst = self.instances.get(key)
        if inst is None:
            prefix, tag, _ = split_slot(ev.slot)
            if prefix == 0:  # send/recv: the slot is the user's tag
                self.p2p.on_event(conn, ev)
                return
            for other in list(self.instances.values()):
                if other.group is conn.group:
                    other.settle_unrooted()
            if prefix not in SUPPORTED:
                kind = KIND_NAMES.get(prefix, "unknown")
                raise ProtocolError(
                    f"collective with slot prefix {prefix} ({kind}) #{tag} on group "
                    f"{conn.group.name!r} is not supported by the Gloo dialect yet"
                )
            inst = self.instances[key] = Instance(self, conn.group, ev.slot)
        inst.feed(conn, ev)

    def on_connected(self, conn: Conn) -> None:
        """A pair opened: post the receives instances created before it could not."""
        for inst, msgs in self.unposted.pop((conn.group.name, conn.real, conn.emu), ()):
            inst._post(conn, msgs)

    def on_meta(self, group: str, slot: int, numel: int | None, elem: int = 1) -> None:
        """The observer's answer for an allreduce: its element count and size, or None."""
        inst = self.instances.get((group, slot))
        if inst is None or inst.schedule is not None:
            return
        if numel is None:
            inst.meta_unavailable()
        else:
            inst.on_meta(numel, elem)

    def on_root(self, group: str, slot: int, root: int | None) -> None:
        """The observer's answer for a broadcast: the root the call named, or None."""
        inst = self.instances.get((group, slot))
        if inst is not None and inst.schedule is None:
            inst.on_root(root)

    def on_input(self, group: str, slot: int, mirror: MirrorInput | None) -> None:
        """The observer's answer for a mirrored instance's input."""
        inst = self.instances.get((group, slot))
        if inst is not None and inst.input_state == "asked":
            inst.on_input(mirror)

    def _complete(self, inst: Instance) -> None:
        inst.completed = True
        del self.instances[(inst.group.name, inst.slot)]
        now = time.monotonic()
        self.publish(
            InstanceRecord(
                inst.group.name,
                inst.tag,
                inst.kind,
                inst.nbytes,
                inst.boundary,
                inst.start,
                now,
                {r: (a, b) for r, (a, b) in inst.rank_times.items()},
                inst.geometry,
                time.thread_time(),
                inst.predicted,
            )
        )

    def publish(self, rec: InstanceRecord) -> None:
        """A finished instance (or point-to-point message) goes to the controller's records."""
        if self.on_complete:
            self.on_complete(rec)

    def pending(self) -> list[str]:
        """Instances in flight, with how many boundary messages each still waits for.
        Read from other threads: list() copies the values in one step under the GIL."""
        return [
            f"{i.name()}: {i.remaining} of {i.boundary} boundary messages left" for i in list(self.instances.values())
        ] + self.p2p.pending_summary()
