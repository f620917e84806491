"""What the collective engine needs of a dialect, and nothing of its frames.

A dialect (Gloo's today, NCCL's beside it) turns a library's bytes into these
three events and these four pair commands, and names each slot's collective;
the engine, the point-to-point handler and the schedules speak only this.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

from neuronabox.schedules import Kind

from .outcomes import ProtocolError


class RecvReady(NamedTuple):
    """The peer posted a receive of `length` bytes on `slot`."""

    slot: int
    length: int


class SendReady(NamedTuple):
    """The peer has a send of `length` bytes pending on `slot`."""

    slot: int
    length: int


class Data(NamedTuple):
    """A payload for `slot` (bytes-like: a dialect may hand its own buffer, forwarded without a copy)."""

    slot: int
    payload: bytes


Event = RecvReady | SendReady | Data


class PairCommands(Protocol):
    """The controller's side of one pair: each command queues frames the driver writes."""

    def recv_ready(self, slot: int, length: int) -> None: ...

    def send_ready(self, slot: int, length: int) -> None: ...

    def send(self, slot: int, payload) -> None:
        """Announce and write a payload (the peer's receive is posted)."""

    def data(self, slot: int, payload) -> None:
        """Write a payload whose send was announced already."""


class UnsupportedCollective(ProtocolError):
    """A slot that names a collective the dialect does not carry (yet)."""


class Dialect(Protocol):
    name: str

    def classify(self, slot: int) -> tuple[Kind | None, int]:
        """(the collective's kind, its tag); kind None: point-to-point, the slot is the
        user's tag. Raises UnsupportedCollective for a collective it cannot carry."""
        ...

    def slot_pattern(self, slot: int) -> tuple[int, int, int, int]:
        """(mask, value, tag_shift, tag_mask) of a collective's slot: later instances of
        the same collective have slot & mask == value, and their tag is (slot >> tag_shift)
        & tag_mask (a native start names its book from them)."""
        ...
