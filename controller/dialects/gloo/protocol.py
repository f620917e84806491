"""The Gloo pair as the engine sees it: the dialect's events, error and machine.

One Gloo TCP pair seen from the controller's side is a sans-IO state machine,
implemented natively: bytes in, events out; commands in, frames out. It enforces
the rules the real side would kill the pair for (docs/wire.md, "Frames"): no data
on a slot before the peer's NOTIFY_RECV_READY, FIFO matching per slot, a payload
no longer than the posted receive, NOTIFY_SEND_READY before data. Sockets live in
driver.py.
"""

from __future__ import annotations

from neuronabox.errors import NeuronaBoxError
from neuronabox.schedules import Kind

from ... import _native
from ...dialect import Data, Event, RecvReady, SendReady, UnsupportedCollective
from .wire import SLOT_DELTA_MASK, SLOT_PREFIX_MASK, SLOT_TAG_MASK, SLOT_TAG_SHIFT, SlotPrefix, split_slot

__all__ = ["GLOO", "Data", "Event", "GlooDialect", "GlooPair", "Payload", "RecvReady", "SendReady", "WireError"]


class WireError(NeuronaBoxError):
    """A frame that breaks the Gloo protocol, from either side."""


# The pair machine is native (controller/native/gloo_pair.h): bytes in, events out;
# commands in, frames queued in the pair's outbox, which `take()` returns as bytes and
# `flush(fd)` writes to a socket; `read(fd)` receives a payload straight into the buffer
# it is later forwarded from (a `Payload`, with the buffer protocol).
_native.bind(WireError, RecvReady, SendReady, Data)
GlooPair = _native.GlooPair
Payload = _native.Payload

KIND_OF_PREFIX = {p: Kind[p.name] for p in SlotPrefix}


class GlooDialect:
    """Gloo's slots: the top byte names the collective (0: send/recv, the slot is the tag)."""

    name = "Gloo"

    def classify(self, slot: int) -> tuple[Kind | None, int]:
        prefix, tag, _ = split_slot(slot)
        if prefix == 0:
            return None, slot
        kind = KIND_OF_PREFIX.get(prefix)
        if kind is None:
            raise UnsupportedCollective(f"collective with slot prefix {prefix} (unknown) #{tag}")
        return kind, tag

    def slot_pattern(self, slot: int) -> tuple[int, int, int, int]:
        mask = SLOT_PREFIX_MASK | SLOT_DELTA_MASK  # the collective and its sub-slot; the tag between
        return mask, slot & mask, SLOT_TAG_SHIFT, SLOT_TAG_MASK


GLOO = GlooDialect()
