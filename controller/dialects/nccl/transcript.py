"""Read the wiretap's recordings (nccl_patch/wiretap.c) into per-connection byte streams.

A transcript of a real NCCL run is what lets a machine without a GPU check the dialect:
each TCP connection of a real rank, which side opened it, and the bytes each way, in
order. The replay tests feed those streams to the sans-IO machines of this package.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from enum import IntEnum

from .errors import NcclWireError

HEADER = struct.Struct("<BBHiQII")  # kind, family, reserved, fd, monotonic ns, length, kept


class TapKind(IntEnum):
    CONNECT = 1
    ACCEPT = 2
    SEND = 3
    RECV = 4
    CLOSE = 5


@dataclass(frozen=True, slots=True)
class TapRecord:
    kind: TapKind
    fd: int
    t_ns: int
    length: int  # bytes the call moved
    data: bytes  # the first `kept` of them (connect/accept: "local peer")


@dataclass
class Connection:
    """One TCP connection of the recorded process, from connect or accept to close."""

    fd: int
    opened_by_us: bool  # True: this process connected; False: it accepted
    local: str
    peer: str
    opened_ns: int
    sent: bytearray = field(default_factory=bytearray)
    received: bytearray = field(default_factory=bytearray)
    sent_calls: list[int] = field(default_factory=list)  # bytes per send call
    received_calls: list[int] = field(default_factory=list)
    complete: bool = True  # every byte kept (no call longer than the recording's cap)
    closed: bool = False


def read_records(raw: bytes | bytearray | memoryview) -> list[TapRecord]:
    """Every record; a file cut inside a record (a process killed mid-write) is refused."""
    out: list[TapRecord] = []
    view, off = memoryview(raw), 0
    while off < len(view):
        if len(view) - off < HEADER.size:
            raise NcclWireError(f"transcript cut inside a record header at byte {off}")
        kind, _family, _res, fd, t_ns, length, kept = HEADER.unpack_from(view, off)
        off += HEADER.size
        if kind not in TapKind._value2member_map_:
            raise NcclWireError(f"transcript record at byte {off - HEADER.size} has unknown kind {kind}")
        if kept > length or len(view) - off < kept:
            raise NcclWireError(f"transcript record at byte {off - HEADER.size} is cut ({kept} of {length} bytes)")
        out.append(TapRecord(TapKind(kind), fd, t_ns, length, bytes(view[off : off + kept])))
        off += kept
    return out


def connections(records: list[TapRecord]) -> list[Connection]:
    """The records grouped by connection, in the order the connections opened."""
    live: dict[int, Connection] = {}
    done: list[Connection] = []
    for r in records:
        if r.kind in (TapKind.CONNECT, TapKind.ACCEPT):
            if r.fd in live:  # an fd reused without a close we saw
                done.append(live.pop(r.fd))
            local, _, peer = r.data.decode("ascii", "replace").partition(" ")
            live[r.fd] = Connection(r.fd, r.kind == TapKind.CONNECT, local, peer, r.t_ns)
            continue
        conn = live.get(r.fd)
        if conn is None:
            continue  # a socket opened before the recording began
        if r.kind == TapKind.CLOSE:
            conn.closed = True
            done.append(live.pop(r.fd))
            continue
        stream, calls = (conn.sent, conn.sent_calls) if r.kind == TapKind.SEND else (conn.received, conn.received_calls)
        stream += r.data
        calls.append(r.length)
        conn.complete &= len(r.data) == r.length
    done.extend(live.values())
    return sorted(done, key=lambda c: c.opened_ns)
