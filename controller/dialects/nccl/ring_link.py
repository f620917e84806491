"""The bootstrap ring as the live controller plays it: for each real rank with an emulated
neighbour, its two ring sockets and its allgathers one after the other (`RingAllGather`),
with every slice in one book: the real ranks' own (checked against the layout when they
come) and the emulated ranks' clones of the mirror rank's (`layouts`). A real rank's
slice reaches the others as it comes; a ring waiting for it goes on then."""

from __future__ import annotations

from collections.abc import Callable

from .bootstrap import RingAllGather, RingSide
from .errors import NcclWireError
from .layouts import (
    check_own_all_gather_info,
    check_own_peer_info,
    check_own_ring_info,
    clone_all_gather_info,
    clone_peer_info,
    clone_ring_info,
)
from .versions import Layout
from .wire import SOCKADDR_SIZE, SockAddr

ALLGATHERS = 3  # ringAllInfo, ncclPeerInfo, allGatherInfo: what NCCL's init sends around the ring
MAX_SLICE = 1 << 20

Writer = Callable[[int, RingSide, bytes], None]  # (real rank, its socket, bytes) -> written or queued


class RingOfRank:
    """One block of real ranks side by side (`first` .. `last`, often one rank) in the ring
    allgathers: the controller dials `first` as its predecessor and `last` dials the controller."""

    def __init__(self, first: int, last: int) -> None:
        self.rank, self.last = first, last
        self.index = 0  # which allgather
        self.stepper: RingAllGather | None = None


def blocks(real: list[int], world: int) -> list[tuple[int, int]]:
    """The runs of real ranks side by side on the ring, as (first, last), cyclically."""
    members = set(real)
    out = []
    for r in sorted(members):
        if (r - 1) % world in members:
            continue
        last = r
        while (last + 1) % world in members:
            last = (last + 1) % world
        out.append((r, last))
    return out


class BootstrapRing:
    """Every real rank's ring allgathers. `node_addr[e]`: emulated rank e's bootstrap address
    (its p2p address in the first allgather); `write` sends what a ring answers."""

    def __init__(self, layout: Layout, world: int, real: list[int], mirror: int, node_addr: dict[int, bytes],
                 write: Writer) -> None:  # fmt: skip
        self.layout, self.world, self.mirror, self.node_addr, self.write = layout, world, mirror, node_addr, write
        self.members = set(real)
        self.blocks = [RingOfRank(first, last) for first, last in blocks(real, world)]
        self.rings = {end: b for b in self.blocks for end in (b.rank, b.last)}  # a block's two ends -> the block
        self.slices: list[dict[int, bytes]] = [{} for _ in range(ALLGATHERS)]  # allgather -> real rank -> slice
        self.p2p_addr: dict[int, SockAddr] = {}  # real rank -> its bootstrap p2p address

    def feed(self, rank: int, side: RingSide, data: bytes) -> None:
        ring = self.rings[rank]
        if ring.stepper is None:
            if ring.index >= ALLGATHERS:
                raise NcclWireError(f"rank {rank} began bootstrap allgather {ring.index + 1} on its ring; NCCL's init "
                                    f"sends {ALLGATHERS} (ringAllInfo, peerInfo, allGatherInfo)")  # fmt: skip
            ring.stepper = RingAllGather(ring.rank, self.world, self.layout.bidirectional_ring,
                                         self._slot_of(ring.index), max_size=MAX_SLICE, last=ring.last)  # fmt: skip
        st = ring.stepper
        self._out(ring, st.feed(side, data))
        for r, payload in list(st.learned.items()):
            if r not in self.slices[ring.index]:
                self._own_slice(r, ring.index, payload)
        if st.done:
            rests = {s: st.leftover(s) for s in RingSide}
            ring.stepper, ring.index = None, ring.index + 1
            for s, rest in rests.items():
                if rest:
                    self.feed(rank, s, rest)

    def _own_slice(self, rank: int, index: int, own: bytes) -> None:
        """A real rank's own slice: check it against the layout, keep it, let every ring go on."""
        if index == 0:
            check_own_ring_info(self.layout, own)
            off = self.layout.ring_info_p2p_off
            self.p2p_addr[rank] = SockAddr.decode(own[off : off + SOCKADDR_SIZE])
        elif index == 1:
            check_own_peer_info(self.layout, own, rank)
        else:
            check_own_all_gather_info(self.layout, own, rank)
        self.slices[index][rank] = own
        for other in self.blocks:
            if other.stepper is not None and other.index == index:
                self._out(other, other.stepper.poke())

    def _slot_of(self, index: int):
        def slot(r: int, _own: bytes) -> bytes | None:
            if r in self.members:
                return self.slices[index].get(r)
            if index == 0:
                return clone_ring_info(self.layout, self.node_addr[r])
            template = self.slices[index].get(self.mirror)
            if template is None:
                return None
            if index == 1:
                return clone_peer_info(self.layout, template, r)
            return clone_all_gather_info(self.layout, template, r)

        return slot

    def _out(self, ring: RingOfRank, writes: dict[RingSide, bytes]) -> None:
        """AS_PREV is the block's first rank's socket, AS_NEXT its last rank's."""
        for side, data in writes.items():
            if data:
                self.write(ring.rank if side is RingSide.AS_PREV else ring.last, side, data)
