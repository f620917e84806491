"""Sans-IO state machine for one Gloo TCP pair, seen from the controller's side.

Bytes in, events out; commands in, bytes out. It enforces the rules the real
side would kill the pair for (GLOO_WIRE.md, "Frames"): no data on a slot before
the peer's NOTIFY_RECV_READY, FIFO matching per slot, a payload no longer than
the posted receive, NOTIFY_SEND_READY before data. Sockets live in driver.py.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

from .wire import PREAMBLE, PREAMBLE_SIZE, Opcode


class WireError(Exception):
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
    """A payload for `slot`."""

    slot: int
    payload: bytes


Event = RecvReady | SendReady | Data


class GlooPair:
    """One connection between a real rank and the emulated rank the controller plays."""

    __slots__ = ("_buf", "_peer_posted", "_announced", "_our_posted", "_peer_announced")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._peer_posted: dict[int, deque[int]] = {}  # slot -> lengths the peer can receive
        self._announced: dict[int, int] = {}  # slot -> our NOTIFY_SEND_READY not yet followed by data
        self._our_posted: dict[int, deque[int]] = {}  # slot -> lengths we posted for the peer
        self._peer_announced: dict[int, int] = {}  # slot -> peer's send notices not yet followed by data

    # -- bytes in, events out ------------------------------------------------
    def receive(self, data: bytes) -> list[Event]:
        buf = self._buf
        buf += data
        events: list[Event] = []
        off = 0
        end = len(buf)
        while end - off >= PREAMBLE_SIZE:
            nbytes, opcode, slot, _offset, length, _roffset = PREAMBLE.unpack_from(buf, off)
            if opcode == Opcode.SEND_UNBOUND_BUFFER:
                if nbytes != PREAMBLE_SIZE + length:
                    raise WireError(f"data frame nbytes={nbytes} does not match length={length}")
                if end - off < nbytes:
                    break
                if not self._peer_announced.get(slot):
                    raise WireError(f"data on slot {slot:#x} before NOTIFY_SEND_READY")
                self._peer_announced[slot] -= 1
                posted = self._our_posted.get(slot)
                if not posted:
                    raise WireError(f"data on slot {slot:#x} without a posted receive")
                want = posted.popleft()
                if length > want:
                    raise WireError(f"{length}-byte payload on slot {slot:#x} exceeds the posted {want} bytes")
                events.append(Data(slot, bytes(buf[off + PREAMBLE_SIZE : off + nbytes])))
                off += nbytes
            elif opcode == Opcode.NOTIFY_RECV_READY:
                self._peer_posted.setdefault(slot, deque()).append(length)
                events.append(RecvReady(slot, length))
                off += PREAMBLE_SIZE
            elif opcode == Opcode.NOTIFY_SEND_READY:
                self._peer_announced[slot] = self._peer_announced.get(slot, 0) + 1
                events.append(SendReady(slot, length))
                off += PREAMBLE_SIZE
            else:
                raise WireError(f"unsupported opcode {opcode} (bound buffers are not used by c10d)")
        if off:
            del buf[:off]
        return events

    # -- commands in, bytes out ----------------------------------------------
    def send_ready(self, slot: int, length: int) -> bytes:
        self._announced[slot] = self._announced.get(slot, 0) + 1
        return PREAMBLE.pack(PREAMBLE_SIZE, Opcode.NOTIFY_SEND_READY, slot, 0, length, 0)

    def recv_ready(self, slot: int, length: int) -> bytes:
        self._our_posted.setdefault(slot, deque()).append(length)
        return PREAMBLE.pack(PREAMBLE_SIZE, Opcode.NOTIFY_RECV_READY, slot, 0, length, 0)

    def data(self, slot: int, payload: bytes) -> bytes:
        """Frame `payload`; refuses anything the real side would reject."""
        if not self._announced.get(slot):
            raise WireError(f"data on slot {slot:#x} before NOTIFY_SEND_READY")
        posted = self._peer_posted.get(slot)
        if not posted:
            raise WireError(f"data on slot {slot:#x} before the peer's NOTIFY_RECV_READY")
        if len(payload) > posted[0]:
            raise WireError(f"{len(payload)}-byte payload on slot {slot:#x} exceeds the peer's {posted[0]}")
        posted.popleft()
        self._announced[slot] -= 1
        n = len(payload)
        return PREAMBLE.pack(PREAMBLE_SIZE + n, Opcode.SEND_UNBOUND_BUFFER, slot, 0, n, 0) + payload

    def send(self, slot: int, payload: bytes) -> bytes:
        """NOTIFY_SEND_READY and the data frame together, as Gloo sends them."""
        return self.send_ready(slot, len(payload)) + self.data(slot, payload)
