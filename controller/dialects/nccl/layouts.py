"""Clone-and-patch: an emulated rank's allgather slice is R's own slice with a few fields changed.

R (the one real rank) contributes its slice first; every emulated rank r claims the same
GPU, topology and NCCL build as R except what must differ for R to see W distinct single-GPU
nodes: the rank, the host and process hashes, and the topology ranks. Before the first clone
the template is checked against the layout, so a wrong table stops the run with the field
and version named instead of feeding R garbage.
"""

from __future__ import annotations

import struct

from .errors import LayoutMismatch
from .versions import Layout
from .wire import NET_HANDLE_SIZE, SOCKADDR_SIZE

U64 = struct.Struct("<Q")
I32 = struct.Struct("<i")
MASK64 = (1 << 64) - 1

# the ncclTopoRanks arrays an emulated rank sets to its own rank: R then sees node r = rank r,
# alone on its node, ring 0 -> 1 -> ... -> W-1 and trees built over ranks (src/graph/connect.cc)
PATCHED_TOPO_FIELDS = ("ring_recv", "ring_send", "tree_to_parent", "tree_to_child0", "tree_to_child1")


def _check_size(layout: Layout, what: str, own: bytes, size: int) -> None:
    if len(own) != size:
        raise LayoutMismatch(
            f"R's {what} slice is {len(own)} bytes, NCCL {layout.name} lays it out in {size}: "
            "the NCCL version or the layout table is wrong"
        )


# ---------------------------------------------------------------- ringAllInfo (allgather #1)

def check_own_ring_info(layout: Layout, own: bytes) -> None:
    """R's ringAllInfo slice: the right size and an IPv4/IPv6 p2p address first."""
    _check_size(layout, "ringAllInfo", own, layout.ring_info_size)
    (family,) = struct.unpack_from("<H", own, layout.ring_info_p2p_off)
    if family not in (2, 10):
        raise LayoutMismatch(
            f"R's ringAllInfo slice has address family {family} where NCCL {layout.name} keeps the p2p address"
        )


def clone_ring_info(layout: Layout, p2p_addr: bytes) -> bytes:
    """An emulated rank's ringAllInfo slice: its own p2p address, the rest zero.

    The proxy address and UDS id are only used between ranks of one host, and a zero RAS
    entry is what NCCL itself sends when RAS is off or failed.
    """
    if len(p2p_addr) != SOCKADDR_SIZE:
        raise ValueError(f"a p2p address is {SOCKADDR_SIZE} bytes, got {len(p2p_addr)}")
    out = bytearray(layout.ring_info_size)
    out[layout.ring_info_p2p_off : layout.ring_info_p2p_off + SOCKADDR_SIZE] = p2p_addr
    return bytes(out)


# ---------------------------------------------------------------- ncclPeerInfo (allgather #2)

def check_own_peer_info(layout: Layout, own: bytes, rank: int) -> None:
    """R's ncclPeerInfo: size, rank field = R, version field = the release we were told."""
    _check_size(layout, "ncclPeerInfo", own, layout.peer_info_size)
    (got,) = I32.unpack_from(own, layout.peer_rank_off)
    if got != rank:
        raise LayoutMismatch(f"R's ncclPeerInfo.rank reads {got}, expected {rank} (NCCL {layout.name} layout)")
    if layout.version is not None:
        (code,) = I32.unpack_from(own, layout.peer_version_off)
        if code != layout.version.code:
            raise LayoutMismatch(
                f"R's ncclPeerInfo.version reads {code}, expected {layout.version.code} "
                f"(NCCL {layout.name} layout): R runs another NCCL than the one declared"
            )


def clone_peer_info(layout: Layout, own: bytes, rank: int) -> bytes:
    """R's ncclPeerInfo with rank = r and hostHash/pidHash = R's + 1 + r (mod 2**64).

    A different hostHash makes R count r as another node, so only the NET transport can
    reach it; everything else (version, compute capability, cuMem support) must agree with R.
    """
    _check_size(layout, "ncclPeerInfo", own, layout.peer_info_size)
    out = bytearray(own)
    I32.pack_into(out, layout.peer_rank_off, rank)
    for off in (layout.peer_host_hash_off, layout.peer_pid_hash_off):
        (h,) = U64.unpack_from(own, off)
        U64.pack_into(out, off, (h + 1 + rank) & MASK64)
    return bytes(out)


# ---------------------------------------------------------------- allGatherInfo (allgather #3)

def _topo_array(layout: Layout, own: bytes, field: str) -> list[int]:
    off = getattr(layout.topo, field)
    return list(struct.unpack_from(f"<{layout.maxchannels}i", own, off))


def check_own_all_gather_info(layout: Layout, own: bytes, rank: int) -> None:
    """R alone on its node: ringRecv[0] == R and ringPrev[0] == -1 at this layout's offsets."""
    _check_size(layout, "allGatherInfo", own, layout.all_gather_info_size)
    for field, want in (("ring_recv", rank), ("ring_prev", -1)):
        got = _topo_array(layout, own, field)[0]
        if got != want:
            raise LayoutMismatch(
                f"R's allGatherInfo.topoRanks.{field}[0] reads {got}, expected {want} "
                f"at offset {getattr(layout.topo, field)} (NCCL {layout.name} layout)"
            )


def clone_all_gather_info(layout: Layout, own: bytes, rank: int) -> bytes:
    """R's allGatherInfo with ringRecv/ringSend/treeToParent/treeToChild0/1 = r in every channel."""
    _check_size(layout, "allGatherInfo", own, layout.all_gather_info_size)
    out = bytearray(own)
    fill = struct.pack(f"<{layout.maxchannels}i", *([rank] * layout.maxchannels))
    for field in PATCHED_TOPO_FIELDS:
        off = getattr(layout.topo, field)
        out[off : off + len(fill)] = fill
    return bytes(out)


# ---------------------------------------------------------------- NET transport ncclConnect blobs

def send_connect_info(layout: Layout, proxy_rank: int, use_gdr: int = 0) -> bytes:
    """A sender's 256-byte ncclConnect: proxyRank@0, useGdr@128 (2.24+; 2.23 writes no flag)."""
    out = bytearray(layout.connect_size)
    I32.pack_into(out, 0, proxy_rank)
    if layout.connect_use_gdr_off is not None:
        I32.pack_into(out, layout.connect_use_gdr_off, use_gdr)
    elif use_gdr:
        raise ValueError(f"NCCL {layout.name} carries no useGdr flag in ncclConnect")
    return bytes(out)


def recv_connect_info(layout: Layout, handle: bytes, use_gdr: int = 0) -> bytes:
    """A receiver's 256-byte ncclConnect: its 128-byte net listen handle@0, useGdr@128 (2.24+)."""
    if len(handle) != NET_HANDLE_SIZE:
        raise ValueError(f"a net handle is {NET_HANDLE_SIZE} bytes, got {len(handle)}")
    out = bytearray(layout.connect_size)
    out[:NET_HANDLE_SIZE] = handle
    if layout.connect_use_gdr_off is not None:
        I32.pack_into(out, layout.connect_use_gdr_off, use_gdr)
    elif use_gdr:
        raise ValueError(f"NCCL {layout.name} carries no useGdr flag in ncclConnect")
    return bytes(out)


def decode_send_connect_info(layout: Layout, blob: bytes) -> tuple[int, int]:
    """(proxyRank, useGdr) of a sender's ncclConnect."""
    _check_size(layout, "ncclConnect", blob, layout.connect_size)
    gdr = 0 if layout.connect_use_gdr_off is None else I32.unpack_from(blob, layout.connect_use_gdr_off)[0]
    return I32.unpack_from(blob, 0)[0], gdr


def decode_recv_connect_info(layout: Layout, blob: bytes) -> tuple[bytes, int]:
    """(net handle, useGdr) of a receiver's ncclConnect."""
    _check_size(layout, "ncclConnect", blob, layout.connect_size)
    gdr = 0 if layout.connect_use_gdr_off is None else I32.unpack_from(blob, layout.connect_use_gdr_off)[0]
    return bytes(blob[:NET_HANDLE_SIZE]), gdr
