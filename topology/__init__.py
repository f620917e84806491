"""The emulated cluster: nodes, ranks per node, rank-to-node mapping."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Topology:
    nnodes: int
    ranks_per_node: int

    @property
    def world_size(self) -> int:
        return self.nnodes * self.ranks_per_node

    def node_of(self, rank: int) -> int:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside a world of {self.world_size}")
        return rank // self.ranks_per_node

    def ranks_of(self, node: int) -> range:
        return range(node * self.ranks_per_node, (node + 1) * self.ranks_per_node)
