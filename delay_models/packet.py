"""A flow-level network in SimPy: flows that share a link share its bandwidth.

The topology becomes concrete links: every rank has an intra-node port each way,
every node a NIC each way, every leaf switch an uplink and a downlink to the tier
above (non-blocking: the leaf's ports' worth of bandwidth). A flow crosses the
links of its path; active flows get max-min fair rates (progressive filling), and
the rates are recomputed whenever a flow starts or ends. A flow ends when its last
byte has drained plus the path's latency.

For the live engine the model prices a collective's hop by simulating one step of
its pattern, every rank sending at once (a ring keeps two segments in flight on
each link), so congestion at shared NICs and uplinks shows in the pace.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import simpy
from neuronabox.topology import LinkClass, Topology

from neuronabox.schedules import Kind

from . import FREE, WalksSchedule

MAX_SIMULATED_RANKS = 1024  # patterns repeat; one step of a larger world is simulated on this many ranks


@dataclass(frozen=True)
class Flow:
    start: float
    src: int
    dst: int
    nbytes: int


class FlowNetwork:
    """Concrete links of a topology and a SimPy run of flows over them."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology

    def links(self, src: int, dst: int) -> list[tuple[tuple, float]]:
        """(link id, bandwidth) of every link a flow from `src` to `dst` crosses."""
        t = self.topology
        a, b = t.node_of(src), t.node_of(dst)
        if src == dst:
            return []
        if a == b:
            return [(("port-out", src), t.intra.bandwidth), (("port-in", dst), t.intra.bandwidth)]
        out = [(("nic-up", a), t.inter.bandwidth)]
        la, lb = a // t.nodes_per_switch, b // t.nodes_per_switch
        if la != lb:
            trunk = t.inter.bandwidth * t.nodes_per_switch
            out += [(("leaf-up", la), trunk), (("leaf-down", lb), trunk)]
        return out + [(("nic-down", b), t.inter.bandwidth)]

    def run(self, flows: Sequence[Flow]) -> list[float]:
        """Finish time of each flow."""
        env = simpy.Environment()
        done = [0.0] * len(flows)
        env.process(self._fluid(env, flows, done))
        env.run()
        return done

    def _fluid(self, env: simpy.Environment, flows: Sequence[Flow], done: list[float]):
        order = sorted(range(len(flows)), key=lambda i: flows[i].start)
        routes = [self.links(f.src, f.dst) for f in flows]
        latency = [sum(lc.latency for lc in self.topology.path(f.src, f.dst)) for f in flows]
        capacity = {link: bw for route in routes for link, bw in route}
        left: dict[int, float] = {}
        nxt = 0
        while nxt < len(order) or left:
            while nxt < len(order) and flows[order[nxt]].start <= env.now:
                i = order[nxt]
                nxt += 1
                if routes[i] and flows[i].nbytes > 0:
                    left[i] = float(flows[i].nbytes)
                else:
                    done[i] = env.now + latency[i]
            rates = self._max_min(left, routes, capacity)
            horizon = flows[order[nxt]].start - env.now if nxt < len(order) else float("inf")
            finish = min((left[i] / rates[i] for i in left), default=float("inf"))
            dt = min(horizon, finish)
            if dt == float("inf"):
                return
            yield env.timeout(dt)
            for i in list(left):
                left[i] -= rates[i] * dt
                if left[i] <= 1e-6 * flows[i].nbytes:
                    del left[i]
                    done[i] = env.now + latency[i]

    @staticmethod
    def _max_min(left: dict[int, float], routes, capacity) -> dict[int, float]:
        """Progressive filling: raise every unfrozen flow's rate together until a link fills."""
        rates: dict[int, float] = {}
        free = dict(capacity)
        active = set(left)
        while active:
            users: dict[tuple, int] = {}
            for i in active:
                for link, _ in routes[i]:
                    users[link] = users.get(link, 0) + 1
            link = min(users, key=lambda k: free[k] / users[k])
            share = free[link] / users[link]
            frozen = {i for i in active if any(lk == link for lk, _ in routes[i])}
            for i in frozen:
                rates[i] = share
                for lk, _ in routes[i]:
                    free[lk] -= share
            active -= frozen
        return rates


class PacketNetwork(WalksSchedule):
    name = "packet"

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.network = FlowNetwork(topology)
        self._hops: dict[tuple, LinkClass] = {}

    def message_time(self, src: int, dst: int, nbytes: int) -> float:
        return self.network.run([Flow(0.0, src, dst, nbytes)])[0]

    def transfer(self, flows: Sequence[Flow]) -> list[float]:
        """Finish times of flows that run at once and share the links they cross."""
        return self.network.run(flows)

    def _pattern(self, kind: str, world: int) -> list[list[tuple[int, int]]]:
        """The (src, dst) pairs of each distinct step of the kind's algorithm."""
        if kind in (Kind.ALLREDUCE, Kind.REDUCE, Kind.ALLGATHER):
            d = 1 if kind == Kind.ALLGATHER else -1
            return [[(r, (r + d) % world) for r in range(world) for _ in range(2)]]
        return [[(r, (r + (1 << k)) % world) for r in range(world)] for k in range((world - 1).bit_length())]

    def hop(self, kind: str, nbytes: int, world: int, schedule=None) -> LinkClass:
        """The link whose walk of the schedule reproduces the simulated steps: the worst
        path latency, and the bandwidth one flow got in the most congested step."""
        if world <= 1:
            return FREE
        size = _step_bytes(kind, nbytes, world, schedule)
        key = (kind, size, min(world, MAX_SIMULATED_RANKS))
        if key not in self._hops:
            w = key[2]
            worst_lat, worst_rate = 0.0, float("inf")
            for pairs in self._pattern(kind, w):
                lat = max(sum(lc.latency for lc in self.topology.path(s, d)) for s, d in pairs)
                worst_lat = max(worst_lat, lat)
                if size > 0:
                    finish = self.network.run([Flow(0.0, s, d, size) for s, d in pairs])
                    drained = [
                        f - sum(lc.latency for lc in self.topology.path(s, d))
                        for f, (s, d) in zip(finish, pairs, strict=True)
                    ]
                    slowest = max(drained)
                    per_flow = 2 if kind in (Kind.ALLREDUCE, Kind.REDUCE, Kind.ALLGATHER) else 1
                    worst_rate = min(worst_rate, per_flow * size / slowest if slowest > 0 else float("inf"))
            self._hops[key] = LinkClass("hop", worst_rate, worst_lat)
        return self._hops[key]


def _step_bytes(kind: str, nbytes: int, world: int, schedule) -> int:
    """Bytes one rank sends in one step of the instance."""
    if schedule is None:
        return nbytes
    geo = getattr(schedule, "geo", None)
    if geo is not None:
        return geo.segment_bytes
    chunks = getattr(schedule, "chunks", None)
    if chunks is not None:
        return chunks[1]
    return getattr(schedule, "nbytes", 0)
