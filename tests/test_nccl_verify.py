"""scripts/nccl_verify.py and controller/dialects/nccl/classify.py on a scripted exchange.

This checks the verifier, not NCCL. Two Python processes under the real wiretap
(LD_PRELOAD, nccl_patch/wiretap.c) play two NCCL-like "ranks" over loopback with the
package's own encoders: a c10d-store-like SET/GET of the unique id, the root check-ins
(2.28.9's 172-byte extInfo) and replies, the ring links with the allgathers of 2.28.9's
element sizes, one transport-setup exchange (tag 257, then its 385 sync) and a Socket-net
connection each way carrying exactly the frames `NcclRing` gives for a 256-float
allreduce, then the closing barrier nccl_record.py's worker runs. The verifier must pass
every fact on that and, once the script is tampered with (one data frame one element
larger, a peerInfo four bytes too long), fail naming the fact, the rank and the index.
NCCL itself is checked when a GPU session runs the verifier on real recordings.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from neuronabox.controller.dialects.nccl.classify import (
    ConnKind,
    FrameScan,
    NetSocket,
    RingLink,
    classify,
    scan_frames,
    split_allgathers,
    stream_of,
)
from neuronabox.controller.dialects.nccl.transcript import Connection
from neuronabox.controller.dialects.nccl.wire import NCCL_SOCKET_MAGIC, encode_frame, encode_net_socket_preamble

from neuronabox.schedules.kinds import Kind
from neuronabox.schedules.nccl import NcclRing

ROOT = Path(__file__).resolve().parents[1]
TAP = ROOT / "nccl_patch" / "build" / "libnbx-wiretap.so"
VERIFY = ROOT / "scripts" / "nccl_verify.py"
WORLD = 2

RANK_PROGRAM = textwrap.dedent(
    """
    import os, random, socket, struct, sys, threading
    from neuronabox.controller.dialects.nccl.layouts import recv_connect_info, send_connect_info
    from neuronabox.controller.dialects.nccl.versions import layout_for
    from neuronabox.controller.dialects.nccl.wire import (
        HANDSHAKE, P2P_ACK, ExtInfo, SockAddr, SocketNetHandle, SocketType, UniqueId,
        encode_handshake, encode_net_socket_preamble, encode_p2p_preamble)
    from neuronabox.schedules.kinds import Kind
    from neuronabox.schedules.nccl import NcclRing

    RANK, W, PORT_FD = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])  # the store's port: rank 0 writes it
    TAMPER = os.environ.get("NBX_TAMPER", "").split(",")
    LAY = layout_for("2.28.9")
    KEY = b"default_pg/0"

    def listener():
        s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(8); return s
    def addr(s): return SockAddr(*s.getsockname())
    def store_port():  # blocks until rank 0 wrote it; rank 0 gone first: EOF, an error
        with os.fdopen(PORT_FD) as pipe:
            return int(pipe.readline())
    def exact(c, n):
        b = b""
        while len(b) < n:
            got = c.recv(n - len(b))
            if not got: raise EOFError(f"rank {RANK}: peer closed")
            b += got
        return b
    def send_frame(c, payload):  # socketSend: the size, then the bytes
        c.sendall(struct.pack("<i", len(payload)))
        if payload: c.sendall(payload)
    def recv_frame(c):
        (n,) = struct.unpack("<i", exact(c, 4)); return exact(c, n) if n else b""
    def dial(a, magic, kind=SocketType.BOOTSTRAP):
        c = socket.create_connection((a.host, a.port)); c.sendall(encode_handshake(magic, kind)); return c
    def accept(l, extra=0):
        c, _ = l.accept(); exact(c, HANDSHAKE.size + extra); return c

    # the c10d store (torch's TCPStore wire: [u8 query][u64 len][key]...; SET = 1, GET = 3)
    if RANK == 0:
        store = listener(); values = {}; cond = threading.Condition()
        def client(c):
            q = exact(c, 1)[0]; (n,) = struct.unpack("<Q", exact(c, 8)); key = exact(c, n)
            if q == 1:
                (m,) = struct.unpack("<Q", exact(c, 8)); v = exact(c, m)
                with cond: values[key] = v; cond.notify_all()
            else:
                with cond: cond.wait_for(lambda: key in values)
                c.sendall(struct.pack("<Q", len(values[key])) + values[key])
            c.close()
        def serve_store():
            for _ in range(W):
                threading.Thread(target=client, args=(store.accept()[0],)).start()
        threading.Thread(target=serve_store).start()
        with os.fdopen(PORT_FD, "w") as pipe:
            pipe.write(f"{store.getsockname()[1]}\\n")
        root = listener()
        uid = UniqueId(random.getrandbits(64), addr(root))
        def serve_root():  # bootstrapRoot: W check-ins, then each rank gets its successor's ring address
            infos = {}
            for _ in range(W):
                c = accept(root); e = ExtInfo.decode(recv_frame(c), LAY); infos[e.rank] = e; c.close()
            for r in range(W):
                c = dial(SockAddr.decode(infos[r].listen_root), uid.magic)
                send_frame(c, infos[(r + 1) % W].connect_info); c.close()
        threading.Thread(target=serve_root).start()
        s = socket.create_connection(store.getsockname())
        s.sendall(b"\\x01" + struct.pack("<Q", len(KEY)) + KEY + struct.pack("<Q", 128) + uid.encode()); s.close()
    else:
        s = socket.create_connection(("127.0.0.1", store_port()))
        s.sendall(b"\\x03" + struct.pack("<Q", len(KEY)) + KEY)
        (n,) = struct.unpack("<Q", exact(s, 8)); uid = UniqueId.decode(exact(s, n)); s.close()

    # check-in, root reply, ring connect
    lroot, lring, lp2p, lnet = listener(), listener(), listener(), listener()
    c = dial(uid.root, uid.magic)
    send_frame(c, ExtInfo(RANK, W, 0, 1, addr(lroot).encode(), addr(lring).encode()).encode(LAY)); c.close()
    c = accept(lroot); succ = SockAddr.decode(recv_frame(c)[:28]); c.close()
    nxt = dial(succ, uid.magic); prv = accept(lring)

    # three allgathers; W = 2 over two rings is one ring-0 step: own slice out, the other's in
    ring_info = bytearray(LAY.ring_info_size); ring_info[:28] = addr(lp2p).encode()
    peer_info = bytearray(LAY.peer_info_size + (4 if "peerinfo" in TAMPER and RANK == 1 else 0))
    struct.pack_into("<i", peer_info, LAY.peer_rank_off, RANK)
    struct.pack_into("<QQ", peer_info, LAY.peer_host_hash_off, 0x1000 + RANK, 0x2000 + RANK)
    struct.pack_into("<i", peer_info, LAY.peer_version_off, LAY.version.code)
    agi = bytearray(LAY.all_gather_info_size); M = LAY.maxchannels
    for f, v in (("ring_recv", RANK), ("ring_send", RANK), ("ring_prev", -1), ("ring_next", -1)):
        struct.pack_into(f"<{M}i", agi, getattr(LAY.topo, f), *([v] * M))
    def allgather(own):
        send_frame(nxt, bytes(own)); return recv_frame(prv)
    peer_ring = allgather(ring_info); allgather(peer_info); allgather(agi)
    peer_p2p = SockAddr.decode(peer_ring[:28])

    # transport setup, W = 2: one combined message each way [recv entries | send entries], tag 257
    peer = (RANK + 1) % W
    c = dial(peer_p2p, uid.magic); c.sendall(encode_p2p_preamble(RANK, 257))
    send_frame(c, recv_connect_info(LAY, SocketNetHandle(addr(lnet)).encode()) + send_connect_info(LAY, RANK))
    c.close()
    c = accept(lp2p); recv_frame(c); reply = recv_frame(c); c.close()
    handle = SocketNetHandle.decode(reply[:128])
    out = socket.create_connection((handle.connect_addr.host, handle.connect_addr.port))
    out.sendall(encode_net_socket_preamble(handle.magic, 0))
    inc = accept(lnet, extra=1)
    c = dial(peer_p2p, uid.magic); send_frame(c, P2P_ACK.pack(RANK, 385)); send_frame(c, b""); c.close()
    c = accept(lp2p); recv_frame(c); recv_frame(c); c.close()

    # the Socket net's data: a 256-float allreduce, then the closing barrier (one float)
    sizes = [m.nbytes for m in NcclRing(Kind.ALLREDUCE, W, 256, 4).sends(RANK)]
    sizes += [m.nbytes for m in NcclRing(Kind.ALLREDUCE, W, 1, 4).sends(RANK)]
    if "net" in TAMPER and RANK == 0:
        sizes[2] += 4
    for n in sizes:
        send_frame(out, bytes(n))
    for _ in sizes:
        recv_frame(inc)
    for s in (out, inc, nxt, prv, lroot, lring, lp2p, lnet):
        s.close()
    print("done", flush=True)
    """
)


@pytest.fixture(scope="module")
def tap() -> Path:
    subprocess.run(["make", "-s", "-C", str(ROOT / "nccl_patch")], check=True, timeout=120)
    assert TAP.is_file()
    return TAP


def record(out: Path, tap: Path, tamper: str = "") -> Path:
    """Run the two scripted ranks under the wiretap into OUT/w2/, as nccl_record.py lays it out."""
    wdir = out / f"w{WORLD}"
    wdir.mkdir(parents=True)
    port_r, port_w = os.pipe()  # rank 0 tells rank 1 where its store listens
    procs = []
    for rank, fd in zip(range(WORLD), (port_w, port_r), strict=True):
        env = {**os.environ, "LD_PRELOAD": str(tap), "NEURONABOX_WIRETAP": str(wdir / f"rank{rank}"),
               "NBX_TAMPER": tamper}  # fmt: skip
        cmd = [sys.executable, "-c", RANK_PROGRAM, str(rank), str(WORLD), str(fd)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      pass_fds=(fd,)))  # fmt: skip
    os.close(port_r)
    os.close(port_w)
    for p in procs:
        stdout, stderr = p.communicate(timeout=30)
        assert p.returncode == 0 and stdout.strip() == "done", stderr
    result = {"torch": "none (scripted ranks)", "nccl": "2.28.9", "gpu": "none", "world": WORLD,
              "checks": [{"kind": "allreduce", "bytes": 1024, "dtype": "torch.float32", "ok": True}],
              "median_s": {}, "store_keys": 1}  # fmt: skip
    (wdir / "result.json").write_text(json.dumps(result))
    return out


def run_verify(out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(VERIFY), str(out), *extra], capture_output=True, text=True, timeout=60)


def fact_lines(stdout: str) -> dict[str, str]:
    out = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] in ("PASS", "FAIL", "UNSEEN"):
            out[parts[1]] = line
    return out


ALL_FACTS = (
    "recording", "nccl.version", "bootstrap.handshake", "uid.store", "extinfo.size", "extinfo.fields",
    "rootreply.size", "rootreply.ring", "allgather.sizes", "allgather.direction", "ringinfo.own",
    "peerinfo.own", "allgatherinfo.own", "setup.tags", "setup.sizes", "setup.sync", "setup.reply",
    "setup.entries", "net.preamble", "net.sends", "net.recvs",
)  # fmt: skip


@pytest.fixture(scope="module")
def clean(tmp_path_factory, tap) -> Path:
    return record(tmp_path_factory.mktemp("clean"), tap)


def test_every_fact_passes_on_the_scripted_exchange(clean):
    done = run_verify(clean, "--version", "2.28.9")
    lines = fact_lines(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr
    for name in ALL_FACTS:
        assert lines.get(name, "").startswith("PASS"), f"{name}: {lines.get(name)}\n{done.stdout}"
    assert "key 'default_pg/0'" in lines["uid.store"]
    assert "[120, 120, 2292]" in lines["allgather.sizes"]
    assert "W = 2" in lines["allgather.direction"]  # the two forms coincide: said, not claimed
    assert "[512] B" in lines["setup.sizes"]  # the combined form: one recv and one send entry


def test_the_classifier_names_every_connection(clean):
    from neuronabox.controller.dialects.nccl.transcript import connections, read_records
    from neuronabox.controller.dialects.nccl.versions import layout_for

    (tap0,) = (clean / "w2").glob("rank0.*.tap")
    recs = classify(connections(read_records(tap0.read_bytes())), layout_for("2.28.9"))
    kinds = [(r.kind, r.outgoing) for r in recs]
    # rank 0 hosts the store and the root: both ends of its own check-in and of its own reply
    assert kinds.count((ConnKind.ROOT_CHECKIN, True)) == 1 and kinds.count((ConnKind.ROOT_CHECKIN, False)) == 2
    assert kinds.count((ConnKind.ROOT_REPLY, True)) == 2 and kinds.count((ConnKind.ROOT_REPLY, False)) == 1
    assert kinds.count((ConnKind.RING_LINK, True)) == 1 and kinds.count((ConnKind.RING_LINK, False)) == 1
    assert sorted(r.tag for r in recs if r.kind is ConnKind.P2P) == [257, 257, 385, 385]
    assert kinds.count((ConnKind.OTHER, True)) == 1 and kinds.count((ConnKind.OTHER, False)) == 2  # the store
    (net_out,) = [r for r in recs if isinstance(r, NetSocket) and r.outgoing]
    want = [m.nbytes for m in NcclRing(Kind.ALLREDUCE, 2, 256, 4).sends(0)]
    assert list(net_out.frames.sizes[: len(want)]) == want


def test_tampering_fails_naming_the_fact_rank_and_index(tmp_path, tap):
    out = record(tmp_path, tap, tamper="net,peerinfo")
    done = run_verify(out)
    lines = fact_lines(done.stdout)
    assert done.returncode == 1, done.stdout + done.stderr
    sent = [m.nbytes for m in NcclRing(Kind.ALLREDUCE, 2, 256, 4).sends(0)]
    assert lines["net.sends"].startswith("FAIL")
    assert ("rank 0 to next (connection" in lines["net.sends"]
            and f"message 2 (allreduce 1024 B float32, its message 2): expected {sent[2]} B, observed {sent[2] + 4} B"
            in lines["net.sends"]), lines["net.sends"]  # fmt: skip
    assert lines["net.recvs"].startswith("FAIL") and "rank 1 from prev" in lines["net.recvs"]
    assert "message 2 " in lines["net.recvs"]
    assert lines["allgather.sizes"].startswith("FAIL")
    assert "rank 1, allgather 1 (peerInfo): expected 120 B, observed 124 B" in lines["allgather.sizes"]
    assert lines["peerinfo.own"].startswith("FAIL") and "124 bytes" in lines["peerinfo.own"]
    for name in ("extinfo.size", "rootreply.ring", "setup.reply", "net.preamble"):
        assert lines[name].startswith("PASS"), lines[name]


def test_a_missing_or_malformed_directory_is_one_line_and_exit_2(tmp_path, clean):
    for out in (tmp_path / "absent", tmp_path):
        done = run_verify(out)
        assert done.returncode == 2 and len(done.stdout.strip().splitlines()) == 1, done.stdout
    (tmp_path / "w2").mkdir()
    done = run_verify(tmp_path)
    assert done.returncode == 2 and "no result.json" in done.stdout
    (tmp_path / "w2" / "result.json").write_text(json.dumps({"world": 2, "nccl": "2.28.9"}))
    raw = next((clean / "w2").glob("rank1.*.tap")).read_bytes()
    (tmp_path / "w2" / "rank1.99.tap").write_bytes(raw[:-3])
    done = run_verify(tmp_path)
    assert done.returncode == 2 and "rank1.99.tap" in done.stdout and "cut" in done.stdout
    done = run_verify(clean, "--version", "2.32.3")
    assert done.returncode == 2 and "not spoken" in done.stdout


def test_frames_are_read_through_the_recordings_cap():
    """A Socket-net stream whose big payloads the wiretap cut: every size still comes from its header."""
    sizes = [40, 70000, 0, 5000]
    calls, kept, cap = [], bytearray(), 64
    pieces = [encode_net_socket_preamble(NCCL_SOCKET_MAGIC, 0)]
    for n in sizes:
        pieces += [struct.pack("<i", n), bytes(n)] if n else [struct.pack("<i", 0)]
    for p in pieces:  # one send() per piece, as NCCL's socket progress does
        calls.append(len(p))
        kept += p[:cap]
    conn = Connection(3, True, "127.0.0.1:1", "127.0.0.1:2", 0, sent=kept, sent_calls=calls, complete=False)
    store = Connection(4, True, "127.0.0.1:1", "127.0.0.1:3", 1, sent=bytearray(b"\x01" + bytes(20)),
                       sent_calls=[21])  # fmt: skip
    empty = Connection(5, True, "127.0.0.1:1", "127.0.0.1:4", 2)
    net, other, nothing = classify([conn, store, empty])
    assert isinstance(net, NetSocket) and net.frames.sizes == tuple(sizes) and net.frames.readable_to_end
    assert net.frames.payloads[0] == bytes(40) and net.frames.payloads[1] is None
    assert other.kind is ConnKind.OTHER and nothing.kind is ConnKind.EMPTY
    # a header the recording lost ends the readable part instead of raising
    real = encode_frame(bytes(10)) + encode_frame(b"xy")  # one call moved a payload and the next header
    stream = stream_of(real[:4] + real[4:8] + real[18:], [4, 14, 2])  # cap 4
    scan = scan_frames(stream, 0)
    assert scan.sizes == (10,) and scan.payloads == (None,) and scan.cut and stream.read(14, 4) is None
    whole = stream_of(encode_frame(b"abc") + encode_frame(b""), [7, 4])
    assert scan_frames(whole, 0).sizes == (3, 0)


def test_ring_framing_tells_one_ring_from_two_above_two_ranks():
    """W = 4: one ring moves 3 frames to the successor per allgather; two rings (2.28.7+) move 2 there and
    1 back. The W = 2 recordings cannot tell them apart; a W = 4 recording can, and this is how."""

    def link(forward: list[int], backward: list[int]) -> RingLink:
        def scan(sizes: list[int]) -> FrameScan:
            return FrameScan(tuple(sizes), tuple(bytes(n) for n in sizes), False, 0)

        return RingLink(index=0, kind=ConnKind.RING_LINK, outgoing=True, local="", peer="", complete=True,
                        handshake=None, forward=scan(forward), backward=scan(backward))  # fmt: skip

    two_rings = link([120, 120, 120, 120, 2292, 2292], [120, 120, 2292])
    assert [a.size for a in split_allgathers(two_rings, 4, True)] == [120, 120, 2292]
    assert split_allgathers(two_rings, 4, False) is None
    one_ring = link([120] * 6 + [2292] * 3, [])
    assert [a.size for a in split_allgathers(one_ring, 4, False)] == [120, 120, 2292]
    assert split_allgathers(one_ring, 4, True) is None
