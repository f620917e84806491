"""Delay models: plugins that turn a message or a collective into time.

Models are found through the `neuronabox.delay_models` entry-point group, so a
user's package can add one: a class taking the run's `Topology`, with
`message_time` and `collective_time`. The live engine releases emulated
messages as soon as their dependencies are met, which is exactly the `zero`
model; the release-time scheduler that consults the others is the next step.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Protocol

from neuronabox.topology import Topology

GROUP = "neuronabox.delay_models"


class DelayModel(Protocol):
    name: str

    def message_time(self, src: int, dst: int, nbytes: int) -> float:
        """Seconds one message of `nbytes` takes from rank `src` to rank `dst`."""
        ...

    def collective_time(self, kind: str, nbytes: int, world: int, schedule=None) -> float:
        """Predicted seconds of one collective instance of `nbytes` (the gathered
        total for allgather) over the first `world` ranks. Models that walk the
        algorithm take its `schedule` from the caller (they sit below the schedules)."""
        ...


def available() -> list[str]:
    return sorted(ep.name for ep in entry_points(group=GROUP))


def load(name: str, topology: Topology) -> DelayModel:
    for ep in entry_points(group=GROUP):
        if ep.name == name:
            return ep.load()(topology)
    raise ValueError(f"unknown delay model {name!r}; available: {', '.join(available()) or 'none'}")
