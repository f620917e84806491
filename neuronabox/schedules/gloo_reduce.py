"""Gloo's reduce as a pure schedule (pytorch/gloo: reduce.cc): the allreduce's leftward
ring, one phase longer, then every chunk to the root (neuronabox/schedules/gloo.py has
the schedules it builds on)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .gloo import MAX_SEGMENT_BYTES, Link, MirrorPlan, Msg, RealRanks, RingAllreduce, RingGeometry, SendRef, round_up
from .kinds import Kind


def reduce_geometry(world: int, total: int, elem: int, max_segment: int = MAX_SEGMENT_BYTES) -> RingGeometry:
    """gloo::reduce sizes its segments from the tensor first (at most half a rank's
    share), then counts them (at least 2W, a multiple of W)."""
    max_seg = elem * max(1, max_segment // elem)
    seg = round_up(min((total + 2 * world - 1) // (2 * world), max_seg), elem)
    num = round_up(max((total + seg - 1) // seg, 2 * world), world)
    return RingGeometry(world, total, num, seg)


def ring_geometry(world: int, total: int, elem: int, reduce: bool) -> RingGeometry:
    """The segments of an allreduce's ring, or of a reduce's (`reduce`)."""
    return reduce_geometry(world, total, elem) if reduce else RingGeometry.for_tensor(world, total, elem)


def segments_are_2w(seg: int, reduce: bool) -> bool:
    """Whether a ring whose full segment is `seg` bytes has exactly 2W segments: an
    allreduce's does when seg <= 2/3 of the maximum, a reduce's when it is under it."""
    return seg < MAX_SEGMENT_BYTES if reduce else seg <= MAX_SEGMENT_BYTES * 2 // 3


# Element sizes by the names c10 and PyTorch's flight recorder give dtypes, which the
# observer's answers carry.
ELEM_SIZES = {
    "Float": 4,
    "Double": 8,
    "Half": 2,
    "BFloat16": 2,
    "Char": 1,
    "Byte": 1,
    "Short": 2,
    "Int": 4,
    "Long": 8,
    "Bool": 1,
}


def one_fitting(sizes: Iterable[tuple[int, str]], world: int, wire: int) -> tuple[int, str] | None:
    """Of allreduce sizes (element count, dtype name), the one whose ring has the segments
    the wire carried (`wire`), if exactly one does (a DDP model's buckets, by their frames)."""
    if not wire:
        return None
    fit = {
        (n, d) for n, d in sizes if d in ELEM_SIZES and fits_wire(world, n * ELEM_SIZES[d], ELEM_SIZES[d], False, wire)
    }
    return fit.pop() if len(fit) == 1 else None


def fits_wire(world: int, total: int, elem: int, reduce: bool, wire: int) -> bool:
    """Whether a ring of `total` bytes in elements of `elem` has the segments a real rank's
    frames carry (`wire`: the longest so far, 0 if none). A told or recorded size that does
    not fit belongs to another collective (an observer's tag bookkeeping gone astray). A
    reduce's frames may include its gather to the root, a rank's whole chunk."""
    if not wire:
        return True
    geo = ring_geometry(world, total, elem, reduce)
    if reduce:
        return wire <= geo.per_rank * geo.segment_bytes
    whole = geo.total >= (geo.num_segments - 1) * geo.segment_bytes  # every block-start segment is full
    return wire <= geo.segment_bytes and (not whole or wire == geo.segment_bytes)


def size_on_wire(world: int, seg: int, reduce: bool) -> bool:
    """Whether a ring's tensor size follows from its full segment `seg` as it crosses the
    wire: 2W segments, none of them empty, so only the last one's length is open (read off
    the wire when it comes). Otherwise the size is the call's alone: the controller's shape
    inference asks the observer, and the observer tells it as the call enters."""
    return segments_are_2w(seg, reduce) and seg >= 8 * 2 * world


class RingReduce(RingAllreduce):
    """gloo::reduce: iterations i < numSegments-2 move segments leftward exactly like
    allreduce's reduce-scatter (rank x sends to x-1 what it received per_rank steps
    before, plus its own), so chunk c is complete on rank c; then, at step `gather_step`,
    every rank but the root sends its chunk (per_rank segments) to the root.

    The root is not on the wire until the gather: `root=None` leaves the gather out,
    and `with_root` adds it once a real rank's first gather frame names it.
    """

    kind = Kind.REDUCE

    def __init__(self, geo: RingGeometry, root: int | None = None) -> None:
        super().__init__(geo)
        self.root = root
        self.gather_step = geo.num_segments - 2

    def with_root(self, root: int) -> RingReduce:
        return RingReduce(self.geo, root)

    def _seg(self, rank: int, t: int, recv: bool) -> int:
        g = self.geo
        return ((rank + (2 if recv else 1)) * g.per_rank + t) % g.num_segments

    def _phase_starts(self) -> tuple[int, ...]:
        return (0,)  # one leftward phase until the gather

    def chunk_len(self, rank: int) -> int:
        g = self.geo
        if not g.last_known and rank == g.world - 1:
            return -1
        chunk = g.per_rank * g.segment_bytes
        return max(0, min(chunk, g.total - rank * chunk))

    @property
    def ring_steps(self) -> int:
        return self.gather_step

    def gather_msgs(self, rank: int, recv: bool) -> list[Msg]:
        if self.root is None:
            return []
        if recv:
            if rank != self.root:
                return []
            return [Msg(j, self.gather_step, n) for j in range(self.world) if j != rank and (n := self.chunk_len(j))]
        n = self.chunk_len(rank)
        return [Msg(self.root, self.gather_step, n)] if rank != self.root and n else []

    def sends(self, rank: int) -> Sequence[Msg]:
        return self._msgs(rank, recv=False) + tuple(self.gather_msgs(rank, recv=False))

    def recvs(self, rank: int) -> Sequence[Msg]:
        return self._msgs(rank, recv=True) + tuple(self.gather_msgs(rank, recv=True))

    upstream = None  # its gather's sends carry a chunk of several: origin() one by one

    def origin(
        self, rank: int, step: int, real: RealRanks
    ) -> tuple[list[SendRef], SendRef | tuple[SendRef, ...] | None]:
        if step != self.gather_step:
            return super().origin(rank, step, real)
        # The chunk `rank` holds complete is what the nearest real rank upstream sent of
        # it (emulated ranks add zeros): x's sends of phase k, chunk rank = x + 1 + k.
        x, _ = real.above(rank)
        k = (rank - x - 1) % self.world
        if k > self.world - 2:
            return [], None
        spr = self.geo.per_rank
        refs = tuple((x, t) for t in range(k * spr, (k + 1) * spr) if self._has_send(x, t))
        return list(refs), refs or None

    @property
    def reducing_steps(self) -> int:
        return self.gather_step  # every ring receive of a reduce is reduced

    def mirror_plan(self, rank: int, step: int, real: RealRanks) -> MirrorPlan:
        if step != self.gather_step:
            return super().mirror_plan(rank, step, real)
        # The chunk `rank` completes: x's partial sums of it, plus one input per rank
        # from x-1 down to `rank`.
        refs, _ = self.origin(rank, step, real)
        x, d = real.above(rank)
        return MirrorPlan(tuple(refs) or None, d, rank * self.geo.per_rank * self.geo.segment_bytes)

    def free_time(self, hop: Link, work: float = 0.0) -> float:
        """The ring (one edge per pace), then W-1 chunks into the root's link."""
        chunk = self.geo.per_rank * self.geo.segment_bytes
        ring = self.gather_step / 2 * (self.pace(hop) + work)
        return ring + hop.latency + (self.world - 1) * chunk / hop.bandwidth

    def rank_time(self, hop: Link, rank: int, work: float = 0.0) -> float:
        return self.free_time(hop, work)
