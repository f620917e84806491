"""Alpha-beta per hop: every link on the path adds its latency; the bytes move at
the path's slowest bandwidth (cut-through switching)."""

from __future__ import annotations

from neuronabox.topology import LinkClass, Topology

from neuronabox.schedules import Kind

from . import FREE, WalksSchedule, path_time

# The rank distances each kind's messages travel: rings talk to a neighbour, trees
# and dissemination at powers of two.
_RING = {Kind.ALLREDUCE: (-1,), Kind.REDUCE: (-1,), Kind.ALLGATHER: (1,)}


class AlphaBeta(WalksSchedule):
    name = "alpha-beta"

    def __init__(self, topology: Topology) -> None:
        self.topology = topology

    def message_time(self, src: int, dst: int, nbytes: int) -> float:
        return path_time(self.topology, src, dst, nbytes)

    def hop(self, kind: str, nbytes: int, world: int, schedule=None) -> LinkClass:
        """The slowest hop the instance's pattern crosses: a ring moves at the pace of
        its slowest neighbour link; a tree or a dissemination round waits for its
        slowest message, one that crosses leaf switches when the world spans them."""
        if world <= 1:
            return FREE
        t = self.topology
        distances = _RING.get(kind) or tuple(1 << k for k in range((world - 1).bit_length()))
        rpn, leaf = t.ranks_per_node, t.ranks_per_node * t.nodes_per_switch
        sources = sorted({s % world for s in (0, rpn - 1, rpn, leaf - 1, leaf, world - 1)})
        paths = [t.path(s, (s + d) % world) for d in distances for s in sources]
        worst = max(paths, key=lambda p: (sum(lc.latency for lc in p), -min((lc.bandwidth for lc in p), default=0)))
        if not worst:
            return FREE
        return LinkClass("hop", min(lc.bandwidth for lc in worst), sum(lc.latency for lc in worst))
