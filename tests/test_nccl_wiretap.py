"""The wiretap (nccl_patch/wiretap.c, LD_PRELOAD) records a real process's TCP
connections byte for byte, and the transcript reader gives them back per connection:
the tool that records the first GPU session's NCCL transcripts, checked here on
Python's own sockets, which call the same libc functions NCCL does."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from neuronabox.controller.dialects.nccl.errors import NcclWireError
from neuronabox.controller.dialects.nccl.transcript import connections, read_records
from neuronabox.controller.dialects.nccl.wire import FrameReader, encode_frame

ROOT = Path(__file__).resolve().parents[1]
TAP = ROOT / "nccl_patch" / "build" / "libnbx-wiretap.so"

# A bootstrap-like exchange: a handshake, framed messages both ways, one frame larger than
# the recording's cap, a Unix socket (not recorded), then close.
PROGRAM = textwrap.dedent(
    """
    import os, socket, struct, sys, threading
    def frame(b): return struct.pack("<i", len(b)) + b
    srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
    big = bytes(range(256)) * 1024  # 256 KiB
    def serve():
        c, _ = srv.accept()
        got = b""
        while len(got) < 12 + 4 + 5 + 4 + len(big):
            got += c.recv(1 << 16)
        c.sendall(frame(b"reply"))
        c.close()
    t = threading.Thread(target=serve); t.start()
    cl = socket.create_connection(srv.getsockname())
    cl.sendall(struct.pack("<Qi", 0x1122334455667788, 1) + frame(b"hello") + frame(big))
    r = b""
    while len(r) < 9:
        r += cl.recv(64)
    a, b = socket.socketpair(); a.sendall(b"unix"); b.recv(4); a.close(); b.close()
    cl.close(); t.join(); srv.close()
    print("done")
    """
)


@pytest.fixture(scope="module")
def tap() -> Path:
    subprocess.run(["make", "-s", "-C", str(ROOT / "nccl_patch")], check=True, timeout=120)
    assert TAP.is_file()
    return TAP


def run_tapped(tmp_path: Path, tap: Path, cap: int | None = None, record: bool = True) -> list[Path]:
    env = {**os.environ, "LD_PRELOAD": str(tap)}
    if record:
        env["NEURONABOX_WIRETAP"] = str(tmp_path / "run")
    if cap is not None:
        env["NEURONABOX_WIRETAP_CAP"] = str(cap)
    out = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "done", out.stderr
    return sorted(tmp_path.glob("run.*.tap"))


def test_both_ends_of_a_connection_are_recorded_byte_for_byte(tmp_path, tap):
    (path,) = run_tapped(tmp_path, tap, cap=1 << 20)
    conns = connections(read_records(path.read_bytes()))
    assert len(conns) == 2, conns  # the client's and the server's end; the Unix pair is not recorded
    client = next(c for c in conns if c.opened_by_us)
    server = next(c for c in conns if not c.opened_by_us)
    assert client.local == server.peer and client.peer == server.local
    big = bytes(range(256)) * 1024
    want = struct.pack("<Qi", 0x1122334455667788, 1) + encode_frame(b"hello") + encode_frame(big)
    assert bytes(client.sent) == want == bytes(server.received)
    assert bytes(server.sent) == encode_frame(b"reply") == bytes(client.received)
    assert client.complete and server.complete and client.closed and server.closed
    # the recorded stream parses as the bootstrap's framing does
    reader = FrameReader(max_size=1 << 20)
    frames = reader.feed(bytes(server.received)[12:])
    assert frames == [b"hello", big]


def test_the_cap_keeps_lengths_and_marks_the_stream_incomplete(tmp_path, tap):
    (path,) = run_tapped(tmp_path, tap, cap=16)
    conns = connections(read_records(path.read_bytes()))
    client = next(c for c in conns if c.opened_by_us)
    assert sum(client.sent_calls) == 12 + 9 + 4 + 256 * 1024
    assert not client.complete and len(client.sent) < sum(client.sent_calls)
    (tmp_path / "default").mkdir()
    (default,) = run_tapped(tmp_path / "default", tap)
    client = next(c for c in connections(read_records(default.read_bytes())) if c.opened_by_us)
    assert not client.complete  # the default cap (64 KiB) keeps bootstrap messages whole, not a 256 KiB send


def test_without_the_variable_nothing_is_written(tmp_path, tap):
    assert run_tapped(tmp_path, tap, record=False) == []


def test_a_cut_transcript_is_refused_naming_where(tmp_path, tap):
    (path,) = run_tapped(tmp_path, tap, cap=1 << 20)
    raw = path.read_bytes()
    with pytest.raises(NcclWireError, match="cut"):
        read_records(raw[:-3])
    with pytest.raises(NcclWireError, match="unknown kind 9"):
        read_records(b"\x09" + raw[1:])


FORKING = textwrap.dedent(
    """
    import os, socket
    srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(2)
    def talk(msg):
        c = socket.create_connection(srv.getsockname()); c.sendall(msg); c.close()
        s, _ = srv.accept(); got = s.recv(64); s.close(); return got
    assert talk(b"parent") == b"parent"
    pid = os.fork()
    if pid == 0:
        talk(b"child!"); os._exit(0)
    os.waitpid(pid, 0)
    assert talk(b"again") == b"again"
    print("done")
    """
)


def test_a_forked_child_records_into_its_own_file(tmp_path, tap):
    """A DataLoader worker forks without exec: its records go to a file of its own pid,
    never into the parent's, and the parent's file stays whole."""
    env = {**os.environ, "LD_PRELOAD": str(tap), "NEURONABOX_WIRETAP": str(tmp_path / "run")}
    out = subprocess.run([sys.executable, "-c", FORKING], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "done", out.stderr
    files = sorted(tmp_path.glob("run.*.tap"))
    assert len(files) == 2
    streams = {p: [bytes(c.sent) for c in connections(read_records(p.read_bytes())) if c.opened_by_us] for p in files}
    assert sorted(streams.values()) == [[b"child!"], [b"parent", b"again"]]
