"""Native starts: the first frames of seen shapes, and what the core starts from them.

A collective instance whose first frames alone settled its schedule (notices on one
pair; no observer's answer but a standing one, a DDP bucket's size, which the same
first frames always get) leaves a starter in the core (`Core.add_starter`): the next
instance of its group with those first frames on that pair gets its book in C++, loaded
with the recorded program and connected before the frames go in, so no Python runs
before its messages flow. A ring whose size only its call's note told (a training loop's
loss, a tiny or a large allreduce outside DDP) leaves an armed starter: it starts only
an instance whose own call noted the same size (`Starters.arm`, as the note comes, ahead
of the call's frames), never one whose first frames merely match, since an unnoted call
(DDP's reducer, a functional collective) with the same first segment may be another size.
Such a call's note starts its instance at once where a starter of the ring's geometry is
in (`Core.note`; NEURONABOX_NOTE_START=0: not): the emulated ranks enter with the real
rank's call, not a round trip after its first frame. Only if the note's tag is the one
after the latest collective tag in that real rank's frames on the group: a point-to-point
call past ProcessGroup's methods shifts every note's tag after it, and a wrong ring would
start, where an arm's frame match finds the note unfit. The notes come on a link of their
own, which the core reads (`Core.watch_notes`): a shape Python has seen noted once
(`Core.know_note`) starts or is armed there with no Python turn before the frames
(docs/fidelity.md, "A note the core reads"). The loop leaves adoption for after the
frames of a noted instance either way (gloo/driver.py, `Adoption`).
An allgather's block takes two notices: its starter is kept only for a program of one
pair, where the core holds the first notice until the second matches (or hands both to
Python, in order, when it does not); meanwhile the receive of chunk 0, which the first
notice alone tells, is posted ahead (`posts_ahead`), and the data it lets come waits with
them. DDP repeats its buckets every step, a training loop its barriers and scalar
allreduces: in steady state most instances start this way.
Python adopts each such book at the driver's next turn (`Engine.adopt_started`), off the
collective's path.

A timed instance's book gets the template's native timeline moved to its own entry
(`timeline.at(t0)`, in C++): the same release times as a timeline made in Python for it,
as long as nothing but the entry differs, so only without jitter, and only while the
what-if and the charged local work stay those the template was made under (its `basis`;
either changing drops every such starter). Under drawn skew (`--skew auto|FILE`) each start
has its own draws: the starter's timeline is then `release.DrawnStart`, which the core
calls with the start's entry and tag to make the instance's timeline as a Python start
would (the skew's draw, seeded by the tag, and its bookkeeping of the place), from the
timing of the moment: a refit of the measured local work (every 5 to 8 steps of a
Lightning job) keeps such starters, and the adopted instance's model is priced again
(`StartTemplate.prediction`); a what-if still drops them. Emulated payloads must be the
book's own (no mirrored input, no reduce whose root a later frame names). A closed pair
or a new generation drops them too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from neuronabox.schedules.gloo import RingGeometry, Schedule
from neuronabox.schedules.kinds import Kind

from .book import Book, Core, Pair, Program
from .dialect import Dialect, Event, SendReady
from .groups import Conn, Group

if TYPE_CHECKING:
    from neuronabox.topology import HostWork

    from .release import ReleaseTiming

STARTERS_KEPT = 256  # first frames a run keeps starters for; more: all are dropped, then relearned


@dataclass(frozen=True)
class StartTemplate:
    """What Python needs to adopt a book started from this starter (Instance.adopt)."""

    group: Group
    schedule: Schedule
    geometry: str
    nbytes: int
    pairs: tuple[Pair, ...]  # the program's pairs, by index
    predicted: float = 0.0  # the model's time for the shape, as Python priced it
    told: tuple[int | None, int | None, str | None] = (None, None, None)  # the ring's numel, elem, dtype if told
    basis: tuple = ()  # what `predicted` was priced under (the what-if, the local work)

    def prediction(self, timing: ReleaseTiming, basis: tuple, kind: Kind, work: HostWork | None) -> float:
        """The model's time for an instance started now: the template's, or, where a refit of
        the local work came since (a drawn starter outlives it), priced again."""
        if same_basis(basis, self.basis):
            return self.predicted
        return timing.predicted(kind, self.nbytes, self.schedule, self.group.real.sorted[0], work)


def same_basis(a: tuple, b: tuple) -> bool:
    """Whether two bases are the same objects (each part is replaced whole when it changes)."""
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


def posts_ahead(kind: str, frames: list[tuple[bool, int]]) -> bool:
    """Whether the emulated peer's first receive on the pair may be posted on the first frame,
    before the rest that settle the shape: a ring allgather's first frame is the real rank's
    send notice of its chunk 0, the chunk its successor receives first (RingAllgather), so
    that receive is the same whatever the block. Its notice then reaches the real rank while
    it is still writing the notices of chunk 1, rather than after them (Pair::post_ahead)."""
    return kind == Kind.ALLGATHER and len(frames) > 1 and frames[0][0]


def guesses_ahead(kind: str) -> bool:
    """Whether a start may post the next instance's first receives once its starter's
    instances repeat (the core's guesses): then the real rank's first sends go at once from
    its own thread, as to a real peer that entered first. Not an allgather's: its emulated
    block mirrors the real one and leaves only once that is in, and the real rank, writing
    its block first, posts the receive notices that block waits for later (1 MiB, W = 2:
    `bench_table1.py --no-guesses`, docs/fidelity.md, "Receives posted on a guess")."""
    return kind != Kind.ALLGATHER


def noted_ring(kind: str, schedule: Schedule) -> RingGeometry | None:
    """The geometry a call's note can tell of an allreduce's ring: whole (every segment's
    length known), so that a note of the same world, bytes and element size is this ring."""
    geo = getattr(schedule, "geo", None)
    if kind != Kind.ALLREDUCE or not isinstance(geo, RingGeometry) or not geo.last_known:
        return None
    return geo


def ring_key(group: str, geo: RingGeometry) -> tuple:
    return (group, geo.world, geo.total, geo.num_segments, geo.segment_bytes)


@dataclass(frozen=True)
class Seen:
    """An instance whose first frame settled its schedule, as it offers a starter."""

    slot: int
    kind: str
    first: tuple[tuple[Conn, Event], ...]  # the frames that settled it, in order, on one pair
    template: StartTemplate
    program: Program
    turnarounds: bool = False  # the book times the real ranks' turnarounds (the local-work meter)
    timeline: object = None  # a native timeline (None: untimed), cloned to each start's entry
    entry_delay: float = 0.0  # the what-if's later entry for the collective
    drawn: bool = False  # `timeline` draws each start's own entry: at(t, tag) (release.DrawnStart)
    armed: bool = False  # its shape came from the call's note: it starts only instances a note of it armed


class Starters:
    """The core's starters, one per (group, pair, collective, first frame)."""

    def __init__(
        self,
        core: Core,
        dialect: Dialect,
        conn_of: Callable[[Group, int, int], Conn | None],
        clock: Callable[[], float] | None = None,
    ) -> None:
        """`clock`: a noted ring starts as its call's note comes (None: at its first frame)."""
        self.core, self.dialect, self.conn_of, self.clock = core, dialect, conn_of, clock
        self.keys: set[tuple] = set()
        self.note_ids: dict[tuple, int] = {}  # a ring's geometry, in its group -> the note id of its starters
        self.worlds: dict[str, int] = {}  # a group's world, as its starters' rings tell it
        self.basis: tuple = ()  # what the starters' timelines were made under (the what-if, the local work)
        self.arm_ids: dict[tuple[str, int, str], int] = {}  # (group, numel, dtype) told -> the arm of its starters
        self.fixed = False  # a starter holds a timeline made under `basis`, moved to each start's entry

    def __len__(self) -> int:
        return len(self.keys)

    def keep_if(self, basis: tuple) -> None:
        """Drop every starter unless they were made under `basis` (the same objects: the
        what-if, the local work). A refit of the local work alone keeps them where each makes
        its timeline as it starts, from the timing of the moment (drawn skew:
        release.DrawnStart), or has none; a what-if may bring jitter, which no native start
        draws."""
        if self.keys and not same_basis(basis, self.basis):
            if self.fixed or not same_basis(basis[:-1], self.basis[:-1]):
                self.clear()
        self.basis = basis

    def offer(self, seen: Seen, basis: tuple = ()) -> None:
        """The next instance with `seen`'s first frames starts natively, if every pair of
        its program is open now (a pair that opens later: Python starts it) and, for more
        than one frame, its program has that one pair; `basis`: what its timeline was made
        under."""
        self.keep_if(basis)
        conn = seen.first[0][0]
        mask, value, tag_shift, tag_mask = self.dialect.slot_pattern(seen.slot)
        frames = [(isinstance(ev, SendReady), ev.length) for _, ev in seen.first]
        tpl = seen.template
        told = (conn.group.name, tpl.told[0], tpl.told[2]) if seen.armed else None
        key = (conn.group.name, conn.real, conn.emu, value, tuple(frames), told)
        conns = [self.conn_of(tpl.group, r, e) for r, e in tpl.pairs]
        if key in self.keys or any(c is None for c in conns) or (len(frames) > 1 and len(tpl.pairs) != 1):
            return
        if len(self.keys) >= STARTERS_KEPT:
            self.clear()
        arm = -1 if told is None else self.arm_ids.setdefault(told, len(self.arm_ids))  # cleared with the core's arms
        note = -1
        if (geo := noted_ring(seen.kind, tpl.schedule)) is not None:
            self.worlds[conn.group.name] = geo.world
            note = self.note_ids.setdefault(ring_key(conn.group.name, geo), len(self.note_ids))
        head, tail = f"{seen.kind} #", f" of group {tpl.group.name!r}"
        self.core.add_starter(
            conn, tpl.pairs.index((conn.real, conn.emu)), mask, value, frames, tag_shift, tag_mask,
            head, tail, seen.program, conns, seen.turnarounds, tpl, seen.timeline, seen.entry_delay, seen.drawn, arm,
            posts_ahead(seen.kind, frames), note, guesses_ahead(seen.kind),
        )  # fmt: skip
        self.keys.add(key)
        self.fixed = self.fixed or (seen.timeline is not None and not seen.drawn)

    def arm(
        self, group: str, tag: int, numel: int, dtype: str, elem: int, rank: int, kind: str, tell: bool = True
    ) -> None:
        """Real rank `rank`'s call of `group` noted its ring's size as it entered (before its
        first frame). With the clock, a ring of that geometry whose starter is in starts now,
        if the note's tag is the one after the rank's latest collective's on the wire
        (`Core.note`): its emulated ranks enter with the real rank's call, so their first
        receives are posted about when its first sends go, as a real peer's are that enters
        with it, not a round trip through the controller after them. Else the instance of
        `tag` may start from a starter of that told shape at its first frame. A frame alone
        never starts a told shape: an unnoted call with the same first frames (a functional
        collective, DDP's unused-parameter map) may be of another size. The core is told
        what this shape's notes start or arm (`Core.know_note`), and does it itself for the
        next such note it reads, with no Python turn before the call's frames (`tell`: False
        while the caller's own checks of the shape are not settled yet)."""
        world = self.worlds.get(group)
        note = None
        if world is not None:
            note = self.note_ids.get(ring_key(group, RingGeometry.for_tensor(world, numel * elem, elem)))
        arm = self.arm_ids.get((group, numel, dtype))
        if tell:
            self.core.know_note(group, kind, numel, dtype, -1 if note is None or self.clock is None else note,
                                -1 if arm is None else arm)  # fmt: skip
        if self.clock is not None and note is not None and self.core.note(note, tag, self.clock(), group, rank):
            return
        if arm is not None:
            self.core.arm(arm, tag)

    def take(self) -> Sequence[tuple[StartTemplate, Book]]:
        """The books started since the last call, with their templates."""
        return self.core.take_started()

    def clear(self) -> None:
        """No native start until instances offer starters again."""
        self.core.clear_starters()
        self.keys.clear()
        self.arm_ids.clear()
        self.note_ids.clear()
        self.fixed = False
