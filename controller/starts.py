"""Native starts: the first frames of seen shapes, and what the core starts from them.

A collective instance whose first frame alone settled its schedule (no other frame, no
observer's answer) leaves a starter in the core (`Core.add_starter`): the next instance
of its group with that first frame on that pair gets its book in C++, loaded with the
recorded program and connected before the frame goes in, so no Python runs before its
messages flow. DDP repeats its buckets every step, a training loop its barriers and
scalar allreduces: in steady state most instances start this way. Python adopts each
such book at the driver's next turn (`Engine.adopt_started`), off the collective's path.

Only while releases are untimed (the zero model with no what-if: there is no timeline
to clone) and emulated payloads are the book's own (no mirrored input, no reduce whose
root a later frame names). A closed pair, a what-if, a new generation: starters go.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from neuronabox.schedules.gloo import Schedule

from .book import Book, Core, Pair, Program
from .dialect import Dialect, Event, SendReady
from .groups import Conn, Group

STARTERS_KEPT = 256  # first frames a run keeps starters for; more: all are dropped, then relearned


@dataclass(frozen=True)
class StartTemplate:
    """What Python needs to adopt a book started from this starter (Instance.adopt)."""

    group: Group
    schedule: Schedule
    geometry: str
    nbytes: int
    pairs: tuple[Pair, ...]  # the program's pairs, by index


@dataclass(frozen=True)
class Seen:
    """An instance whose first frame settled its schedule, as it offers a starter."""

    slot: int
    kind: str
    first: tuple[Conn, Event]
    template: StartTemplate
    program: Program
    index: dict[Pair, int]


class Starters:
    """The core's starters, one per (group, pair, collective, first frame)."""

    def __init__(self, core: Core, dialect: Dialect, conn_of: Callable[[Group, int, int], Conn | None]) -> None:
        self.core, self.dialect, self.conn_of = core, dialect, conn_of
        self.keys: set[tuple] = set()

    def __len__(self) -> int:
        return len(self.keys)

    def offer(self, seen: Seen, turnarounds: bool) -> None:
        """The next instance with `seen`'s first frame starts natively, if every pair of
        its program is open now (a pair that opens later: Python starts it)."""
        conn, ev = seen.first
        mask, value, tag_shift, tag_mask = self.dialect.slot_pattern(seen.slot)
        send_ready = isinstance(ev, SendReady)
        key = (conn.group.name, conn.real, conn.emu, value, send_ready, ev.length)
        tpl = seen.template
        conns = [self.conn_of(tpl.group, r, e) for r, e in tpl.pairs]
        if key in self.keys or any(c is None for c in conns):
            return
        if len(self.keys) >= STARTERS_KEPT:
            self.clear()
        head, tail = f"{seen.kind} #", f" of group {tpl.group.name!r}"
        self.core.add_starter(
            conn, seen.index[(conn.real, conn.emu)], mask, value, send_ready, ev.length, tag_shift, tag_mask,
            head, tail, seen.program, conns, turnarounds, tpl,
        )  # fmt: skip
        self.keys.add(key)

    def take(self) -> list[tuple[StartTemplate, Book]]:
        """The books started since the last call, with their templates."""
        return self.core.take_started()

    def clear(self) -> None:
        """No native start until instances offer starters again."""
        self.core.clear_starters()
        self.keys.clear()
