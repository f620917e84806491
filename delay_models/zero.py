"""The zero-delay model: the emulated network is infinitely fast."""

from __future__ import annotations

from neuronabox.topology import HostWork, LinkClass, Topology

from . import FREE


class ZeroDelay:
    name = "zero"

    def __init__(self, topology: Topology | None = None) -> None:
        self.topology = topology

    @property
    def local_work(self) -> HostWork:
        """None: zero stays zero, whatever the topology says."""
        return HostWork()

    def message_time(self, src: int, dst: int, nbytes: int) -> float:
        return 0.0

    def hop(self, kind: str, nbytes: int, world: int, schedule=None) -> LinkClass:
        return FREE

    def collective_time(self, kind: str, nbytes: int, world: int, schedule=None) -> float:
        return 0.0
