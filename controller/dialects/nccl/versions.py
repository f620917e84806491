"""Which NCCL releases the controller speaks, and every byte offset that differs between them.

Each `Layout` covers a run of release tags whose structs were read in the NCCL git history
and laid out with gcc on x86_64 (docs/nccl_wire.md lists tag and file per fact). A version
outside those runs is refused: guessing a struct size makes R fail later with "Message
truncated" or, worse, read garbage in silence.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from enum import Enum

from .errors import UnsupportedNcclVersion

__all__ = ["Layout", "NcclVersion", "P2pPreamble", "TopoOffsets", "layout_for", "LAYOUTS", "SPOKEN"]


@dataclass(frozen=True, order=True)
class NcclVersion:
    """An NCCL release as major.minor.patch (the '-1' packaging suffix of the git tags is dropped)."""

    major: int
    minor: int
    patch: int

    @classmethod
    def parse(cls, value: NcclVersion | int | str | tuple[int, ...]) -> NcclVersion:
        """From NCCL's int code (22809), a string ("2.28.9", "2.28.9-1") or torch's tuple (2, 28, 9)."""
        if isinstance(value, NcclVersion):
            return value
        if isinstance(value, bool):
            raise TypeError("an NCCL version is not a bool")
        if isinstance(value, int):
            # NCCL_VERSION(X,Y,Z): X*10000+Y*100+Z since 2.9; X*1000+Y*100+Z before.
            if value >= 20900:
                return cls(value // 10000, value % 10000 // 100, value % 100)
            return cls(value // 1000, value % 1000 // 100, value % 100)
        if isinstance(value, tuple):
            parts = tuple(int(p) for p in value) + (0, 0)
            return cls(*parts[:3])
        if isinstance(value, str):
            m = re.fullmatch(r"\s*v?(\d+)\.(\d+)(?:\.(\d+))?(?:-\d+)?\s*", value)
            if m is None:
                raise ValueError(f"{value!r} is not an NCCL version (expected e.g. 2.28.9)")
            return cls(int(m[1]), int(m[2]), int(m[3] or 0))
        raise TypeError(f"cannot read an NCCL version from {type(value).__name__}")

    @property
    def code(self) -> int:
        """The int NCCL puts in ncclPeerInfo.version and returns from ncclGetVersion."""
        return self.major * 10000 + self.minor * 100 + self.patch

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"


class P2pPreamble(Enum):
    """How bootstrapSend announces itself on a p2p connection."""

    SPLIT = "split"  # <= 2.22: [4][rank] then [4][tag]  (not spoken)
    COMBINED = "combined"  # >= 2.23: [8][rank, tag]


@dataclass(frozen=True)
class TopoOffsets:
    """Where the int[MAXCHANNELS] arrays of ncclTopoRanks sit inside the allGatherInfo slice."""

    ring_recv: int
    ring_send: int
    ring_prev: int
    ring_next: int
    tree_to_parent: int
    tree_to_child0: int
    tree_to_child1: int


def _topo(start: int, maxchannels: int) -> TopoOffsets:
    step = 4 * maxchannels
    return TopoOffsets(*(start + i * step for i in range(7)))


@dataclass(frozen=True)
class Layout:
    """Every version-dependent wire fact for one run of NCCL releases (x86_64, little endian)."""

    first: NcclVersion  # first verified release tag of the run
    last: NcclVersion  # last verified release tag of the run
    # extInfo: what each rank sends the root (src/bootstrap.cc)
    ext_info_size: int
    ext_offset_off: int | None  # the 2.29+ rank-distribution offset; None before
    ext_listen_root_off: int
    ext_connect_info_off: int
    unique_id_has_nranks: bool  # ncclBootstrapHandle.nRanks at byte 36 (2.29+)
    root_reply_size: int  # union ringConnectInfo the root sends each rank
    # allgather #1 (bootstrapInit ringAllInfo): p2p addr@0, proxy addr@28, UDS id@56, RAS init@64
    ring_info_size: int
    # allgather #2: ncclPeerInfo (src/include/transport.h)
    peer_info_size: int
    peer_version_off: int
    # allgather #3: the local allGatherInfo of initTransportsRank (src/init.cc)
    all_gather_info_size: int
    topo: TopoOffsets
    maxchannels: int
    num_algorithms: int
    bidirectional_ring: bool  # bootstrapAllGather over two rings (2.28.7+)
    # transport setup (src/transport.cc, src/transport/net.cc)
    connect_use_gdr_off: int | None  # NET connect blob's useGdr int; None = not written (2.23)
    net_plugin_newest: int  # newest ncclNetPlugin_vN symbol NCCL looks for
    net_plugin_oldest: int
    profiler_newest: int
    wrong_socket_type_drops: bool  # True: INFO + keep accepting; False: WARN + the accept fails
    recv_waits_for_eof: bool  # bootstrapRecv reads to EOF before closing (2.26+): close after each send
    # the data path (src/enqueue.cc scheduleCollTasksToPlan): a channel's least traffic, the
    # cell the channel partition cuts a collective into (schedules.nccl.NcclConfig)
    min_traffic_per_channel: int = 16 << 10  # 2.23 .. 2.28
    # the fields that do not move inside the spoken range, kept here so callers read one table
    peer_rank_off: int = 0
    peer_host_hash_off: int = 16
    peer_pid_hash_off: int = 24
    ext_rank_off: int = 0
    ext_nranks_off: int = 4
    ext_iroot_off: int = 8
    ext_nroots_off: int = 12
    ring_info_p2p_off: int = 0
    p2p_preamble: P2pPreamble = P2pPreamble.COMBINED
    connect_size: int = 256  # sizeof(struct ncclConnect)
    sync_tag_bit: int = 0x80  # setup tag + 128 = the post-connect sync tag (2.21+)
    sync_payload_size: int = 0  # the sync messages carry nothing (2.23+)
    version: NcclVersion | None = None  # the exact release asked for, set by layout_for

    def covers(self, version: NcclVersion) -> bool:
        return self.first <= version <= self.last

    @property
    def name(self) -> str:
        return str(self.version) if self.version else f"{self.first}..{self.last}"


V = NcclVersion.parse

_EXT_4 = dict(ext_info_size=172, ext_offset_off=None, ext_listen_root_off=16, ext_connect_info_off=44,
              unique_id_has_nranks=False)
_EXT_5 = dict(ext_info_size=176, ext_offset_off=16, ext_listen_root_off=20, ext_connect_info_off=48,
              unique_id_has_nranks=True, min_traffic_per_channel=32 << 10)  # both change in 2.29.2
_AG_32 = dict(maxchannels=32, topo=_topo(224, 32))
_AG_64 = dict(maxchannels=64, topo=_topo(224, 64))
_AG_64X = dict(maxchannels=64, topo=_topo(228, 64))  # crossNicRing int first in ncclTopoRanks (2.28+)
_COMMON = dict(root_reply_size=128, num_algorithms=7, net_plugin_oldest=6, wrong_socket_type_drops=False,
               recv_waits_for_eof=True)

_OLD = {**_COMMON, "net_plugin_oldest": 5, "recv_waits_for_eof": False}  # 2.23 .. 2.25

# Runs of release tags with identical layouts. Sizes/offsets: gcc on the re-declared structs
# at each tag (docs/nccl_wire.md, "How the numbers were checked").
LAYOUTS: tuple[Layout, ...] = (
    Layout(V("2.23.4"), V("2.23.4"), **_EXT_4, **_AG_32, **_OLD,
           ring_info_size=64, peer_info_size=104, peer_version_off=100, all_gather_info_size=1260,
           bidirectional_ring=False, connect_use_gdr_off=None, net_plugin_newest=8, profiler_newest=1),
    Layout(V("2.24.3"), V("2.24.3"), **_EXT_4, **_AG_32, **_OLD,
           ring_info_size=104, peer_info_size=104, peer_version_off=100, all_gather_info_size=1260,
           bidirectional_ring=False, connect_use_gdr_off=128, net_plugin_newest=9, profiler_newest=2),
    Layout(V("2.25.1"), V("2.25.1"), **_EXT_4, **_AG_64, **_OLD,
           ring_info_size=104, peer_info_size=104, peer_version_off=100, all_gather_info_size=2284,
           bidirectional_ring=False, connect_use_gdr_off=128, net_plugin_newest=9, profiler_newest=2),
    Layout(V("2.26.2"), V("2.26.6"), **_EXT_4, **_AG_64, **_COMMON,
           ring_info_size=120, peer_info_size=104, peer_version_off=100, all_gather_info_size=2284,
           bidirectional_ring=False, connect_use_gdr_off=128, net_plugin_newest=10, profiler_newest=3),
    Layout(V("2.27.3"), V("2.27.7"), **_EXT_4, **_AG_64, **_COMMON,
           ring_info_size=120, peer_info_size=120, peer_version_off=112, all_gather_info_size=2288,
           bidirectional_ring=False, connect_use_gdr_off=128, net_plugin_newest=10, profiler_newest=4),
    Layout(V("2.28.3"), V("2.28.3"), **_EXT_4, **_AG_64X, **_COMMON,
           ring_info_size=120, peer_info_size=120, peer_version_off=112, all_gather_info_size=2292,
           bidirectional_ring=False, connect_use_gdr_off=128, net_plugin_newest=11, profiler_newest=5),
    Layout(V("2.28.7"), V("2.28.9"), **_EXT_4, **_AG_64X, **_COMMON,
           ring_info_size=120, peer_info_size=120, peer_version_off=112, all_gather_info_size=2292,
           bidirectional_ring=True, connect_use_gdr_off=128, net_plugin_newest=11, profiler_newest=5),
    Layout(V("2.29.2"), V("2.29.3"), **_EXT_5, **_AG_64X, **_COMMON,
           ring_info_size=120, peer_info_size=120, peer_version_off=112, all_gather_info_size=2300,
           bidirectional_ring=True, connect_use_gdr_off=128, net_plugin_newest=11, profiler_newest=6),
    Layout(V("2.29.7"), V("2.29.7"), **_EXT_5, **_AG_64X, **_COMMON,
           ring_info_size=120, peer_info_size=128, peer_version_off=112, all_gather_info_size=2300,
           bidirectional_ring=True, connect_use_gdr_off=128, net_plugin_newest=11, profiler_newest=6),
    Layout(V("2.30.3"), V("2.30.4"), **_EXT_5, **_AG_64X, **_COMMON,
           ring_info_size=120, peer_info_size=128, peer_version_off=112, all_gather_info_size=2320,
           bidirectional_ring=True, connect_use_gdr_off=128, net_plugin_newest=12, profiler_newest=6),
    Layout(V("2.30.7"), V("2.30.7"), **_EXT_5, **_AG_64X, **{**_COMMON, "wrong_socket_type_drops": True},
           ring_info_size=120, peer_info_size=144, peer_version_off=128, all_gather_info_size=2320,
           bidirectional_ring=True, connect_use_gdr_off=128, net_plugin_newest=12, profiler_newest=6),
)

OLDEST = LAYOUTS[0].first
NEWEST = LAYOUTS[-1].last
SPOKEN = f"{OLDEST} to {NEWEST}"


def layout_for(version: NcclVersion | int | str | tuple[int, ...]) -> Layout:
    """The layout for one release, or an `UnsupportedNcclVersion` whose message is one line."""
    v = NcclVersion.parse(version)
    for layout in LAYOUTS:
        if layout.covers(v):
            return dataclasses.replace(layout, version=v)
    why = ""
    if OLDEST < v < NEWEST:
        below = max(lay.last for lay in LAYOUTS if lay.last < v)
        above = min(lay.first for lay in LAYOUTS if lay.first > v)
        why = f"; it falls between the read releases {below} and {above}, whose layouts differ"
    raise UnsupportedNcclVersion(
        f"NCCL {v} is not spoken by this controller (spoken: {SPOKEN}){why}; pin nvidia-nccl to one of those"
    )
