"""Topology objects: they read like the cluster they describe."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from neuronabox.errors import NeuronaBoxError


class TopologyError(NeuronaBoxError, ValueError):
    """A topology that cannot be used; the message names the field."""


@dataclass(frozen=True)
class LinkClass:
    """One kind of link: `bandwidth` in bytes per second, `latency` in seconds. `small`:
    the same link as NCCL's low-latency protocols (LL, LL128) use it, a lower latency at a
    lower bandwidth; NCCL's formulas then price a collective by whichever is faster, as
    NCCL's tuner picks a protocol by size (None: one protocol)."""

    name: str
    bandwidth: float
    latency: float
    small: LinkClass | None = None

    def time(self, nbytes: int) -> float:
        return self.latency + nbytes / self.bandwidth


@dataclass(frozen=True)
class HostWork:
    """The local work of one rank, which an emulated rank is charged so that it keeps a
    real rank's pace: `message` seconds of software cost per message (its send and its
    receive together), and the `reduce_bandwidth` in bytes per second at which a rank
    folds a received segment into its own (inf: free)."""

    message: float = 0.0
    reduce_bandwidth: float = math.inf

    def __post_init__(self) -> None:
        if not self.message >= 0:
            raise TopologyError(f"local_work.message: must be at least 0 seconds, got {self.message!r}")
        if not self.reduce_bandwidth > 0:
            raise TopologyError(f"local_work.reduce: must be a positive bandwidth, got {self.reduce_bandwidth!r}")

    @property
    def reduce_per_byte(self) -> float:
        """Seconds to reduce one received byte (0 when reducing is free)."""
        return 0.0 if math.isinf(self.reduce_bandwidth) else 1.0 / self.reduce_bandwidth

    def any(self) -> bool:
        """Whether there is work to charge at all."""
        return self.message > 0 or self.reduce_per_byte > 0

    def describe(self) -> str:
        parts = [f"{self.message * 1e6:g} us per message"] if self.message else []
        if self.reduce_per_byte:
            parts.append(f"reduce {self.reduce_bandwidth / 1e9:g} GB/s")
        return ", ".join(parts)


@dataclass(frozen=True)
class Topology:
    """`nnodes` nodes of `ranks_per_node` ranks. Ranks of one node talk over `intra`;
    nodes hang off leaf switches of `nodes_per_switch` ports, and `switch_tiers`
    tiers above connect the leaves, every hop an `inter` link. `work`: what a rank
    spends on its own per message (none unless the file says so)."""

    name: str
    nnodes: int
    ranks_per_node: int
    intra: LinkClass
    inter: LinkClass
    nodes_per_switch: int = 32
    switch_tiers: int = 2
    work: HostWork = field(default_factory=HostWork)

    def __post_init__(self) -> None:
        for name, value in (
            ("nodes", self.nnodes),
            ("ranks_per_node", self.ranks_per_node),
            ("nodes_per_switch", self.nodes_per_switch),
            ("switch_tiers", self.switch_tiers),
        ):
            if not isinstance(value, int) or value < 1:
                raise TopologyError(f"{name}: must be a whole number of at least 1, got {value!r}")

    @property
    def world_size(self) -> int:
        return self.nnodes * self.ranks_per_node

    def with_nodes(self, nnodes: int, ranks_per_node: int | None = None) -> Topology:
        """The same cluster sized for a run (`--nnodes`, `--nproc-per-node`)."""
        return Topology(
            self.name,
            nnodes,
            ranks_per_node or self.ranks_per_node,
            self.intra,
            self.inter,
            self.nodes_per_switch,
            self.switch_tiers,
            self.work,
        )

    def node_of(self, rank: int) -> int:
        if not 0 <= rank < self.world_size:
            raise TopologyError(f"rank {rank} is outside a world of {self.world_size}")
        return rank // self.ranks_per_node

    def path(self, src: int, dst: int) -> list[LinkClass]:
        """The links a message from rank `src` to rank `dst` crosses, in order."""
        a, b = self.node_of(src), self.node_of(dst)
        if src == dst:
            return []
        if a == b:
            return [self.intra]
        if a // self.nodes_per_switch == b // self.nodes_per_switch:
            return [self.inter, self.inter]  # up to the shared leaf and down
        return [self.inter] * (2 * self.switch_tiers)

    def describe(self) -> str:
        def link(lc: LinkClass) -> str:
            return f"{lc.bandwidth * 8 / 1e9:g} Gb/s ({lc.bandwidth / 1e9:g} GB/s), {lc.latency * 1e6:g} us"

        lines = [
            f"topology {self.name}",
            f"  nodes            {self.nnodes} x {self.ranks_per_node} ranks = {self.world_size} ranks",
            f"  intra-node link  {link(self.intra)}",
            f"  inter-node link  {link(self.inter)}",
            f"  switches         {self.switch_tiers} tier(s), {self.nodes_per_switch} nodes per leaf",
        ]
        if self.work.any():
            lines.append(f"  local work       {self.work.describe()}")
        return "\n".join(lines)
