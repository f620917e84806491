"""Testbeds for fidelity runs: where each node of a job lives, and what CPU it gets.

A `Host` reads like the machine it stands for (Mininet's hosts are the model): its
address and interface, the network namespace it lives in, the cores it is pinned to
and the CPU share it gets. A testbed hands out hosts for the nodes of a run and for
the controller:

- `Loopback`: every host on loopback, each pinned to cores of its own (the NeuronaBox
  paper's two-node setup: one core per rank).
- `Netns`: one network namespace per node, a veth from each to a bridge that lives in
  a namespace of its own, each node's link shaped by tbf in both directions, and a
  cgroup v1 CPU quota per node so every node gets the same CPU share whether its
  peers run for real or are emulated. Nothing is created in the root namespace, so
  closing the testbed (deleting its namespaces and cgroups) leaves nothing behind;
  a testbed whose launcher died is swept by the next one (`sweep_stale`).

Needs root, `ip` and `tc` (iproute2), and the cgroup v1 cpu controller.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from neuronabox.errors import NeuronaBoxError
from neuronabox.limits import read_bounded

CGROUP_CPU = Path("/sys/fs/cgroup/cpu")
NETNS_DIR = Path("/var/run/netns")  # where `ip netns add` pins a namespace
CLONE_NEWNET = 0x40000000
CGROUP_PERIOD_US = 10_000  # a short period keeps a quota smooth at the scale of one iteration
PREFIX = "nbx"  # namespaces are nbx<pid>-<host>, cgroups neuronabox-<pid>
SUBNET = "198.18.0"  # RFC 2544's benchmarking range, only inside the testbed's own namespaces
CONTROLLER_OCTET = 254  # larger than every node's: by Gloo's rule the controller dials
TEARDOWN_WAIT = 10.0  # seconds a closing testbed waits for its processes, namespaces and cgroups to go
_RATE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(bit|kbit|mbit|gbit|[kMG]b/s|[kMG]bps)\s*$", re.IGNORECASE)
_RATE_SCALE = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}


class TestbedError(NeuronaBoxError, RuntimeError):
    """A testbed run failed; the message is its one-line cause (exit status 1)."""


class TestbedUnavailable(TestbedError):
    """Bad input, or this machine cannot host the testbed (exit status 2)."""


def parse_rate(text: str) -> float:
    """Bits per second from tc's units (`100mbit`, `1gbit`) or ours (`100Mb/s`)."""
    m = _RATE.match(text)
    if not m or float(m.group(1)) <= 0:
        raise TestbedUnavailable(f"--rate takes a link rate such as 100mbit, 1gbit or 500Mb/s, got {text!r}")
    unit = m.group(2).lower()
    prefix = "" if unit == "bit" else unit[0]
    return float(m.group(1)) * _RATE_SCALE[prefix]


def _setns(path: Path) -> None:
    """Join the network namespace pinned at `path` (os.setns is Python 3.12+)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {path}")
    finally:
        os.close(fd)


@dataclass
class Host:
    """One machine of the testbed: a node of the job, or the controller's."""

    name: str
    address: str  # where its sockets listen
    ifname: str = "lo"  # GLOO_SOCKET_IFNAME
    netns: str | None = None
    cpus: list[int] | None = None  # pinned to these cores
    cgroup: str | None = None  # a cgroup v1 cpu folder: its quota is this host's CPU share

    def enter(self) -> None:
        """Move the calling process into this host's network namespace, onto its cores
        and into its CPU share (a child's preexec_fn). setns(2) rather than `ip netns
        exec`, which remounts /sys and so hides the cgroup folder."""
        if self.cgroup:
            Path(self.cgroup, "cgroup.procs").write_text(str(os.getpid()))
        if self.cpus:
            os.sched_setaffinity(0, self.cpus)
        if self.netns:
            _setns(NETNS_DIR / self.netns)

    def preexec(self) -> Callable[[], None] | None:
        return self.enter if (self.cgroup or self.cpus or self.netns) else None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: dict) -> Host:
        return cls(**doc)


@dataclass
class Placement:
    """Where a run's real nodes and its controller live (the launcher's `--placement`)."""

    nodes: dict[int, Host]
    controller: Host

    def dumps(self) -> str:
        return json.dumps(
            {"nodes": {str(k): h.to_dict() for k, h in self.nodes.items()}, "controller": self.controller.to_dict()}
        )

    @classmethod
    def loads(cls, text: str) -> Placement:
        doc = json.loads(text)
        return cls({int(k): Host.from_dict(v) for k, v in doc["nodes"].items()}, Host.from_dict(doc["controller"]))


# ---------------------------------------------------------------------------------
# loopback: one core per rank, one for the controller
# ---------------------------------------------------------------------------------
class Loopback:
    """Every host on loopback; node i is pinned to cores [i*P, (i+1)*P), the controller
    to the next free core."""

    name = "loopback"

    def __init__(self, nnodes: int, nproc: int, real_nodes: list[int], cores: int | None = None) -> None:
        cores = cores if cores is not None else len(os.sched_getaffinity(0))
        self.nnodes, self.nproc = nnodes, nproc
        all_real = nnodes * nproc
        emulated = len(real_nodes) * nproc + 1
        need = max(all_real, emulated)
        if need > cores:
            raise TestbedUnavailable(
                f"the loopback testbed pins every rank and the controller to a core of its own: "
                f"{nnodes} x {nproc} ranks need {need} cores, this machine has {cores} "
                f"(use --testbed netns, which shares cores by CPU quota)"
            )

    def node(self, i: int) -> Host:
        return Host(f"node{i}", "127.0.0.1", "lo", cpus=list(range(i * self.nproc, (i + 1) * self.nproc)))

    def all_real(self) -> dict[int, Host]:
        return {i: self.node(i) for i in range(self.nnodes)}

    def emulated(self, real_nodes: list[int]) -> Placement:
        """The real nodes on the cores they have in the all-real run; the controller on
        the first core no real node uses (the one an emulated node would have had)."""
        nodes = {i: self.node(i) for i in real_nodes}
        used = {c for h in nodes.values() for c in h.cpus or []}
        spare = next(c for c in range(len(used) + 1) if c not in used)
        return Placement(nodes, Host("controller", "127.0.0.2", "lo", cpus=[spare]))

    def close(self) -> None:
        pass

    def __enter__(self) -> Loopback:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---------------------------------------------------------------------------------
# network namespaces with shaped links and CPU quotas
# ---------------------------------------------------------------------------------
def _run(cmd: list[str]) -> None:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise TestbedError(f"{' '.join(cmd)} failed: {(out.stderr or out.stdout).strip().splitlines()[-1:]}")


def _netns_list() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    return [line.split()[0] for line in out.stdout.splitlines() if line.strip()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def owned_netns(pid: int | None = None) -> list[str]:
    """Namespaces of testbeds (of `pid`'s testbed when given)."""
    pat = re.compile(rf"^{PREFIX}(\d+)-")
    return [n for n in _netns_list() if (m := pat.match(n)) and (pid is None or int(m.group(1)) == pid)]


def owned_cgroups(pid: int | None = None) -> list[Path]:
    if not CGROUP_CPU.is_dir():
        return []
    pat = re.compile(r"^neuronabox-(\d+)$")
    return [p for p in CGROUP_CPU.iterdir() if (m := pat.match(p.name)) and (pid is None or int(m.group(1)) == pid)]


def _remove_cgroup(root: Path, wait: float = 0.0) -> bool:
    """Remove a cgroup folder (tasks still inside move to the parent). A folder whose
    last task is still exiting cannot go yet: retried for up to `wait` seconds.
    Returns whether it is gone."""
    deadline = time.monotonic() + wait
    while True:
        for child in sorted(root.glob("*/"), reverse=True):
            if (child / "cgroup.procs").exists():
                _remove_cgroup(child)
        try:
            for pid in read_bounded(root / "cgroup.procs", 1 << 20, "cgroup's task list").decode().split():
                try:
                    (root.parent / "cgroup.procs").write_text(pid)
                except OSError:
                    pass
            root.rmdir()
        except OSError:
            pass
        if not root.exists():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def _cgroup_tasks(root: Path) -> set[int]:
    pids: set[int] = set()
    for procs in root.rglob("cgroup.procs"):
        try:
            pids.update(int(x) for x in read_bounded(procs, 1 << 20, "cgroup's task list").split())
        except (OSError, ValueError):
            continue
    return pids


def _netns_members(names: list[str]) -> set[int]:
    """Processes whose network namespace is one of `names` (matched by the namespace's
    inode, as /proc/PID/ns/net reads it)."""
    inodes = set()
    for ns in names:
        try:
            st = os.stat(NETNS_DIR / ns)
            inodes.add((st.st_dev, st.st_ino))
        except OSError:
            continue
    pids: set[int] = set()
    if not inodes:
        return pids
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                st = os.stat(f"/proc/{entry}/ns/net")
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in inodes:
                pids.add(int(entry))
    return pids


def stop_inside(names: list[str], cgroot: Path, wait: float = TEARDOWN_WAIT) -> None:
    """SIGKILL every process still inside a testbed's namespaces or cgroups and wait
    for them to go: a run's processes are stopped before the testbed closes, but one
    that left its launcher's tree (a worker whose agent died first) would keep its
    cgroup busy and outlive the testbed."""
    pids = _netns_members(names) | (_cgroup_tasks(cgroot) if cgroot.is_dir() else set())
    pids.discard(os.getpid())
    procs = []
    for pid in sorted(pids):
        try:
            proc = psutil.Process(pid)
            proc.kill()
            procs.append(proc)
        except psutil.Error:
            continue
    psutil.wait_procs(procs, timeout=wait)  # reaps those that are this process's children


def delete_netns(names: list[str], wait: float = TEARDOWN_WAIT) -> None:
    """Delete namespaces and check that they are gone: a delete can fail while a process
    that entered one is still leaving it (a failed run's, under load). Retried, with
    growing pauses, for up to `wait` seconds; one namespace's failure (even a hung
    `ip`) does not stop the others. What still stands is named on stderr, and the next
    testbed's sweep (`sweep_stale`) removes it once its launcher is gone."""
    left, why = list(names), {}
    deadline, pause = time.monotonic() + wait, 0.05
    while left:
        for ns in left:
            try:
                done = subprocess.run(["ip", "netns", "delete", ns], capture_output=True, text=True, timeout=10)
                why[ns] = done.stderr.strip()
            except (subprocess.SubprocessError, OSError) as exc:
                why[ns] = str(exc)
        try:
            present = set(_netns_list())
        except (subprocess.SubprocessError, OSError):
            present = {ns for ns in left if (NETNS_DIR / ns).exists()}
        left = [ns for ns in left if ns in present]
        if not left or time.monotonic() + pause > deadline:
            break
        time.sleep(pause)
        pause = min(2 * pause, 1.0)
    for ns in left:
        print(f"neuronabox: warning: namespace {ns} still stands: {why[ns] or 'no reason given'}", file=sys.stderr)


def stale() -> tuple[list[str], list[Path]]:
    """The namespaces and cgroups of testbeds whose launcher no longer runs: what
    `sweep_stale` removes, and what a closed testbed must not have left."""
    netns = [ns for ns in owned_netns() if not _alive(int(ns[len(PREFIX) :].split("-", 1)[0]))]
    cgroups = [cg for cg in owned_cgroups() if not _alive(int(cg.name.split("-")[1]))]
    return netns, cgroups


def sweep_stale() -> list[str]:
    """Remove what testbeds of launchers that no longer run left behind (a launcher
    killed with SIGKILL cannot clean up after itself). Returns what it removed."""
    netns, cgroups = stale()
    delete_netns(netns)
    for cg in cgroups:
        _remove_cgroup(cg)
    return [*netns, *map(str, cgroups)]


def check_netns_possible() -> None:
    if os.geteuid() != 0:
        raise TestbedUnavailable(
            "--testbed netns needs root (it creates network namespaces, links and cgroups); run as root"
        )
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise TestbedUnavailable(f"--testbed netns needs `{tool}` (iproute2), which is not installed")
    if not (CGROUP_CPU / "cpu.cfs_quota_us").exists():
        raise TestbedUnavailable(
            f"--testbed netns needs the cgroup v1 cpu controller at {CGROUP_CPU}, which is not mounted"
        )


class Netns:
    """`nnodes` node namespaces and one for the controller, each with a veth `eth0` into
    a bridge in the switch namespace. Node links are shaped at `rate` bits/s in both
    directions (tbf on the node's side and on the bridge's side); the controller's link
    is not shaped, since it carries every emulated node's traffic at once. Each host gets
    a cgroup with a CPU quota: `cpu_share` cores per node, and the controller the share of
    every node together (capped by the machine: it stands in for all but the real ones)."""

    name = "netns"

    def __init__(
        self, nnodes: int, rate_bps: float | None, cpu_share: float | None, mtu: int = 1500, owner: int | None = None
    ) -> None:
        check_netns_possible()
        sweep_stale()
        self.nnodes = nnodes
        self.rate = rate_bps
        self.cpu_share = cpu_share
        self.mtu = mtu
        self.owner = owner or os.getpid()
        self.switch = f"{PREFIX}{self.owner}-sw"
        self.cgroot = CGROUP_CPU / f"neuronabox-{self.owner}"
        self.hosts: dict[str, Host] = {}
        self.created: list[str] = []
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    # -- building ----------------------------------------------------------------------
    def _build(self) -> None:
        self._add_netns(self.switch)
        _run(["ip", "-n", self.switch, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", self.switch, "link", "set", "br0", "up"])
        self.cgroot.mkdir(exist_ok=True)
        for i in range(self.nnodes):
            self.hosts[f"node{i}"] = self._add_host(f"node{i}", i + 1, shaped=True, share=self.cpu_share)
        ctl_share = None if self.cpu_share is None else self.cpu_share * self.nnodes
        self.hosts["controller"] = self._add_host("controller", CONTROLLER_OCTET, shaped=False, share=ctl_share)

    def _add_netns(self, name: str) -> None:
        _run(["ip", "netns", "add", name])
        self.created.append(name)

    def _add_host(self, name: str, octet: int, shaped: bool, share: float | None) -> Host:
        ns = f"{PREFIX}{self.owner}-{'ctl' if name == 'controller' else name.replace('node', 'n')}"
        peer = f"p{octet}"
        self._add_netns(ns)
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        _run(["ip", "-n", ns, "link", "add", "eth0", "mtu", str(self.mtu), "type", "veth", "peer", "name", peer,
              "netns", self.switch])  # fmt: skip
        _run(["ip", "-n", ns, "addr", "add", f"{SUBNET}.{octet}/24", "dev", "eth0"])
        _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
        _run(["ip", "-n", self.switch, "link", "set", peer, "master", "br0"])
        _run(["ip", "-n", self.switch, "link", "set", peer, "up"])
        # Data-centre TCP: no slow start again after each idle gap between collectives.
        _run(["ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.tcp_slow_start_after_idle=0"])
        if shaped and self.rate:
            for where, dev in ((ns, "eth0"), (self.switch, peer)):
                _run(["tc", "-n", where, "qdisc", "add", "dev", dev, "root", "tbf", *self.tbf_args()])
        cgroup = None
        if share is not None:
            cg = self.cgroot / name
            cg.mkdir(exist_ok=True)
            (cg / "cpu.cfs_period_us").write_text(str(CGROUP_PERIOD_US))
            (cg / "cpu.cfs_quota_us").write_text(str(max(1000, int(share * CGROUP_PERIOD_US))))
            cgroup = str(cg)
        return Host(name, f"{SUBNET}.{octet}", "eth0", netns=ns, cgroup=cgroup)

    def tbf_args(self) -> list[str]:
        """A token bucket of about 1 ms of the rate (at least two frames): small enough
        that a message's time is its bytes over the rate, not a free burst."""
        rate_bytes = self.rate / 8
        burst = max(2 * (self.mtu + 14), int(rate_bytes / 1000))
        return ["rate", f"{int(self.rate)}bit", "burst", str(burst), "latency", "100ms"]

    # -- hosts ---------------------------------------------------------------------------
    def node(self, i: int) -> Host:
        return self.hosts[f"node{i}"]

    def all_real(self) -> dict[int, Host]:
        return {i: self.node(i) for i in range(self.nnodes)}

    def emulated(self, real_nodes: list[int]) -> Placement:
        return Placement({i: self.node(i) for i in real_nodes}, self.hosts["controller"])

    # -- teardown ------------------------------------------------------------------------
    def close(self) -> None:
        """Stop what still runs inside, then delete every namespace (their veths, bridge
        and qdiscs go with them) and cgroup. Never raises: each part is tried whatever
        became of the others, and what could not go is named on stderr."""
        try:
            stop_inside(self.created, self.cgroot)
        finally:
            delete_netns(list(reversed(self.created)))
            self.created.clear()
            if self.cgroot.exists() and not _remove_cgroup(self.cgroot, wait=TEARDOWN_WAIT):
                print(f"neuronabox: warning: cgroup {self.cgroot} still stands (a task inside)", file=sys.stderr)

    def __enter__(self) -> Netns:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
