"""An instance's native book: its schedule's boundary program, handed to C++ once.

The book (`controller/native/book.h`) matches the real ranks' frames, tracks what
crossed, frees and times the emulated sends and writes them, with no Python per
message (docs/architecture.md, "The data plane"). It takes an instance whose
emulated messages are zeros or forwarded real bytes, and whose program is whole at
install: not a reduce whose root only its gather names, not a mirrored input, not
per-message jitter. Those stay with the Python matcher (`matching.py`).
"""

from __future__ import annotations

from neuronabox.schedules.gloo import RealRanks, RingReduce, Schedule, SendRef

from ._native import Book, Core, bind_book
from .matching import Pair, post_len
from .outcomes import ProtocolError

__all__ = ["Book", "Core", "load_program", "takes"]

bind_book(ProtocolError)


def takes(schedule: Schedule, wants_input: bool, jitter: bool) -> bool:
    """May the native book run this instance?"""
    unrooted = isinstance(schedule, RingReduce) and schedule.root is None
    return not (unrooted or wants_input or jitter)


def _refs(content: SendRef | tuple[SendRef, ...] | None) -> tuple[SendRef, ...]:
    if content is None:
        return ()
    return (content,) if isinstance(content[0], int) else content


def load_program(book: Book, schedule: Schedule, real: RealRanks) -> dict[Pair, int]:
    """Every boundary message of the real ranks, in program order per pair, into `book`
    (an emulated send with the real sends it waits for and carries); returns each
    (real, emulated) pair's index in the book."""
    index: dict[Pair, int] = {}

    def pair(r: int, e: int) -> int:
        i = index.get((r, e))
        if i is None:
            i = index[(r, e)] = book.add_pair(r, e)
        return i

    for r in real.sorted:
        for m in schedule.sends(r):
            if m.peer not in real:
                n = post_len(schedule, m)
                book.expect_send(pair(r, m.peer), m.step, m.nbytes, n, n)
        for m in schedule.recvs(r):
            if m.peer not in real:
                deps, content = schedule.origin(m.peer, m.step, real)
                book.expect_recv(pair(r, m.peer), m.step, m.nbytes, post_len(schedule, m), deps, _refs(content))
    return index
