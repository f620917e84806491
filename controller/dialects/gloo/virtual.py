"""The engine in virtual time: the second driver of the sans-IO core.

The socket driver (driver.py) runs the engine against real ranks on real sockets
and the monotonic clock. This one runs the same engine, the same native pair
machines, books, release timing and delay models against a simulated real rank,
with time owned by the loop: nothing sleeps, nothing reads a wall clock, and a run
is as long as its events. The simulated rank speaks the dialect to the engine as a
stock Gloo rank does (receives posted, sends announced, data once its peer's
receive is posted) and runs the schedule's program punctually: a step's send leaves
when the receives it waits for are in and worked on, as an emulated rank's would (a
ring's send waits for the receives up to two steps back; a tree's or a barrier's for
the receives before it). Frames cross between the pairs at once; the engine's
release times are the model's arrivals.

Per frame it is native (controller/native/virtual_wire.cc: the loop, the simulated
rank, both pair machines, the books and their timers); Python sets up each instance
(its shape, its book, its record), as in a live run. Each rank program is built once
per shape, as the books' are. This is what the simulation fallback builds on; it
plays one real rank, in the default group and in any subgroups it belongs to, and
the tests hold its end times to the schedules' closed forms.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from neuronabox.schedules import Kind
from neuronabox.schedules.gloo import RealRanks, RingAllgather, RingAllreduce, Schedule
from neuronabox.schedules.gloo_pairwise import WIRE, PairwiseAlltoall, RootedPairwise

from ... import _native
from ...book import ProgramCache
from ...dialect import Event
from ...engine import Conn, Engine, Group, InstanceRecord
from ...release import ReleaseTiming
from .protocol import GLOO, GlooPair
from .wire import SlotPrefix, make_slot

PREFIX_OF_KIND = {Kind[p.name]: p for p in SlotPrefix}
NO_WAIT = _native.NO_WAIT  # a lag this long: a pairwise collective's sends wait for no receive


@dataclass
class SimulatedRank:
    """One instance as the simulated real rank entered it; `done` once it is over for it."""

    kind: Kind
    schedule: Schedule
    slot: int
    group: str
    entry: float
    meta: tuple[int, int] | None = None  # what the observer would say of an allreduce: (numel, elem)
    on_done: Callable[[SimulatedRank], None] | None = None
    done: float | None = None


def rank_program(schedule: Schedule, rank: int, msg_bytes: int) -> _native.RankProgram:
    """`rank`'s side of `schedule` for the native simulated rank: its sends in program
    order, its receives, and how far back a send waits (a ring's send for the receive
    two steps back, a tree's or a barrier's for those before it, a pairwise one's for none)."""

    sends, recvs = schedule.sends(rank), schedule.recvs(rank)
    pairwise = isinstance(schedule, (RootedPairwise, PairwiseAlltoall))
    if pairwise:  # a pairwise message's length is the wire's (WIRE): the recorded one
        sends, recvs = ([m._replace(nbytes=msg_bytes) if m.nbytes == WIRE else m for m in ms] for ms in (sends, recvs))
    lag = 2 if isinstance(schedule, (RingAllreduce, RingAllgather)) else (NO_WAIT if pairwise else 1)
    return _native.RankProgram(sends, recvs, lag)


def shape_of(schedule: Schedule, rank: int, msg_bytes: int) -> Hashable:
    """What a rank program depends on: the schedule's class and public parameters."""
    params = tuple((k, v) for k, v in vars(schedule).items() if not k.startswith("_"))
    return type(schedule), rank, msg_bytes, params


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
        self.rank = real[0]
        self.groups = {"0": Group("0", world, RealRanks(real, world))}
        for name, ranks in (subgroups or {}).items():
            if self.rank not in ranks:
                raise ValueError(f"group {name!r} does not hold the simulated rank {self.rank}")
            mine = ranks.index(self.rank)
            self.groups[name] = Group(name, len(ranks), RealRanks([mine], len(ranks)), tuple(ranks))
        self._group_ids = {name: i for i, name in enumerate(self.groups)}
        self.conns: dict[tuple[str, int], Conn] = {}  # (group, emulated peer) -> the engine's side of the pair
        self._links: dict[tuple[str, int], int] = {}  # the same -> its link on the wire
        self.sims: dict[tuple[str, int], SimulatedRank] = {}  # (group, slot) -> the instance in flight
        self._programs = ProgramCache()  # the simulated rank's program per shape
        self.records: list[InstanceRecord] = []
        self.engine = Engine(
            emit=lambda conn: self.loop.emit(conn),
            dialect=GLOO,
            request_meta=self._answer_meta,
            on_complete=on_complete or self.records.append,
            conn_of=lambda g, r, e: self.conns.get((g.name, e)),
            timing=timing,
            call_at=lambda when, fn: self.loop.call_at(when, fn),
            clock=lambda: self.loop.now,
        )
        # The loop: virtual time, the books' timers and writes, the simulated rank's frames.
        self.loop = _native.VirtualWire(self.engine.core, self._frames)
        self._tags = {name: itertools.count() for name in self.groups}  # each group counts its own

    # -- the engine's side --------------------------------------------------------------
    def _frames(self, conn: Conn, events: list[Event]) -> None:
        """Frames no book takes yet (an instance whose shape is not known): Python's engine."""
        for ev in events:
            self.engine.on_event(conn, ev)

    def _answer_meta(self, group: str, slot: int, real: int, kind: str, world: int = 0, wire: int = 0) -> bool:
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
        before now); `schedule` is over the group's ranks. `work`: an emulated rank's work
        per edge, which the punctual real rank does too."""
        g = self.groups[group]
        slot = make_slot(PREFIX_OF_KIND[kind], next(self._tags[group]))
        me = g.real.sorted[0]
        program = self._programs.kept(shape_of(schedule, me, msg_bytes), lambda: rank_program(schedule, me, msg_bytes))
        links = [self._link(g, me, peer) for peer in program.peers]
        sim = self.sims[group, slot] = SimulatedRank(kind, schedule, slot, group, max(at, self.loop.now), meta, on_done)

        def finished(end: float) -> None:
            sim.done = end
            del self.sims[group, slot]
            if on_done is not None:
                on_done(sim)

        self.loop.start(program, self._group_ids[group], slot, at, work, links, finished)
        return sim

    def _link(self, g: Group, me: int, peer: int) -> int:
        key = (g.name, peer)
        link = self._links.get(key)
        if link is None:
            conn = self.conns[key] = Conn(g, me, peer, GlooPair())
            link = self._links[key] = self.loop.link(self._group_ids[g.name], peer, conn)
        return link
