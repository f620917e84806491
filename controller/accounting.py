"""An instance's accounting: each real rank's first and last boundary time (its
frames before the book, then the book's own), and the record it leaves in the trace.
What is left to cross is the book's (controller/native/book.h)."""

from __future__ import annotations

from collections.abc import Callable

from neuronabox.schedules import Kind

from .outcomes import InstanceRecord


class Accounting:
    def __init__(self, start: float) -> None:
        self.start = start  # the first real frame: the emulated ranks enter now
        self.boundary = 0  # boundary messages the schedule has (the book's count, at the end)
        self.rank_times: dict[int, list[float]] = {}  # real rank -> [entered, last crossed]

    def enter(self, real: int, clock: Callable[[], float]) -> None:
        """A real rank's frame: the first one says when it entered the collective (the
        clock is read for that one only)."""
        if real not in self.rank_times:
            now = clock()
            self.rank_times[real] = [now, now]

    def record(
        self, group: str, tag: int, kind: Kind, nbytes: int, geometry: str, end: float, predicted: float, cpu: float
    ) -> InstanceRecord:
        """`cpu`: the loop's CPU seconds at work so far (`Engine.loop_cpu`)."""
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
            cpu,
            predicted,
        )
