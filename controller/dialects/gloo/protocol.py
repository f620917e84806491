"""The Gloo pair as the engine sees it: its events, its error, its machine.

One Gloo TCP pair seen from the controller's side is a sans-IO state machine,
implemented natively: bytes in, events out; commands in, frames out. It enforces
the rules the real side would kill the pair for (docs/wire.md, "Frames"): no data
on a slot before the peer's NOTIFY_RECV_READY, FIFO matching per slot, a payload
no longer than the posted receive, NOTIFY_SEND_READY before data. Sockets live in
driver.py.
"""

from __future__ import annotations

from typing import NamedTuple

from neuronabox.errors import NeuronaBoxError

from ... import _native


class WireError(NeuronaBoxError):
    """A frame that breaks the Gloo protocol, from either side."""


class RecvReady(NamedTuple):
    """The peer posted a receive of `length` bytes on `slot`."""

    slot: int
    length: int


class SendReady(NamedTuple):
    """The peer has a send of `length` bytes pending on `slot`."""

    slot: int
    length: int


class Data(NamedTuple):
    """A payload for `slot` (a native `Payload`: bytes-like, forwarded without a copy)."""

    slot: int
    payload: bytes


Event = RecvReady | SendReady | Data


# The pair machine is native (controller/native/gloo_pair.h): bytes in, events out;
# commands in, frames queued in the pair's outbox, which `take()` returns as bytes and
# `flush(fd)` writes to a socket; `read(fd)` receives a payload straight into the buffer
# it is later forwarded from (a `Payload`, with the buffer protocol).
_native.bind(WireError, RecvReady, SendReady, Data)
GlooPair = _native.GlooPair
Payload = _native.Payload
