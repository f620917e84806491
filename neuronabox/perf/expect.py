"""What each real rank's output holds after one checked collective, under the data
policy (docs/guide.md, "--data zeros|mirror"): what `#wrong` counts against. Pure.

Every rank r fills its input with `value(r)` (small integers, exact in every dtype
at the sizes a reduction reaches here), so a block names the rank it came from; a
broadcast's receivers fill -1, but the mirror source, when the root is emulated (its
buffer is what the emulated root sends under mirror).
With every rank real (`--all-real`) the expectation is the collective's own.
"""

from __future__ import annotations

import math
from functools import reduce as fold

from neuronabox.schedules import Kind
from neuronabox.schedules.gloo import RealRanks

BLOCKED = (Kind.ALLGATHER, Kind.ALLTOALL)  # outputs made of one block per rank


def value(rank: int) -> float:
    return float(rank % 4 + 1)


def mirror_source(world: int, real: list[int]) -> int:
    """The real rank whose inputs the emulated ranks mirror: the schedules' own rule."""
    return RealRanks(real, world).mirror


def contribution(rank: int, world: int, real: list[int], policy: str) -> float | None:
    """What rank `rank` puts into a collective: its own value if real; an emulated rank
    the mirror source's under mirror, nothing (the op's identity) under zeros."""
    if rank in real:
        return value(rank)
    return value(mirror_source(world, real)) if policy == "mirror" else None


def reduced(op: str, world: int, real: list[int], policy: str) -> float:
    parts = [c for r in range(world) if (c := contribution(r, world, real, policy)) is not None]
    if op == "sum":
        return math.fsum(parts)
    if op == "avg":
        return math.fsum(parts) / world
    if op == "prod":
        return fold(lambda a, b: a * b, parts, 1.0)
    return max(parts) if op == "max" else min(parts)


def expected(kind: Kind, op: str, rank: int, world: int, real: list[int], policy: str, root: int) -> list[float] | None:
    """The values of real rank `rank`'s output (one per block for gathers and alltoall,
    one for the rest), or None where the collective leaves nothing defined to check
    (a reduce's non-root ranks)."""
    if kind in (Kind.ALLREDUCE, Kind.REDUCE_SCATTER):
        return [reduced(op, world, real, policy)]
    if kind == Kind.REDUCE:
        return [reduced(op, world, real, policy)] if rank == root else None
    if kind == Kind.BROADCAST:
        if root in real:
            return [value(root)]
        return [value(mirror_source(world, real)) if policy == "mirror" else 0.0]
    if kind == Kind.ALLGATHER:  # an emulated block is the mirror source's under both policies
        return [value(j) if j in real else value(mirror_source(world, real)) for j in range(world)]
    if kind == Kind.ALLTOALL:  # block j of rank r's output comes from rank j
        return [c if (c := contribution(j, world, real, policy)) is not None else 0.0 for j in range(world)]
    return None
