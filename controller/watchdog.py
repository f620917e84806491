"""The watchdog: a real rank that makes no progress for the run's timeout ends it.

Progress is what the controller sees of a rank: a boundary message it sent or
received, a collective it finished, an optimizer step its observer reported.
A hung rank (a deadlock, a lost device, a `sleep` nobody meant) would otherwise
keep the run alive forever, since the emulated ranks never give up on it. The
default timeout is the process group's (Gloo's 30 minutes), the limit a real
peer would have waited. Time comes in as an argument; the controller calls
`check` from its loop's periodic tick.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from neuronabox.errors import NeuronaBoxError


class RankStalled(NeuronaBoxError, RuntimeError):
    """A real rank made no progress for the run's timeout."""


class InFlight(Protocol):
    """What the watchdog reads of an instance in flight."""

    def name(self) -> str: ...

    def summary(self) -> str: ...

    def real_ranks_entered(self) -> dict[int, float]: ...  # global rank -> its last boundary time


@dataclass
class Progress:
    last: float  # when the rank was last seen to move
    after: str = ""  # the last collective it finished


class Watchdog:
    """Two kinds of wait: a rank not yet in the default group (`expect`: the emulated
    peers wait for its record, as real peers wait in init_process_group, for the
    timeout), and a rank in it (`watch`: it must keep moving). A rank that leaves the
    group (`leave`: it destroyed it, or its process ended) is watched no more."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout = timeout_s
        self.ranks: dict[int, Progress] = {}  # only ranks whose pairs are open are watched
        self.joining: dict[int, float] = {}  # rank -> since when the emulated peers wait for its record

    def expect(self, rank: int, now: float) -> None:
        """The emulated peers entered init_process_group at `now` and wait for this rank's
        record (a later call, e.g. when the rank's torch.distributed has loaded, moves the start)."""
        if rank not in self.ranks:
            self.joining[rank] = max(self.joining.get(rank, now), now)

    def watch(self, rank: int, now: float) -> None:
        self.joining.pop(rank, None)
        self.ranks.setdefault(rank, Progress(now))

    def leave(self, rank: int) -> None:
        self.ranks.pop(rank, None)
        self.joining.pop(rank, None)

    def touch(self, rank: int, when: float, finished: str = "") -> None:
        p = self.ranks.get(rank)
        if p is None:
            return
        p.last = max(p.last, when)
        if finished:
            p.after = finished

    def check(self, now: float, in_flight: list[InFlight]) -> str | None:
        """The cause that ends the run, or None while every watched rank moves. A stalled
        rank outside every instance in flight is named before the ranks waiting for it."""
        entered: dict[int, list[tuple[float, InFlight]]] = {}
        for inst in in_flight:
            for rank, last in inst.real_ranks_entered().items():
                entered.setdefault(rank, []).append((last, inst))
        late = [r for r, since in sorted(self.joining.items()) if now - since > self.timeout]
        if late:
            return (
                f"real rank {late[0]} did not join the default process group within {self.timeout:g} s "
                "(it never called init_process_group; --timeout sets the limit)"
            )
        stalled = [
            rank
            for rank, p in sorted(self.ranks.items())
            if now - max([p.last, *(t for t, _ in entered.get(rank, []))]) > self.timeout
        ]
        if not stalled:
            return None
        culprits = [r for r in stalled if r not in entered] or stalled
        rank = culprits[0]
        head = f"real rank {rank} made no progress for {self.timeout:g} s"
        if rank in entered:
            return f"{head}: it is stuck in {max(entered[rank], key=lambda x: x[0])[1].summary()}"
        for inst in in_flight:
            others = sorted(inst.real_ranks_entered())
            if others:
                return f"{head}: it has not entered {inst.name()}, which real rank {others[0]} is in"
        after = self.ranks[rank].after
        where = f"its last collective was {after}" if after else "it finished no collective yet"
        return f"{head} ({where}; --timeout sets the limit)"
