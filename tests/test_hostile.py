"""Local processes that tamper with a run: the tests play them, with real sockets.

A stranger (any process on the machine) may connect to the controller's observer
port and Gloo listener and write anything; it is dropped, logged, and changes
nothing in the run (no stall, no wrong values, no memory growth, no failure). An
authenticated observer that breaks the link's protocol ends the run with a clear
cause naming its rank. Every listener the controller opens binds the run's own
address, never every interface."""

from __future__ import annotations

import json
import selectors
import socket
import threading
import time
from pathlib import Path

import psutil
import pytest
from conftest import EXAMPLE, SCRIPTS, Live, tagged_processes
from neuronabox.controller import observers
from neuronabox.controller.dialects.gloo.driver import HANDSHAKE_TIMEOUT_S, GlooDriver
from neuronabox.controller.dialects.gloo.protocol import GlooPair
from neuronabox.controller.dialects.gloo.wire import PREAMBLE, SEQ, Opcode, SlotPrefix, make_slot
from neuronabox.controller.groups import Conn, Group
from neuronabox.controller.net import listener
from neuronabox.controller.observers import HELLO_TIMEOUT_S, ObserverError, ObserverHub

from neuronabox.schedules.gloo import RealRanks

COLLECTIVES = str(SCRIPTS / "collectives.py")
FLOOD = 64 << 20  # what a stranger tries to make the controller hold


# -- helpers ----------------------------------------------------------------------------------
def controller_of(live: Live, timeout: float = 60) -> psutil.Process:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in tagged_processes(live.tag):
            try:
                if "neuronabox.controller.main" in " ".join(p.cmdline()):
                    return p
            except psutil.Error:
                continue
        time.sleep(0.1)
    pytest.fail("no controller process")


def run_dir(ctl: psutil.Process) -> Path:
    return Path(ctl.cmdline()[-1]).parent  # the launcher's folder: controller.json, ready.json, controller.log


def ready_info(ctl: psutil.Process) -> dict:
    return json.loads((run_dir(ctl) / "ready.json").read_text())


def host_port(addr: str) -> tuple[str, int]:
    host, port = addr.rsplit(":", 1)
    return host, int(port)


def listening(ctl: psutil.Process) -> list[tuple[str, int]]:
    return [(c.laddr.ip, c.laddr.port) for c in ctl.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]


def dial(addr: tuple[str, int], first: bytes = b"") -> socket.socket:
    s = socket.create_connection(addr, timeout=10)
    if first:
        s.sendall(first)
    return s


def flood(s: socket.socket, total: int, byte: bytes) -> int:
    """Send up to `total` bytes of `byte`; how many went before the peer closed (or stopped reading)."""
    chunk, sent = byte * (1 << 20), 0
    s.settimeout(10)
    try:
        while sent < total:
            sent += s.send(chunk)
    except OSError:
        pass
    return sent


def closed_by_peer(s: socket.socket, within: float) -> bool:
    s.settimeout(within)
    try:
        while s.recv(65536):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def still_running(live: Live, within: float = 10) -> None:
    """The run goes on: an iteration ends within `within` seconds from now."""
    live.drain()
    live.wait_line(r"iteration \d+ done", timeout=within)


# -- live runs ------------------------------------------------------------------------------------
def test_strangers_change_nothing_and_listeners_bind_the_run_address(tmp_path):
    """Node 0 emulated (the controller hosts the store). Strangers on the observer port
    (junk, a forged hello, a hello-less flood, silence) and on the Gloo listener (a
    guessed pair id with a stalled frame, an unexpected id, a partial handshake, a
    frame claiming 2^40 bytes) are each dropped and logged; the run neither stalls nor
    fails nor grows, and ends with status 0."""
    go_on = tmp_path / "done"
    live = Live(
        "torchrun", "--nnodes", "2", "--real-nodes", "1", COLLECTIVES, "--repeat", "1",
        "--until-file", str(go_on), "--sizes", "1024", "--dtypes", "float32",
    )  # fmt: skip
    opened: list[socket.socket] = []
    try:
        live.wait_line(r"iteration 0 done")
        ctl = controller_of(live)
        listens = listening(ctl)
        assert not [a for a in listens if a[0] in ("0.0.0.0", "::")], listens
        master_port = json.loads(Path(ctl.cmdline()[-1]).read_text())["master_port"]
        assert ("127.0.0.1", master_port) in listens  # the run's store, hosted by the controller
        info = ready_info(ctl)
        obs = host_port(info["observer"])
        gloo = next(a for a in listens if a[0] == "127.0.0.2")
        rss0 = ctl.memory_info().rss

        # Gloo: a partial handshake that stalls is opened first; the others are served meanwhile.
        partial = dial(gloo, b"\x01\x00\x00")
        guessed = dial(gloo, SEQ.pack(0 * 2 + 1) + b"\x00" * 20)  # emulated 0 -> real 1: 0 * world + 1
        unknown = dial(gloo, SEQ.pack(123456789))
        huge = dial(gloo, SEQ.pack(1) + PREAMBLE.pack(48 + (1 << 40), Opcode.SEND_UNBOUND_BUFFER,
                                                      make_slot(SlotPrefix.ALLREDUCE, 1), 0, 1 << 40, 0))  # fmt: skip
        # Observer port: none of these knows the run's secret.
        silent = dial(obs)
        junk = dial(obs, b"not json at all\n")
        forged = dial(obs, json.dumps({"hello": 1, "rank": 1, "pid": 1}).encode() + b"\n" + b'{"step": 1}\n')
        nokey = dial(obs, b'{"step": 1}\n')
        endless = dial(obs)
        opened += [partial, guessed, unknown, huge, silent, junk, forged, nokey, endless]
        t0 = time.monotonic()
        assert flood(endless, FLOOD, b"x") < FLOOD  # cut off: never buffered whole
        assert flood(huge, FLOOD, b"\x00") < FLOOD
        for s in (guessed, unknown, huge, junk, forged, nokey, endless):
            assert closed_by_peer(s, 5), "a stranger was not dropped at once"
        still_running(live)  # nothing stalled behind the strangers
        assert closed_by_peer(partial, HANDSHAKE_TIMEOUT_S + 5)
        assert closed_by_peer(silent, HELLO_TIMEOUT_S + 5)
        assert time.monotonic() - t0 < max(HANDSHAKE_TIMEOUT_S, HELLO_TIMEOUT_S) + 8
        still_running(live)
        grown = ctl.memory_info().rss - rss0
        assert grown < 16 << 20, f"the controller grew by {grown >> 20} MiB"
        log = (run_dir(ctl) / "controller.log").read_text()
        assert log.count("observer link: dropped") >= 5, log[-3000:]
        assert log.count("Gloo listener: dropped") >= 4, log[-3000:]
        go_on.touch()
        live.finish(timeout=120)
    finally:
        for s in opened:
            s.close()
        live.stop()
    assert live.proc.returncode == 0, live.err[-3000:]
    assert "rank 1: all checks passed" in "".join(live.out)


def test_a_forged_hello_cannot_take_a_real_ranks_questions():
    """--data mirror asks the real rank's observer for every input; a stranger who says
    hello as that rank once got the questions (a 25 s stall, then zeros: wrong values)."""
    steps = 60
    live = Live("torchrun", "--nnodes", "2", "--data", "mirror", EXAMPLE, "--steps", str(steps), "--check-grads")
    try:
        live.wait_line(r"step 0: grad check ok")
        ctl = controller_of(live)
        obs = host_port(ready_info(ctl)["observer"])
        t0 = time.monotonic()
        forged = dial(obs, json.dumps({"hello": 1, "rank": 0, "pid": 1, "secret": "0" * 64}).encode() + b"\n")
        try:
            assert closed_by_peer(forged, 5)
            live.finish(timeout=120)
        finally:
            forged.close()
    finally:
        live.stop()
    assert live.proc.returncode == 0, live.err[-3000:]
    assert "".join(live.out).count("grad check ok") == steps
    assert time.monotonic() - t0 < 20  # no question waited on the stranger


@pytest.mark.parametrize(
    "link,sent,names",
    [
        ({}, b'{"step": 1}\n', ("observer of real rank 0", "'t'")),
        ({"notes": 1}, b"0\tseven\tall_reduce\t7\tFloat\n", ("note link of real rank 0", "seven")),
    ],
    ids=["observer-link", "note-link"],
)
def test_an_observer_that_breaks_the_protocol_ends_the_run_with_its_rank(tmp_path, link, sent, names):
    """An authenticated observer (the test has the run's secret) sending a message with a
    key missing ends the run with one clear line, not "KeyError: 't'"; so does a line on
    its note link (which the controller's core reads itself) that is no note."""
    go_on = tmp_path / "done"
    live = Live(
        "torchrun", "--nnodes", "2", COLLECTIVES, "--repeat", "1", "--until-file", str(go_on),
        "--sizes", "1024", "--dtypes", "float32",
    )  # fmt: skip
    try:
        live.wait_line(r"iteration 0 done")
        info = ready_info(controller_of(live))
        hello = {"hello": 1, "rank": 0, "pid": 1, "secret": info["observer_secret"], **link}
        with dial(host_port(info["observer"]), json.dumps(hello).encode() + b"\n" + sent):
            live.finish(timeout=120)
    finally:
        go_on.touch()
        live.stop()
    assert live.proc.returncode == 1
    errs = [ln for ln in live.err.splitlines() if ln.startswith("neuronabox: error:")]
    assert errs and all(n in errs[-1] for n in names), live.err[-3000:]
    assert "KeyError" not in errs[-1]


# -- the observer hub and the Gloo listener on their own ---------------------------------------------
class Loop:
    """The driver's part the hub uses: register a socket's handler, and timers."""

    def __init__(self) -> None:
        self.sel = selectors.DefaultSelector()
        self.timers: list[tuple[float, object]] = []

    def register(self, f, handler) -> None:
        self.sel.register(f, selectors.EVENT_READ, handler)

    def unregister(self, f) -> None:
        try:
            self.sel.unregister(f)
        except (KeyError, ValueError):
            pass

    def call_at(self, when: float, fn) -> None:
        self.timers.append((when, fn))

    def spin(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for key, mask in self.sel.select(0.01):
                key.data(mask)
            now = time.monotonic()
            due = [t for t in self.timers if t[0] <= now]
            self.timers = [t for t in self.timers if t[0] > now]
            for _, fn in due:
                fn()


def hub_with_peer(secret: str = "s3cret", rank: int = 3):
    loop = Loop()
    logged: list[str] = []
    hub = ObserverHub(listener("127.0.0.1"), loop.register, loop.unregister, secret, call_at=loop.call_at,
                      log=logged.append)  # fmt: skip
    lost: list[int] = []
    hub.on_lost = lost.append
    peer = dial(hub.address, json.dumps({"hello": 1, "rank": rank, "pid": 1, "secret": secret}).encode() + b"\n")
    loop.spin(0.2)
    assert hub.by_rank.get(rank) is not None
    return loop, hub, peer, logged, lost


@pytest.mark.parametrize(
    "line,cause",
    [
        (b"{not json", "not a JSON object"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"step": 1}', "'t'"),
        (b'{"anysource": "0", "tag": "x", "nbytes": 4}', "'tag'"),
        (b'{"group": "g", "ranks": [0, "a"]}', "'ranks'"),
        (b'{"dtypes": [["0", 1]]}', "'dtypes'"),
        (b'{"dtypes": [["0", "1", "Float"]]}', "'dtypes'"),
        (b'{"dtypes": {"0": 1}}', "'dtypes'"),
    ],
)
def test_an_authenticated_observers_bad_line_is_a_clear_error(line, cause):
    loop, hub, peer, _, _ = hub_with_peer()
    try:
        peer.sendall(line + b"\n")
        with pytest.raises(ObserverError) as err:
            loop.spin(1)
        assert "observer of real rank 3" in str(err.value) and cause in str(err.value)
    finally:
        peer.close()
        hub.close()


def test_observer_line_limits(monkeypatch):
    """A stranger's line is cut at 4 KiB before its hello; an authenticated peer's at the
    link's limit, raised for the input the controller asked for (a mirrored input rides
    base64 on one line)."""
    monkeypatch.setattr(observers, "PEER_LINE_MAX", 1 << 20)
    loop, hub, peer, logged, lost = hub_with_peer()
    stranger = dial(hub.address)
    try:
        stranger.sendall(b"{" * 8192)  # no newline, no hello
        loop.spin(0.3)
        assert closed_by_peer(stranger, 1) and "observer link: dropped" in logged[-1] and not lost
        assert hub.ask(3, {"q": 1, "input": 1}, reply_bytes=3 << 20)  # base64 of 3 MiB: 4 MiB
        big = json.dumps({"q": 1, "data": "A" * (4 << 20)}).encode() + b"\n"
        replies: list[dict] = []
        hub.on_reply = replies.append
        for i in range(0, len(big), 1 << 16):  # interleaved with the loop, which reads it
            peer.sendall(big[i : i + (1 << 16)])
            loop.spin(0.001)
        loop.spin(0.3)
        assert len(replies) == 1 and len(replies[0]["data"]) == 4 << 20
        with pytest.raises(ObserverError) as err:
            sent = 0
            while sent < 16 << 20:
                peer.sendall(b"B" * (1 << 16))
                sent += 1 << 16
                loop.spin(0.001)
        assert "observer of real rank 3" in str(err.value) and "longer than" in str(err.value)
        assert len(hub._bufs[peer_sock(hub, 3)]) <= (4 << 20) + (1 << 20)
    finally:
        stranger.close()
        peer.close()
        hub.close()


def peer_sock(hub: ObserverHub, rank: int) -> socket.socket:
    return hub.by_rank[rank]


def test_observer_hello_deadline_and_wrong_secret():
    loop, hub, peer, logged, lost = hub_with_peer()
    silent = dial(hub.address)
    wrong = dial(hub.address, json.dumps({"hello": 1, "rank": 3, "pid": 2, "secret": "guess"}).encode() + b"\n")
    try:
        loop.spin(0.3)
        assert closed_by_peer(wrong, 1) and hub.by_rank[3] is not None and not lost
        loop.spin(HELLO_TIMEOUT_S + 0.2)
        assert closed_by_peer(silent, 1)
        assert sum("observer link: dropped" in m for m in logged) == 2, logged
        assert hub.by_rank.get(3) is not None  # the real one stays
    finally:
        silent.close()
        wrong.close()
        peer.close()
        hub.close()


class _Engine:
    def on_event(self, conn, ev) -> None:
        pass


def test_gloo_listener_takes_each_expected_sequence_once():
    """A real rank that dials the controller (its address compares larger) is taken once
    per pair, also when it dials before the controller read its record; a second
    connection for the pair, an unknown sequence and a stalled handshake are dropped,
    and none of them ends the loop."""
    drv = GlooDriver(lambda d: _Engine(), "127.0.0.1")
    logged: list[str] = []
    drv.log = logged.append
    opened: list[Conn] = []
    drv.on_open = opened.append
    group = Group("0", 4, RealRanks([0], 4))
    early, later = Conn(group, 0, 1, GlooPair()), Conn(group, 0, 2, GlooPair())
    drv.accept_router = lambda seq: seq == 4  # a pair whose real rank's record is not read yet
    drv.expect(8, later)
    loop = threading.Thread(target=drv.run, daemon=True)
    loop.start()
    addr = drv.address
    socks = []
    try:
        stall = dial(addr, b"\x08\x00")
        first = dial(addr, SEQ.pack(8))
        second = dial(addr, SEQ.pack(8))
        unknown = dial(addr, SEQ.pack(99))
        parked = dial(addr, SEQ.pack(4))
        socks += [stall, first, second, unknown, parked]
        assert closed_by_peer(second, 2) and closed_by_peer(unknown, 2)
        assert not closed_by_peer(first, 0.2)
        drv.call_soon(lambda: drv.expect(4, early))
        time.sleep(0.3)
        assert opened == [later, early] and drv.socks[early] and drv.socks[later]
        assert not closed_by_peer(parked, 0.1)
        assert closed_by_peer(stall, HANDSHAKE_TIMEOUT_S + 2)
        assert drv.running and drv.error is None
        assert sum("Gloo listener: dropped" in m for m in logged) == 3, logged
    finally:
        drv.running = False
        drv.call_soon(lambda: None)
        loop.join(5)
        for s in socks:
            s.close()
        drv.close_all()


def test_store_listener_binds_the_master_address():
    """The store the controller hosts (node 0 emulated) listens on the run's address only."""
    from neuronabox.controller.config import ControllerConfig
    from neuronabox.controller.rendezvous import open_store

    from neuronabox.launcher.ports import free_port

    cfg = ControllerConfig(
        nnodes=2, nproc_per_node=1, real_nodes=[1], master_addr="127.0.0.1", master_port=free_port(),
        run_id="t", lazy=False, store_timeout_s=10,
    )  # fmt: skip
    store, server = open_store(cfg)
    try:
        store.set("k", "v")
        assert store.get("k") == b"v"
        mine = [
            c.laddr for c in psutil.Process().net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == cfg.master_port
        ]  # fmt: skip
        assert [(a.ip, a.port) for a in mine] == [("127.0.0.1", cfg.master_port)]
    finally:
        store.close()
        server.close()
    assert not server.thread.is_alive()
    left = [c for c in psutil.Process().net_connections(kind="inet") if c.laddr.port == cfg.master_port]
    assert not [c for c in left if c.status != psutil.CONN_TIME_WAIT], left
