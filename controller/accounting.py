"""An instance's accounting: its boundary messages left, each real rank's first and
last boundary time, and the record it leaves in the trace."""

from __future__ import annotations

import time
from collections.abc import Callable

from neuronabox.schedules import Kind

from .outcomes import InstanceRecord


class Accounting:
    def __init__(self, start: float) -> None:
        self.start = start  # the first real frame: the emulated ranks enter now
        self.boundary = 0  # boundary messages the schedule has
        self.remaining = 0  # of those, not yet crossed
        self.rank_times: dict[int, list[float]] = {}  # real rank -> [entered, last crossed]

    def enter(self, real: int, clock: Callable[[], float]) -> None:
        """A real rank's frame: the first one says when it entered the collective (the
        clock is read for that one only)."""
        if real not in self.rank_times:
            now = clock()
            self.rank_times[real] = [now, now]

    def expect(self, n: int = 1, boundary: bool = True) -> None:
        """`n` more messages to cross (`boundary` False: a placeholder, not a message)."""
        self.remaining += n
        if boundary:
            self.boundary += n

    def settle(self, n: int = 1) -> None:
        """Drop `n` placeholders (or what will never cross)."""
        self.remaining -= n

    def crossed(self, real: int, now: float) -> bool:
        """One message crossed between `real` and an emulated peer; True when none is left."""
        self.rank_times[real][1] = now
        self.remaining -= 1
        return self.remaining == 0

    @property
    def done(self) -> bool:
        return self.remaining == 0

    def record(
        self, group: str, tag: int, kind: Kind, nbytes: int, geometry: str, end: float, predicted: float
    ) -> InstanceRecord:
        return InstanceRecord(
            group,
            tag,
            kind,
            nbytes,
            self.boundary,
            self.start,
            end,
            {r: (a, b) for r, (a, b) in self.rank_times.items()},
            geometry,
            time.thread_time(),
            predicted,
        )

    def summary(self, name: str) -> str:
        return f"{name}: {self.remaining} of {self.boundary} boundary messages left"
