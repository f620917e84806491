"""NCCL's ring and double binary tree over the Simple protocol, as pure schedules.

Read from NVIDIA/nccl v2.28.9 (the NCCL that torch 2.11 ships): the device loops
in src/device/{all_reduce,all_gather,reduce_scatter,broadcast}.h, the slice split
of src/device/prims_simple.h, the chunking and channel partition of src/enqueue.cc
(calcCollChunking, scheduleCollTasksToPlan, ncclCollCbdPart in src/include/device.h)
and the trees of src/graph/trees.cc. The rules hold from 2.23 to 2.28; 2.29 raised
the channel partition's cell from 16 KiB to 32 KiB of traffic (`NcclConfig`).

Every rank is alone on its node (the emulated world's shape), so the ring is
0 -> 1 -> ... -> W-1 -> 0 on every channel and a rank's ring index is its rank.

What a schedule answers, per rank and channel: the ordered messages it sends to
its ring successor (or tree peers) and receives from its predecessor, each one
NCCL net message (one isend/irecv of the proxy), with its size in bytes. Empty
slices are 0-byte messages on the wire: NCCL still moves the step. The Simple
receiver never reads the size, so a controller must send exactly this count of
messages, each no larger than the receiver posted (`posted_bytes`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

from .gloo import Link, Work, round_up
from .kinds import Kind

NCCL_STEPS = 8  # slots per connection (src/include/device.h)
DEFAULT_BUFFSIZE = 4 << 20  # NCCL_BUFFSIZE default for Simple
SIMPLE_THREAD_THRESHOLD = 64  # NCCL_SIMPLE_THREAD_THRESHOLD (src/include/comm.h)
RING_KINDS = (Kind.ALLREDUCE, Kind.ALLGATHER, Kind.REDUCE_SCATTER, Kind.BROADCAST)


@dataclass(frozen=True, slots=True)
class NcclConfig:
    """What the real rank's environment pins and the schedule depends on."""

    buffsize: int = DEFAULT_BUFFSIZE  # NCCL_BUFFSIZE (local to the real rank)
    channels: int = 1  # the communicator's channels (NCCL_MIN_NCHANNELS = NCCL_MAX_NCHANNELS)
    min_traffic_per_channel: int = 16 << 10  # 16 KiB in 2.23-2.28, 32 KiB from 2.29 (versions.Layout)
    threads: int = 512  # NCCL_NTHREADS, pinned: with the threshold, how far small collectives trim channels
    search_channels: int = 1  # the real rank's tree graph's channels: channels alternate trees in runs of it

    @property
    def step_bytes(self) -> int:
        return self.buffsize // NCCL_STEPS


def ring_steps(kind: Kind) -> tuple[int, int]:
    """(chunkSteps, sliceSteps) of a ring collective under Simple (src/include/collectives.h)."""
    if kind == Kind.BROADCAST:
        return 1, 1
    return NCCL_STEPS // 2, NCCL_STEPS // 4


def wire_elem(kind: Kind, elem: int) -> int:
    """NCCL moves allgather and broadcast as bytes (their count is converted to int8)."""
    return 1 if kind in (Kind.ALLGATHER, Kind.BROADCAST) else elem


def traffic_per_byte(kind: Kind, world: int) -> int:
    """The partition's weight of one byte of count (src/enqueue.cc ncclFuncTrafficPerByte)."""
    if kind == Kind.ALLREDUCE:
        return 2
    if kind in (Kind.ALLGATHER, Kind.REDUCE_SCATTER):
        return world
    return 1


def div_up(a: int, b: int) -> int:
    return -(-a // b)


class Part(NamedTuple):
    """One channel's share of a collective: `count` elements from `offset`, moved in
    chunks of `chunk` elements."""

    channel: int
    offset: int
    count: int
    chunk: int


def channel_parts(kind: Kind, count: int, elem: int, world: int, config: NcclConfig) -> list[Part]:
    """The channel partition of a plan holding this one collective ("cbd": lo, mid and
    hi channels, each a whole number of cells of at least the minimum traffic).

    `count` is per rank for allgather and reduce-scatter, in elements of `elem` bytes.
    """
    if kind in (Kind.ALLGATHER, Kind.BROADCAST):  # moved as bytes
        count, elem = count * elem, 1
    chunk_steps, _ = ring_steps(kind)
    chunk = config.step_bytes * chunk_steps // elem
    n_max = max(1, config.channels)
    if n_max == 1 or count == 0:
        return [Part(0, 0, count, chunk)]
    tpb = traffic_per_byte(kind, world)
    task_nbytes = count * elem * (world if kind in (Kind.ALLGATHER, Kind.REDUCE_SCATTER) else 1)
    n_task = task_channels(task_nbytes, n_max, config)
    traffic = max(config.min_traffic_per_channel, count * elem * tpb)
    per_channel = max(config.min_traffic_per_channel, traffic // n_task)
    cell = round_up(div_up(config.min_traffic_per_channel, tpb), 16)
    per_cell = cell // elem
    cells = div_up(count * elem, cell)
    traffic_per_cell = cell * tpb
    cells_per_channel = min(cells, div_up(per_channel, traffic_per_cell))
    cells_lo = cells if n_max == 1 else min(cells, div_up(per_channel, traffic_per_cell))
    n_mid = (cells - cells_lo) // cells_per_channel
    cells_hi = (cells - cells_lo) % cells_per_channel
    used = (1 if cells_lo else 0) + n_mid + (1 if cells_hi else 0)
    if n_max < used:  # overflow: spread the rest over the channels left
        n_mid = n_max - 2
        cells_per_channel = (cells - cells_lo) // (n_mid + 1)
        cells_hi = cells_per_channel + (cells - cells_lo) % (n_mid + 1)
    if cells_hi == 0 and n_mid != 0:
        cells_hi = cells_per_channel
        n_mid -= 1
    counts = [cells_lo * per_cell] + [cells_per_channel * per_cell] * n_mid
    if cells_hi:
        counts.append(cells_hi * per_cell)
    counts[-1] -= cells * per_cell - count
    parts, offset = [], 0
    for ch, n in enumerate(counts):
        parts.append(Part(ch, offset, n, chunk))
        offset += n
    return parts


def task_channels(nbytes: int, channels: int, config: NcclConfig) -> int:
    """The channels one collective may use (src/enqueue.cc topoGetAlgoInfo, Ring/Tree): one
    fewer while the bytes do not give every thread of every channel its threshold's worth
    (Simple: 64 bytes), never below one. `nbytes` counts every rank's block for allgather
    and reduce-scatter."""
    nc = channels
    while nc >= 2 and nbytes < nc * config.threads * SIMPLE_THREAD_THRESHOLD:
        nc -= 1
    return nc


def slice_sizes(nelem: int, slices_per_chunk: int, steps_per_slice: int, step_elems: int) -> tuple[int, ...]:
    """The messages one primitive op on `nelem` elements sends (prims_simple.h genericOp):
    `slices_per_chunk` slices of at most S elements, the last ones possibly empty."""
    nelem = max(0, nelem)
    size = max(div_up(nelem, 16 * slices_per_chunk) * 16, step_elems * steps_per_slice // 32)
    out, offset = [], 0
    for _ in range(slices_per_chunk):
        n = max(0, min(size, nelem - offset))
        out.append(n)
        offset += n
    return tuple(out)


class Op(NamedTuple):
    """One primitive op of a rank's device loop on one channel: receive `slices` from
    the predecessor (if `recv`), then send the same slices on (if `send`); `block` is
    the data block (ring chunk index, or the rank whose block an allgather moves)."""

    recv: bool
    send: bool
    block: int
    slices: tuple[int, ...]  # bytes of each message


class ChannelMsg(NamedTuple):
    """One net message of a rank on one channel: the `step`-th on its connection to `peer`."""

    channel: int
    peer: int
    step: int
    nbytes: int


class NcclRing:
    """A ring collective (allreduce, allgather, reduce-scatter, broadcast) over Simple.

    `count` is in elements of `elem` bytes: the whole tensor for allreduce and
    broadcast, one rank's block for allgather and reduce-scatter (NCCL's own counts).
    """

    def __init__(
        self, kind: Kind, world: int, count: int, elem: int, root: int = 0, config: NcclConfig | None = None
    ) -> None:
        if kind not in RING_KINDS:
            raise ValueError(f"NCCL's ring has no {kind} schedule here (spoken: {', '.join(RING_KINDS)})")
        if world < 1 or count < 0 or elem < 1 or not 0 <= root < world:
            raise ValueError(f"bad NCCL ring: world {world}, count {count}, elem {elem}, root {root}")
        self.kind = Kind(kind)
        self.world = world
        self.count = count
        self.elem = elem
        self.root = root
        self.config = config or NcclConfig()
        self.wire_elem = wire_elem(self.kind, elem)
        chunk_steps, slice_steps = ring_steps(self.kind)
        self.slices_per_chunk = chunk_steps // slice_steps
        self.steps_per_slice = slice_steps
        self.step_elems = self.config.step_bytes // self.wire_elem
        self._programs: dict[int, dict[int, list[Op]]] = {}

    @cached_property
    def parts(self) -> list[Part]:
        return channel_parts(self.kind, self.count, self.elem, self.world, self.config)

    @property
    def posted_bytes(self) -> int:
        """What the receiving proxy posts per message: sliceSteps steps of the buffer."""
        return self.steps_per_slice * self.config.step_bytes

    def _slices(self, nelem: int) -> tuple[int, ...]:
        e = self.wire_elem
        return tuple(n * e for n in slice_sizes(nelem, self.slices_per_chunk, self.steps_per_slice, self.step_elems))

    def ops(self, rank: int, part: Part) -> list[Op]:
        """The device loop of `rank` on one channel, op by op."""
        w, k = self.world, self.kind
        if w == 1:
            return []
        if k == Kind.ALLREDUCE:
            return self._allreduce_ops(rank, part)
        ops: list[Op] = []
        for base in range(0, part.count, part.chunk):
            n = min(part.chunk, part.count - base)
            sl = self._slices(n)
            if k == Kind.BROADCAST:
                if rank == self.root:
                    ops.append(Op(False, True, base, sl))
                elif (rank + 1) % w == self.root:
                    ops.append(Op(True, False, base, sl))
                else:
                    ops.append(Op(True, True, base, sl))
                continue
            if k == Kind.ALLGATHER:  # own block out, then W-2 forwards, then the last block in
                blocks = [(rank - j) % w for j in range(w)]
            else:  # reduce-scatter: block R-1 out, W-2 reduce-and-forward, own block last
                blocks = [(rank - 1 - j) % w for j in range(w)]
            ops.append(Op(False, True, blocks[0], sl))
            ops.extend(Op(True, True, b, sl) for b in blocks[1:-1])
            ops.append(Op(True, False, blocks[-1], sl))
        return ops

    def _allreduce_ops(self, rank: int, part: Part) -> list[Op]:
        """RingTwice: reduce-scatter then allgather of W chunks per loop; a final partial
        loop spreads what is left over W chunks aligned to 16 bytes."""
        w = self.world
        chunk = part.chunk
        loop = w * chunk
        ops: list[Op] = []
        for base in range(0, part.count, loop):
            rem = part.count - base
            if rem < loop:
                chunk = round_up(div_up(rem, w), max(1, 16 // self.elem))

            def n(c: int, rem: int = rem, chunk: int = chunk) -> tuple[int, ...]:
                return self._slices(min(chunk, rem - c * chunk))

            order = [(rank - 1) % w] + [(rank - j) % w for j in range(2, w)] + [rank]
            order += [(rank - j) % w for j in range(1, w - 1)] + [(rank + 1) % w]
            ops.append(Op(False, True, order[0], n(order[0])))
            ops.extend(Op(True, True, c, n(c)) for c in order[1:-1])
            ops.append(Op(True, False, order[-1], n(order[-1])))
        return ops

    def program(self, rank: int) -> dict[int, list[Op]]:
        """Channel -> ops of `rank`, built once per rank: sends, recvs and the echo plan
        all read it, and at 16384 ranks one allreduce's ops take ~0.1 s to build."""
        if rank not in self._programs:
            self._programs[rank] = {p.channel: self.ops(rank, p) for p in self.parts}
        return self._programs[rank]

    def _msgs(self, rank: int, recv: bool) -> list[ChannelMsg]:
        peer = (rank - 1) % self.world if recv else (rank + 1) % self.world
        out: list[ChannelMsg] = []
        for ch, ops in self.program(rank).items():
            step = 0
            for op in ops:
                if op.recv if recv else op.send:
                    for nbytes in op.slices:
                        out.append(ChannelMsg(ch, peer, step, nbytes))
                        step += 1
        return out

    def sends(self, rank: int) -> list[ChannelMsg]:
        return self._msgs(rank, recv=False)

    def recvs(self, rank: int) -> list[ChannelMsg]:
        return self._msgs(rank, recv=True)

    def echo_plan(self, rank: int) -> list[int | None]:
        """What the emulated predecessor sends `rank`, the one real rank of the ring, in
        `recvs(rank)` order: None for zeros, or the index in `sends(rank)` of the real
        rank's own message whose bytes go back to it.

        - allreduce, emulated ranks contributing zeros: what the real rank reduces is
          zeros; a finished chunk comes back as the bytes the real rank sent for it while
          reducing (its input plus zeros), so it ends with its own input;
        - allgather, mirror: every block is the real rank's, so each receive echoes the
          same slice of the real rank's own block (sent first in every loop);
        - reduce-scatter and broadcast from an emulated root: zeros.
        """
        plan: list[int | None] = []
        sent = 0
        for ops in self.program(rank).values():
            first_send: dict[int, int] = {}  # block -> index of its first slice sent in this loop
            for op in ops:
                if op.send and not op.recv:  # a loop begins with a send-only op
                    first_send = {}
                if op.recv:
                    echo = None
                    if self.kind == Kind.ALLGATHER:
                        echo = next(iter(first_send.values()), None)
                    elif self.kind == Kind.ALLREDUCE:
                        echo = first_send.get(op.block)
                    plan.extend(None if echo is None else echo + i for i in range(len(op.slices)))
                if op.send:
                    first_send.setdefault(op.block, sent)
                    sent += len(op.slices)
        return plan

    # -- timing -----------------------------------------------------------------
    def channel_time(self, part: Part, hop: Link, work: float = 0.0) -> float:
        """Seconds one channel takes with every rank emulated and every hop costing `hop`."""
        if self.kind == Kind.BROADCAST:
            return pipeline_time(self._chunk_sizes(part), self.world - 1, hop, work)
        return ring_walk(self.ops(0, part), hop, work)

    def free_time(self, hop: Link, work: float = 0.0) -> float:
        if self.world <= 1:
            return 0.0
        return max(self.channel_time(p, hop, work) for p in self.parts)

    def rank_time(self, hop: Link, rank: int, work: float = 0.0) -> float:
        """Every rank of a ring ends with the instance (broadcast: its last receive)."""
        if self.kind != Kind.BROADCAST or self.world <= 1:
            return self.free_time(hop, work)
        hops = (rank - self.root) % self.world
        return max(pipeline_time(self._chunk_sizes(p), hops, hop, work) for p in self.parts)

    def _chunk_sizes(self, part: Part) -> list[int]:
        return [sum(op.slices) for op in self.ops(self.root, part)]

    def edge_work(self, work: Work) -> float:
        """One forwarded message: its own cost, plus the reduction of its bytes where
        the op reduces (allreduce's first half, every reduce-scatter op)."""
        if self.kind not in (Kind.ALLREDUCE, Kind.REDUCE_SCATTER):
            return work.message
        share = 0.5 if self.kind == Kind.ALLREDUCE else 1.0
        return work.message + share * min(self.posted_bytes, self.count * self.elem) * work.reduce_per_byte


def ring_walk(ops: list[Op], hop: Link, work: float = 0.0) -> float:
    """One pass over a symmetric ring rank's program: every rank runs the same ops on
    rotated blocks, so the i-th message a rank receives is its predecessor's i-th send,
    which left when this rank's own i-th send did. A send leaves when the link is free
    and, if it forwards, `work` after the receive it forwards arrived; ops run in order.
    Exact when every rank's messages have the same sizes; an allreduce whose last loop
    leaves ragged chunks differs from walking every rank by well under 0.1%."""
    return max(ring_arrivals(ops, hop, work), default=0.0)


def ring_arrivals(ops: list[Op], hop: Link, work: float = 0.0) -> list[float]:
    """When each message a symmetric ring rank receives arrives, in receive order, every
    rank having entered at 0 (`ring_walk`'s walk): the live controller's release times."""
    arrive: list[float] = []
    link_free = ready = 0.0
    got: list[float] = []
    for op in ops:
        for nbytes in op.slices:
            if op.recv:
                at = arrive[len(got)]
                got.append(at)
                ready = max(ready, at + (work if op.send else 0.0))
            if op.send:
                leave = max(ready, link_free)
                link_free = leave + nbytes / hop.bandwidth
                arrive.append(link_free + hop.latency)
    return got


def pipeline_arrivals(sizes: list[int], hops: int, hop: Link, work: float = 0.0) -> list[float]:
    """When each chunk of a pipeline reaches the rank `hops` links down the chain
    (`pipeline_time`'s tandem, chunk by chunk)."""
    if hops <= 0:
        return [0.0] * len(sizes)
    service = [n / hop.bandwidth for n in sizes]
    tail = (hops - 1) * (max(service, default=0.0) + work) + hops * hop.latency
    out, sent = [], 0.0
    for s in service:
        sent += s
        out.append(sent + tail)
    return out


def pipeline_time(sizes: list[int], hops: int, hop: Link, work: float = 0.0) -> float:
    """A chain of `hops` links carrying chunks of `sizes` bytes back to back, each
    forwarded `work` after it arrived: the longest path of the tandem, every chunk
    through the first link and the largest through the others."""
    if hops <= 0 or not sizes:
        return 0.0
    return pipeline_arrivals(sizes, hops, hop, work)[-1]


# ---------------------------------------------------------------------------
# double binary tree (src/graph/trees.cc), one rank per node
# ---------------------------------------------------------------------------
class TreeLinks(NamedTuple):
    """A rank's place in one tree: parent (-1: root) and children (-1: none)."""

    up: int
    down0: int
    down1: int

    @property
    def children(self) -> tuple[int, ...]:
        return tuple(c for c in (self.down0, self.down1) if c != -1)


def btree(nranks: int, rank: int) -> TreeLinks:
    """NCCL's binary tree on ranks: rank 0 is the root with one child (the largest power
    of two below nranks); rank r's parent clears its lowest set bit b and sets 2b (or
    only clears b if that leaves the world); its children are r -/+ b/2, the upper one
    halved towards r until it fits."""
    bit = 1
    while bit < nranks and not bit & rank:
        bit <<= 1
    if rank == 0:
        return TreeLinks(-1, -1, bit >> 1 if nranks > 1 else -1)
    up = (rank ^ bit) | (bit << 1)
    if up >= nranks:
        up = rank ^ bit
    low = bit >> 1
    down0 = rank - low if low else -1
    down1 = rank + low if low else -1
    while down1 >= nranks:
        down1 = rank + low if low else -1
        low >>= 1
    return TreeLinks(up, down0, down1)


def dtree(nranks: int, rank: int) -> tuple[TreeLinks, TreeLinks]:
    """The two trees: the binary tree, and its mirror (even world) or its shift by one
    (odd world), so that a rank that is a leaf in one is inside the other."""
    first = btree(nranks, rank)
    if nranks % 2:
        t = btree(nranks, (rank - 1) % nranks)
        move = lambda r: -1 if r == -1 else (r + 1) % nranks  # noqa: E731
    else:
        t = btree(nranks, nranks - 1 - rank)
        move = lambda r: -1 if r == -1 else nranks - 1 - r  # noqa: E731
    return first, TreeLinks(move(t.up), move(t.down0), move(t.down1))


def tree_depth(nranks: int, which: int) -> int:
    """Hops from the deepest rank to the root of tree `which` (0 or 1)."""
    depth = 0
    for r in range(nranks):
        d, x = 0, r
        while (up := dtree(nranks, x)[which].up) != -1:
            x, d = up, d + 1
        depth = max(depth, d)
    return depth


class NcclTreeAllreduce:
    """Tree allreduce over Simple: per chunk of one buffer step, a rank receives from
    each child, reduces and sends to its parent; concurrently it receives the result
    from its parent and sends it to each child. Channels alternate the two trees in runs
    of the real rank's searched channel count (`NcclConfig.search_channels`); one channel
    carries tree 0 only."""

    kind = Kind.ALLREDUCE

    def __init__(self, world: int, count: int, elem: int, config: NcclConfig | None = None) -> None:
        if world < 1 or count < 0 or elem < 1:
            raise ValueError(f"bad NCCL tree: world {world}, count {count}, elem {elem}")
        self.world = world
        self.count = count
        self.elem = elem
        self.config = config or NcclConfig()

    @cached_property
    def parts(self) -> list[Part]:
        chunk = self.config.step_bytes // self.elem  # chunkSteps = sliceSteps = 1 off the ring
        parts = channel_parts(Kind.ALLREDUCE, self.count, self.elem, self.world, self.config)
        return [p._replace(chunk=chunk) for p in parts]

    @property
    def posted_bytes(self) -> int:
        return self.config.step_bytes

    def tree_of(self, channel: int) -> int:
        """NCCL gives tree 0 to the search's S channels and tree 1 to the next S, then
        repeats that pair up to the pinned count (src/graph/connect.cc connectTrees and
        copyChannels): S comes from the real rank's own graph search."""
        return channel // max(1, self.config.search_channels) % 2

    def links(self, rank: int, channel: int) -> TreeLinks:
        return dtree(self.world, rank)[self.tree_of(channel)]

    def chunks(self, part: Part) -> list[int]:
        """Bytes of each chunk: one message per peer per chunk, never empty."""
        return [min(part.chunk, part.count - b) * self.elem for b in range(0, part.count, part.chunk)]

    def _msgs(self, rank: int, recv: bool) -> list[ChannelMsg]:
        out: list[ChannelMsg] = []
        if self.world == 1:
            return out
        for part in self.parts:
            t = self.links(rank, part.channel)
            peers = list(t.children) + ([t.up] if t.up != -1 else [])
            for peer in peers:
                out.extend(ChannelMsg(part.channel, peer, i, n) for i, n in enumerate(self.chunks(part)))
        return out

    def sends(self, rank: int) -> list[ChannelMsg]:
        """Up to the parent (the reduced chunk) and down to each child (the result)."""
        return self._msgs(rank, recv=False)

    def recvs(self, rank: int) -> list[ChannelMsg]:
        return self._msgs(rank, recv=True)

    def echo_plan(self, rank: int) -> list[int | None]:
        """What the emulated tree peers send `rank`, the one real rank, in `recvs(rank)`
        order, emulated ranks contributing zeros: None (zeros) from each child; from the
        parent, chunk by chunk, the bytes the real rank sent it up (its input plus zeros),
        the index in `sends(rank)`. The root gets only zeros and ends with its input."""
        sends = self.sends(rank)
        up_index = {(m.channel, m.step): i for i, m in enumerate(sends) if m.peer == self._up(rank, m.channel)}
        return [
            up_index[(m.channel, m.step)] if m.peer == self._up(rank, m.channel) else None for m in self.recvs(rank)
        ]

    def _up(self, rank: int, channel: int) -> int:
        return self.links(rank, channel).up

    def free_time(self, hop: Link, work: float = 0.0) -> float:
        """Up the deepest branch and back down, one chunk deep, then the other chunks at
        the pace of the busiest rank: an inner rank moves `fan` chunks per chunk in
        each direction (two children in, two children out)."""
        if self.world <= 1:
            return 0.0
        fan = 2 if self.world > 2 else 1
        times = []
        for part in self.parts:
            sizes = self.chunks(part)
            if not sizes:
                continue
            depth = tree_depth(self.world, self.tree_of(part.channel))
            first = sizes[0] / hop.bandwidth
            times.append(2 * depth * (hop.latency + first + work) - work + fan * sum(sizes[1:]) / hop.bandwidth)
        return max(times, default=0.0)

    def rank_time(self, hop: Link, rank: int, work: float = 0.0) -> float:
        return self.free_time(hop, work)

    def edge_work(self, work: Work) -> float:
        return work.message + min(self.posted_bytes, self.count * self.elem) * work.reduce_per_byte


def nccl_schedule(
    kind: Kind | str,
    world: int,
    count: int,
    elem: int,
    algo: str = "ring",
    root: int = 0,
    config: NcclConfig | None = None,
) -> NcclRing | NcclTreeAllreduce:
    """The schedule NCCL runs for one collective under a pinned algorithm (NCCL_ALGO).

    A barrier is NCCL's allreduce of one float (PyTorch's barrier on NCCL)."""
    kind = Kind(kind)
    if kind == Kind.BARRIER:
        kind, count, elem = Kind.ALLREDUCE, 1, 4
    if algo == "tree":
        if kind != Kind.ALLREDUCE:
            raise ValueError(f"NCCL's tree runs allreduce only, not {kind}")
        return NcclTreeAllreduce(world, count, elem, config)
    if algo != "ring":
        raise ValueError(f"NCCL algorithm {algo!r} is not spoken (ring, tree)")
    return NcclRing(kind, world, count, elem, root, config)
