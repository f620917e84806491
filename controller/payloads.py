"""Payload policy: what an emulated rank's message carries.

Under `zeros` an emulated rank contributes zeros: its message is the real bytes
its schedule forwards (a ring segment a real rank sent, passed on unchanged), or
zeros. Under `mirror` every emulated rank holds the mirror source's input, and
the message folds it into the bytes it builds on (controller/mirror.py). Either
way the bytes forwarded are the buffers they were received into: no copy.
Object collectives carry pickles, which zeros cannot give: under both policies
an emulated root's object broadcast or scatter, and the emulated blocks of an
object gather, are the input the mirror source's observer noted for them.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum, auto

from neuronabox.schedules import Kind
from neuronabox.schedules.gloo import BinomialBroadcast, Msg, RealRanks, Schedule, SendRef
from neuronabox.schedules.gloo_pairwise import RootedPairwise

from .mirror import MirrorInput, fold

Content = SendRef | tuple[SendRef, ...] | None


class Input(Enum):
    """The mirror source's input for one instance."""

    NOT_NEEDED = auto()
    ASKED = auto()  # the observer was asked; messages that fold it wait
    IN = auto()  # answered (with the input, or with none: those messages stay zeros)


class PayloadPolicy:
    def __init__(self, data: str) -> None:
        self.data = data  # zeros or mirror
        self.lookup: Callable[[SendRef], bytes] | None = None  # a real send's payload (the instance's book)
        self.input = Input.NOT_NEEDED
        self.mirror: MirrorInput | None = None

    def wants_input(self, schedule: Schedule, real: RealRanks) -> bool:
        """Mirror folds every input; zeros asks only where the observer may have noted one:
        a broadcast from an emulated root (DDP's construction broadcasts, so the real ranks
        keep their own model; an object broadcast's sizes and pickles), and a scatter from an
        emulated root or a gather to a real one (an object scatter's or gather's pickles:
        zeros cannot unpickle). Without a note the messages stay zeros."""
        if self.data == "mirror":
            return hasattr(schedule, "mirror_plan")
        if isinstance(schedule, RootedPairwise):  # emulated ranks send: the root's scatter, or gather to it
            return (schedule.root in real) == (schedule.kind == Kind.GATHER)
        return isinstance(schedule, BinomialBroadcast) and schedule.root not in real

    def asked(self) -> None:
        self.input = Input.ASKED

    def on_input(self, mirror: MirrorInput | None) -> None:
        self.mirror, self.input = mirror, Input.IN

    def payload(self, schedule: Schedule, real: RealRanks, emu: int, m: Msg, content: Content) -> bytes:
        """The bytes emulated rank `emu` sends in message `m`."""
        if self.mirror is not None:
            mirrored = self._mirrored(schedule, real, emu, m)
            if mirrored is not None:
                return mirrored
        return self._bytes_of(content, m.nbytes)

    def _bytes_of(self, c: Content, n: int) -> bytes:
        if c is None:
            return bytes(n)
        if isinstance(c[0], tuple):  # several real sends, concatenated (a reduce's chunk)
            return b"".join(self.lookup(ref) for ref in c)
        return self.lookup(c)

    def _mirrored(self, schedule: Schedule, real: RealRanks, emu: int, m: Msg) -> bytes | None:
        plan = schedule.mirror_plan(emu, m.step, real)
        block = None if plan is None else self.mirror.block(plan, m.nbytes)
        if block is None:
            return None
        base = None if plan.base is None else self._bytes_of(plan.base, m.nbytes)
        return fold(base, block, plan.folds, self.mirror.op, self.mirror.dtype)
