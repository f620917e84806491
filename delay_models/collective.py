"""The classic collective cost formulas (Thakur, Rabenseifner and Gropp 2005):
alpha is the per-message latency and beta the bandwidth of the slowest link the
collective crosses; n is the message size in bytes, W the world size.

| kind | algorithm | time |
| --- | --- | --- |
| allreduce | ring | 2(W-1) alpha + 2 (W-1)/W n/beta |
| allreduce | recursive doubling | log2(W) (alpha + n/beta) |
| allgather | ring | (W-1) alpha + (W-1)/W n/beta (n: the gathered total) |
| broadcast | binomial tree | ceil(log2 W) (alpha + n/beta) |
| barrier | dissemination | ceil(log2 W) alpha |
| reduce | ring reduce-scatter, then chunks to the root | W alpha + 2 (W-1)/W n/beta |
| gather, scatter | flat: every message posted at once, the root's link serializes | alpha + (W-1)/W n/beta |
| alltoall | pairwise, every message posted at once | alpha + (W-1)/W n/beta |
| reduce_scatter | ring | (W-1) alpha + (W-1)/W n/beta (n: the whole input) |

NCCL's own formulas (`nccl-ring`, `nccl-tree`; NVIDIA/nccl src/graph/tuning.cc
ncclTopoTuneModel, every rank alone on its node): a ring takes nsteps hops of
latency and moves the bytes at the bus bandwidth scaled by W/nsteps; the double
binary tree climbs and descends log2(W) levels and moves every byte twice.

| kind | nsteps | ring | tree |
| --- | --- | --- | --- |
| allreduce | 2(W-1) | 2(W-1) alpha + 2 (W-1)/W n/beta | 2 floor(log2 W) alpha + 2 n/beta |
| allgather, reduce_scatter | W-1 | (W-1) alpha + (W-1)/W n/beta | (ring) |
| broadcast, reduce | W | W alpha + n/beta | (ring) |
| barrier | | an allreduce of one float | |

Simplified from tuning.cc: the hardware latencies are the topology's alpha, not NCCL's
per-algorithm constants; a ring broadcast always pays W alphas (NCCL pays one when all
channels share a ring); the ring allreduce's latency plateau factors are left out.
"""

from __future__ import annotations

import math

from neuronabox.topology import HostWork, LinkClass, Topology

from neuronabox.schedules import Kind

from . import FREE, path_time

FORMULAS = ("classic", "nccl-ring", "nccl-tree")


class CollectiveFormulas:
    name = "collective"

    def __init__(self, topology: Topology, allreduce: str = "ring", formulas: str = "classic") -> None:
        if formulas not in FORMULAS:
            raise ValueError(f"unknown collective formulas {formulas!r}; known: {', '.join(FORMULAS)}")
        self.topology = topology
        self.allreduce = allreduce
        self.formulas = formulas
        if formulas != "classic":
            self.name = formulas

    @property
    def local_work(self) -> HostWork:
        return self.topology.work

    def _links(self, world: int) -> list[LinkClass]:
        """The links the slowest path of a `world`-rank collective crosses."""
        t = self.topology
        if world <= t.ranks_per_node:
            return [t.intra]
        if world <= t.ranks_per_node * t.nodes_per_switch:
            return [t.inter] * 2
        return [t.inter] * (2 * t.switch_tiers)

    def _alpha_beta(self, world: int) -> tuple[float, float]:
        links = self._links(world)
        return sum(lc.latency for lc in links), min(lc.bandwidth for lc in links)

    def message_time(self, src: int, dst: int, nbytes: int) -> float:
        return path_time(self.topology, src, dst, nbytes)

    def hop(self, kind: str, nbytes: int, world: int, schedule=None) -> LinkClass:
        """The formula spread over the schedule's steps: the formula's (alpha, beta),
        scaled so that walking the schedule with it takes exactly the formula's time."""
        if world <= 1:
            return FREE
        a, b = self._alpha_beta(world)
        link = LinkClass("hop", b, a)
        walked = schedule.free_time(link) if schedule is not None else 0.0
        if walked <= 0:
            return link
        s = self.collective_time(kind, nbytes, world) / walked
        return LinkClass("hop", b / s if s > 0 else float("inf"), a * s)

    def collective_time(self, kind: str, nbytes: int, world: int, schedule=None) -> float:
        if world <= 1:
            return 0.0
        a, b = self._alpha_beta(world)
        w = world
        if self.formulas != "classic" and kind not in (Kind.GATHER, Kind.SCATTER, Kind.ALLTOALL):
            return self._nccl_time(kind, nbytes, w, a, b)
        if kind == Kind.ALLREDUCE:
            if self.allreduce == "recursive-doubling":
                return math.log2(w) * (a + nbytes / b)
            return 2 * (w - 1) * a + 2 * (w - 1) / w * nbytes / b
        if kind == Kind.ALLGATHER:
            return (w - 1) * a + (w - 1) / w * nbytes / b
        if kind == Kind.BROADCAST:
            return math.ceil(math.log2(w)) * (a + nbytes / b)
        if kind == Kind.BARRIER:
            return math.ceil(math.log2(w)) * a
        if kind == Kind.REDUCE:
            return w * a + 2 * (w - 1) / w * nbytes / b
        if kind in (Kind.GATHER, Kind.SCATTER, Kind.ALLTOALL):
            return a + (w - 1) / w * nbytes / b
        if kind == Kind.REDUCE_SCATTER:
            return (w - 1) * a + (w - 1) / w * nbytes / b
        raise ValueError(f"no cost formula for collective kind {kind!r}")

    def _nccl_time(self, kind: str, nbytes: int, w: int, a: float, b: float) -> float:
        """NCCL's tuning model: latency per step, bytes at the bus bandwidth; where the
        links say how NCCL's low-latency protocols use them, the faster of the two, as
        NCCL's tuner picks a protocol by size."""
        steps, moved = nccl_terms(self.formulas, kind, w, nbytes)
        t = steps * a + moved / b
        small = self._small_alpha_beta(w)
        return t if small is None else min(t, steps * small[0] + moved / small[1])

    def _small_alpha_beta(self, world: int) -> tuple[float, float] | None:
        """`_alpha_beta` under the low-latency protocols (None: no link says)."""
        if self.topology.intra.small is None and self.topology.inter.small is None:
            return None
        links = [lc.small or lc for lc in self._links(world)]
        return sum(lc.latency for lc in links), min(lc.bandwidth for lc in links)


def nccl_terms(formulas: str, kind: str, w: int, nbytes: int) -> tuple[float, float]:
    """NCCL's formula for `kind` over `w` ranks as (steps, bytes over the link): its time is
    steps x alpha + bytes / beta (linear in both, so `calibrate --from-nccl-tests` fits them)."""
    if kind == Kind.BARRIER:
        kind, nbytes = Kind.ALLREDUCE, 4
    if kind == Kind.ALLREDUCE and formulas == "nccl-tree":
        return 2 * (w.bit_length() - 1), 2 * nbytes
    if kind == Kind.ALLREDUCE:
        nsteps = 2 * (w - 1)
    elif kind in (Kind.ALLGATHER, Kind.REDUCE_SCATTER):
        nsteps = w - 1
    elif kind in (Kind.BROADCAST, Kind.REDUCE):
        nsteps = w
    else:
        raise ValueError(f"no NCCL formula for collective kind {kind!r}")
    return nsteps, nbytes * nsteps / w  # the bytes at the bus bandwidth: algbw x nsteps / w


def nccl_ring(topology: Topology) -> CollectiveFormulas:
    """The `nccl-ring` delay model: NCCL's ring formulas (NCCL_ALGO=Ring)."""
    return CollectiveFormulas(topology, formulas="nccl-ring")


def nccl_tree(topology: Topology) -> CollectiveFormulas:
    """The `nccl-tree` delay model: NCCL's tree allreduce, its ring for the rest."""
    return CollectiveFormulas(topology, formulas="nccl-tree")
