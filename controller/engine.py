"""The engine: collective instances, boundary bitmaps, try-send / try-receive.

It is sans-IO like the dialect: events from real ranks come in through
`on_event`, frames go out through the `emit` callback, and the metadata an
instance may need (an allreduce's tensor size) is asked for through
`request_meta`. One engine serves every process group of a run.
"""

from __future__ import annotations

import time
from collections import deque
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
    Schedule,
    SendRef,
)

from .dialects.gloo.protocol import Data, Event, GlooPair, RecvReady, SendReady
from .dialects.gloo.wire import SlotPrefix, split_slot
from .release import ReleaseTiming

KIND_NAMES = {p.value: p.name.lower() for p in SlotPrefix}
SUPPORTED = {SlotPrefix.ALLREDUCE, SlotPrefix.ALLGATHER, SlotPrefix.BROADCAST, SlotPrefix.BARRIER}


class ProtocolError(Exception):
    """A frame that does not match what the collective's schedule expects."""


@dataclass
class Group:
    """A process group as the controller sees it."""

    name: str
    world: int
    real: RealRanks


@dataclass(eq=False)
class Conn:
    """One Gloo pair between real rank `real` and emulated rank `emu` of `group`."""

    group: Group
    real: int
    emu: int
    pair: GlooPair = field(default_factory=GlooPair)


@dataclass
class InstanceRecord:
    """What the trace keeps of one collective instance."""

    group: str
    tag: int
    kind: str
    nbytes: int
    boundary_messages: int
    start: float
    end: float
    per_rank: dict[int, tuple[float, float]]
    geometry: str
    loop_cpu: float  # CPU seconds of the controller's loop thread when the instance completed
    predicted: float = 0.0  # the delay model's time for the instance on the first real rank


class _PendingSend:
    """An emulated rank's send to a real rank, waiting for its dependencies."""

    __slots__ = ("conn", "msg", "missing", "content", "release", "timed")

    def __init__(self, conn: Conn, msg: Msg, missing: int, content: SendRef | None) -> None:
        self.conn = conn
        self.msg = msg  # from the real rank's point of view: peer = the emulated sender
        self.missing = missing
        self.content = content
        self.release: float | None = None  # when it may leave (None: not asked yet)
        self.timed = False  # a driver timer is set for it


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
        self.meta_state: str | None = None
        self.first_notice: dict[int, list[tuple[Conn, Event]]] = {}
        self.expect_send: dict[tuple[int, int], deque[Msg]] = {}
        self.expect_data: dict[tuple[int, int], deque[Msg]] = {}
        self.expect_recv: dict[tuple[int, int], deque[Msg]] = {}
        self.received: dict[SendRef, bytes] = {}
        self.waiting: dict[SendRef, list[_PendingSend]] = {}
        self.outq: dict[tuple[int, int], deque[_PendingSend]] = {}
        self.remaining = 0
        self.boundary = 0
        self.start = time.monotonic()  # the first real frame: the emulated ranks enter now
        self.rank_times: dict[int, list[float]] = {}
        self.timeline = None
        self.predicted = 0.0

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
        elif self.prefix == SlotPrefix.ALLREDUCE:
            sched = self._resolve_allreduce()
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
        root = 0 if 0 in cands else min(cands)
        self.geometry = f"root={root}" + ("" if len(cands) == 1 else " (inferred)")
        self.nbytes = nbytes
        return BinomialBroadcast(w, root, nbytes)

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

    def _resolve_allreduce(self) -> Schedule | None:
        """Segmentation from the wire when it is certain, else from the observer.

        The first notice of each direction is a block-start segment, so its length
        L is a full segment. With L <= 2/3 of the maximum segment the ring has 2W
        segments, and with L >= 8 bytes x 2W none of them is empty, so only the
        last segment's length is open and it is read off the wire when it comes.
        Otherwise the tensor size is not on the wire: the observer is asked.
        """
        if self.meta_state == "requested":
            return None  # the observer's answer installs the schedule
        lens = [e.length for evs in self.first_notice.values() for _, e in evs if not isinstance(e, Data)]
        seg = max(lens)
        w = self.group.world
        certain = seg <= MAX_SEGMENT_BYTES * 2 // 3 and seg >= 8 * 2 * w
        if not certain and self.meta_state is None and self.engine.request_meta is not None:
            self.meta_state = "requested"
            if self.engine.request_meta(self.group.name, self.tag, self.buffered[0][0].real):
                return None
            self.meta_state = "unavailable"
        num = 2 * w if seg <= MAX_SEGMENT_BYTES * 2 // 3 else 3 * w
        geo = RingGeometry(w, num * seg, num, seg, last_known=False)
        self.geometry = f"segments={num}x{seg} ({'wire' if certain else 'guessed from the wire'})"
        self.nbytes = geo.total
        return RingAllreduce.of(geo)

    def on_meta(self, numel: int, elem: int) -> None:
        geo = RingGeometry.for_tensor(self.group.world, numel * elem, elem)
        self.geometry = f"segments={geo.num_segments}x{geo.segment_bytes} (observer)"
        self.nbytes = geo.total
        self.meta_state = "answered"
        self._install(RingAllreduce.of(geo))

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
        for r in g.real.sorted:
            for m in sched.sends(r):
                if m.peer not in g.real:
                    self.expect_send.setdefault((r, m.peer), deque()).append(m)
                    self.boundary += 1
            for m in sched.recvs(r):
                if m.peer not in g.real:
                    self.expect_recv.setdefault((r, m.peer), deque()).append(m)
                    self.boundary += 1
        self.remaining = self.boundary
        self._post_receives()
        buffered, self.buffered = self.buffered, []
        for conn, ev in buffered:
            self._dispatch(conn, ev)
        if self.boundary == 0:  # nothing crosses the boundary (otherwise the last _mark completes it)
            self.engine._complete(self)

    def _post_receives(self) -> None:
        """The emulated receivers post every receive the real ranks will send into, at
        once (zero delay): the real rank's data then flows without a round trip, and the
        notices for one pair leave in a single write."""
        for (r, e), q in self.expect_send.items():
            conn = self.engine.conn_of(self.group, r, e)
            if conn is None:  # not connected yet: posted when the pair opens
                self.engine.unposted.setdefault((self.group.name, r, e), []).append((self, list(q)))
                continue
            self._post(conn, q)

    def _post(self, conn: Conn, msgs) -> None:
        """Post receives for `msgs`; the open-length last ring segment gets a whole segment."""
        seg = getattr(getattr(self.schedule, "geo", None), "segment_bytes", 0)
        pair = conn.pair
        self.engine.emit(conn, b"".join(pair.recv_ready(self.slot, m.nbytes if m.nbytes >= 0 else seg) for m in msgs))

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
        if m.nbytes < 0:  # the last ring segment, whose length the wire tells
            if length > self.schedule.geo.segment_bytes:
                raise ProtocolError(self._where(conn, f"{length} bytes exceed the segment size", m.step))
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
            if not q:
                raise ProtocolError(self._unexpected(conn, "NOTIFY_SEND_READY", ev.length, "send"))
            m = self._check_len(conn, q.popleft(), ev.length, "sends")
            self.expect_data.setdefault(key, deque()).append(m)  # its receive is already posted
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
            if not q:
                raise ProtocolError(self._unexpected(conn, "NOTIFY_RECV_READY", ev.length, "recv"))
            m = self._check_len(conn, q.popleft(), ev.length, "receives")
            deps, content = self.schedule.origin(conn.emu, m.step, self.group.real)
            p = _PendingSend(conn, m, 0, content)
            for ref in deps:
                if ref not in self.received:
                    p.missing += 1
                    self.waiting.setdefault(ref, []).append(p)
            self.outq.setdefault(key, deque()).append(p)
            if p.missing == 0:
                self._flush(conn)

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

    def _send(self, p: _PendingSend) -> None:
        n = p.msg.nbytes
        payload = self.received[p.content] if p.content is not None else bytes(n)
        if len(payload) != n:
            what = f"forwarded {len(payload)} bytes into a {n}-byte receive"
            raise ProtocolError(self._where(p.conn, what, p.msg.step))
        self.engine.emit(p.conn, p.conn.pair.send(self.slot, payload))
        self._mark(p.conn.real)

    def _mark(self, real: int) -> None:
        now = time.monotonic()
        self.rank_times.setdefault(real, [now, now])[1] = now
        self.remaining -= 1
        if self.remaining == 0:
            self.engine._complete(self)


class Engine:
    """Routes events to instances keyed by (group, slot) and keeps the counters."""

    def __init__(
        self,
        emit: Callable[[Conn, bytes], None],
        request_meta: Callable[[str, int, int], bool] | None = None,
        on_complete: Callable[[InstanceRecord], None] | None = None,
        conn_of: Callable[[Group, int, int], Conn | None] | None = None,
        timing: ReleaseTiming | None = None,
        call_at: Callable[[float, Callable[[], None]], None] | None = None,
    ) -> None:
        self.emit = emit
        if timing is not None and call_at is None:
            raise ValueError("timed releases need the driver's call_at")
        self.timing = timing
        self.call_at = call_at
        self.conn_of = conn_of or (lambda group, real, emu: None)
        self.unposted: dict[tuple[str, int, int], list[tuple[Instance, list[Msg]]]] = {}
        self.request_meta = request_meta
        self.on_complete = on_complete
        self.instances: dict[tuple[str, int], Instance] = {}
        self.records: list[InstanceRecord] = []
        self.boundary_messages = 0

    def on_event(self, conn: Conn, ev: Event) -> None:
        key = (conn.group.name, ev.slot)
        inst = self.instances.get(key)
        if inst is None:
            prefix, tag, _ = split_slot(ev.slot)
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

    def _complete(self, inst: Instance) -> None:
        del self.instances[(inst.group.name, inst.slot)]
        self.boundary_messages += inst.boundary
        now = time.monotonic()
        rec = InstanceRecord(
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
        self.records.append(rec)
        if self.on_complete:
            self.on_complete(rec)

    def pending(self) -> list[str]:
        """Instances in flight, with how many boundary messages each still waits for.
        Read from other threads: list() copies the values in one step under the GIL."""
        return [
            f"{i.name()}: {i.remaining} of {i.boundary} boundary messages left" for i in list(self.instances.values())
        ]
