"""Process groups and their boundary pairs, as the controller sees them."""

from __future__ import annotations

from dataclasses import dataclass

from neuronabox.schedules.gloo import RealRanks

from .dialect import PairCommands


@dataclass
class Group:
    """A process group: its size, which of its ranks are real, and their global ranks."""

    name: str
    world: int
    real: RealRanks  # group ranks
    ranks: tuple[int, ...] = ()  # global rank of each group rank (empty: the default group)

    def global_rank(self, r: int) -> int:
        return self.ranks[r] if self.ranks else r


@dataclass(eq=False)
class Conn:
    """One pair of `group` between real rank `real` and emulated rank `emu`; `pair` is
    the dialect's machine for it."""

    group: Group
    real: int
    emu: int
    pair: PairCommands
