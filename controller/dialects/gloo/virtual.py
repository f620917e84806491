"""The engine in virtual time: the second driver of the sans-IO core.

The socket driver (driver.py) runs the engine against real ranks on real sockets
and the monotonic clock. This one runs the same engine, the same native pair
machines, release timing and delay models against simulated real ranks, with
time owned by the loop: nothing sleeps, nothing reads a wall clock, and a run is
as long as its events. A simulated real rank speaks the dialect to the engine as
a stock Gloo rank does (receives posted, sends announced, data once its peer's
receive is posted) and runs the schedule's program punctually: a step's send
leaves when the receives it waits for are in and worked on, as an emulated
rank's would (a ring's send waits for the receives up to two steps back; a
tree's or a barrier's for the receives before it). Frames cross between the
pairs at once; the engine's release times are the model's arrivals.

This is what the simulation fallback builds on; it plays one real rank, in the
default group and in any subgroups it belongs to, and the tests hold its end
times to the schedules' closed forms.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from neuronabox.schedules import Kind
from neuronabox.schedules.gloo import Msg, RealRanks, RingAllgather, RingAllreduce, Schedule
from neuronabox.schedules.gloo_pairwise import WIRE, PairwiseAlltoall, RootedPairwise

from ...engine import Conn, Engine, Group, InstanceRecord
from ...release import ReleaseTiming
from .protocol import GLOO, Data, GlooPair, RecvReady
from .wire import SlotPrefix, make_slot

PREFIX_OF_KIND = {Kind[p.name]: p for p in SlotPrefix}


class VirtualLoop:
    """Time and timers: `call_at` queues, `run` advances `now` from event to event."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()

    def call_at(self, when: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self._heap, (max(when, self.now), next(self._seq), fn))

    def run(self, until: float = math.inf) -> None:
        while self._heap and self._heap[0][0] <= until:
            when, _, fn = heapq.heappop(self._heap)
            self.now = when
            fn()


@dataclass
class SimulatedRank:
    """One real rank's side of one instance, played punctually from its schedule."""

    rank: int  # in its group
    schedule: Schedule
    slot: int
    entry: float
    work: float  # an emulated rank's work per edge: the punctual real rank does the same
    meta: tuple[int, int] | None = None  # what the observer would say of an allreduce: (numel, elem)
    on_done: Callable[[SimulatedRank], None] | None = None
    group: str = "0"
    msg_bytes: int = 0  # a pairwise message's length, which the schedule leaves to the wire (WIRE)
    credits: dict[int, int] = field(default_factory=dict)  # peer -> receives it posted, not yet served
    pending: dict[int, deque] = field(default_factory=dict)  # peer -> announced sends, in order
    done: float | None = None

    def __post_init__(self) -> None:
        def sized(m: Msg) -> Msg:  # a pairwise message's length is the wire's: the recorded one
            return m if m.nbytes != WIRE else Msg(m.peer, m.step, self.msg_bytes)

        self.sends = [sized(m) for m in self.schedule.sends(self.rank)]
        self.recvs = sorted(map(sized, self.schedule.recvs(self.rank)), key=lambda m: m.step)
        self._recv_steps = [m.step for m in self.recvs]
        self._expect: dict[int, deque[int]] = {}  # peer -> its receive steps, in order (FIFO per pair)
        for m in self.recvs:
            self._expect.setdefault(m.peer, deque()).append(m.step)
        self.arrived: dict[int, float] = {}  # receive step -> when its data came
        self._prefix: list[float] = []  # latest arrival among the first k receives (in step order)
        # A ring's send waits for the receive two steps back, a tree's or a barrier's for the
        # ones before it; a pairwise collective posts every send at entry.
        pairwise = isinstance(self.schedule, (RootedPairwise, PairwiseAlltoall))
        self._lag = 2 if isinstance(self.schedule, (RingAllreduce, RingAllgather)) else (1 << 30 if pairwise else 1)

    def got(self, peer: int, when: float) -> None:
        """Data from `peer`: its oldest receive not yet served."""
        step = self._expect[peer].popleft()
        self.arrived[step] = when
        steps, prefix = self._recv_steps, self._prefix
        while len(prefix) < len(steps) and steps[len(prefix)] in self.arrived:
            arrival = self.arrived[steps[len(prefix)]]
            prefix.append(max(prefix[-1], arrival) if prefix else arrival)

    def ready(self, step: int) -> float | None:
        """When the send at `step` may leave, or None while a receive it waits for is out:
        a ring's send waits for the receives up to two steps back, others' for those
        before it."""
        k = bisect.bisect_right(self._recv_steps, step - self._lag)
        if k > len(self._prefix):
            return None
        return max(self.entry, self._prefix[k - 1] + self.work) if k else self.entry

    @property
    def finished(self) -> bool:
        return len(self.arrived) == len(self.recvs) and not any(self.pending.values())


Key = tuple[str, int]  # (group name, emulated group rank): one pair; or (group name, slot): one instance


class VirtualRun:
    """The engine, the default group and `subgroups` (name -> global ranks, in group
    order; each must hold the real rank), and the real rank simulated, in virtual time.
    Instances may overlap (DDP's buckets do): each is keyed by its group and slot, and
    a group's pairs are shared, as one TCP pair carries every instance between two ranks."""

    def __init__(
        self,
        world: int,
        real: list[int],
        timing: ReleaseTiming | None,
        on_complete: Callable[[InstanceRecord], None] | None = None,
        subgroups: dict[str, tuple[int, ...]] | None = None,
    ) -> None:
        if len(real) != 1:
            raise NotImplementedError("the virtual driver plays one real rank")
        self.loop = VirtualLoop()
        self.rank = real[0]
        self.groups = {"0": Group("0", world, RealRanks(real, world))}
        for name, ranks in (subgroups or {}).items():
            if self.rank not in ranks:
                raise ValueError(f"group {name!r} does not hold the simulated rank {self.rank}")
            mine = ranks.index(self.rank)
            self.groups[name] = Group(name, len(ranks), RealRanks([mine], len(ranks)), tuple(ranks))
        self.conns: dict[Key, Conn] = {}  # (group, emulated peer) -> the engine's side of the pair
        self.mirrors: dict[Key, GlooPair] = {}  # (group, emulated peer) -> the real rank's side
        self.sims: dict[Key, SimulatedRank] = {}  # (group, slot) -> the instance in flight
        self.records: list[InstanceRecord] = []
        self.engine = Engine(
            emit=self._deliver,
            dialect=GLOO,
            request_meta=self._answer_meta,
            on_complete=on_complete or self.records.append,
            conn_of=lambda g, r, e: self.conns.get((g.name, e)),
            timing=timing,
            call_at=self.loop.call_at,
            clock=lambda: self.loop.now,
        )
        self._tags = {name: itertools.count() for name in self.groups}  # each group counts its own

    # -- the engine's side --------------------------------------------------------------
    def _answer_meta(self, group: str, slot: int, real: int, kind: str) -> bool:
        """What the observer would say: an allreduce's element count and size, a
        broadcast's root (answered in the loop, as the observer's reply comes later)."""
        sim = self.sims[group, slot]
        if kind == Kind.BROADCAST:
            root = sim.schedule.root
            self.loop.call_at(self.loop.now, lambda: self.engine.on_root(group, slot, root))
            return True
        if sim.meta is None:
            return False
        numel, elem = sim.meta
        self.loop.call_at(self.loop.now, lambda: self.engine.on_meta(group, slot, numel, elem))
        return True

    def _deliver(self, conn: Conn) -> None:
        """The engine wrote on a pair: the simulated rank reads it at this instant, but
        after the engine's turn ends (as a socket would), never inside it."""
        raw = conn.pair.take()
        self.loop.call_at(self.loop.now, lambda: self._read(conn.group.name, conn.emu, raw))

    def _read(self, group: str, peer: int, raw: bytes) -> None:
        for ev in self.mirrors[group, peer].receive(raw):  # raises on anything Gloo would kill the pair for
            sim = self.sims[group, ev.slot]
            if isinstance(ev, RecvReady):
                sim.credits[peer] = sim.credits.get(peer, 0) + 1
                self._serve(sim, peer)
                self._check_done(sim)
            elif isinstance(ev, Data):
                sim.got(peer, self.loop.now)
                self._wake(sim)

    def _say(self, group: str, peer: int) -> None:
        """The simulated rank's queued frames to `peer` reach the engine."""
        conn = self.conns[group, peer]
        for ev in conn.pair.receive(self.mirrors[group, peer].take(), self.loop.now):  # a book takes its own
            self.engine.on_event(conn, ev)

    # -- the simulated rank's side ------------------------------------------------------
    def start(
        self,
        kind: Kind,
        schedule: Schedule,
        at: float,
        work: float = 0.0,
        meta: tuple[int, int] | None = None,
        on_done: Callable[[SimulatedRank], None] | None = None,
        group: str = "0",
        msg_bytes: int = 0,
    ) -> SimulatedRank:
        """The real rank enters a collective of `kind` in `group` at virtual time `at` (not
        before now); `schedule` is over the group's ranks."""
        g = self.groups[group]
        slot = make_slot(PREFIX_OF_KIND[kind], next(self._tags[group]))
        me = g.real.sorted[0]
        sim = self.sims[group, slot] = SimulatedRank(me, schedule, slot, at, work, meta, on_done, group, msg_bytes)
        for m in sim.sends + sim.recvs:
            if (group, m.peer) not in self.conns:
                self.conns[group, m.peer] = Conn(g, me, m.peer, GlooPair())
                self.mirrors[group, m.peer] = GlooPair()
        self.loop.call_at(at, lambda: self._enter(sim))
        return sim

    def _enter(self, sim: SimulatedRank) -> None:
        sim.entry = self.loop.now
        g = sim.group
        for m in sim.recvs:
            self.mirrors[g, m.peer].recv_ready(sim.slot, m.nbytes)
            self._say(g, m.peer)
        for m in sim.sends:
            sim.pending.setdefault(m.peer, deque()).append(m)
            self.mirrors[g, m.peer].send_ready(sim.slot, m.nbytes)
            self._say(g, m.peer)
        self._wake(sim)

    def _wake(self, sim: SimulatedRank) -> None:
        for peer, queue in sim.pending.items():
            if queue:
                self._serve(sim, peer)
        self._check_done(sim)

    def _check_done(self, sim: SimulatedRank) -> None:
        """Everything received and sent: the instance is over for the real rank."""
        if sim.done is None and sim.finished:
            sim.done = max([sim.entry, *sim.arrived.values()])
            del self.sims[sim.group, sim.slot]
            if sim.on_done is not None:
                sim.on_done(sim)

    def _serve(self, sim: SimulatedRank, peer: int) -> None:
        """Send what `peer` has a receive posted for and the program allows by now."""
        queue = sim.pending.get(peer)
        while queue and sim.credits.get(peer):
            m = queue[0]
            when = sim.ready(m.step)
            if when is None:
                return
            if when > self.loop.now:
                self.loop.call_at(when, lambda: self._wake(sim))
                return
            queue.popleft()
            sim.credits[peer] -= 1
            self.mirrors[sim.group, peer].data(sim.slot, bytes(m.nbytes))
            self._say(sim.group, peer)
