"""The bootstrap as the controller plays it when R is rank 0 (R hosts the root) and the
controller plays ranks 1..W-1: the root check-ins to send, the root replies to expect, and a
sans-IO stepper for the ring allgathers over the controller's two ring sockets.

Ring sockets, named by the part the controller plays on each:
- `RingSide.AS_NEXT`: R dialled it; the controller is R's successor (rank R+1). R writes its
  ring-0 slices here and (2.28.7+) reads ring-1 slices.
- `RingSide.AS_PREV`: the controller dialled R's ring address as R's predecessor (rank R-1).
  R reads ring-0 slices here and (2.28.7+) writes ring-1 slices.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from .errors import NcclWireError
from .versions import Layout
from .wire import NET_HANDLE_SIZE, ExtInfo, FrameReader, SocketType, UniqueId, encode_frame, encode_handshake

# ---------------------------------------------------------------- root protocol (scenario A)

@dataclass(frozen=True)
class RootCheckIn:
    """What emulated rank `rank` sends the root: one connection, handshake, [size][extInfo], close."""

    rank: int
    payload: bytes  # the extInfo
    wire: bytes  # handshake + framed payload, ready to write


def root_checkins(
    layout: Layout,
    uid: UniqueId,
    world: int,
    root_listen: Sequence[bytes] | Mapping[int, bytes],
    ring_listen: Sequence[bytes] | Mapping[int, bytes],
    ranks: Iterable[int] | None = None,
) -> list[RootCheckIn]:
    """The check-ins of the emulated `ranks` (default 1..W-1: R is rank 0). `root_listen[r]` /
    `ring_listen[r]` are rank r's 28-byte addresses, distinct per rank so the controller can
    tell which emulated rank the root or R dialled. Single root: iroot 0, nroots 1, offset 0."""
    if world < 2:
        raise ValueError("a world of one rank has nobody to impersonate")
    ranks = list(range(1, world) if ranks is None else ranks)
    try:
        addrs = [(root_listen[r], ring_listen[r]) for r in ranks]
    except (IndexError, KeyError) as exc:
        raise ValueError(f"no root-listen or ring-listen address for rank {exc.args[0]}") from None
    hello = encode_handshake(uid.magic, SocketType.BOOTSTRAP)
    out = []
    for r, (root_addr, ring_addr) in zip(ranks, addrs, strict=True):
        info = ExtInfo(r, world, 0, 1, root_addr, ring_addr)
        payload = info.encode(layout)
        out.append(RootCheckIn(r, payload, hello + encode_frame(payload)))
    return out


def expected_root_reply(layout: Layout, rank: int, world: int, ring_listen: Sequence[bytes]) -> bytes | None:
    """The root's reply to emulated `rank`: the ring address of rank+1, padded to 128 bytes.
    None for rank W-1, whose successor is R (the reply carries R's ring address)."""
    if rank == world - 1:
        return None
    addr = bytes(ring_listen[rank + 1])
    return addr + bytes(layout.root_reply_size - len(addr))


def decode_root_reply(layout: Layout, payload: bytes) -> bytes:
    """The 128-byte ring connect info from a root reply, size checked."""
    if len(payload) != layout.root_reply_size or layout.root_reply_size != NET_HANDLE_SIZE:
        raise NcclWireError(f"a root reply is {layout.root_reply_size} bytes in NCCL {layout.name}, got {len(payload)}")
    return bytes(payload)


# ---------------------------------------------------------------- ring allgather

class RingSide(Enum):
    AS_NEXT = "as_next"
    AS_PREV = "as_prev"


# slot(r, own) -> rank r's slice, built from R's own slice (the clone template), or None while
# it is not known yet (another real rank's slice, with several real ranks, that has not come)
SlotFn = Callable[[int, bytes], "bytes | None"]


@dataclass(frozen=True)
class RingPlan:
    """Slice indices per socket and direction, in stream order, for one allgather."""

    r_writes: dict[RingSide, tuple[int, ...]]  # what R sends on each socket
    c_writes: dict[RingSide, tuple[int, ...]]  # what the controller sends on each socket


def ring_plan(rank: int, world: int, bidirectional: bool, last: int | None = None) -> RingPlan:
    """Which slices cross which socket, per bootstrapAllGather (src/bootstrap.cc, socketRingAllGather).

    `rank` .. `last` (mod W) is a block of real ranks side by side (one rank: `last` is
    `rank`): the controller is `last`'s successor and `rank`'s predecessor, and the block
    moves slices through itself as one rank would."""
    w, r = world, rank
    b = r if last is None else last
    if w < 2:
        empty = {RingSide.AS_NEXT: (), RingSide.AS_PREV: ()}
        return RingPlan(dict(empty), dict(empty))
    if bidirectional:
        steps = w // 2
        both = steps - 1 if w % 2 == 0 else steps  # an even world ends with one ring-0-only step
    else:
        steps, both = w - 1, 0
    return RingPlan(
        r_writes={
            RingSide.AS_NEXT: tuple((b - s) % w for s in range(steps)),  # ring 0, R (the block's last) -> next
            RingSide.AS_PREV: tuple((r + s) % w for s in range(both)),  # ring 1, R (the block's first) -> prev
        },
        c_writes={
            RingSide.AS_PREV: tuple((r - s - 1) % w for s in range(steps)),  # ring 0, prev -> R
            RingSide.AS_NEXT: tuple((b + s + 1) % w for s in range(both)),  # ring 1, next -> R
        },
    )


class RingAllGather:
    """The controller's half of one bootstrapAllGather on the two ring sockets.

    Feed it what arrives on either socket; it returns what to write on each. The element size
    is learnt from R's first size header (R writes it without waiting); the controller's size
    headers go out at once, because R waits for them before sending data, and its slices go out
    once R's own slice (the template for every clone) has arrived. Later slices R forwards are
    the controller's own coming back around and are checked against what was sent. At most
    `window` steps are written ahead of R, and R's frames are refused above `max_size`, so
    memory stays bounded at any W. Bytes after this allgather's last frame are left in
    `leftover(side)` for the next one.
    """

    def __init__(self, rank: int, world: int, bidirectional: bool, slot: SlotFn, *, max_size: int,
                 window: int = 8, last: int | None = None):
        if window < 1:
            raise ValueError("window must be >= 1")
        self.rank, self.world, self.slot, self.window = rank, world, slot, window
        self.last = rank if last is None else last
        self.block = {(rank + i) % world for i in range((self.last - rank) % world + 1)}
        self.learned: dict[int, bytes] = {}  # the block's slices, as they come
        self.plan = ring_plan(rank, world, bidirectional, self.last)
        self._readers = {
            side: FrameReader(max_size, what=f"R's ring allgather frame ({side.value})",
                              limit=len(self.plan.r_writes[side]))
            for side in RingSide
        }
        self._sent = {side: 0 for side in RingSide}  # controller frames written (headers count once data goes)
        self._headers_sent = {side: False for side in RingSide}
        self.size: int | None = None
        self.own: bytes | None = None

    @property
    def done(self) -> bool:
        return all(self._readers[s].finished and self._sent[s] == len(self.plan.c_writes[s]) for s in RingSide)

    def leftover(self, side: RingSide) -> bytes:
        """Bytes fed on `side` beyond this allgather (the next one's, if any)."""
        reader = self._readers[side]
        return reader.rest if reader.finished else b""

    def poke(self) -> dict[RingSide, bytes]:
        """What can be written now that a slice this ring waited for is known (several real ranks)."""
        return self._writes()

    def feed(self, side: RingSide, data: bytes) -> dict[RingSide, bytes]:
        reader = self._readers[side]
        before = reader.count
        frames = reader.feed(data)
        if self.size is None and reader.declared is not None:
            self.size = reader.declared
        for n, payload in enumerate(frames, start=before):
            self._check_frame(side, n, payload)
        return self._writes()

    def _check_frame(self, side: RingSide, n: int, payload: bytes) -> None:
        if self.size is None:
            self.size = len(payload)
        if len(payload) != self.size:
            raise NcclWireError(
                f"R's ring allgather frame {n} on {side.value} is {len(payload)} bytes; its first was {self.size}"
            )
        index = self.plan.r_writes[side][n]
        if index in self.block:  # the block's own: new, or the same again on the other socket
            if index not in self.learned:
                self.learned[index] = payload
                if index == self.rank:
                    self.own = payload
            elif payload != self.learned[index]:
                raise NcclWireError(f"R sent two different copies of rank {index}'s slice on its two ring sockets")
            return
        if self.own is None and len(self.block) == 1:
            raise NcclWireError(f"R forwarded slice {index} on {side.value} before sending its own")
        want = self.slot(index, self.own)
        if want is None or payload != want:
            raise NcclWireError(
                f"R forwarded slice {index} on {side.value} altered: the ring is out of step with R"
            )

    def _writes(self) -> dict[RingSide, bytes]:
        out = {side: bytearray() for side in RingSide}
        if self.size is None:
            return {side: b"" for side in RingSide}
        for side in RingSide:
            todo = self.plan.c_writes[side]
            if todo and not self._headers_sent[side] and self._sent[side] == 0:
                # the first header goes alone: R blocks on it before it sends its own slice
                out[side] += self.size.to_bytes(4, "little", signed=True)
                self._headers_sent[side] = True
        if self.own is None and len(self.block) == 1:  # R's own slice is every clone's template
            return {side: bytes(b) for side, b in out.items()}
        progress = self._readers[RingSide.AS_NEXT].count  # ring-0 frames R has finished = its step
        for side in RingSide:
            todo = self.plan.c_writes[side]
            while self._sent[side] < len(todo) and self._sent[side] < progress + self.window:
                index = todo[self._sent[side]]
                payload = self.slot(index, self.own)
                if payload is None:
                    break  # another real rank's slice, still on its way
                if len(payload) != self.size:
                    raise ValueError(f"slot({index}) built {len(payload)} bytes; R's slices are {self.size}")
                if self._sent[side] == 0:
                    out[side] += payload  # its header went out already
                else:
                    out[side] += encode_frame(payload)
                self._sent[side] += 1
        return {side: bytes(b) for side, b in out.items()}
