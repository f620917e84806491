"""What each message an emulated NCCL rank sends a real rank carries, for any set of real
ranks: the data side of NCCL's ring (nccl.py) that the live controller's relay follows.

The data policy (the echo plan, generalised): an emulated rank contributes the identity of
the reduction, so every op that receives forwards what it received; an op that only sends
(a loop's first) sends zeros, but for an allgather, whose emulated blocks are the mirror
rank's own; a broadcast forwards from its root, which sends zeros if it is emulated. With
one real rank this is `NcclRing.echo_plan` (tested).
"""

from __future__ import annotations

from typing import NamedTuple

from .kinds import Kind
from .nccl import NcclRing, Op


class Source(NamedTuple):
    """Where a message an emulated rank sends a real rank comes from: the `index`-th
    message real rank `rank` sent on the same channel."""

    rank: int
    index: int


def ring_sources(ring: NcclRing, real: list[int] | tuple[int, ...], mirror: int) -> dict[int, dict[int, list]]:
    """What each message that a real rank receives from its emulated predecessor carries,
    per channel, in receive order: a `Source` (bytes a real rank sent, forwarded along the
    emulated ranks unchanged) or None (zeros). Real ranks whose predecessor is real are left
    out: their link is real.

    Closed form, O(1) a message: every ring rank runs the same ops in each loop (on rotated
    blocks), and what a rank receives in the loop's op j its predecessor sent in op j-1. So
    the message left the loop's first op (a send of its own) j hops upstream; if a real rank
    sits d <= j hops up, it is that rank's message of op j-d; otherwise it is an emulated
    rank's own: zeros, or for an allgather the `mirror` rank's own block at the same index.
    A broadcast's message comes from the root, or from a real rank on the way.
    `walk_sources` follows each message hop by hop: the reference this is tested against."""
    members = sorted(set(real))
    w = ring.world
    out: dict[int, dict[int, list]] = {}
    for r in members:
        if (r - 1) % w in members:
            continue
        d = min((r - x) % w or w for x in members)  # the nearest real rank upstream
        up = (r - d) % w
        chans: dict[int, list] = {}
        for ch, ops in ring.program(r).items():
            srcs: list = []
            if ring.kind == Kind.BROADCAST:
                n = sum(len(op.slices) for op in ops if op.recv)
                src = [Source(up, k) for k in range(n)] if d <= (r - ring.root) % w else [None] * n
                chans[ch] = src
                continue
            first_send, loop_start, sent = [], 0, 0
            for o, op in enumerate(ops):
                if op.send and not op.recv:
                    loop_start = o
                first_send.append(sent)
                sent += len(op.slices) if op.send else 0
                if not op.recv:
                    continue
                j = o - loop_start
                for i in range(len(op.slices)):
                    if d <= j:
                        srcs.append(Source(up, first_send[o - d] + i))
                    elif ring.kind == Kind.ALLGATHER:
                        srcs.append(Source(mirror, first_send[loop_start] + i))
                    else:
                        srcs.append(None)
            chans[ch] = srcs
        out[r] = chans
    return out


def walk_sources(ring: NcclRing, real: list[int] | tuple[int, ...], mirror: int) -> dict[int, dict[int, list]]:
    """`ring_sources` the long way: each message followed back one emulated sender at a
    time (O(W) a message). The reference the closed form is checked against."""
    members = set(real)
    w = ring.world
    out: dict[int, dict[int, list]] = {}
    for r in sorted(members):
        if (r - 1) % w in members:
            continue
        chans: dict[int, list] = {}
        for ch, ops in ring.program(r).items():
            send_pos: list[tuple[int, int]] = []  # send index -> (op, slice)
            first_recv: list[int] = []  # op -> its first receive index
            n_recv = 0
            for o, op in enumerate(ops):
                first_recv.append(n_recv)
                if op.recv:
                    n_recv += len(op.slices)
                if op.send:
                    send_pos.extend((o, i) for i in range(len(op.slices)))
            chans[ch] = [_trace(ring, ops, send_pos, first_recv, members, mirror, r, k) for k in range(n_recv)]
        out[r] = chans
    return out


def _trace(ring: NcclRing, ops: list[Op], send_pos, first_recv, members, mirror: int, r: int, k: int):
    """Message `k` that `r` receives, followed back through its emulated senders."""
    w = ring.world
    e = (r - 1) % w
    for _ in range(w):
        if e in members:
            return Source(e, k)
        if ring.kind == Kind.BROADCAST:
            if e == ring.root:
                return None
        else:
            o, i = send_pos[k]
            if not ops[o].recv:
                return Source(mirror, k) if ring.kind == Kind.ALLGATHER else None
            k = first_recv[o] + i
        e = (e - 1) % w
    raise AssertionError("a ring message followed back around the whole ring")
