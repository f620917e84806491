"""The reactive transport-setup responder: answer each bootstrapSend R makes in
ncclTransportP2pSetup (src/transport.cc) with the message R will wait for from that peer.

For each distance i = 1..W-1, R exchanges ncclConnect entries with recvPeer = R-i (the rank
it receives from) and sendPeer = R+i (the rank it sends to), with tag (i << 8) + graphId+1
(0 for p2p operations). Every receive R posts is paired with a send of its own to the same
peer with the same tag, so answering R's sends one by one is enough for any algorithm:

- R -> R-i carries R's *recv* infos (R's net handles): that peer answers with its *send* infos;
- R -> R+i carries R's *send* infos: that peer answers with its *recv* infos (handles R dials);
- when R-i == R+i (W = 2, or i = W/2) R sends one message [recv infos | send infos] and
  expects [the peer's recv infos for R's send channels | the peer's send infos];
- the sync that follows uses tag + 128 and carries nothing (2.23+); the answer is empty too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from .errors import NcclWireError
from .layouts import recv_connect_info, send_connect_info
from .versions import Layout

# (peer, tag, position) -> the 128-byte net handle the emulated `peer` listens on for the
# position-th channel of this exchange (ascending channel order, as R packs them)
RecvHandleFn = Callable[[int, int, int], bytes]


class PeerRole(Enum):
    """What the addressed peer is to R in this exchange."""

    SENDS_TO_R = "sends_to_r"  # peer = R - i: R sent its recv infos
    RECEIVES_FROM_R = "receives_from_r"  # peer = R + i: R sent its send infos
    BOTH = "both"  # R - i == R + i: one combined message each way


@dataclass(frozen=True)
class SetupTag:
    """A transport-setup bootstrap tag taken apart."""

    distance: int  # i = tag >> 8
    graph: int  # low 7 bits: graph id + 1 (0 = p2p operations)
    sync: bool  # bit 7: the post-connect sync

    @classmethod
    def decode(cls, tag: int, layout: Layout) -> SetupTag:
        return cls(tag >> 8, tag & (layout.sync_tag_bit - 1), bool(tag & layout.sync_tag_bit))


@dataclass(frozen=True)
class SetupReply:
    """The message the emulated rank `src` must bootstrapSend to R (`dst`), and what R told it."""

    src: int
    dst: int
    tag: int
    payload: bytes
    role: PeerRole
    sync: bool
    r_recv_infos: tuple[bytes, ...] = ()  # R's recv connect blobs: handles `src` must dial as sender
    r_send_infos: tuple[bytes, ...] = ()  # R's send connect blobs: R will dial `src`'s handles


class SetupResponder:
    """Pure: R's (peer, tag, payload) in, the emulated peer's reply out. No state across calls."""

    def __init__(self, layout: Layout, rank: int, world: int, recv_handle: RecvHandleFn):
        if world < 2 or not 0 <= rank < world:
            raise ValueError(f"rank {rank} of world {world} has no transport peers")
        self.layout = layout
        self.rank = rank
        self.world = world
        self.recv_handle = recv_handle

    def role_of(self, peer: int, tag: int) -> tuple[SetupTag, PeerRole]:
        """Which side `peer` plays for R under `tag`, from (peer - R) mod W and i = tag >> 8."""
        t = SetupTag.decode(tag, self.layout)
        w, r = self.world, self.rank
        if not 1 <= t.distance < w:
            raise NcclWireError(f"setup tag {tag} names distance {t.distance}, outside 1..{w - 1} for world {w}")
        recv_peer, send_peer = (r - t.distance) % w, (r + t.distance) % w
        if peer == recv_peer == send_peer:
            return t, PeerRole.BOTH
        if peer == recv_peer:
            return t, PeerRole.SENDS_TO_R
        if peer == send_peer:
            return t, PeerRole.RECEIVES_FROM_R
        raise NcclWireError(
            f"R sent setup tag {tag} (distance {t.distance}) to rank {peer}, which is neither "
            f"{recv_peer} nor {send_peer}"
        )

    def respond(self, peer: int, tag: int, payload: bytes) -> SetupReply:
        t, role = self.role_of(peer, tag)
        if t.sync:
            if len(payload) != self.layout.sync_payload_size:
                raise NcclWireError(
                    f"R's setup sync (tag {tag}) to rank {peer} carries {len(payload)} bytes, "
                    f"expected {self.layout.sync_payload_size}"
                )
            return SetupReply(peer, self.rank, tag, b"", role, True)
        size = self.layout.connect_size
        if len(payload) == 0 or len(payload) % size:
            raise NcclWireError(
                f"R's setup message (tag {tag}) to rank {peer} is {len(payload)} bytes, not a positive "
                f"multiple of the {size}-byte ncclConnect"
            )
        entries = tuple(bytes(payload[o : o + size]) for o in range(0, len(payload), size))
        k = len(entries)
        if role is PeerRole.SENDS_TO_R:
            reply = [send_connect_info(self.layout, peer) for _ in range(k)]
            return SetupReply(peer, self.rank, tag, b"".join(reply), role, False, r_recv_infos=entries)
        if role is PeerRole.RECEIVES_FROM_R:
            reply = [self._recv_info(peer, tag, j) for j in range(k)]
            return SetupReply(peer, self.rank, tag, b"".join(reply), role, False, r_send_infos=entries)
        # combined: R packed [its recv infos | its send infos]; with the same channel mask both ways
        # (every ring and tree graph NCCL builds is symmetric between two peers) that is half and half
        if k % 2:
            raise NcclWireError(
                f"R's combined setup message (tag {tag}) to rank {peer} has {k} entries; an odd count means "
                "different recv and send channel masks, which this responder does not model"
            )
        half = k // 2
        reply = [self._recv_info(peer, tag, j) for j in range(half)]
        reply += [send_connect_info(self.layout, peer) for _ in range(half)]
        return SetupReply(
            peer, self.rank, tag, b"".join(reply), role, False, r_recv_infos=entries[:half], r_send_infos=entries[half:]
        )

    def _recv_info(self, peer: int, tag: int, position: int) -> bytes:
        return recv_connect_info(self.layout, self.recv_handle(peer, tag, position))
