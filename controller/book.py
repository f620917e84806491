"""An instance's native book: its schedule's boundary program, handed to C++ once.

The book (`controller/native/book.h`) matches the real ranks' frames, tracks what
crossed, frees and times the emulated sends and writes them, with no Python per
message (docs/architecture.md, "The data plane"). Python hands it the program when
the instance's shape is known, and again when the program grows (a reduce's
gather, once a frame names its root).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

from neuronabox.schedules.gloo import Msg, RealRanks, Schedule, SendRef
from neuronabox.schedules.gloo_reduce import RingReduce

from ._native import Book, Core, Program, bind_book
from .outcomes import ProtocolError

__all__ = ["INPUT", "Book", "Core", "Pair", "Program", "ProgramCache", "load_program", "post_len"]

Pair = tuple[int, int]  # (real group rank, emulated group rank)
T = TypeVar("T")
PROGRAMS_KEPT = 256  # shapes whose program a run keeps (DDP has a few buckets; the rest are rare)
INPUT: SendRef = (-1, 0)  # what sends wait on for the mirror source's input (no rank sends it)

bind_book(ProtocolError)


def post_len(schedule: Schedule, m: Msg) -> int:
    """The receive an emulated rank posts for real send `m`: its length, a whole
    segment (chunk, for a reduce's gather) when only the wire tells the last one,
    or -1 when only the real rank's notice tells it (pairwise messages)."""
    geo = getattr(schedule, "geo", None)
    if m.nbytes >= 0 or geo is None:
        return m.nbytes
    if isinstance(schedule, RingReduce) and m.step == schedule.gather_step:
        return geo.per_rank * geo.segment_bytes
    return geo.segment_bytes


def _refs(content: SendRef | tuple[SendRef, ...] | None) -> tuple[SendRef, ...]:
    if content is None:
        return ()
    return (content,) if isinstance(content[0], int) else content


def load_program(
    book: Book | Program,
    schedule: Schedule,
    real: RealRanks,
    index: dict[Pair, int],
    sends: Callable[[int], Sequence[Msg]],
    recvs: Callable[[int], Sequence[Msg]],
    extra_deps: tuple[SendRef, ...] = (),
) -> set[Pair]:
    """The real ranks' boundary messages from `sends` and `recvs` (the schedule's, or a
    part of them), in program order per pair, into `book`: each emulated send with the
    real sends it waits for (and `extra_deps`) and those whose bytes it carries. New
    pairs are added to the book and to `index`; returns the pairs that got messages."""
    grown: set[Pair] = set()
    members = real.members
    # A recorded Program takes a pair's messages at once when their lengths are known: a
    # large world's ring has 2(W-1) of them, and this is a new shape's set-up, live too.
    bulk = isinstance(book, Program) and not extra_deps

    def pair(r: int, e: int) -> int:
        grown.add((r, e))
        i = index.get((r, e))
        if i is None:
            i = index[(r, e)] = book.add_pair(r, e)
        return i

    for r in real.sorted:
        for peer, msgs in _by_peer(sends(r), members).items():
            i = pair(r, peer)
            if bulk and all(m.nbytes >= 0 for m in msgs):
                book.expect_sends(i, msgs)
                continue
            for m in msgs:
                n = post_len(schedule, m)
                book.expect_send(i, m.step, m.nbytes, n, n)
        upstream = getattr(schedule, "upstream", None)
        for peer, msgs in _by_peer(recvs(r), members).items():
            i = pair(r, peer)
            if bulk and upstream is not None and all(m.nbytes >= 0 for m in msgs):
                steps = [m.step for m in msgs]
                x, data, wait = upstream(peer, steps, real)
                book.expect_recvs_upstream(i, steps, [m.nbytes for m in msgs], x, data, wait)
                continue
            for m in msgs:
                deps, content = schedule.origin(m.peer, m.step, real)
                book.expect_recv(i, m.step, m.nbytes, post_len(schedule, m), [*deps, *extra_deps], _refs(content))
    return grown


def _by_peer(msgs: Sequence[Msg], real: frozenset[int]) -> dict[int, list[Msg]]:
    """The messages with emulated peers, by peer (in first-seen order), each peer's in order."""
    peers = {m.peer for m in msgs}
    if len(peers) == 1:  # a ring's: one peer
        (peer,) = peers
        return {} if peer in real else {peer: list(msgs)}
    out: dict[int, list[Msg]] = {}
    for m in msgs:
        if m.peer not in real:
            mine = out.get(m.peer)
            if mine is None:
                out[m.peer] = [m]
            else:
                mine.append(m)
    return out


class ProgramCache:
    """Programs recorded once per (group, shape), the most recently used kept: an instance
    of a shape seen before loads its program natively (`Book.load`) instead of walking
    its schedule in Python. `kept` serves any program built once per shape (the
    virtual-time driver's simulated rank's too)."""

    def __init__(self, limit: int = PROGRAMS_KEPT) -> None:
        self.limit = limit
        self._kept: OrderedDict[Hashable, object] = OrderedDict()
        self.hits = self.misses = 0

    def kept(self, key: Hashable, make: Callable[[], T]) -> T:
        """What `make()` built for `key`, built the first time (and again once dropped)."""
        found = self._kept.get(key)
        if found is not None:
            self._kept.move_to_end(key)
            self.hits += 1
            return found
        self.misses += 1
        found = self._kept[key] = make()
        if len(self._kept) > self.limit:
            self._kept.popitem(last=False)
        return found

    def program(
        self, key: Hashable, record: Callable[[Program, dict[Pair, int]], object]
    ) -> tuple[Program, dict[Pair, int]]:
        """The program for `key`, recorded by `record(program, index)` the first time."""

        def make() -> tuple[Program, dict[Pair, int]]:
            program, index = Program(), {}
            record(program, index)
            return program, index

        return self.kept(key, make)

    def clear(self) -> None:
        self._kept.clear()
