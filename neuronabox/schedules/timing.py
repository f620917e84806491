"""Release times of emulated messages: when each message an emulated rank sends a
real rank arrives there, under a delay model (DESIGN.md, "Timing semantics").

The model, for one collective instance:
- every emulated rank enters at the instance's entry time plus its skew (a straggler);
- every hop of the collective costs the same `Link` (the pace of its slowest link,
  as in the classic analysis of rings and trees);
- every edge from a receive to the send that depends on it costs the receiving
  emulated rank `work` seconds of its own (the schedule's `edge_work`: per-message
  software cost and the reduction of a received segment, calibrated from a real
  rank); a real rank's own work is in its real times;
- an emulated rank's program follows the library's: a ring step waits for the
  receive two steps back, a tree node forwards after its receive and serializes its
  sends on its link, a dissemination round waits for the round before;
- real ranks are inputs: the controller records when each of their boundary
  messages arrived (`real_sent`), and paths through a real rank start there again.

The timelines below answer `arrival` in O(1) amortized (rings: closed forms of the
step and the distance to the nearest real rank upstream) or O(log W) (trees and
dissemination: walks up the tree or over the bits of a distance), never O(W) per
message; under drawn skew a barrier walks each sender's window of ranks once, O(W) per
instance. `reference_arrivals` evaluates the same model over the whole DAG, every
rank and every step, and backs the tests.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from . import _timing
from .gloo import BinomialBroadcast, DisseminationBarrier, Link, RealRanks, RingAllgather, RingAllreduce, Schedule

NEVER = -math.inf


MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def drawn_skew(draws: tuple[float, ...], shift: float, seed: int, rank: int) -> float:
    """The entry delay emulated `rank` draws (--skew): one of `draws`, picked by a hash of
    the seed and the rank (native/ring_timeline.cc computes the same), less `shift`, at
    least 0. O(1), with nothing stored per rank: a world of any size draws lazily."""
    if not draws:
        return 0.0
    h = _splitmix64((seed & MASK64) ^ _splitmix64(rank & MASK64))
    return max(0.0, draws[h % len(draws)] - shift)


@dataclass(frozen=True)
class Entry:
    """When the emulated ranks enter the instance: `t0`, plus `skew[rank]` for stragglers,
    plus, under --skew, a delay each emulated rank draws from `draws` (less `shift`, the
    real rank's own lateness this time; `seed`: the instance's), in every kind of collective.
    `hold_real`: no real rank's send counts before `t0`, for a latency that holds the whole
    collective (`latency=+X,per=collective`): it starts X later for the real ranks too, so
    what they sent on entering, before any emulated message came, waits for the start.
    Their sends after a receive are late already (the receive was)."""

    t0: float
    skew: Mapping[int, float] = field(default_factory=dict)
    draws: tuple[float, ...] = ()
    shift: float = 0.0
    seed: int = 0
    hold_real: bool = False

    def of(self, rank: int) -> float:
        return self.t0 + self.skew.get(rank, 0.0) + drawn_skew(self.draws, self.shift, self.seed, rank)


class Timeline:
    """Arrival times of one instance's emulated-to-real messages.

    `modeled`: the boundary hop is priced by the model (one machine, loopback), so a
    real rank's message reaches its emulated peer one hop after the controller got it,
    and an emulated message is released when it would arrive. Otherwise the link to the
    real rank is itself a cluster link: release when the message would leave.
    """

    def __init__(
        self, schedule: Schedule, hop: Link, entry: Entry, real: RealRanks, modeled: bool = True, work: float = 0.0
    ) -> None:
        self.schedule = schedule
        self.hop = hop
        self.entry = entry
        self.real = real
        self.modeled = modeled
        self.work = work

    def real_sent(self, rank: int, step: int, t: float) -> None:
        """Real `rank`'s boundary send of `step` reached the controller at `t`."""
        raise NotImplementedError

    def arrival(self, emu: int, step: int) -> float:
        """When emulated `emu`'s send of `step` reaches its (real) peer."""
        raise NotImplementedError

    def boundary_cost(self, emu: int, step: int) -> float:
        """The modeled time of the boundary hop itself, which a real link would spend
        (the link only: the sender's local work stays in the release)."""
        raise NotImplementedError

    def release(self, emu: int, step: int) -> float:
        t = self.arrival(emu, step)
        return t if self.modeled else t - self.boundary_cost(emu, step)


# ---------------------------------------------------------------------------------
# rings (allreduce, allgather): two steps in flight, one pace c per two steps
# ---------------------------------------------------------------------------------
def ring_timeline(
    schedule: RingAllreduce | RingAllgather, hop: Link, entry: Entry, real: RealRanks, modeled: bool, work: float
) -> _timing.RingTimeline:
    """A ring's timeline, native (native/ring_timeline.h): it is asked once per emulated
    message, the hottest question on the path. Rank e at distance j downstream of its
    nearest real rank x (the chain x -> ... -> e is all emulated) is ready for step t at

        max( T + min(j-1, t//2) (c+w),                     entries of the chain
             T + skew(q) + (j-i) (c+w),   if j-i <= t//2,  a straggler q at distance i <= j
             A_x(t - 2j) + (j-1) (c+w) + w )                the wave from x

    where A_x(s) is the latest arrival at x's emulated neighbour of x's sends up to
    step s, and every emulated receiver on the way works w before it sends on. Its
    message arrives one pace c later. The delay model's part, c, comes in once here."""
    stragglers = {q: d for q, d in entry.skew.items() if q not in real}
    down = isinstance(schedule, RingAllreduce)  # allreduce data goes to e-1, allgather to e+1
    return _timing.RingTimeline(
        schedule.world, real.sorted, down, entry.t0, schedule.pace(hop), work, modeled, stragglers,
        entry.draws, entry.shift, entry.seed & MASK64, entry.hold_real,
    )  # fmt: skip


# ---------------------------------------------------------------------------------
# binomial broadcast and dissemination barrier, native (native/tree_barrier_timeline.h)
# ---------------------------------------------------------------------------------
def tree_timeline(
    schedule: BinomialBroadcast, hop: Link, entry: Entry, real: RealRanks, modeled: bool, work: float
) -> _timing.TreeTimeline:
    """A broadcast's timeline: a rank forwards after its receive and its work; its k-th
    send leaves after k messages' worth of bytes on its link."""
    return _timing.TreeTimeline(
        schedule.world, schedule.root, real.sorted, entry.t0, hop.latency, schedule.nbytes / hop.bandwidth, work,
        modeled, dict(entry.skew), entry.hold_real, entry.draws, entry.shift, entry.seed & MASK64,
    )  # fmt: skip


def barrier_timeline(
    schedule: DisseminationBarrier, hop: Link, entry: Entry, real: RealRanks, modeled: bool, work: float
) -> _timing.BarrierTimeline:
    """A barrier's timeline: round k waits for round k-1's send and receive (and its work)."""
    stragglers = {q: d for q, d in entry.skew.items() if q not in real}
    return _timing.BarrierTimeline(
        schedule.world, real.sorted, entry.t0, hop.latency, work, modeled, stragglers, entry.hold_real,
        entry.draws, entry.shift, entry.seed & MASK64,
    )  # fmt: skip


# ---------------------------------------------------------------------------------
# one message per pair (gather, scatter, alltoall, point-to-point): nothing to wait for
# ---------------------------------------------------------------------------------
class LagTimeline(Timeline):
    """An emulated rank's message depends on no other rank: it arrives `lag` after the
    sender entered and did the message's work (its place in the sender's or the root's
    queue on the link)."""

    def real_sent(self, rank: int, step: int, t: float) -> None:
        pass

    def arrival(self, emu: int, step: int) -> float:
        return self.entry.of(emu) + self.work + self.schedule.lag(emu, step, self.hop)

    def boundary_cost(self, emu: int, step: int) -> float:
        return self.hop.latency


def timeline_for(
    schedule: Schedule, hop: Link, entry: Entry, real: RealRanks, modeled: bool = True, work: float = 0.0
) -> Timeline | _timing.RingTimeline | _timing.TreeTimeline | _timing.BarrierTimeline:
    """The instance's timeline; `work`: seconds per edge, the schedule's `edge_work`."""
    if hasattr(schedule, "lag"):
        return LagTimeline(schedule, hop, entry, real, modeled, work)
    if isinstance(schedule, (RingAllreduce, RingAllgather)):
        return ring_timeline(schedule, hop, entry, real, modeled, work)
    if isinstance(schedule, BinomialBroadcast):
        return tree_timeline(schedule, hop, entry, real, modeled, work)
    if isinstance(schedule, DisseminationBarrier):
        return barrier_timeline(schedule, hop, entry, real, modeled, work)
    raise TypeError(f"no timeline for {type(schedule).__name__}")


# ---------------------------------------------------------------------------------
# the reference: the same model over the whole DAG
# ---------------------------------------------------------------------------------
def reference_arrivals(
    schedule: Schedule,
    hop: Link,
    entry: Entry,
    real: RealRanks,
    real_sends: Iterable[tuple[int, int, float]],
    modeled: bool = True,
    work: float = 0.0,
) -> dict[tuple[int, int], float]:
    """Arrival of every emulated rank's send to a real rank, {(emu, step): t}, by
    evaluating every rank's every step. `real_sends`: (rank, step, t) of real boundary
    sends; `work`: seconds an emulated receiver spends before a send that depends on it."""
    w = schedule.world
    emulated = [e for e in range(w) if e not in real]
    sent = {(x, s): max(t, entry.t0) if entry.hold_real else t for x, s, t in real_sends}
    out: dict[tuple[int, int], float] = {}
    if isinstance(schedule, (RingAllreduce, RingAllgather)):
        c = schedule.pace(hop)
        upstream = 1 if isinstance(schedule, RingAllreduce) else -1
        steps = 2 * (schedule.geo.phase_steps if isinstance(schedule, RingAllreduce) else w - 1)
        ready = {e: [NEVER] * steps for e in emulated}
        for t in range(steps):
            for e in emulated:
                r = max(entry.of(e), ready[e][t - 1] if t else NEVER)
                if t >= 2:
                    u = (e + upstream) % w
                    if u in real:
                        r = max(r, sent.get((u, t - 2), NEVER) + (c if modeled else 0.0) + work)
                    else:
                        r = max(r, ready[u][t - 2] + c + work)
                ready[e][t] = r
        for e in emulated:
            for m in schedule.sends(e):
                if m.peer in real:
                    out[(e, m.step)] = ready[e][m.step] + c
        return out
    if isinstance(schedule, BinomialBroadcast):
        ser = schedule.nbytes / hop.bandwidth
        ready: dict[int, float] = {}
        order = sorted(range(w), key=lambda r: (r - schedule.root) % w)  # parents before children
        for r in order:
            p = schedule.parent(r)
            t = entry.of(r)
            if p is not None:
                parent, bit = p
                if parent in real:
                    got = sent.get((parent, bit), NEVER) + (hop.latency + ser if modeled else 0.0)
                else:
                    got = ready[parent] + hop.latency + schedule.send_index(parent, bit) * ser
                t = max(t, got + work)
            ready[r] = t
        for e in emulated:
            for m in schedule.sends(e):
                if m.peer in real:
                    out[(e, m.step)] = ready[e] + hop.latency + schedule.send_index(e, m.step) * ser
        return out
    if isinstance(schedule, DisseminationBarrier):
        a = hop.latency
        ready = {e: [entry.of(e)] for e in emulated}
        for k in range(schedule.rounds):
            for e in emulated:
                u = (e - (1 << k)) % w
                got = sent.get((u, k), NEVER) + (a if modeled else 0.0) if u in real else ready[u][k] + a
                ready[e].append(max(ready[e][k], got + work))
        for e in emulated:
            for m in schedule.sends(e):
                if m.peer in real:
                    out[(e, m.step)] = ready[e][m.step] + a
        return out
    raise TypeError(f"no reference for {type(schedule).__name__}")
