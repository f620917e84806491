"""What the engine and the point-to-point handler report: finished instances and
protocol errors (one module below both, so neither imports the other for them)."""

from __future__ import annotations

from dataclasses import dataclass, field

from neuronabox.errors import NeuronaBoxError


class ProtocolError(NeuronaBoxError):
    """A frame that does not match what the collective's schedule expects."""


class StateError(NeuronaBoxError):
    """A state machine asked for a transition its table does not have: a bug, named."""


@dataclass
class InstanceRecord:
    """What the trace keeps of one collective instance."""

    group: str
    tag: int
    kind: str
    nbytes: int
    boundary_messages: int
    start: float
    end: float
    per_rank: dict[int, tuple[float, float]]
    geometry: str
    loop_cpu: float  # CPU seconds of the controller's loop thread when the instance completed
    predicted: float = 0.0  # the delay model's time for the instance on the first real rank
    world: int = 0  # the group's size
    ranks: list[int] = field(default_factory=list)  # the group's global ranks (empty: the default group)
    root: int | None = None  # a rooted collective's root (group rank), when known
    numel: int | None = None  # element count and size, when the observer told them
    elem: int | None = None
    dtype: str | None = None  # the observer's name for it (c10's: "Float", "Half", ...), when it told
    lag: float | None = None  # the emulator's lag (native Book.lag); None: the delay model priced nothing
    work: tuple[float, float] | None = None  # the measured local work its emulated ranks were charged (s/msg, s/byte)
    native: bool = False  # its book started natively, from an earlier instance's first frame (engine.StartTemplate)
    on_note: bool = False  # ...as its call's note came, before any of its frames (Core.note)
