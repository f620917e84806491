"""Real nodes on several hosts, torchrun's way: each real node's host runs
`neuronabox torchrun ... --node-rank K`, the controller runs with node 0's launcher or
alone (`neuronabox controller`), and the launchers hold one link to the head.

The hosts are network namespaces of the netns testbed (a bridge between them, each its
own address), so every process is real and every connection crosses a veth: the stock
torchrun agents, Gloo, the store and the observer. Those tests need root and skip with
that reason otherwise (CI runs as root). The link's own rules are checked on loopback."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest
from conftest import EXAMPLE, ROOT, tagged_processes

from neuronabox.fidelity.testbed import Netns
from neuronabox.launcher.hosts import HeadLink, HostLinkError, MemberLink, MemberState

pytestmark = pytest.mark.xdist_group("netns")  # with test_fidelity's, which counts testbed namespaces
needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("ss") is None,
    reason="hosts as network namespaces need root, iproute2 and ss",
)
PORT = "29500"  # each namespace has its own ports: nothing else listens there


class Launcher:
    """One host's `neuronabox` command, started in that host's namespace; its output is
    read as it comes (a reader thread), so a test waits on a line, not on a timer."""

    def __init__(self, host, argv: list[str], tag: str) -> None:
        env = dict(os.environ, NEURONABOX_TEST_TAG=tag, PYTHONUNBUFFERED="1", GLOO_SOCKET_IFNAME=host.ifname)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "neuronabox.cli", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
            preexec_fn=host.enter,
        )
        self._lines: list[str] = []
        self._ended = False  # its output closed (it exited)
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for raw in self.proc.stdout:
            with self._changed:
                self._lines.append(raw.decode(errors="replace"))
                self._changed.notify_all()
        with self._changed:  # the output ended: a waiter learns it now, not at its deadline
            self._ended = True
            self._changed.notify_all()

    def text(self) -> str:
        with self._changed:
            return "".join(self._lines)

    def wait_for(self, pattern: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        with self._changed:
            while not re.search(pattern, "".join(self._lines)):
                assert not self._ended, f"exited before {pattern!r}:\n{''.join(self._lines)[-3000:]}"
                left = deadline - time.monotonic()
                assert left > 0, f"no {pattern!r} in {timeout} s:\n{''.join(self._lines)[-3000:]}"
                self._changed.wait(left)

    def end(self, timeout: float = 120) -> int:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"still running after {timeout} s:\n{self.text()[-3000:]}")
        self.close()  # the rest of its output, before the test reads it
        return rc

    def close(self) -> None:
        self._reader.join(timeout=30)
        if not self._reader.is_alive():
            self.proc.stdout.close()

    def error(self) -> str:
        """The launcher's last error line. Its torchrun agent shares the stream, and an agent
        stopped mid-line (its store gone) leaves that line unended: the error line then
        follows it on the same line (CI once read `...^^^^neuronabox: error: ...`)."""
        marker = "neuronabox: error:"
        lines = [ln[ln.index(marker) :] for ln in self.text().splitlines() if marker in ln]
        return lines[-1] if lines else ""


@pytest.fixture
def hosts():
    """Three hosts on one bridge: node0 and node1 (the real nodes' hosts) and controller."""
    bed = Netns(2, rate_bps=None, cpu_share=None)
    tag = uuid.uuid4().hex
    started: list[Launcher] = []

    def start(host: str, *argv: str) -> Launcher:
        launcher = Launcher(bed.hosts[host], list(argv), tag)
        started.append(launcher)
        return launcher

    try:
        yield bed, start
    finally:
        for launcher in started:
            if launcher.proc.poll() is None:
                launcher.proc.kill()
                launcher.proc.wait()
            launcher.close()
        left = tagged_processes(tag)
        for p in left:
            p.kill()
        bed.close()
        assert not left, [p.cmdline() for p in left]


def world(bed, *more: str, real: str = "1,2") -> list[str]:
    """The flags every host's command takes: 4 nodes, `real` of them real, the store on the controller's host."""
    addr = bed.hosts["controller"].address
    return ["--nnodes", "4", "--real-nodes", real, "--master-addr", addr, "--master-port", PORT, *more]


def listeners(netns: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "exec", netns, "ss", "-Hltn"], capture_output=True, text=True, timeout=30)
    found = [line.split()[3].rsplit(":", 1)[0] for line in out.stdout.splitlines() if line.strip()]
    return [a.removeprefix("[::ffff:").removesuffix("]") for a in found]  # a v4-mapped address is its v4


@needs_root
def test_two_real_nodes_on_two_hosts_and_the_controller_on_a_third(hosts, tmp_path):
    bed, start = hosts
    trace = tmp_path / "trace.jsonl"
    head = start("controller", "controller", *world(bed, "--trace", str(trace)))
    # Each host's launcher waits for the head in the store: no order to keep between them.
    one = start("node0", "torchrun", *world(bed, "--node-rank", "1"), EXAMPLE, "--steps", "4", "--check-grads")
    two = start("node1", "torchrun", *world(bed, "--node-rank", "2"), EXAMPLE, "--steps", "4", "--check-grads")
    head.wait_for("waiting for real nodes 1,2")
    # The controller's host listens on the cluster's address and on loopback, nowhere else.
    bound = listeners(bed.hosts["controller"].netns)
    assert len(bound) >= 5 and set(bound) == {bed.hosts["controller"].address, "127.0.0.1"}, bound
    for launcher in (head, one, two):
        assert launcher.end() == 0, launcher.text()[-3000:]
    assert re.search(r"real node 1 joined from 198\.18\.0\.1:", head.text()), head.text()
    assert re.search(r"real node 2 joined from 198\.18\.0\.2:", head.text()), head.text()
    for launcher in (head, one, two):  # the run's summary, on every host
        assert re.search(r"world size\s+4\n", launcher.text()) and "real ranks      1, 2" in launcher.text()
        assert "optimizer steps 4" in launcher.text(), launcher.text()[-2000:]
    # Both real ranks' averaged gradients are what two real ranks of four give, every step.
    assert one.text().count("grad check ok") + two.text().count("grad check ok") == 8
    assert trace.stat().st_size > 0 and '"allreduce"' in trace.read_text()


@needs_root
def test_a_host_that_dies_ends_the_run_naming_it(hosts):
    """Node 0 real this time: its launcher is the head and runs the controller, and its
    torchrun agent hosts the store."""
    bed, start = hosts
    flags = world(bed, real="0,1")
    head = start("controller", "torchrun", *flags, "--node-rank", "0", EXAMPLE, "--steps", "100000")
    start("node0", "torchrun", *flags, "--node-rank", "1", EXAMPLE, "--steps", "100000")
    head.wait_for(r"step 3 loss")
    pids = subprocess.run(["ip", "netns", "pids", bed.hosts["node0"].netns], capture_output=True, text=True).stdout
    for pid in map(int, pids.split()):  # the host dies: every process on it at once
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert head.end() == 1
    assert "real node 1's host is gone: its launcher's link from 198.18.0.1:" in head.error(), head.text()[-2000:]


@needs_root
def test_a_host_that_never_joins_ends_the_run_on_every_host_naming_it(hosts):
    bed, start = hosts
    # 8 s: under a second test worker's load node 1's launcher once took more than 3 s to join.
    head = start("controller", "controller", *world(bed, "--join-timeout", "8"))
    one = start("node0", "torchrun", *world(bed, "--node-rank", "1", "--join-timeout", "8"), EXAMPLE)
    assert head.end() == 1 and one.end() == 1
    assert "real node 2 never joined: no launcher with --node-rank 2" in head.error(), head.text()[-2000:]
    assert "the head ended the run: real node 2 never joined" in one.error(), one.text()[-2000:]


# -- without root: the flags, and the link's rules on loopback ----------------------------------
def test_several_hosts_refuse_what_cannot_work(run):
    store = ["--master-addr", "127.0.0.1", "--master-port", "29999"]
    cases = [
        (("torchrun", "--nnodes", "4", "--real-nodes", "1,2", "--node-rank", "1", EXAMPLE),
         "--node-rank needs --master-addr and --master-port"),
        (("torchrun", "--nnodes", "4", "--real-nodes", "1,2", "--node-rank", "3", *store, EXAMPLE),
         "--node-rank 3 is not a real node (--real-nodes 1,2)"),
        (("torchrun", "--nnodes", "4", "--real-nodes", "1", "--node-rank", "4", *store, EXAMPLE),
         "--node-rank 4 is outside the world's 4 nodes"),
        (("torchrun", "--nnodes=4", "--nproc-per-node=2", "--real-ranks=1", "--node-rank=0", *store, EXAMPLE),
         "give --real-nodes, not --real-ranks"),
        (("torchrun", "--nnodes", "4", "--backend", "nccl", "--node-rank", "0", *store, EXAMPLE),
         "several hosts run Gloo jobs"),
        (("controller", "--nnodes", "4", "--real-nodes", "0,1", *store), "node 0 is real: the controller runs with"),
        (("controller", "--nnodes", "4", "--real-nodes", "1"), "neuronabox controller needs --master-addr"),
        (("controller", "--nnodes", "4", "--real-nodes", "1", *store, EXAMPLE), "this command runs no script"),
        (("controller", "--nnodes", "4", "--real-nodes", "1", "--join-timeout", "0", *store), "--join-timeout takes"),
    ]  # fmt: skip
    for argv, expected in cases:
        res = run(*argv, timeout=60)
        assert res.rc == 2 and expected in res.last_error, (argv, res.err[-1500:])


def test_a_member_without_a_head_says_where_it_looked(run):
    from neuronabox.launcher.ports import free_port

    port = str(free_port())
    argv = ["--nnodes", "3", "--real-nodes", "1", "--master-addr", "127.0.0.1", "--master-port", port]
    res = run("torchrun", *argv, "--node-rank", "1", "--join-timeout", "1", EXAMPLE, timeout=120)
    assert res.rc == 1 and f"no head at the store 127.0.0.1:{port} in 1 s" in res.last_error, res.err[-1500:]


FACTS = {"nnodes": 4, "nproc_per_node": 1, "real_nodes": [0, 1, 2], "run_id": "nbx-1", "backend": "gloo"}


def poll_until(link: HeadLink, want: int, timeout: float = 10) -> list:
    events: list = []
    deadline = time.monotonic() + timeout
    while len(events) < want and time.monotonic() < deadline:
        events += link.poll(time.monotonic(), wait=0.1)
    return events


def joining(link: HeadLink, node: int, facts: dict) -> MemberLink:
    """A member's join, which blocks on the head's answer: the head polls meanwhile."""
    import threading

    box: dict = {}

    def go() -> None:
        try:
            box["member"] = MemberLink.join(link.address, node, facts, timeout_s=10)
        except HostLinkError as exc:
            box["error"] = exc

    t = threading.Thread(target=go)
    t.start()
    while t.is_alive():
        link.poll(time.monotonic(), wait=0.05)
    if "error" in box:
        raise box["error"]
    return box["member"]


def test_the_head_link_welcomes_refuses_and_tracks_each_member():
    link = HeadLink("127.0.0.1", [1, 2], FACTS, join_s=60, now=time.monotonic())
    link.welcome = {"observer": "127.0.0.1:1", "observer_secret": "s"}
    try:
        with pytest.raises(HostLinkError, match="this host's flags differ from the head's: nnodes is 8 there"):
            joining(link, 1, dict(FACTS, nnodes=8))
        with pytest.raises(HostLinkError, match=r"--node-rank 3 is not a real node another host runs \(those are 1,2"):
            joining(link, 3, FACTS)
        one = joining(link, 1, FACTS)
        assert one.welcome == link.welcome and link.states[1] is MemberState.RUNNING
        with pytest.raises(HostLinkError, match="real node 1 joined already"):
            joining(link, 1, FACTS)
        two = joining(link, 2, FACTS)
        one.send({"done": True})
        two.send({"failed": "rank 2's process exited with status 3"})
        events = poll_until(link, 2)
        assert {(e.node, e.state) for e in events} == {(1, MemberState.DONE), (2, MemberState.FAILED)}
        assert not link.all_done
        link.end("the job failed on real node 2", "summary")
        assert one.poll(timeout=5) == {"end": "the job failed on real node 2", "summary": "summary"}
    finally:
        link.close()


def test_a_member_whose_link_closes_is_gone_and_one_never_seen_is_absent():
    link = HeadLink("127.0.0.1", [1, 2], FACTS, join_s=1.0, now=time.monotonic())
    link.welcome = {}
    try:
        one = joining(link, 1, FACTS)
        one.close()  # its host died: the kernel closes its sockets
        events = poll_until(link, 2, timeout=10)
        gone = [e for e in events if e.state is MemberState.GONE]
        absent = [e for e in events if e.state is MemberState.ABSENT]
        assert gone and gone[0].node == 1 and "closed while its node ran" in gone[0].cause
        assert absent and absent[0].node == 2 and "no launcher with --node-rank 2" in absent[0].cause
        # A silent connection (not a launcher) is dropped, never counted as a member.
        stray = socket.create_connection(tuple(link.listener.getsockname()[:2]))
        stray.close()
        assert link.poll(time.monotonic()) == []
    finally:
        link.close()
