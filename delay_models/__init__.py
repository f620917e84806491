"""Delay models: plugins that turn a message or a collective into time.

Models are found through the `neuronabox.delay_models` entry-point group, so a
user's package can add one. The live engine releases emulated messages as soon
as their dependencies are met, which is exactly the `zero` model; the
release-time scheduler that consults other models arrives with the timing work.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Protocol

GROUP = "neuronabox.delay_models"


class DelayModel(Protocol):
    name: str

    def message_time(self, src: int, dst: int, nbytes: int) -> float:
        """Seconds one message of `nbytes` takes from rank `src` to rank `dst`."""
        ...

    def collective_time(self, kind: str, nbytes: int, world: int) -> float:
        """Predicted seconds of a whole collective instance."""
        ...


def available() -> list[str]:
    return sorted(ep.name for ep in entry_points(group=GROUP))


def load(name: str) -> DelayModel:
    for ep in entry_points(group=GROUP):
        if ep.name == name:
            return ep.load()()
    raise ValueError(f"unknown delay model {name!r}; available: {', '.join(available()) or 'none'}")
