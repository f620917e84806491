"""Finished instances whose records wait for the loop's idle turn, oldest first.

The trace holds a real rank's gaps open until every instance it entered is recorded, so
it asks for each rank's earliest entry among the waiting records at every record it
writes. Asked of each waiting instance, that cost grew with the queue: at 4 MiB
allreduces, 60 waiting records made one idle turn 300 us, which landed between a
collective's frames. Here each rank keeps the sliding-window minimum of its entries
(a monotonic deque), so the answer costs the number of real ranks, not the queue.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class WaitingRecords(Generic[T]):
    """A FIFO of (item, end) with each rank's earliest entry over what it holds."""

    def __init__(self) -> None:
        self._items: deque[tuple[T, float]] = deque()
        self._earliest: dict[int, deque[tuple[int, float]]] = {}  # rank -> (seq, entry), entries increasing
        self._pushed = 0  # sequence number of the next push
        self._popped = 0  # sequence number of the next pop

    def __len__(self) -> int:
        return len(self._items)

    def push(self, item: T, end: float, entries: dict[int, float]) -> None:
        """`item` finished at `end`; `entries`: global rank -> when it entered (final now)."""
        seq = self._pushed
        self._pushed += 1
        self._items.append((item, end))
        for rank, t in entries.items():
            window = self._earliest.setdefault(rank, deque())
            while window and window[-1][1] >= t:  # never the minimum while this one waits
                window.pop()
            window.append((seq, t))

    def pop(self) -> tuple[T, float]:
        """The oldest (item, end); IndexError when none waits."""
        item = self._items.popleft()
        seq = self._popped
        self._popped += 1
        for rank in list(self._earliest):
            window = self._earliest[rank]
            while window and window[0][0] <= seq:
                window.popleft()
            if not window:
                del self._earliest[rank]
        return item

    def earliest(self) -> dict[int, float]:
        """Global rank -> its earliest entry among the waiting items."""
        return {rank: window[0][1] for rank, window in self._earliest.items()}
