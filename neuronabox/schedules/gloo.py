"""Gloo's CPU algorithms as pure schedules (pytorch/gloo: allreduce.cc ring,
broadcast.cc, allgather.cc, barrier.cc).

A schedule answers, for any rank, the ordered sends and receives it performs
(peer, step, bytes), and, for a send by an emulated rank, which sends of real
ranks it waits for (`deps`) and whose bytes it carries (`content`). Emulated
ranks hold zeros and forward what they receive, so a send's bytes are those of
the nearest real rank upstream on the data path, or zeros when there is none.

Every query costs O(log R) for R real ranks (rings use closed forms of the
distance to the nearest real rank), never O(world).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache, partial
from typing import NamedTuple, Protocol

from .kinds import Kind

MAX_SEGMENT_BYTES = 1 << 20  # Gloo's AllreduceOptions::maxSegmentSize default


class Msg(NamedTuple):
    """One message in a rank's program: to/from `peer`, at `step`, `nbytes` long."""

    peer: int
    step: int
    nbytes: int


SendRef = tuple[int, int]  # (rank, step) of a send
_msg = partial(tuple.__new__, Msg)  # a Msg from a (peer, step, nbytes) tuple, without Python in between


class MirrorPlan(NamedTuple):
    """An emulated message's bytes under the mirror policy (every emulated rank holds
    the mirror source's input): `base` (the bytes of these real sends, or nothing)
    with the input's bytes at `offset` folded in `folds` times by the reduce op.
    `block_for`: the input's block destined for that rank (alltoall), not `offset`."""

    base: SendRef | tuple[SendRef, ...] | None
    folds: int
    offset: int = 0
    block_for: int | None = None


class RealRanks:
    """The sorted set of real ranks, with cyclic nearest-neighbour queries."""

    def __init__(self, ranks: list[int] | tuple[int, ...] | set[int], world: int) -> None:
        self.sorted = sorted(set(ranks))
        self.members = frozenset(self.sorted)
        self.world = world
        # The real rank whose own sends reach an emulated rank first: gathers
        # mirror its block into the blocks of emulated ranks.
        self.mirror = next((x for x in self.sorted if (x + 1) % world not in self.members), self.sorted[0])

    def __contains__(self, rank: int) -> bool:
        return rank in self.members

    def above(self, rank: int) -> tuple[int, int]:
        """Nearest real rank x strictly after `rank` going up the ring, and d = x - rank mod W."""
        i = bisect.bisect_right(self.sorted, rank)
        x = self.sorted[i] if i < len(self.sorted) else self.sorted[0]
        return x, (x - rank) % self.world or self.world

    def below(self, rank: int) -> tuple[int, int]:
        """Nearest real rank x strictly before `rank` going down the ring, and d = rank - x mod W."""
        i = bisect.bisect_left(self.sorted, rank) - 1
        x = self.sorted[i]  # index -1 wraps to the largest
        return x, (rank - x) % self.world or self.world


class Link(Protocol):
    """What a hop costs: `latency` seconds plus bytes over `bandwidth` (topology.LinkClass)."""

    latency: float
    bandwidth: float


class Work(Protocol):
    """What a rank spends on its own (topology.HostWork): `message` seconds per message
    (send and receive together), `reduce_per_byte` seconds per received byte it reduces."""

    @property
    def message(self) -> float: ...

    @property
    def reduce_per_byte(self) -> float: ...


class Schedule(Protocol):
    world: int
    kind: Kind

    def sends(self, rank: int) -> Sequence[Msg]: ...

    def recvs(self, rank: int) -> Sequence[Msg]: ...

    def origin(
        self, rank: int, step: int, real: RealRanks
    ) -> tuple[list[SendRef], SendRef | tuple[SendRef, ...] | None]:
        """For emulated `rank`'s send at `step`: (real sends it waits for, real send(s) whose
        bytes it carries, concatenated; None: zeros)."""
        ...

    def edge_work(self, work: Work) -> float:
        """Seconds of local work an emulated rank spends between a receive and the send
        that depends on it: one edge of the timing DAG (schedules.timing)."""
        ...

    def free_time(self, hop: Link, work: float = 0.0) -> float:
        """Seconds the instance takes when every rank is emulated, every hop costs `hop`
        and every edge `work` (from `edge_work`)."""
        ...

    def rank_time(self, hop: Link, rank: int, work: float = 0.0) -> float:
        """Seconds from entry until `rank` is done, every rank emulated."""
        ...


def round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


# ---------------------------------------------------------------------------
# allreduce: segmented ring (reduce-scatter then allgather on one slot)
# ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RingGeometry:
    """Segmentation of one ring allreduce, exactly as gloo::allreduce computes it."""

    world: int
    total: int  # bytes
    num_segments: int
    segment_bytes: int
    last_known: bool = True  # False: no empty segments, the last one's length is read off the wire

    @classmethod
    def for_tensor(cls, world: int, total: int, elem: int, max_segment: int = MAX_SEGMENT_BYTES) -> RingGeometry:
        max_seg = elem * max(1, max_segment // elem)
        num = round_up(max((total + max_seg - 1) // max_seg, world * 2), world)
        seg = round_up((total + num - 1) // num, elem)
        return cls(world, total, num, seg)

    @property
    def per_rank(self) -> int:
        return self.num_segments // self.world

    @property
    def phase_steps(self) -> int:
        return self.num_segments - self.per_rank

    def seg_len(self, seg: int) -> int:
        """Bytes of segment `seg` (0: skipped; -1: the last one, length not known yet)."""
        return self.seg_lens((seg,))[0]

    def seg_lens(self, segs: Sequence[int]) -> list[int]:
        """`seg_len` of each of `segs`, at once (a large ring's program asks them all)."""
        size, unknown = self.segment_bytes, -1 if self.last_known else self.num_segments - 1
        if size <= 0:
            return [-1 if s == unknown else 0 for s in segs]
        full, rest = divmod(self.total, size)  # segments below `full` are whole, `full` holds the rest
        return [-1 if s == unknown else size if s < full else rest if s == full else 0 for s in segs]


class RingAllreduce:
    """Ring allreduce. Global step t: reduce-scatter for t < P, allgather after (P = phase_steps).

    Rank x at step t sends to x-1 the segment it received at t - per_rank, so a
    segment's bytes move one rank down every `per_rank` steps; its program waits,
    at step t, for the receive and the send of step t-2.
    """

    kind = Kind.ALLREDUCE

    def __init__(self, geo: RingGeometry) -> None:
        self.geo = geo
        self.world = geo.world

    def _seg(self, rank: int, t: int, recv: bool) -> int:
        g = self.geo
        spr, p = g.per_rank, g.phase_steps
        if t < p:
            base = rank + (2 if recv else 1)
            return ((base * spr) + t) % g.num_segments
        base = rank + (1 if recv else 0)
        return ((base * spr) + t - p) % g.num_segments

    @property
    def ring_steps(self) -> int:
        """Steps on the ring: reduce-scatter then allgather."""
        return 2 * self.geo.phase_steps

    def _phase_starts(self) -> tuple[int, ...]:
        """The steps where a phase begins: within one, each step's segment follows the last's."""
        return (0, self.geo.phase_steps)

    def _segs(self, rank: int, recv: bool) -> list[int]:
        """`_seg` of every step, at once: each phase's first from `_seg`, the rest counted on."""
        steps, num, segs = self.ring_steps, self.geo.num_segments, []
        bounds = sorted({b for b in self._phase_starts() if b < steps} | {0}) + [steps]
        for a, b in zip(bounds, bounds[1:], strict=False):
            first, n = self._seg(rank, a, recv), b - a
            while n > 0:  # first, first+1, ... wrapping to 0 at `num`: whole ranges, no arithmetic per step
                run = min(n, num - first)
                segs += range(first, first + run)
                first, n = 0, n - run
        return segs

    def _msgs(self, rank: int, recv: bool) -> tuple[Msg, ...]:
        peer = (rank + 1) % self.world if recv else (rank - 1) % self.world
        lens = self.geo.seg_lens(self._segs(rank, recv))
        return tuple(map(_msg, [(peer, t, n) for t, n in enumerate(lens) if n != 0]))

    def sends(self, rank: int) -> Sequence[Msg]:
        return self._msgs(rank, recv=False)

    def recvs(self, rank: int) -> Sequence[Msg]:
        return self._msgs(rank, recv=True)

    @staticmethod
    @cache
    def of(geo: RingGeometry) -> RingAllreduce:
        """One shared, pure schedule per geometry: DDP repeats its bucket sizes every step."""
        sched = RingAllreduce(geo)
        sched._msgs = cache(sched._msgs)  # type: ignore[method-assign]
        return sched

    def origin(self, rank: int, step: int, real: RealRanks) -> tuple[list[SendRef], SendRef | None]:
        x, d = real.above(rank)
        deps: list[SendRef] = []
        content = None
        data_step = step - d * self.geo.per_rank
        if data_step >= 0:
            content = (x, data_step)
            deps.append(content)
        wait_step = step - 2 * d  # the program-order wave: recv of t-2 at every hop
        if wait_step >= 0 and wait_step != data_step and self._has_send(x, wait_step):
            deps.append((x, wait_step))
        return deps, content

    def upstream(self, rank: int, steps: Sequence[int], real: RealRanks) -> tuple[int, list[int], list[int]]:
        """`origin` of emulated `rank`'s sends at `steps`, at once (a new shape's whole program):
        (x, data, wait), x the nearest real rank upstream; each send carries and waits for x's
        send at `data` and waits for x's send at `wait` too (-1: none)."""
        x, d = real.above(rank)
        shift, sent = d * self.geo.per_rank, {m.step for m in self.sends(x)}
        data = [s - shift if s >= shift else -1 for s in steps]
        wait = [w if (w := s - 2 * d) >= 0 and w != s - shift and w in sent else -1 for s in steps]
        return x, data, wait

    def _has_send(self, rank: int, t: int) -> bool:
        return self.geo.seg_len(self._seg(rank, t, recv=False)) != 0

    @property
    def reducing_steps(self) -> int:
        """Receives before this step are reduced into the receiver's own input."""
        return self.geo.phase_steps

    def mirror_plan(self, rank: int, step: int, real: RealRanks) -> MirrorPlan:
        """What emulated `rank` sends at `step`: the nearest real rank x upstream sent
        the segment at `data_step`, and each rank on the way down to `rank` that got it
        while reducing added its own input; with no real sender in reach, the segment
        holds `step // per_rank + 1` emulated inputs."""
        spr = self.geo.per_rank
        offset = self._seg(rank, step, recv=False) * self.geo.segment_bytes
        x, d = real.above(rank)
        data_step = step - d * spr
        if data_step < 0:
            return MirrorPlan(None, step // spr + 1, offset)
        adds = sum(1 for j in range(d) if data_step + j * spr < self.reducing_steps)
        return MirrorPlan((x, data_step), adds, offset)

    # -- timing: the ring moves in lockstep at the pace of its slowest hop -------------
    steps_per_pace = 2  # Gloo keeps two steps in flight: step t waits for step t-2

    def pace(self, hop: Link) -> float:
        """Seconds per two steps: one hop's latency plus both in-flight segments
        serialized on the link (2 x segment / bandwidth)."""
        return hop.latency + 2 * self.geo.segment_bytes / hop.bandwidth

    def edge_work(self, work: Work) -> float:
        """One edge per pace covers the two steps in flight: two messages, and the
        reduction of two received segments on the ring's reducing share of its steps."""
        steps = self.ring_steps
        reduced = self.reducing_steps / steps if steps else 0.0
        return self.steps_per_pace * (work.message + reduced * self.geo.segment_bytes * work.reduce_per_byte)

    def _arrival(self, hop: Link, step: int, work: float) -> float:
        """When the receive of `step` arrives, every rank emulated: step//2 edges, then one hop."""
        return (step // 2 + 1) * self.pace(hop) + step // 2 * work

    def free_time(self, hop: Link, work: float = 0.0) -> float:
        """The instance's time with every rank emulated: 2P steps, two per pace."""
        steps = self.ring_steps
        return self._arrival(hop, steps - 1, work) if steps else 0.0

    def rank_time(self, hop: Link, rank: int, work: float = 0.0) -> float:
        """When `rank`'s last receive arrives, or its last send leaves (after the receive
        two steps back and one edge of work: a rank whose last segments to receive are
        empty still forwards), whichever is later; a small tensor in a large world leaves
        a rank done before the instance is."""
        recvs, sends = self.recvs(rank), self.sends(rank)
        last_recv = self._arrival(hop, recvs[-1].step, work) if recvs else 0.0
        s = sends[-1].step if sends else 0
        return max(last_recv, s // 2 * (self.pace(hop) + work))


# ---------------------------------------------------------------------------
# allgather: ring, each block in two halves
# ---------------------------------------------------------------------------
class RingAllgather:
    """Ring allgather: send to rank+1, receive from rank-1, 2(W-1) steps of half blocks.

    Emulated ranks' blocks mirror a real rank's block (zeros would break the
    metadata exchanges that ride on allgather, such as DDP's parameter count).
    """

    kind = Kind.ALLGATHER

    def __init__(self, world: int, block_bytes: int) -> None:
        self.world = world
        self.block_bytes = block_bytes
        half = block_bytes // 2
        self.chunks = (half, block_bytes - half)

    def _msgs(self, rank: int, recv: bool) -> list[Msg]:
        if self.block_bytes == 0 or self.world == 1:
            return []
        peer = (rank - 1) % self.world if recv else (rank + 1) % self.world
        return list(map(_msg, [(peer, i, self.chunks[i & 1]) for i in range(2 * (self.world - 1))]))

    def sends(self, rank: int) -> list[Msg]:
        return self._msgs(rank, recv=False)

    def recvs(self, rank: int) -> list[Msg]:
        return self._msgs(rank, recv=True)

    steps_per_pace = 2

    def pace(self, hop: Link) -> float:
        return hop.latency + 2 * self.chunks[1] / hop.bandwidth

    def edge_work(self, work: Work) -> float:
        """Two messages per pace, as in the allreduce; a gathered block is copied, not reduced."""
        return self.steps_per_pace * work.message

    def free_time(self, hop: Link, work: float = 0.0) -> float:
        """W-1 paces: the last of 2(W-1) steps arrives after W-2 edges."""
        paces = self.world - 1
        return paces * self.pace(hop) + max(paces - 1, 0) * work

    def rank_time(self, hop: Link, rank: int, work: float = 0.0) -> float:
        return self.free_time(hop, work) if self.recvs(rank) else 0.0

    def origin(self, rank: int, step: int, real: RealRanks) -> tuple[list[SendRef], SendRef | None]:
        x, d = real.below(rank)
        s = step - 2 * d
        if s < 0:  # the block belongs to an emulated rank: it mirrors a real rank's block
            x, s = real.mirror, step & 1
        return [(x, s)], (x, s)


# ---------------------------------------------------------------------------
# broadcast: binomial tree
# ---------------------------------------------------------------------------
def log2ceil(n: int) -> int:
    return (n - 1).bit_length()


class BinomialBroadcast:
    """Binomial tree over vrank = (rank - root) mod W: at bit i, vrank v < 2^(i+1)
    sends to v + 2^i when bit i of v is clear, or receives from v - 2^i."""

    kind = Kind.BROADCAST

    def __init__(self, world: int, root: int, nbytes: int) -> None:
        self.world = world
        self.root = root
        self.nbytes = nbytes
        self.dim = log2ceil(world)

    def _v(self, rank: int) -> int:
        return (rank - self.root) % self.world

    def _r(self, v: int) -> int:
        return (v + self.root) % self.world

    def parent(self, rank: int) -> tuple[int, int] | None:
        """(parent rank, step at which it sends to `rank`), None for the root."""
        v = self._v(rank)
        if v == 0:
            return None
        h = v.bit_length() - 1
        return self._r(v - (1 << h)), h

    def sends(self, rank: int) -> list[Msg]:
        v = self._v(rank)
        out = []
        for i in range(self.dim):
            if v >= (1 << (i + 1)) or v & (1 << i):
                continue
            if v + (1 << i) < self.world:
                out.append(Msg(self._r(v + (1 << i)), i, self.nbytes))
        return out

    def recvs(self, rank: int) -> list[Msg]:
        p = self.parent(rank)
        return [] if p is None else [Msg(p[0], p[1], self.nbytes)]

    def send_index(self, rank: int, bit: int) -> int:
        """1-based position of the send at `bit` among `rank`'s sends (they share its link)."""
        return bit - (self._v(rank).bit_length() - 1)

    def edge_work(self, work: Work) -> float:
        """A node forwards what it received: one message's cost, nothing reduced."""
        return work.message

    def _arrival(self, hop: Link, v: int, work: float) -> float:
        """When vrank v > 0 gets the data: popcount(v) hops, bitlen(v) messages' worth of
        serialization (the k-th send of a rank waits for the k-1 before it on its link),
        and the work of the popcount(v)-1 forwarders on the way."""
        hops = bin(v).count("1")
        return hops * hop.latency + v.bit_length() * self.nbytes / hop.bandwidth + (hops - 1) * work

    def free_time(self, hop: Link, work: float = 0.0) -> float:
        """The instance ends when the costliest vrank has the data."""
        if self.world < 2:
            return 0.0
        top = self.world - 1
        # The most set bits below `top`: top itself, or top with one set bit cleared and every bit under it set.
        cands = [top] + [(top & ~((2 << i) - 1)) | ((1 << i) - 1) for i in range(top.bit_length()) if top >> i & 1]
        return max(self._arrival(hop, v, work) for v in cands)

    def rank_time(self, hop: Link, rank: int, work: float = 0.0) -> float:
        """A receiver: when the data reaches it; the root: when its last send has left."""
        v = self._v(rank)
        if v == 0:
            return len(self.sends(rank)) * self.nbytes / hop.bandwidth
        return self._arrival(hop, v, work)

    def origin(self, rank: int, step: int, real: RealRanks) -> tuple[list[SendRef], SendRef | None]:
        node = rank
        while True:
            p = self.parent(node)
            if p is None:
                return [], None  # an emulated root broadcasts zeros
            if p[0] in real:
                return [p], p
            node = p[0]

    def mirror_plan(self, rank: int, step: int, real: RealRanks) -> MirrorPlan:
        """Forward a real rank's bytes, or (emulated root) the mirrored input."""
        content = self.origin(rank, step, real)[1]
        return MirrorPlan(content, 0) if content is not None else MirrorPlan(None, 1)


# ---------------------------------------------------------------------------
# barrier: dissemination, zero-byte messages
# ---------------------------------------------------------------------------
class DisseminationBarrier:
    """Round k (d = 2^k < W): receive from rank-d, send to rank+d, then wait both."""

    kind = Kind.BARRIER

    def __init__(self, world: int) -> None:
        self.world = world
        self.rounds = log2ceil(world)

    def sends(self, rank: int) -> list[Msg]:
        return [Msg((rank + (1 << k)) % self.world, k, 0) for k in range(self.rounds)]

    def recvs(self, rank: int) -> list[Msg]:
        return [Msg((rank - (1 << k)) % self.world, k, 0) for k in range(self.rounds)]

    def edge_work(self, work: Work) -> float:
        """A round's send waits for the previous round's receive: one message's cost."""
        return work.message

    def free_time(self, hop: Link, work: float = 0.0) -> float:
        """`rounds` hops, with an edge between each two."""
        return self.rounds * hop.latency + max(self.rounds - 1, 0) * work

    def rank_time(self, hop: Link, rank: int, work: float = 0.0) -> float:
        return self.free_time(hop, work)

    def origin(self, rank: int, step: int, real: RealRanks) -> tuple[list[SendRef], SendRef | None]:
        # Rank x is in the causal past of (rank, round k) through its send at round
        # lowbit(m), m = rank - x (mod W) in [1, 2^k - 1]; sends to real ranks are
        # covered by that real rank's own later sends.
        deps: list[SendRef] = []
        span = (1 << step) - 1
        w = self.world
        for x in real.sorted:
            m = (rank - x) % w
            while 0 < m <= span:
                j = (m & -m).bit_length() - 1
                if (x + (1 << j)) % w not in real:
                    deps.append((x, j))
                m += w
        return deps, None
