"""Name each recorded TCP connection of one real NCCL rank by what travels on it.

A wiretap transcript (transcript.py) is a list of connections with the bytes each way; the
verifier of the first GPU session (scripts/nccl_verify.py) needs to know which is the root
check-in, the root reply, a ring link, a bootstrap p2p message, a Socket-net data connection
or the c10d store, and what each carried. Every NCCL socket starts with the connecting side's
handshake (u64 magic, i32 type, wire.py); what follows tells the bootstrap kinds apart:

- root check-in: one frame of the layout's extInfo size, nothing back;
- root reply: one frame of the root reply size (128), nothing back;
- ring link: many frames (every allgather of the communicator), possibly both ways;
- p2p (bootstrapSend): the preamble frame [i32 8][rank, tag], then the payload frame(s);
- Socket net: type 3, one socket-index byte, then [i32 size][data] frames one way.

Anything without an NCCL handshake (the c10d store) is OTHER. Pure and tolerant: a stream
the recording cut (the wiretap keeps only the first `cap` bytes of each send/recv call) is
read through its kept bytes; sizes come from the stream's own headers wherever those were
kept, and a lost header ends the readable part instead of raising.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum

from .errors import NcclWireError
from .transcript import Connection
from .versions import LAYOUTS, Layout
from .wire import HANDSHAKE, NCCL_MAGIC, NCCL_SOCKET_MAGIC, P2P_ACK, SIZE, ExtInfo, SockAddr, SocketType

MAX_FRAME = 1 << 30  # NCCL_MAX_NET_SIZE: no NCCL message declares more
KEEP_PAYLOAD = 1 << 16  # payloads kept for decoding; larger ones (net data) keep only their size


class ConnKind(Enum):
    """What one connection is, judged from its first bytes."""

    ROOT_CHECKIN = "root check-in"
    ROOT_REPLY = "root reply"
    RING_LINK = "ring link"
    P2P = "p2p"
    BOOTSTRAP_OTHER = "bootstrap (unrecognised)"  # type 1 handshake, content fits no kind above
    NET_SOCKET = "socket net"
    PROXY = "proxy"
    NCCL_OTHER = "nccl (other type)"  # IB out-of-band, RAS
    OTHER = "other"  # no NCCL handshake: the c10d store, anything else
    EMPTY = "empty"  # no byte either way (a connect NCCL retried, a store socket read with read())


# ---------------------------------------------------------------- streams the recording may have cut

@dataclass(frozen=True)
class Stream:
    """One direction of a connection as the recording kept it: `segments` are (offset in the
    real stream, kept bytes), in order; `length` is what really moved."""

    segments: tuple[tuple[int, bytes], ...]
    length: int

    @property
    def complete(self) -> bool:
        return sum(len(b) for _, b in self.segments) == self.length

    def read(self, offset: int, n: int) -> bytes | None:
        """Bytes [offset, offset + n) if the recording kept all of them, else None."""
        if n == 0:
            return b""
        starts = [s for s, _ in self.segments]
        i = bisect.bisect_right(starts, offset) - 1
        if i < 0:
            return None
        start, data = self.segments[i]
        if offset + n > start + len(data):
            return None
        return data[offset - start : offset - start + n]


def _infer_cap(calls: Sequence[int], kept: int) -> int | None:
    """The per-call cap c with sum(min(len, c)) == kept (unique when some call exceeds it)."""
    lo, hi = 0, max(calls)
    while lo < hi:
        mid = (lo + hi) // 2
        if sum(min(n, mid) for n in calls) < kept:
            lo = mid + 1
        else:
            hi = mid
    return lo if sum(min(n, lo) for n in calls) == kept else None


def stream_of(data: bytes | bytearray, calls: Sequence[int]) -> Stream:
    """Rebuild a direction from its kept bytes and its per-call lengths (Connection.sent and
    sent_calls). The wiretap keeps min(length, cap) bytes of every call, so the cap follows
    from the totals; each call's kept bytes sit at the call's start in the real stream."""
    total = sum(calls)
    raw = bytes(data)
    if len(raw) >= total:
        return Stream(((0, raw[:total]),) if total else (), total)
    cap = _infer_cap(calls, len(raw)) if calls else None
    if cap is None:  # inconsistent totals: trust only the first call's bytes
        first = raw[: min(len(raw), calls[0])] if calls else b""
        return Stream(((0, first),) if first else (), total)
    segments: list[tuple[int, bytearray]] = []
    pos = taken = 0
    for n in calls:
        k = min(n, cap)
        chunk = raw[taken : taken + k]
        if segments and segments[-1][0] + len(segments[-1][1]) == pos:
            segments[-1][1].extend(chunk)
        elif chunk:
            segments.append((pos, bytearray(chunk)))
        pos += n
        taken += k
    return Stream(tuple((s, bytes(b)) for s, b in segments), total)


@dataclass(frozen=True)
class FrameScan:
    """The [i32 size][bytes] frames of a stream from some offset, read as far as the recording allows."""

    sizes: tuple[int, ...]
    payloads: tuple[bytes | None, ...]  # None: not kept whole, or larger than KEEP_PAYLOAD
    cut: bool  # a header fell where the recording kept nothing: later frames are unknown
    partial: int  # bytes of an unfinished frame at the end (a stream that ended mid-message)
    bad: str = ""  # why reading stopped at an impossible header, if it did

    @property
    def readable_to_end(self) -> bool:
        return not self.cut and not self.bad


def scan_frames(stream: Stream, offset: int, *, max_frames: int | None = None) -> FrameScan:
    sizes: list[int] = []
    payloads: list[bytes | None] = []
    pos, cut, bad = offset, False, ""
    while pos + SIZE.size <= stream.length and (max_frames is None or len(sizes) < max_frames):
        head = stream.read(pos, SIZE.size)
        if head is None:
            cut = True
            break
        (size,) = SIZE.unpack(head)
        if size < 0 or size > MAX_FRAME:
            bad = f"frame {len(sizes)} at byte {pos} declares {size} bytes"
            break
        if pos + SIZE.size + size > stream.length:
            break
        payloads.append(stream.read(pos + SIZE.size, size) if size <= KEEP_PAYLOAD else None)
        sizes.append(size)
        pos += SIZE.size + size
    partial = 0 if cut or bad or (max_frames is not None and len(sizes) >= max_frames) else stream.length - pos
    return FrameScan(tuple(sizes), tuple(payloads), cut, partial, bad)


# ---------------------------------------------------------------- records

@dataclass(frozen=True)
class Handshake:
    magic: int
    type: int  # the raw i32; SocketType(type) for the known ones


@dataclass(frozen=True)
class Record:
    """One connection: `index` is its place in open order, `outgoing` True when this rank dialled."""

    index: int
    kind: ConnKind
    outgoing: bool
    local: str
    peer: str
    complete: bool
    handshake: Handshake | None


@dataclass(frozen=True)
class RootCheckIn(Record):
    size: int
    ext: ExtInfo | None  # None when the payload was not kept whole


@dataclass(frozen=True)
class RootReply(Record):
    size: int
    payload: bytes | None
    ring_addr: SockAddr | None  # the successor's ring address it carries (socket bootstrap)


@dataclass(frozen=True)
class RingLink(Record):
    """forward: frames from the side that dialled (ring 0: a rank to its successor);
    backward: frames the other way (ring 1 of the bidirectional allgather, 2.28.7+)."""

    forward: FrameScan
    backward: FrameScan


@dataclass(frozen=True)
class P2pMessage(Record):
    sender: int
    tag: int
    sizes: tuple[int, ...]  # payload frames after the preamble (bootstrapSend: exactly one)
    payloads: tuple[bytes | None, ...]


@dataclass(frozen=True)
class NetSocket(Record):
    sock_index: int  # the preamble byte: data sockets 0..nSocks-1, control socket nSocks
    frames: FrameScan  # from the connecting side (the sender)
    reverse_bytes: int  # bytes the other way (the Socket net sends none)


@dataclass(frozen=True)
class Unrecognised(Record):
    """PROXY, NCCL_OTHER, BOOTSTRAP_OTHER, OTHER, EMPTY: the first bytes and frame sizes if any."""

    sent: int
    received: int
    frames: FrameScan | None  # after the handshake, for an NCCL one


# ---------------------------------------------------------------- classification

def _streams(conn: Connection) -> tuple[Stream, Stream]:
    """(from the dialling side, from the accepting side)."""
    sent = stream_of(conn.sent, conn.sent_calls)
    received = stream_of(conn.received, conn.received_calls)
    return (sent, received) if conn.opened_by_us else (received, sent)


def _handshake(stream: Stream) -> Handshake | None:
    raw = stream.read(0, HANDSHAKE.size)
    if raw is None:
        return None
    magic, kind = HANDSHAKE.unpack(raw)
    return Handshake(magic, kind)


def _plausible(hs: Handshake | None) -> bool:
    return hs is not None and SocketType.BOOTSTRAP <= hs.type <= SocketType.RAS


def nccl_magics(conns: Iterable[Connection], known: Iterable[int] = ()) -> set[int]:
    """The magics this rank's NCCL used: NCCL's constants, `known`, and any magic that opens two
    or more connections with the same plausible socket type (a communicator's magic is random,
    but every rank opens at least four bootstrap connections with it; the store's first bytes
    do not repeat like that within one process)."""
    seen: Counter[tuple[int, int]] = Counter()
    for conn in conns:
        hs = _handshake(_streams(conn)[0])
        if _plausible(hs):
            seen[(hs.magic, hs.type)] += 1
    return {NCCL_MAGIC, NCCL_SOCKET_MAGIC, *known} | {m for (m, _t), n in seen.items() if n >= 2}


def _ext_sizes(layout: Layout | None) -> set[int]:
    return {layout.ext_info_size} if layout else {lay.ext_info_size for lay in LAYOUTS}


def _reply_sizes(layout: Layout | None) -> set[int]:
    return {layout.root_reply_size} if layout else {lay.root_reply_size for lay in LAYOUTS}


def _ext_layout(layout: Layout | None, size: int) -> Layout | None:
    if layout is not None:
        return layout
    return next((lay for lay in LAYOUTS if lay.ext_info_size == size), None)


def classify_one(conn: Connection, index: int, magics: set[int], layout: Layout | None = None) -> Record:
    fwd, back = _streams(conn)
    hs = _handshake(fwd)
    base = dict(index=index, outgoing=conn.opened_by_us, local=conn.local, peer=conn.peer,
                complete=conn.complete)  # fmt: skip
    sent, received = len(conn.sent), len(conn.received)

    def other(kind: ConnKind, frames: FrameScan | None = None) -> Unrecognised:
        return Unrecognised(kind=kind, handshake=hs if kind is not ConnKind.OTHER else None, sent=sum(conn.sent_calls),
                            received=sum(conn.received_calls), frames=frames, **base)  # fmt: skip

    if not _plausible(hs) or hs.magic not in magics:
        return other(ConnKind.EMPTY if sent == received == 0 else ConnKind.OTHER)
    if hs.type == SocketType.NET_SOCKET:
        raw = fwd.read(HANDSHAKE.size, 1)
        if raw is None:
            return other(ConnKind.NCCL_OTHER)
        frames = scan_frames(fwd, HANDSHAKE.size + 1)
        return NetSocket(kind=ConnKind.NET_SOCKET, handshake=hs, sock_index=raw[0], frames=frames,
                         reverse_bytes=back.length, **base)  # fmt: skip
    if hs.type == SocketType.PROXY:
        return other(ConnKind.PROXY)
    if hs.type != SocketType.BOOTSTRAP:
        return other(ConnKind.NCCL_OTHER)
    frames = scan_frames(fwd, HANDSHAKE.size)
    backward = scan_frames(back, 0)
    if frames.sizes and frames.sizes[0] == P2P_ACK.size and frames.payloads[0] is not None:
        sender, tag = P2P_ACK.unpack(frames.payloads[0])
        return P2pMessage(kind=ConnKind.P2P, handshake=hs, sender=sender, tag=tag, sizes=frames.sizes[1:],
                          payloads=frames.payloads[1:], **base)  # fmt: skip
    single = len(frames.sizes) == 1 and frames.readable_to_end and not frames.partial and back.length == 0
    if single and frames.sizes[0] in _ext_sizes(layout):
        payload = frames.payloads[0]
        lay = _ext_layout(layout, frames.sizes[0])
        ext = None
        if payload is not None and lay is not None:
            try:
                ext = ExtInfo.decode(payload, lay)
            except NcclWireError:
                ext = None
        return RootCheckIn(kind=ConnKind.ROOT_CHECKIN, handshake=hs, size=frames.sizes[0], ext=ext, **base)
    if single and frames.sizes[0] in _reply_sizes(layout):
        payload = frames.payloads[0]
        addr = None
        if payload is not None:
            try:
                addr = SockAddr.decode(payload)
            except NcclWireError:
                addr = None
        return RootReply(kind=ConnKind.ROOT_REPLY, handshake=hs, size=frames.sizes[0], payload=payload,
                         ring_addr=addr, **base)  # fmt: skip
    if len(frames.sizes) + len(backward.sizes) >= 2:
        return RingLink(kind=ConnKind.RING_LINK, handshake=hs, forward=frames, backward=backward, **base)
    return other(ConnKind.BOOTSTRAP_OTHER, frames)


def classify(conns: Sequence[Connection], layout: Layout | None = None, magics: Iterable[int] = ()) -> list[Record]:
    """Every connection of one rank's transcript, in the order given (transcript.connections
    gives open order). `layout` pins the extInfo / root reply sizes that name a one-frame
    bootstrap connection (without it, any spoken release's sizes do); `magics` adds known
    communicator magics (e.g. the unique id's) to those found by repetition."""
    found = nccl_magics(conns, magics)
    return [classify_one(c, i, found, layout) for i, c in enumerate(conns)]


# ---------------------------------------------------------------- ring allgathers

@dataclass(frozen=True)
class Allgather:
    """One bootstrapAllGather as seen on a rank's link to its successor."""

    size: int  # element (slice) size
    own: bytes | None  # the rank's own slice: the first ring-0 frame of the allgather
    forward: int  # frames the rank sent to its successor
    backward: int  # frames it received from its successor (ring 1)


def ring_frames_per_allgather(world: int, bidirectional: bool) -> tuple[int, int]:
    """(ring-0 frames, ring-1 frames) one rank sends per allgather (src/bootstrap.cc): W-1
    steps on one ring up to 2.28.3; floor(W/2) steps on two rings from 2.28.7, the last
    one ring-0 only when W is even."""
    if world < 2:
        return 0, 0
    if not bidirectional:
        return world - 1, 0
    steps = world // 2
    return steps, steps - 1 if world % 2 == 0 else steps


def split_allgathers(link: RingLink, world: int, bidirectional: bool) -> list[Allgather] | None:
    """The allgathers on a rank's outgoing ring link, or None when the framing does not fit
    this direction model (frame counts, or sizes that change inside one allgather)."""
    n0, n1 = ring_frames_per_allgather(world, bidirectional)
    f, b = link.forward.sizes, link.backward.sizes
    if n0 == 0 or len(f) % n0:
        return None
    count = len(f) // n0
    if len(b) != count * n1:
        return None
    out = []
    for g in range(count):
        group = f[g * n0 : (g + 1) * n0] + b[g * n1 : (g + 1) * n1]
        if len(set(group)) != 1:
            return None
        out.append(Allgather(group[0], link.forward.payloads[g * n0], n0, n1))
    return out
