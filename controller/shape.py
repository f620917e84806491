"""Shape inference: which schedule a collective instance runs, from the real ranks'
first frames, asking the observer only where the wire leaves it open.

The wire gives most of it: a notice's length is a ring segment, an allgather
block, a pairwise message; a broadcast's root is narrowed by the peer distances
the real ranks' first frames cross. What it cannot give (a ring's tensor size
when segments may be uneven, one root among several candidates) the observer of a
real rank answers, or a documented guess stands in when there is none.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum, auto
from typing import NamedTuple

from neuronabox.schedules import Kind
from neuronabox.schedules.gloo import (
    BinomialBroadcast,
    DisseminationBarrier,
    RingAllgather,
    RingAllreduce,
    RingGeometry,
    Schedule,
)
from neuronabox.schedules.gloo_pairwise import PairwiseAlltoall, RootedPairwise
from neuronabox.schedules.gloo_reduce import RingReduce, fits_wire, ring_geometry, segments_are_2w, size_on_wire

from .dialect import Data, Event, RecvReady, SendReady
from .groups import Conn, Group
from .outcomes import ProtocolError, StateError

ROOT_CANDIDATES_CHECKED = 64  # broadcast roots weighed against silent real ranks (more: the lowest is taken)
ROOT_GRACE_S = 0.02  # how long an ambiguous broadcast root waits for a silent real rank to speak
OBSERVER_OP = {Kind.ALLREDUCE: "all_reduce", Kind.REDUCE: "reduce", Kind.BROADCAST: "broadcast"}  # its op names


class Told(NamedTuple):
    """A ring's element count, element size and dtype, as the observer told them before
    any question: one call's note, or a standing answer (`standing`: a DDP model's buckets,
    where the same first frames get the same answer, so its shape may start natively)."""

    numel: int
    elem: int
    dtype: str
    standing: bool = False


# (group, slot, global rank, op, group size, the wire's longest segment so far) -> asked, or
# the answer at once when the real rank's call already told it (observer/sizes.py)
Ask = Callable[[str, int, int, str, int, int], "bool | Told"]


class Question(Enum):
    """The observer question a shape may need."""

    NOT_ASKED = auto()
    ASKED = auto()
    ANSWERED = auto()
    UNAVAILABLE = auto()  # no observer, or it could not say: the wire's best guess stands


class Grace(Enum):
    """An ambiguous broadcast root's wait for silent real ranks to speak."""

    NOT_STARTED = auto()
    RUNNING = auto()
    OVER = auto()


QUESTION_MOVES = {
    Question.NOT_ASKED: {Question.ASKED, Question.UNAVAILABLE},
    Question.ASKED: {Question.ANSWERED, Question.UNAVAILABLE},
    Question.UNAVAILABLE: {Question.ANSWERED},  # an answer after the question timed out
    Question.ANSWERED: set(),
}
GRACE_MOVES = {Grace.NOT_STARTED: {Grace.RUNNING}, Grace.RUNNING: {Grace.OVER}, Grace.OVER: set()}


class ShapeInference:
    def __init__(
        self,
        name: str,
        group: Group,
        kind: Kind,
        slot: int,
        ask: Ask | None,
        can_wait: bool,
        clock: Callable[[], float],
    ) -> None:
        self.name, self.group, self.kind, self.slot = name, group, kind, slot
        self._ask, self._can_wait, self._clock = ask, can_wait, clock
        self.question = Question.NOT_ASKED
        self.grace = Grace.NOT_STARTED
        self.root_hint: int | None = None  # a broadcast's root, as the observer knows it
        self.grace_until = 0.0  # while the grace runs: when to resolve again (the caller's timer)
        self.first: tuple[Conn, Event] | None = None  # the instance's first frame
        self.notices: dict[int, list[tuple[Conn, Event]]] = {}  # real rank -> its frames so far
        self.geometry = ""
        self.nbytes = 0
        self.numel: int | None = None  # the tensor's element count, size and dtype, when the observer told them
        self.elem: int | None = None
        self.dtype: str | None = None
        self.told: Told | None = None  # the size as told before any question (a note, or a standing answer)

    # -- transitions, in one place -------------------------------------------------------
    def _move_question(self, to: Question) -> None:
        if to not in QUESTION_MOVES[self.question]:
            raise StateError(f"{self.name}: question {self.question.name} -> {to.name}")
        self.question = to

    def _move_grace(self, to: Grace) -> None:
        if to not in GRACE_MOVES[self.grace]:
            raise StateError(f"{self.name}: grace {self.grace.name} -> {to.name}")
        self.grace = to

    def _ask_observer(self, real: int, wire: int = 0) -> bool | Told:
        """Ask real group rank `real`'s observer; False (and UNAVAILABLE) when there is none,
        the answer itself when the call already told it (`wire`: the longest frame so far)."""
        if self._ask is None:
            self._move_question(Question.UNAVAILABLE)
            return False
        self._move_question(Question.ASKED)
        asked = self._ask(
            self.group.name, self.slot, self.group.global_rank(real), OBSERVER_OP[self.kind], self.group.world, wire
        )
        if asked:
            return asked
        self._move_question(Question.UNAVAILABLE)
        return False

    # -- inputs ------------------------------------------------------------------------
    def note(self, conn: Conn, ev: Event) -> None:
        if self.first is None:
            self.first = (conn, ev)
        self.notices.setdefault(conn.real, []).append((conn, ev))

    def on_root(self, root: int | None) -> None:
        """The observer's answer to an ambiguous broadcast: the root (group rank) or None."""
        if root is not None and 0 <= root < self.group.world:
            self.root_hint = root
            self._move_question(Question.ANSWERED)
        elif self.question is not Question.UNAVAILABLE:
            self._move_question(Question.UNAVAILABLE)

    def unavailable(self) -> None:
        if self.question is not Question.UNAVAILABLE:
            self._move_question(Question.UNAVAILABLE)

    def from_meta(self, numel: int, elem: int, dtype: str | None = None) -> Schedule:
        """The observer's answer for a ring: the tensor's element count, size and dtype."""
        self._move_question(Question.ANSWERED)
        self.numel, self.elem, self.dtype = numel, elem, dtype
        reduce = self.kind == Kind.REDUCE
        geo = ring_geometry(self.group.world, numel * elem, elem, reduce)
        # Told sizes are checked against the wire before they are used, by the controller and
        # the observer; an answer that still does not fit would send the wrong segments.
        wire = self._longest()
        if not fits_wire(self.group.world, numel * elem, elem, reduce, wire):
            raise ProtocolError(
                f"{self.name}: the observer says {numel} elements of {elem} bytes (segments of "
                f"{geo.segment_bytes} bytes), but a real rank's frames carry segments of {wire}"
            )
        self.geometry = f"segments={geo.num_segments}x{geo.segment_bytes} (observer)"
        self.nbytes = geo.total
        return self._ring(geo)

    def grace_over(self) -> None:
        """The grace period ended: the next `resolve` decides among the roots left."""
        self._move_grace(Grace.OVER)

    def settled_by(self) -> list[tuple[Conn, Event]] | None:
        """The frames that alone gave the schedule, in order, when they are notices on one
        pair and neither a question nor a grace period had a part (a standing answer, which
        the same frames get again, may; so may the call's own note, for an instance whose
        call notes the same shape: `told`): another instance with those first frames on that
        pair has this shape (a native start, controller/starts.py; an allgather's block
        takes two notices; the data of its chunk 0, which the core's receive posted ahead may
        let come among them, is no part of them). None otherwise. A reduce's root comes from
        a later frame."""
        frames = [f for evs in self.notices.values() for f in evs if not isinstance(f[1], Data)]
        if (
            not (self.question is Question.NOT_ASKED or (self.question is Question.ANSWERED and self.told is not None))
            or self.grace is not Grace.NOT_STARTED
            or self.kind == Kind.REDUCE
            or len({id(conn) for conn, _ in frames}) != 1
            or not all(isinstance(ev, (SendReady, RecvReady)) for _, ev in frames)
        ):
            return None
        return frames

    # -- resolution --------------------------------------------------------------------
    def resolve(self) -> Schedule | None:
        """The schedule, once the frames so far (and the observer) determine it."""
        k, w = self.kind, self.group.world
        if k == Kind.BARRIER:
            self.geometry = "dissemination"
            return DisseminationBarrier(w)
        if k == Kind.BROADCAST:
            return self._broadcast()
        if k == Kind.ALLGATHER:
            return self._allgather()
        if k in (Kind.ALLREDUCE, Kind.REDUCE):
            return self._ring_from_wire()
        if k in (Kind.GATHER, Kind.SCATTER):
            return self._rooted()
        if k == Kind.ALLTOALL:
            _, ev = self.first
            self.nbytes = ev.length * w
            self.geometry = "pairwise"
            return PairwiseAlltoall(w, ev.length)
        raise ProtocolError(f"{self.name}: no schedule for collective kind {k}")

    def _broadcast(self) -> Schedule | None:
        w = self.group.world
        cands: set[int] | None = None
        nbytes = None
        for r, evs in self.notices.items():
            conn, ev = evs[0]
            if isinstance(ev, Data):
                continue
            nbytes = ev.length
            d = (conn.emu - r) % w if isinstance(ev, SendReady) else (r - conn.emu) % w
            if d & (d - 1):
                raise ProtocolError(
                    f"{self.name} rank pair {conn.real}<->{conn.emu}: peer distance is not a power of two"
                )
            if isinstance(ev, SendReady):  # r sends at bit i: its vrank is below d
                c = {(r - v) % w for v in range(min(d, w))}
            else:  # r receives at bit i from r - d: its vrank is in [d, 2d)
                c = {(r - v) % w for v in range(d, min(2 * d, w))}
            cands = c if cands is None else cands & c
        if not cands or nbytes is None:
            if cands is not None:
                raise ProtocolError(f"{self.name}: no broadcast root fits the real ranks' frames")
            return None
        if len(cands) > 1 and self.question is not Question.UNAVAILABLE:
            # Ambiguous: the observer of a rank that spoke knows the root the call named.
            if self.root_hint in cands:
                cands = {self.root_hint}
            elif self.question is Question.NOT_ASKED:
                if self._ask_observer(next(iter(self.notices))):
                    return None
            elif self.question is Question.ASKED:
                return None
        silent = [r for r in self.group.real.sorted if r not in self.notices]
        if len(cands) > 1 and silent and len(cands) <= ROOT_CANDIDATES_CHECKED:
            # A real rank that has not spoken either has not entered yet, or, under the
            # true root, does not speak on entry (it waits on a real parent, or has no
            # boundary message). After a grace period in which no other frame came, keep
            # the roots under which every silent real rank is of the second kind.
            if self._can_wait and self.grace is not Grace.OVER:
                if self.grace is Grace.NOT_STARTED:
                    self._move_grace(Grace.RUNNING)
                    self.grace_until = self._clock() + ROOT_GRACE_S
                return None
            sched = {c: BinomialBroadcast(w, c, nbytes) for c in cands}
            fits = {c for c in cands if not any(self._speaks_on_entry(sched[c], r) for r in silent)}
            cands = fits or cands  # none fits: a rank is merely late; the lowest root is the guess
        root = 0 if 0 in cands else min(cands)
        self.geometry = f"root={root}" + ("" if len(cands) == 1 else " (inferred)")
        self.nbytes = nbytes
        return BinomialBroadcast(w, root, nbytes)

    def _speaks_on_entry(self, sched: BinomialBroadcast, r: int) -> bool:
        """Whether real rank r sends a boundary frame as soon as it enters: a receiver
        posts its one receive first (a notice only if the parent is emulated); the root
        posts all its sends at once."""
        first = sched.recvs(r) or sched.sends(r)
        return any(m.peer not in self.group.real for m in first)

    def _allgather(self) -> Schedule | None:
        for evs in self.notices.values():
            sends = [e.length for _, e in evs if isinstance(e, SendReady)]
            recvs = [e.length for _, e in evs if isinstance(e, RecvReady)]
            for lens in (sends, recvs):
                if len(lens) >= 2:
                    block = lens[0] + lens[1]
                    self.nbytes = block * self.group.world
                    self.geometry = f"block={block}"
                    return RingAllgather(self.group.world, block)
        return None

    def _rooted(self) -> Schedule:
        """gather / scatter: a real rank's first frame names the root (the peer it sends
        to in a gather or receives from in a scatter, else itself)."""
        conn, ev = self.first
        to_peer = isinstance(ev, SendReady) == (self.kind == Kind.GATHER)
        root = conn.emu if to_peer else conn.real
        self.nbytes = ev.length * self.group.world
        self.geometry = f"root={root}"
        return RootedPairwise(self.kind, self.group.world, root, ev.length)

    def _longest(self) -> int:
        """The longest notice the real ranks' frames carried so far (a full segment)."""
        return max((e.length for evs in self.notices.values() for _, e in evs if not isinstance(e, Data)), default=0)

    def _ring(self, geo: RingGeometry) -> Schedule:
        return RingReduce(geo) if self.kind == Kind.REDUCE else RingAllreduce.of(geo)

    def _ring_from_wire(self) -> Schedule | None:
        """Segmentation from the wire when it is certain, else from the observer.

        The first notice of each direction is a block-start segment, so its length
        L is a full segment. With L <= 2/3 of the maximum segment the ring has 2W
        segments (reduce: L under the maximum), and with L >= 8 bytes x 2W none of
        them is empty, so only the last segment's length is open and it is read off
        the wire when it comes. Otherwise the tensor size is not on the wire: the
        observer is asked.
        """
        if self.question is Question.ASKED:
            return None  # the observer's answer installs the schedule
        seg = self._longest()
        w = self.group.world
        reduce = self.kind == Kind.REDUCE
        two_w, certain = segments_are_2w(seg, reduce), size_on_wire(w, seg, reduce)
        if not certain and self.question is Question.NOT_ASKED:
            asked = self._ask_observer(self.first[0].real, seg)
            if isinstance(asked, tuple):
                self.told = asked if isinstance(asked, Told) else None
                return self.from_meta(asked[0], asked[1], asked[2])
            if asked:
                return None
        num = 2 * w if two_w else 3 * w
        geo = RingGeometry(w, num * seg, num, seg, last_known=False)
        self.geometry = f"segments={num}x{seg} ({'wire' if certain else 'guessed from the wire'})"
        self.nbytes = geo.total
        return self._ring(geo)
