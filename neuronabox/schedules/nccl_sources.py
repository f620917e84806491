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

    An emulated rank's own allgather block is the `mirror` rank's: its first send of the
    same loop, at the same index (every ring rank runs the same program shape). Tracing
    back one emulated rank at a time is at most one loop of ops deep."""
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
