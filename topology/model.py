"""Topology objects: they read like the cluster they describe."""

from __future__ import annotations

from dataclasses import dataclass


class TopologyError(ValueError):
    """A topology that cannot be used; the message names the field."""


@dataclass(frozen=True)
class LinkClass:
    """One kind of link: `bandwidth` in bytes per second, `latency` in seconds."""

    name: str
    bandwidth: float
    latency: float

    def time(self, nbytes: int) -> float:
        return self.latency + nbytes / self.bandwidth


@dataclass(frozen=True)
class Topology:
    """`nnodes` nodes of `ranks_per_node` ranks. Ranks of one node talk over `intra`;
    nodes hang off leaf switches of `nodes_per_switch` ports, and `switch_tiers`
    tiers above connect the leaves, every hop an `inter` link."""

    name: str
    nnodes: int
    ranks_per_node: int
    intra: LinkClass
    inter: LinkClass
    nodes_per_switch: int = 32
    switch_tiers: int = 2

    def __post_init__(self) -> None:
        for field, value in (
            ("nodes", self.nnodes),
            ("ranks_per_node", self.ranks_per_node),
            ("nodes_per_switch", self.nodes_per_switch),
            ("switch_tiers", self.switch_tiers),
        ):
            if not isinstance(value, int) or value < 1:
                raise TopologyError(f"{field}: must be a whole number of at least 1, got {value!r}")

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

        return "\n".join(
            [
                f"topology {self.name}",
                f"  nodes            {self.nnodes} x {self.ranks_per_node} ranks = {self.world_size} ranks",
                f"  intra-node link  {link(self.intra)}",
                f"  inter-node link  {link(self.inter)}",
                f"  switches         {self.switch_tiers} tier(s), {self.nodes_per_switch} nodes per leaf",
            ]
        )
