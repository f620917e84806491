"""The NCCL dialect's sans-IO layer: version tables against the sources, codecs, clone-and-patch,
the setup responder and the ring allgather stepper against an independent model of R."""

import random
import struct

import pytest
from neuronabox.controller.dialects.nccl.bootstrap import (
    RingAllGather,
    RingSide,
    decode_root_reply,
    expected_root_reply,
    ring_plan,
    root_checkins,
)
from neuronabox.controller.dialects.nccl.errors import LayoutMismatch, NcclError, NcclWireError, UnsupportedNcclVersion
from neuronabox.controller.dialects.nccl.layouts import (
    check_own_all_gather_info,
    check_own_peer_info,
    check_own_ring_info,
    clone_all_gather_info,
    clone_peer_info,
    clone_ring_info,
    decode_recv_connect_info,
    decode_send_connect_info,
    recv_connect_info,
    send_connect_info,
)
from neuronabox.controller.dialects.nccl.setup import PeerRole, SetupResponder, SetupTag
from neuronabox.controller.dialects.nccl.versions import LAYOUTS, NcclVersion, layout_for
from neuronabox.controller.dialects.nccl.wire import (
    NCCL_SOCKET_MAGIC,
    ExtInfo,
    FrameReader,
    SockAddr,
    SocketNetHandle,
    SocketType,
    UniqueId,
    decode_handshake,
    decode_net_socket_preamble,
    decode_p2p_preamble,
    encode_frame,
    encode_handshake,
    encode_net_socket_preamble,
    encode_p2p_preamble,
    encode_sockaddr,
)

from neuronabox.errors import NeuronaBoxError

L2289 = layout_for("2.28.9")
ADDR = encode_sockaddr("127.0.0.1", 5000)

# ------------------------------------------------------------------ golden facts from the sources
# Each row: (release, fact, value). Struct sizes/offsets were obtained by re-declaring the structs
# at that tag in a throwaway C file and printing sizeof/offsetof with gcc on x86_64; the files:
#   extInfo            src/bootstrap.cc            (2.23.4-1 .. 2.28.9-1: 4 ints; 2.29.2-1+: + offset)
#   ringAllInfo slice  src/bootstrap.cc bootstrapRingData + src/include/ras.h rasRankInit
#   ncclPeerInfo       src/include/transport.h (+ nvmlGpuFabricInfo_v2_t, src/include/nvmlwrap.h)
#   allGatherInfo      src/init.cc (local struct) + src/include/graph.h ncclTopoRanks
#   MAXCHANNELS        src/include/device.h;  bidirectional ring: src/bootstrap.cc socketRingAllGather
#   useGdr@128         src/transport/net.cc sendSetup/recvSetup (absent at v2.23.4-1)
#   EOF wait           src/bootstrap.cc bootstrapRecv: ncclSocketClose(&sock, wait=true) from v2.26.2-1
#   wrong socket type  src/misc/socket.cc socketFinalizeAccept (INFO + keep accepting only at v2.30.7-1)
#   plugin symbols     dlsym("ncclNetPlugin_vN") / dlsym("ncclProfiler_vN") under src/
GOLDEN = [
    ("2.23.4", "ext_info_size", 172), ("2.23.4", "ext_connect_info_off", 44),
    ("2.28.9", "ext_info_size", 172), ("2.28.9", "ext_listen_root_off", 16), ("2.28.9", "ext_connect_info_off", 44),
    ("2.29.2", "ext_info_size", 176), ("2.29.2", "ext_offset_off", 16), ("2.29.2", "ext_listen_root_off", 20),
    ("2.29.2", "ext_connect_info_off", 48), ("2.30.7", "ext_info_size", 176),
    ("2.23.4", "ring_info_size", 64), ("2.24.3", "ring_info_size", 104), ("2.25.1", "ring_info_size", 104),
    ("2.26.2", "ring_info_size", 120), ("2.28.9", "ring_info_size", 120), ("2.30.7", "ring_info_size", 120),
    ("2.23.4", "peer_info_size", 104), ("2.26.6", "peer_info_size", 104), ("2.26.6", "peer_version_off", 100),
    ("2.27.3", "peer_info_size", 120), ("2.28.9", "peer_info_size", 120), ("2.28.9", "peer_version_off", 112),
    ("2.29.3", "peer_info_size", 120), ("2.29.7", "peer_info_size", 128), ("2.30.4", "peer_info_size", 128),
    ("2.30.7", "peer_info_size", 144), ("2.30.7", "peer_version_off", 128),
    ("2.23.4", "all_gather_info_size", 1260), ("2.24.3", "all_gather_info_size", 1260),
    ("2.25.1", "all_gather_info_size", 2284), ("2.26.6", "all_gather_info_size", 2284),
    ("2.27.7", "all_gather_info_size", 2288), ("2.28.3", "all_gather_info_size", 2292),
    ("2.28.9", "all_gather_info_size", 2292), ("2.29.7", "all_gather_info_size", 2300),
    ("2.30.3", "all_gather_info_size", 2320), ("2.30.7", "all_gather_info_size", 2320),
    ("2.24.3", "maxchannels", 32), ("2.25.1", "maxchannels", 64), ("2.28.9", "maxchannels", 64),
    ("2.28.3", "bidirectional_ring", False), ("2.28.7", "bidirectional_ring", True),
    ("2.28.9", "bidirectional_ring", True), ("2.30.7", "bidirectional_ring", True),
    ("2.23.4", "connect_use_gdr_off", None), ("2.24.3", "connect_use_gdr_off", 128),
    ("2.28.9", "connect_use_gdr_off", 128),
    ("2.23.4", "net_plugin_newest", 8), ("2.25.1", "net_plugin_newest", 9), ("2.27.7", "net_plugin_newest", 10),
    ("2.28.9", "net_plugin_newest", 11), ("2.30.7", "net_plugin_newest", 12),
    ("2.28.9", "profiler_newest", 5), ("2.29.2", "profiler_newest", 6),
    ("2.28.9", "root_reply_size", 128), ("2.28.9", "connect_size", 256),
    ("2.30.4", "wrong_socket_type_drops", False), ("2.30.7", "wrong_socket_type_drops", True),
    ("2.25.1", "recv_waits_for_eof", False), ("2.26.2", "recv_waits_for_eof", True),  # bootstrapRecv's close
    ("2.23.4", "min_traffic_per_channel", 16 << 10), ("2.28.9", "min_traffic_per_channel", 16 << 10),
    ("2.29.2", "min_traffic_per_channel", 32 << 10), ("2.30.7", "min_traffic_per_channel", 32 << 10),  # enqueue.cc
]
# ncclTopoRanks array offsets inside allGatherInfo (gcc at v2.23.4-1, v2.25.1-1, v2.28.9-1, v2.30.7-1)
GOLDEN_TOPO = {
    "2.23.4": (224, 352, 480, 608, 736, 864, 992),
    "2.25.1": (224, 480, 736, 992, 1248, 1504, 1760),
    "2.27.7": (224, 480, 736, 992, 1248, 1504, 1760),
    "2.28.9": (228, 484, 740, 996, 1252, 1508, 1764),
    "2.30.7": (228, 484, 740, 996, 1252, 1508, 1764),
}


@pytest.mark.parametrize("release,fact,value", GOLDEN)
def test_layout_golden_facts(release, fact, value):
    assert getattr(layout_for(release), fact) == value


@pytest.mark.parametrize("release", sorted(GOLDEN_TOPO))
def test_topo_offsets_golden(release):
    lay = layout_for(release)
    t = lay.topo
    assert (t.ring_recv, t.ring_send, t.ring_prev, t.ring_next, t.tree_to_parent, t.tree_to_child0,
            t.tree_to_child1) == GOLDEN_TOPO[release]
    # the arrays sit in the slice, the last one ending before nvlsHeads
    assert t.tree_to_child1 + 4 * lay.maxchannels + 4 * lay.maxchannels + 4 <= lay.all_gather_info_size


def test_fixed_offsets_and_every_read_tag_is_spoken():
    for tag in ["2.23.4", "2.24.3", "2.25.1", "2.26.2", "2.26.3", "2.26.5", "2.26.6", "2.27.3", "2.27.5", "2.27.6",
                "2.27.7", "2.28.3", "2.28.7", "2.28.9", "2.29.2", "2.29.3", "2.29.7", "2.30.3", "2.30.4", "2.30.7"]:
        lay = layout_for(tag)
        assert (lay.peer_rank_off, lay.peer_host_hash_off, lay.peer_pid_hash_off) == (0, 16, 24)
        assert lay.version == NcclVersion.parse(tag)
    # the runs do not overlap and are in order
    for a, b in zip(LAYOUTS, LAYOUTS[1:], strict=False):
        assert a.last < b.first


# ------------------------------------------------------------------ versions

def test_version_parsing_forms():
    want = NcclVersion(2, 28, 9)
    assert NcclVersion.parse(22809) == want
    assert NcclVersion.parse("2.28.9") == want
    assert NcclVersion.parse("v2.28.9-1") == want
    assert NcclVersion.parse((2, 28, 9)) == want
    assert want.code == 22809 and str(want) == "2.28.9"
    assert NcclVersion.parse(2708) == NcclVersion(2, 7, 8)  # the pre-2.9 code scheme
    with pytest.raises(ValueError):
        NcclVersion.parse("twenty")


@pytest.mark.parametrize("version,shown", [("2.32.3", "2.32.3"), ((2, 22, 3), "2.22.3"), ("2.22", "2.22.0"),
                                           (23100, "2.31.0")])
def test_unread_versions_are_refused_in_one_line(version, shown):
    with pytest.raises(UnsupportedNcclVersion) as err:
        layout_for(version)
    msg = str(err.value)
    assert msg == (f"NCCL {shown} is not spoken by this controller (spoken: 2.23.4 to 2.30.7); "
                   "pin nvidia-nccl to one of those")
    assert "\n" not in msg
    assert isinstance(err.value, NeuronaBoxError)


def test_version_between_runs_is_refused_with_the_reason():
    with pytest.raises(UnsupportedNcclVersion, match=r"2\.29\.5 is not spoken .* between the read releases "
                                                     r"2\.29\.3 and 2\.29\.7"):
        layout_for("2.29.5")


# ------------------------------------------------------------------ wire codecs

def test_sockaddr_example_bytes():
    assert ADDR == bytes.fromhex("0200 1388 7f000001") + bytes(20)
    assert len(ADDR) == 28
    assert SockAddr.decode(ADDR) == SockAddr("127.0.0.1", 5000)
    assert SockAddr("10.1.2.3", 65535).encode()[2:4] == b"\xff\xff"
    with pytest.raises(NcclWireError, match="AF_INET"):
        SockAddr.decode(bytes(28))


def test_unique_id_round_trip_and_layout():
    uid = UniqueId(0x1122334455667788, SockAddr("127.0.0.1", 5000))
    raw = uid.encode()
    assert len(raw) == 128
    assert raw[:8] == bytes.fromhex("8877665544332211")
    assert raw[8:36] == ADDR and raw[36:] == bytes(92)
    assert UniqueId.decode(raw) == uid
    grown = UniqueId(5, SockAddr("127.0.0.2", 1), n_ranks=7)
    assert grown.encode()[36:40] == struct.pack("<i", 7)
    assert UniqueId.decode(grown.encode()) == grown
    with pytest.raises(NcclWireError):
        UniqueId.decode(raw[:127])


def test_handshake_round_trip():
    raw = encode_handshake(0xDEADBEEF, SocketType.BOOTSTRAP)
    assert raw == struct.pack("<Q", 0xDEADBEEF) + b"\x01\x00\x00\x00"
    assert decode_handshake(raw) == (0xDEADBEEF, SocketType.BOOTSTRAP)
    assert [t.value for t in SocketType] == [0, 1, 2, 3, 4, 5]
    with pytest.raises(NcclWireError, match="unknown NCCL socket type 9"):
        decode_handshake(struct.pack("<Qi", 1, 9))


def test_p2p_preamble_round_trip():
    raw = encode_p2p_preamble(3, 257)
    assert raw == struct.pack("<iii", 8, 3, 257)
    reader = FrameReader(64)
    (payload,) = reader.feed(raw)
    assert decode_p2p_preamble(payload) == (3, 257)
    with pytest.raises(NcclWireError):
        decode_p2p_preamble(b"\x00" * 4)


@pytest.mark.parametrize("release", ["2.23.4", "2.28.9", "2.29.2", "2.30.7"])
def test_ext_info_round_trip(release):
    lay = layout_for(release)
    ring = bytes(range(128))
    info = ExtInfo(5, 9, 0, 1, ADDR, ring)
    raw = info.encode(lay)
    assert len(raw) == lay.ext_info_size
    assert struct.unpack_from("<4i", raw, 0) == (5, 9, 0, 1)
    assert raw[lay.ext_listen_root_off:lay.ext_listen_root_off + 28] == ADDR
    assert raw[lay.ext_connect_info_off:] == ring
    assert ExtInfo.decode(raw, lay) == info
    short = ExtInfo(1, 2, 0, 1, ADDR, ADDR).encode(lay)
    assert ExtInfo.decode(short, lay).connect_info == ADDR + bytes(100)
    with pytest.raises(NcclWireError, match=str(lay.ext_info_size)):
        ExtInfo.decode(raw + b"\x00", lay)


def test_socket_net_handle_and_preamble():
    h = SocketNetHandle(SockAddr("127.0.0.9", 4242), magic=0xABCDEF, n_socks=0, n_threads=0)
    raw = h.encode()
    assert len(raw) == 128
    assert raw[:28] == encode_sockaddr("127.0.0.9", 4242) and raw[28:32] == bytes(4)
    assert struct.unpack_from("<Qii", raw, 32) == (0xABCDEF, 0, 0)
    assert raw[48:] == bytes(80)  # connect-state and the unused tail must be zero
    assert SocketNetHandle.decode(raw) == h
    assert SocketNetHandle(SockAddr("1.2.3.4", 1)).magic == NCCL_SOCKET_MAGIC == 0x564AB9F2FC4B9D6C
    pre = encode_net_socket_preamble(0xABCDEF, 0)
    assert pre == struct.pack("<Qi", 0xABCDEF, 3) + b"\x00"
    assert decode_net_socket_preamble(pre) == (0xABCDEF, 0)
    with pytest.raises(NcclWireError, match="BOOTSTRAP"):
        decode_net_socket_preamble(encode_handshake(1, SocketType.BOOTSTRAP) + b"\x00")


def test_connect_infos_round_trip():
    handle = SocketNetHandle(SockAddr("127.0.0.3", 77)).encode()
    for release in ("2.24.3", "2.28.9"):
        lay = layout_for(release)
        s = send_connect_info(lay, 3, use_gdr=1)
        assert len(s) == 256 and s[:4] == struct.pack("<i", 3) and s[128:132] == struct.pack("<i", 1)
        assert decode_send_connect_info(lay, s) == (3, 1)
        r = recv_connect_info(lay, handle)
        assert r[:128] == handle and r[128:] == bytes(128)
        assert decode_recv_connect_info(lay, r) == (handle, 0)
    old = layout_for("2.23.4")
    assert send_connect_info(old, 3) == struct.pack("<i", 3) + bytes(252)
    with pytest.raises(ValueError):
        send_connect_info(old, 3, use_gdr=1)


# ------------------------------------------------------------------ framing

def test_frame_reader_split_at_every_byte_boundary():
    stream = encode_frame(b"hello") + encode_frame(b"") + encode_frame(bytes(range(40)))
    want = [b"hello", b"", bytes(range(40))]
    for cut in range(len(stream) + 1):
        reader = FrameReader(64)
        got = reader.feed(stream[:cut]) + reader.feed(stream[cut:])
        assert got == want, cut
        assert reader.rest == b"" and reader.declared is None
    reader = FrameReader(64)
    got = [p for b in stream for p in reader.feed(bytes([b]))]
    assert got == want


def test_frame_reader_refuses_oversize_and_negative_sizes():
    reader = FrameReader(100, what="R's p2p message")
    with pytest.raises(NcclWireError, match=r"R's p2p message declares 101 bytes, more than the 100 expected"):
        reader.feed(struct.pack("<i", 101))
    with pytest.raises(NcclWireError):  # the reader stays refused: it never resyncs on the payload
        reader.feed(bytes(101))
    with pytest.raises(NcclWireError, match="negative"):
        FrameReader(100).feed(struct.pack("<i", -1))
    ok = FrameReader(100)
    assert ok.feed(struct.pack("<i", 100)) == [] and ok.declared == 100


def test_frame_reader_limit_leaves_the_rest():
    reader = FrameReader(16, limit=1)
    assert reader.feed(encode_frame(b"ab") + b"NEXT") == [b"ab"]
    assert reader.finished and reader.rest == b"NEXT"
    assert reader.feed(b"MORE") == [] and reader.rest == b"NEXTMORE"


# ------------------------------------------------------------------ clone and patch

def _own_peer_info(lay, rank, rng):
    raw = bytearray(rng.randbytes(lay.peer_info_size))
    struct.pack_into("<i", raw, 0, rank)
    struct.pack_into("<i", raw, lay.peer_version_off, lay.version.code)
    struct.pack_into("<Q", raw, 16, 2**64 - 2)  # wraps for r >= 1
    return bytes(raw)


def _own_all_gather_info(lay, rank, rng):
    raw = bytearray(rng.randbytes(lay.all_gather_info_size))
    m = lay.maxchannels
    struct.pack_into(f"<{m}i", raw, lay.topo.ring_recv, *[rank] * m)
    struct.pack_into(f"<{m}i", raw, lay.topo.ring_prev, *[-1] * m)
    return bytes(raw)


def _changed(a, b):
    return {i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y}


@pytest.mark.parametrize("release", ["2.23.4", "2.25.1", "2.28.9", "2.29.7", "2.30.7"])
def test_peer_info_patch_touches_only_rank_and_hashes(release):
    lay, rng = layout_for(release), random.Random(1)
    own = _own_peer_info(lay, 0, rng)
    check_own_peer_info(lay, own, 0)
    host, pid = struct.unpack_from("<QQ", own, 16)
    allowed = set(range(0, 4)) | set(range(16, 32))
    for r in (1, 2, 7):
        clone = clone_peer_info(lay, own, r)
        assert len(clone) == len(own)
        assert _changed(own, clone) <= allowed
        assert struct.unpack_from("<i", clone, 0)[0] == r
        assert struct.unpack_from("<QQ", clone, 16) == ((host + 1 + r) % 2**64, (pid + 1 + r) % 2**64)
        v = lay.peer_version_off
        assert clone[v:v + 4] == own[v:v + 4]


@pytest.mark.parametrize("release", ["2.23.4", "2.25.1", "2.28.9", "2.30.7"])
def test_all_gather_info_patch_touches_only_the_named_arrays(release):
    lay, rng = layout_for(release), random.Random(2)
    own = _own_all_gather_info(lay, 0, rng)
    check_own_all_gather_info(lay, own, 0)
    m = lay.maxchannels
    t = lay.topo
    named = [t.ring_recv, t.ring_send, t.tree_to_parent, t.tree_to_child0, t.tree_to_child1]
    allowed = {o + i for o in named for i in range(4 * m)}
    clone = clone_all_gather_info(lay, own, 5)
    assert _changed(own, clone) <= allowed
    for off in named:
        assert struct.unpack_from(f"<{m}i", clone, off) == (5,) * m
    assert clone[t.ring_prev:t.ring_next + 4 * m] == own[t.ring_prev:t.ring_next + 4 * m]


def test_ring_info_clone_is_the_address_and_zeros():
    own = ADDR + bytes(L2289.ring_info_size - 28)
    check_own_ring_info(L2289, own)
    mine = encode_sockaddr("127.0.0.5", 6000)
    clone = clone_ring_info(L2289, mine)
    assert clone == mine + bytes(120 - 28)
    with pytest.raises(LayoutMismatch, match="104 bytes, NCCL 2.28.9 lays it out in 120"):
        check_own_ring_info(L2289, own[:104])


def test_self_check_refuses_a_slice_whose_ring_prev_is_not_minus_one():
    own = bytearray(_own_all_gather_info(L2289, 0, random.Random(3)))
    struct.pack_into("<i", own, L2289.topo.ring_prev, 4)
    with pytest.raises(LayoutMismatch, match=r"ring_prev\[0\] reads 4, expected -1 at offset 740 \(NCCL 2.28.9"):
        check_own_all_gather_info(L2289, bytes(own), 0)
    # the 2.27 layout (no crossNicRing) on a 2.28 slice: ringRecv[0] reads crossNicRing's neighbour
    good = _own_all_gather_info(L2289, 3, random.Random(4))
    l227 = layout_for("2.27.7")
    with pytest.raises(LayoutMismatch):
        check_own_all_gather_info(l227, good[:l227.all_gather_info_size], 3)


def test_self_check_of_peer_info_names_rank_and_version():
    lay = L2289
    own = _own_peer_info(lay, 0, random.Random(5))
    with pytest.raises(LayoutMismatch, match="rank reads 0, expected 2"):
        check_own_peer_info(lay, own, 2)
    with pytest.raises(LayoutMismatch, match="version reads 22809, expected 22807"):
        check_own_peer_info(layout_for("2.28.7"), own, 0)
    with pytest.raises(LayoutMismatch):
        check_own_peer_info(lay, own[:104], 0)


# ------------------------------------------------------------------ setup responder

def _handle(peer, tag, pos):
    return SocketNetHandle(SockAddr(f"127.0.{peer}.{pos + 1}", 7000 + tag), magic=peer * 1000 + pos).encode()


def _r_recv_info(k):
    return [recv_connect_info(L2289, SocketNetHandle(SockAddr("127.0.0.1", 9000 + j)).encode()) for j in range(k)]


def test_setup_tags_decode():
    assert SetupTag.decode(257, L2289) == SetupTag(1, 1, False)
    assert SetupTag.decode(385, L2289) == SetupTag(1, 1, True)
    assert SetupTag.decode((3 << 8) + 2, L2289) == SetupTag(3, 2, False)
    assert SetupTag.decode(2 << 8, L2289) == SetupTag(2, 0, False)


def test_setup_responder_world_four_ring():
    rs = SetupResponder(L2289, rank=0, world=4, recv_handle=_handle)
    # 1. R -> 3 (its prev): R's recv infos; 3 answers with send infos, proxyRank 3
    a = rs.respond(3, 257, b"".join(_r_recv_info(2)))
    assert (a.src, a.dst, a.tag, a.role, a.sync) == (3, 0, 257, PeerRole.SENDS_TO_R, False)
    assert a.payload == send_connect_info(L2289, 3) * 2
    assert a.r_recv_infos == tuple(_r_recv_info(2))
    # 2. R -> 1 (its next): R's send infos; 1 answers with recv infos = its handles in channel order
    mine = send_connect_info(L2289, 0) * 2
    b = rs.respond(1, 257, mine)
    assert b.role is PeerRole.RECEIVES_FROM_R and b.src == 1
    assert b.payload == recv_connect_info(L2289, _handle(1, 257, 0)) + recv_connect_info(L2289, _handle(1, 257, 1))
    assert b.r_send_infos == (send_connect_info(L2289, 0),) * 2
    # sync: 0 bytes each way, both peers
    for peer in (1, 3):
        s = rs.respond(peer, 385, b"")
        assert s.sync and s.payload == b"" and s.tag == 385 and s.src == peer
    with pytest.raises(NcclWireError, match="carries 4 bytes"):
        rs.respond(1, 385, b"\x00" * 4)
    # tree (graph id 1 -> tag +2) at distance 2: peer 2 is both prev and next -> combined
    c = rs.respond(2, (2 << 8) + 2, b"".join(_r_recv_info(1)) + send_connect_info(L2289, 0))
    assert c.role is PeerRole.BOTH
    assert c.payload == recv_connect_info(L2289, _handle(2, 514, 0)) + send_connect_info(L2289, 2)


def test_setup_responder_world_two_combined():
    rs = SetupResponder(L2289, rank=0, world=2, recv_handle=_handle)
    sent = b"".join(_r_recv_info(2)) + send_connect_info(L2289, 0) * 2
    rep = rs.respond(1, 257, sent)
    assert rep.role is PeerRole.BOTH
    # [1's recv infos for R's 2 send channels | 1's send infos for R's 2 recv channels]
    want = b"".join(recv_connect_info(L2289, _handle(1, 257, j)) for j in range(2)) + send_connect_info(L2289, 1) * 2
    assert rep.payload == want
    assert rep.r_recv_infos == tuple(_r_recv_info(2)) and rep.r_send_infos == (send_connect_info(L2289, 0),) * 2
    sync = rs.respond(1, 385, b"")
    assert sync.sync and sync.payload == b"" and sync.role is PeerRole.BOTH
    with pytest.raises(NcclWireError, match="odd count"):
        rs.respond(1, 257, b"".join(_r_recv_info(3)))


def test_setup_responder_refuses_inconsistent_messages():
    rs = SetupResponder(L2289, rank=0, world=4, recv_handle=_handle)
    with pytest.raises(NcclWireError, match="neither 3 nor 1"):
        rs.respond(2, 257, bytes(256))
    with pytest.raises(NcclWireError, match="not a positive multiple"):
        rs.respond(1, 257, bytes(255))
    with pytest.raises(NcclWireError, match="outside 1..3"):
        rs.respond(1, 4 << 8, bytes(256))
    rs5 = SetupResponder(L2289, rank=2, world=5, recv_handle=_handle)
    assert rs5.role_of(1, 257)[1] is PeerRole.SENDS_TO_R and rs5.role_of(3, 257)[1] is PeerRole.RECEIVES_FROM_R
    assert rs5.role_of(4, 513)[1] is PeerRole.RECEIVES_FROM_R and rs5.role_of(0, 513)[1] is PeerRole.SENDS_TO_R


# ------------------------------------------------------------------ bootstrap root plan

@pytest.mark.parametrize("release", ["2.28.9", "2.29.7"])
def test_root_checkins(release):
    lay = layout_for(release)
    uid = UniqueId(0xC0FFEE, SockAddr("127.0.0.1", 5000))
    w = 4
    root_listen = [bytes(28)] + [encode_sockaddr(f"127.1.0.{r}", 6000) for r in range(1, w)]
    ring_listen = [bytes(28)] + [encode_sockaddr(f"127.2.0.{r}", 6001) for r in range(1, w)]
    plan = root_checkins(lay, uid, w, root_listen, ring_listen)
    assert [c.rank for c in plan] == [1, 2, 3]
    for c in plan:
        assert c.wire[:12] == encode_handshake(0xC0FFEE, SocketType.BOOTSTRAP)
        reader = FrameReader(lay.ext_info_size)
        (payload,) = reader.feed(c.wire[12:])
        assert payload == c.payload and len(payload) == lay.ext_info_size
        info = ExtInfo.decode(payload, lay)
        assert (info.rank, info.nranks, info.iroot, info.nroots, info.offset) == (c.rank, w, 0, 1, 0)
        assert info.listen_root == root_listen[c.rank]
        assert info.connect_info == ring_listen[c.rank] + bytes(100)
    assert expected_root_reply(lay, 1, w, ring_listen) == ring_listen[2] + bytes(100)
    assert expected_root_reply(lay, 3, w, ring_listen) is None
    assert decode_root_reply(lay, bytes(128)) == bytes(128)
    with pytest.raises(NcclWireError):
        decode_root_reply(lay, bytes(28))


# ------------------------------------------------------------------ ring allgather vs a model of R

def r_side(rank, world, size, own, bidirectional):
    """R's bootstrapAllGather written out from src/bootstrap.cc at v2.28.9-1 (bidirectional) and
    v2.28.3-1 (unidirectional) as a generator of socket operations. Sockets are R's: 'next' is
    the one R dialled (R's successor), 'prev' the one R accepted. Sends never block (kernel
    buffers); ('recv', sock, n) blocks until n bytes arrived."""
    data = [None] * world
    data[rank] = own

    def send_size(sock):
        yield ("send", sock, struct.pack("<i", size))

    def recv_size(sock):
        (got,) = struct.unpack("<i", (yield ("recv", sock, 4)))
        assert got <= size, "Message truncated"
        return got

    if bidirectional:
        total = world // 2
        for step in range(total):
            final = step == total - 1 and world % 2 == 0
            s0, r0 = (rank - step) % world, (rank - step - 1) % world
            s1, r1 = (rank + step) % world, (rank + step + 1) % world
            yield from send_size("next")  # socketSendRecv of the ring-0 sizes
            n0 = yield from recv_size("prev")
            if final:
                yield ("send", "next", data[s0])
                data[r0] = yield ("recv", "prev", n0)
                continue
            yield from send_size("prev")  # then the ring-1 sizes
            n1 = yield from recv_size("next")
            yield ("send", "next", data[s0])  # then the four data operations together
            yield ("send", "prev", data[s1])
            data[r0] = yield ("recv", "prev", n0)
            data[r1] = yield ("recv", "next", n1)
    else:
        for i in range(world - 1):
            s, rr = (rank - i) % world, (rank - i - 1) % world
            yield from send_size("next")
            n = yield from recv_size("prev")
            yield ("send", "next", data[s])
            data[rr] = yield ("recv", "prev", n)
    return data


def slot_of(r, own):
    return bytes((b + r) % 256 for b in own)


def run_ring(rank, world, size, bidirectional, seed, trailing=b""):
    rng = random.Random(seed)
    own = rng.randbytes(size)
    stepper = RingAllGather(rank, world, bidirectional, slot_of, max_size=4096, window=rng.choice([1, 2, 8]))
    side_of = {"next": RingSide.AS_NEXT, "prev": RingSide.AS_PREV}
    to_c = {s: bytearray() for s in RingSide}  # R -> controller, not yet fed
    to_r = {"next": bytearray(), "prev": bytearray()}  # controller -> R, not yet read
    gen = r_side(rank, world, size, own, bidirectional)
    op, value, result = next(gen), None, None
    while True:
        progressed = False
        while True:  # run R until it blocks
            kind, sock, arg = op
            if kind == "send":
                to_c[side_of[sock]] += arg
                value = None
            elif len(to_r[sock]) >= arg:
                value = bytes(to_r[sock][:arg])
                del to_r[sock][:arg]
            else:
                break
            progressed = True
            try:
                op = gen.send(value)
            except StopIteration as stop:
                result = stop.value
                break
        if result is not None:
            break
        for side in RingSide:  # deliver what R wrote, in random pieces
            buf = to_c[side]
            while buf:
                n = rng.randint(1, len(buf))
                piece = bytes(buf[:n])
                del buf[:n]
                progressed = True
                for out_side, out in stepper.feed(side, piece).items():
                    to_r["next" if out_side is RingSide.AS_NEXT else "prev"] += out
        assert progressed, f"deadlock: R waits for {op} and the controller has nothing to write"
    # R's leftovers reach the stepper too (the final sends), then the next allgather's first bytes
    for side in RingSide:
        for out_side, out in stepper.feed(side, bytes(to_c[side]) + trailing).items():
            to_r["next" if out_side is RingSide.AS_NEXT else "prev"] += out
    return own, result, stepper, to_r


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("world", [2, 3, 4, 5, 8])
def test_ring_allgather_against_a_model_of_r(world, bidirectional):
    for rank in sorted({0, world - 1, world // 2}):
        size = 120 if rank == 0 else 37
        own, gathered, stepper, to_r = run_ring(rank, world, size, bidirectional, seed=world * 31 + rank)
        want = [own if r == rank else slot_of(r, own) for r in range(world)]
        assert gathered == want  # every slice where it should be on R's side
        assert stepper.own == own and stepper.size == size  # the controller's side: the template
        assert stepper.done
        assert to_r == {"next": bytearray(), "prev": bytearray()}  # R read everything it was sent
        for side in RingSide:
            assert stepper.leftover(side) == b""


def test_ring_plan_matches_the_source_formulas():
    plan = ring_plan(0, 4, True)
    assert plan.r_writes == {RingSide.AS_NEXT: (0, 3), RingSide.AS_PREV: (0,)}
    assert plan.c_writes == {RingSide.AS_PREV: (3, 2), RingSide.AS_NEXT: (1,)}
    plan5 = ring_plan(0, 5, True)
    assert plan5.c_writes == {RingSide.AS_PREV: (4, 3), RingSide.AS_NEXT: (1, 2)}
    uni = ring_plan(2, 4, False)
    assert uni.r_writes == {RingSide.AS_NEXT: (2, 1, 0), RingSide.AS_PREV: ()}
    assert uni.c_writes == {RingSide.AS_PREV: (1, 0, 3), RingSide.AS_NEXT: ()}


def test_ring_allgather_leaves_the_next_allgathers_bytes():
    _, _, stepper, _ = run_ring(0, 4, 16, True, seed=9, trailing=b"\x10\x00\x00\x00")
    assert stepper.done
    assert stepper.leftover(RingSide.AS_NEXT) == b"\x10\x00\x00\x00"
    assert stepper.leftover(RingSide.AS_PREV) == b"\x10\x00\x00\x00"


def test_ring_allgather_refuses_oversize_and_altered_slices():
    st = RingAllGather(0, 4, True, slot_of, max_size=64)
    with pytest.raises(NcclWireError, match="declares 65 bytes, more than the 64 expected"):
        st.feed(RingSide.AS_NEXT, struct.pack("<i", 65))
    st = RingAllGather(0, 5, True, slot_of, max_size=64)
    own = b"abcd"
    out = st.feed(RingSide.AS_NEXT, encode_frame(own))
    assert out[RingSide.AS_PREV] == encode_frame(slot_of(4, own)) + encode_frame(slot_of(3, own))
    assert out[RingSide.AS_NEXT] == encode_frame(slot_of(1, own)) + encode_frame(slot_of(2, own))
    st.feed(RingSide.AS_PREV, encode_frame(own))
    with pytest.raises(NcclWireError, match="slice 1 on as_prev altered"):
        st.feed(RingSide.AS_PREV, encode_frame(b"XXXX"))


def test_errors_share_the_dialect_root():
    for cls in (UnsupportedNcclVersion, LayoutMismatch, NcclWireError):
        assert issubclass(cls, NcclError) and issubclass(cls, NeuronaBoxError)
