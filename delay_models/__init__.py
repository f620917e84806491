"""Delay models: plugins that turn a message or a collective into time.

Models are found through the `neuronabox.delay_models` entry-point group, so a
user's package can add one: a class taking the run's `Topology` that answers

- `message_time(src, dst, nbytes)`: one message on the path between two ranks;
- `hop(kind, nbytes, world, schedule)`: the link every hop of a collective instance
  is priced at (the release-time scheduler walks the schedule with it);
- `collective_time(kind, nbytes, world, schedule)`: the instance's predicted time;
- `local_work`: the `HostWork` a rank spends on its own (per-message software cost,
  reduction), which release times charge every emulated rank: the topology's
  `work` for the built-in models, none for `zero` (a model without it: none).

Models sit below the schedules: the caller passes the instance's schedule, whose
`free_time(link)` walks the library's algorithm with every rank emulated.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Protocol

from neuronabox.topology import HostWork, LinkClass, Topology

GROUP = "neuronabox.delay_models"
FREE = LinkClass("free", float("inf"), 0.0)


class DelayModel(Protocol):
    name: str

    def message_time(self, src: int, dst: int, nbytes: int) -> float:
        """Seconds one message of `nbytes` takes from rank `src` to rank `dst`."""
        ...

    def hop(self, kind: str, nbytes: int, world: int, schedule) -> LinkClass:
        """The (latency, bandwidth) each hop of this instance costs."""
        ...

    def collective_time(self, kind: str, nbytes: int, world: int, schedule) -> float:
        """Predicted seconds of one collective instance of `nbytes` (the gathered
        total for allgather) over the first `world` ranks."""
        ...

    @property
    def local_work(self) -> HostWork:
        """What one rank spends on its own, which emulated ranks are charged (optional)."""
        ...


def path_time(topology: Topology, src: int, dst: int, nbytes: int) -> float:
    """Alpha-beta on a path: every link adds its latency; the bytes move at the
    slowest link's bandwidth (cut-through switching)."""
    path = topology.path(src, dst)
    if not path:
        return 0.0
    return sum(lc.latency for lc in path) + nbytes / min(lc.bandwidth for lc in path)


class WalksSchedule:
    """For models that price an instance by walking its schedule with their `hop`."""

    name = "model"
    topology: Topology

    @property
    def local_work(self) -> HostWork:
        return self.topology.work

    def collective_time(self, kind: str, nbytes: int, world: int, schedule=None) -> float:
        if world <= 1:
            return 0.0
        if schedule is None:
            raise ValueError(f"{self.name} needs the {kind} schedule to price an instance")
        return schedule.free_time(self.hop(kind, nbytes, world, schedule))


def available() -> list[str]:
    return sorted(ep.name for ep in entry_points(group=GROUP))


def load(name: str, topology: Topology) -> DelayModel:
    for ep in entry_points(group=GROUP):
        if ep.name == name:
            return ep.load()(topology)
    raise ValueError(f"unknown delay model {name!r}; available: {', '.join(available()) or 'none'}")
