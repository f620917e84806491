"""The observer link as the controller uses it: the real ranks' observer connections
(controller/observers.py), the questions the engine asks them about an instance the
wire says too little of, and where their answers and reports go.

A question is kept until its answer comes; when a rank's observer goes away its open
questions are answered "unknown", so the instances waiting on them fall back to the
wire (and a mirrored input to zeros) instead of waiting for ever.
"""

from __future__ import annotations

import base64
import socket
from collections.abc import Callable
from typing import NamedTuple

from neuronabox.schedules.gloo_reduce import ELEM_SIZES, fits_wire, one_fitting, ring_geometry

from .dialects.gloo.wire import split_slot
from .engine import Engine
from .mirror import DTYPES, MirrorInput
from .observers import ObserverHub
from .shape import Told

NOTED_MAX = 4096  # sizes told and not asked for yet (each real rank of a group tells its own)
BUCKET_SIZES_MAX = 1024  # DDP bucket sizes kept per group


class Question(NamedTuple):
    """An open question to real rank `real`'s observer about instance (group, slot)."""

    group: str
    slot: int
    real: int
    is_input: bool  # the instance's input (--data mirror), not its element count and dtype


class ObserverLink:
    """`on_group`, `on_anysource`, `on_step`, `on_dtypes`, `on_loaded`, `on_held`: where the observers' reports go
    (ObserverHub's hooks of those names); `register`, `unregister`, `call_at`: the loop's."""

    def __init__(
        self,
        sock: socket.socket,
        secret: str,
        engine: Engine,
        register: Callable[[object, Callable[[int], None]], None],
        unregister: Callable[[object], None],
        call_at: Callable[[float, Callable[[], None]], None],
        log: Callable[[str], None],
        on_group: Callable[[str, list[int]], None],
        on_anysource: Callable[[int, str, int, int], None],
        on_step: Callable[[int, float], None],
        on_dtypes: Callable[[list[list]], None],
        on_loaded: Callable[[int], None] = lambda rank: None,
        on_held: Callable[[int, float, float, float, str], None] = lambda rank, start, end, cpu, clock: None,
    ) -> None:
        self.engine = engine
        self.secret = secret  # an observer's hello carries it (the ready file has it)
        self.hub = ObserverHub(sock, register, unregister, secret, call_at=call_at, log=log)
        self.address = self.hub.address
        self.hub.on_reply = self._on_reply
        self.hub.on_lost = self._on_lost
        self.hub.on_group = on_group
        self.hub.on_anysource = on_anysource
        self.hub.on_step = on_step
        self.hub.on_dtypes = on_dtypes
        self.hub.on_loaded = on_loaded
        self.hub.on_held = on_held
        self.hub.on_meta = self._on_noted
        self.hub.on_note_link = self._on_note_link
        self.hub.on_note_link_closed = lambda sock: self.engine.core.unwatch_notes(sock.fileno())
        self._questions: dict[int, Question] = {}
        self._qid = 0
        self._noted: dict[tuple[str, int], tuple[str, int, str]] = {}  # (group, tag) -> (op, numel, dtype)
        self._buckets: dict[str, set[tuple[int, str]]] = {}  # group -> its DDP models' buckets (numel, dtype)
        self._worlds: dict[str, int] = {}  # group -> its size, as the engine's questions said
        self.hub.on_buckets = self._on_buckets

    # -- the engine's questions ------------------------------------------------------------
    def request_meta(self, group: str, slot: int, real: int, kind: str, world: int, wire: int) -> bool | Told:
        """The instance's element count, size and dtype (the engine's `request_meta`): at once
        if its call told them and they fit the wire (`wire`: the longest segment its frames
        carried), else asked of the observer, which checks its own note the same way."""
        self._worlds[group] = world
        self.drain_notes()  # a note the core read, and Python not yet
        note = self._noted.pop((group, split_slot(slot)[1]), None)
        if note is not None and note[0] == kind:
            numel, dtype = note[1], note[2]
            elem = ELEM_SIZES[dtype]
            if fits_wire(world, numel * elem, elem, kind == "reduce", wire):
                return Told(numel, elem, dtype)
        bucket = one_fitting(self._buckets.get(group, ()), world, wire) if kind == "all_reduce" else None
        if bucket is not None:  # a DDP bucket (its reducer's call tells nothing): the model's, by its segments
            return Told(bucket[0], ELEM_SIZES[bucket[1]], bucket[1], standing=True)
        return self._ask(Question(group, slot, real, False), {"kind": kind, "world": world, "seg": wire})

    def request_input(self, group: str, slot: int, real: int) -> bool:
        """Ask for the instance's input (the engine's `request_input`)."""
        inst = self.engine.instances.get((group, slot))  # the input is at most the instance's bytes
        return self._ask(Question(group, slot, real, True), {"input": 1}, inst.nbytes if inst is not None else 0)

    def _ask(self, question: Question, what: dict, reply_bytes: int = 0) -> bool:
        tag = split_slot(question.slot)[1]
        query = {"q": self._qid + 1, "pg": question.group, "tag": tag, **what}
        if not self.hub.ask(question.real, query, reply_bytes):
            return False
        self._qid += 1
        self._questions[self._qid] = question
        return True

    # -- their answers ---------------------------------------------------------------------
    def _on_reply(self, msg: dict) -> None:
        question = self._questions.pop(msg["q"], None)
        if question is None:
            return
        group, slot = question.group, question.slot
        if "root" in msg:
            self.engine.on_root(group, slot, msg["root"])
            return
        if question.is_input:
            data = msg.get("data")
            mirror = None
            if data is not None and msg.get("dtype") in DTYPES:
                mirror = MirrorInput(base64.b64decode(data), msg["dtype"], msg.get("op", "SUM"), msg.get("splits"))
            self.engine.on_input(group, slot, mirror)
            return
        numel, dtype = msg.get("numel"), msg.get("dtype")
        if numel is None or dtype not in ELEM_SIZES:
            self.engine.on_meta(group, slot, None)
        else:
            self.engine.on_meta(group, slot, numel, ELEM_SIZES[dtype], dtype)

    def _on_note_link(self, rank: int, sock: socket.socket, early: bytes) -> None:
        """Real rank `rank`'s observer opened its note link: the core's loop reads it from
        now on (`Core.watch_notes`), and hands its notes over at Python's turns (`drain_notes`)."""
        self.engine.core.watch_notes(sock.fileno(), rank, early)

    def drain_notes(self) -> None:
        """The notes the core read on the note links since the last turn: what it did not do
        with them itself (a shape it was not told of) is done here (the driver's turn: before
        any frame where one was unknown, else at its idle or adoption turn)."""
        for rank, group, tag, kind, numel, dtype, known in self.engine.core.take_notes():
            self._on_noted(rank, group, tag, kind, numel, dtype, known)

    def _on_noted(
        self, rank: int, group: str, tag: int, kind: str, numel: int, dtype: str, known: bool = False
    ) -> None:
        """Real rank `rank`'s call told its ring's size as it entered (neuronabox/observer/sizes.py),
        before its first frame: kept for the instance's question, and starting or arming a
        native start of that shape (controller/starts.py), unless the core did (`known`).
        If the frame came first, the question is out already, and the observer answers it
        from the same note."""
        if dtype not in ELEM_SIZES:
            return  # the question, when it comes, is answered from the flight recorder
        if kind == "all_reduce" and not known:
            if self._collides(group, numel, dtype):
                self.engine.clear_starters()
            # It may start natively; the core acts on the shape's next notes itself once the
            # group's world is known here, as the check of a DDP bucket's collision needs.
            self.engine.starters.arm(group, tag, numel, dtype, ELEM_SIZES[dtype], rank, kind, group in self._worlds)
        self._noted[(group, tag)] = (kind, numel, dtype)
        if len(self._noted) > NOTED_MAX:
            del self._noted[next(iter(self._noted))]

    def forget_notes(self) -> None:
        """A new generation numbers its calls from the start again: a note kept from the old
        one (an instance that started natively never asks for its note) would answer the new
        call of the same tag."""
        self._noted.clear()

    def _on_buckets(self, group: str, sizes: list[tuple[int, str]]) -> None:
        """A real rank's DDP model's gradient buckets on `group` (neuronabox/observer/sizes.py)."""
        known = self._buckets.setdefault(group, set())
        before = len(known)
        known.update((n, d) for n, d in sizes if d in ELEM_SIZES)
        if len(known) != before:  # a shape a bucket sized may now be ambiguous: its starter goes
            self.engine.clear_starters()
        if len(known) > BUCKET_SIZES_MAX:  # a script that builds model after model: the question path
            known.clear()

    def _collides(self, group: str, numel: int, dtype: str) -> bool:
        """Whether an allreduce the call told has the first segment of another size among the
        group's buckets: a native start from that bucket's first frame would run the wrong ring."""
        world = self._worlds.get(group)  # known once an instance of the group was sized here
        if world is None:
            return False
        elem = ELEM_SIZES[dtype]
        bucket = one_fitting(
            self._buckets.get(group, ()), world, ring_geometry(world, numel * elem, elem, False).segment_bytes
        )
        return bucket is not None and bucket != (numel, dtype)

    def _on_lost(self, rank: int) -> None:
        """A real rank's observer went away: its open questions fall back to the wire
        (inputs to zeros)."""
        for q, question in list(self._questions.items()):
            if question.real == rank:
                del self._questions[q]
                if question.is_input:
                    self.engine.on_input(question.group, question.slot, None)
                else:
                    self.engine.on_meta(question.group, question.slot, None)

    def close(self) -> None:
        self.hub.close()
