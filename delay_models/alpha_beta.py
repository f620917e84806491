"""Alpha-beta per hop: every link on the path adds its latency; the bytes move at
the path's slowest bandwidth (cut-through switching)."""

from __future__ import annotations

from neuronabox.topology import Topology


class AlphaBeta:
    name = "alpha-beta"

    def __init__(self, topology: Topology) -> None:
        self.topology = topology

    def message_time(self, src: int, dst: int, nbytes: int) -> float:
        path = self.topology.path(src, dst)
        if not path:
            return 0.0
        return sum(link.latency for link in path) + nbytes / min(link.bandwidth for link in path)

    def _worst_hop(self, world: int, distance: int) -> tuple[int, int]:
        """A rank pair at ring distance `distance` whose path is the slowest: one that
        crosses leaf switches, or nodes, when the world spans them."""
        t = self.topology
        rpn, leaf = t.ranks_per_node, t.ranks_per_node * t.nodes_per_switch
        candidates = {src % world for src in (0, rpn, leaf, rpn - 1, leaf - 1, world - 1)}
        pairs = [(src, (src + distance) % world) for src in sorted(candidates)]
        return max(pairs, key=lambda p: (len(t.path(*p)), -min((lc.bandwidth for lc in t.path(*p)), default=0)))

    def collective_time(self, kind: str, nbytes: int, world: int, schedule=None) -> float:
        """Walk the collective's schedule (from `neuronabox.schedules`, passed in by the
        caller: models sit below the schedules) step by step; each step costs its
        slowest message, which in a uniform ring or tree is the slowest hop's."""
        if world <= 1:
            return 0.0
        if schedule is None:
            raise ValueError(f"alpha-beta needs the {kind} schedule to price an instance")
        distance = {"allreduce": -1, "allgather": 1}.get(kind)
        if distance is not None:  # rings: every step is one message to the next rank
            src, dst = self._worst_hop(world, distance)
            return sum(self.message_time(src, dst, m.nbytes) for m in schedule.sends(src))
        if kind in ("broadcast", "barrier"):  # step k: messages at distance 2^k
            levels = sorted({m.step for m in schedule.sends(0)})  # rank 0 (root) sends at every level
            size = nbytes if kind == "broadcast" else 0
            return sum(self.message_time(*self._worst_hop(world, 1 << k), size) for k in levels)
        raise ValueError(f"alpha-beta has no cost for collective kind {kind!r}")
