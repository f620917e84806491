"""A perf ladder of NCCL ranks called directly (`rig_worker.py`, ctypes, as nccl-tests calls
NCCL): the wheel's unmodified libnccl on the rig's CUDA driver (`--device cpu`) or on the
machine's own driver and GPU (`--device cuda`); the emulated ranks are the controller's NCCL
dialect (`python -m neuronabox.controller.nccl_main`), or every rank is real (`--all-real`).

What is emulated here: the CUDA driver and NCCL's kernels (CPU code in the rig). What is
real: all of NCCL's host side (bootstrap, topology, transport setup, proxy, Socket net)
and, in an emulated run, the controller speaking NCCL's wire to it.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from neuronabox.controller.config import real_ranks_of
from neuronabox.controller.dialects.nccl.errors import UnsupportedNcclVersion
from neuronabox.controller.dialects.nccl.versions import layout_for
from neuronabox.errors import NeuronaBoxError
from neuronabox.launcher.nccl_pins import NcclPins
from neuronabox.launcher.nccl_rig import RigError, library, library_version, rank_env
from neuronabox.launcher.torchrun_args import index_list
from neuronabox.limits import read_tail
from neuronabox.perf.ladder import PerfSpec
from neuronabox.perf.run import rows_of
from neuronabox.perf.table import Row


class RigRunError(NeuronaBoxError, RuntimeError):
    """A rig run that failed: a rank or the controller, named with its own last line."""


class RigUsageError(NeuronaBoxError, ValueError):
    """A rig run refused before anything starts."""


RIG_REAL_MAX = 8  # real rig ranks in an emulated world: each is a process with NCCL's threads


@dataclass
class RigJob:
    """One communicator on the rig: `world` ranks of which `real` run; the rest the controller's."""

    specs: list[PerfSpec]
    world: int
    real: list[int]
    channels: int = 1
    delay_model: str = "zero"
    topology: str = "cpu-25gbe"
    inject: list[str] = field(default_factory=list)
    policy: str = "zeros"
    timeout: float = 300.0
    library: Path | None = None  # None: the wheel's, checked
    nccl: str = "2.28.9"  # the release the library reports
    nproc_per_node: int = 1
    device: str = "cpu"  # cpu: the rig's driver and kernels; cuda: the machine's driver and GPU
    announce: bool = True  # the ranks' profiler announces each collective (False: a rank the controller cannot follow)
    silence_s: float = 10.0  # how long the controller waits for an announcement its bytes need

    @property
    def redop(self) -> str:
        """The reduction every spec uses: the controller's emulated ranks add its identity."""
        ops = {s.op for s in self.specs if s.op not in ("none", "-")} or {"sum"}
        if len(ops) > 1:
            raise RigUsageError(f"one run reduces with one op, got {', '.join(sorted(ops))}")
        return ops.pop()

    @property
    def emulated(self) -> bool:
        return len(self.real) < self.world


def rig_library(device: str = "cpu") -> Path:
    """`nccl_rig.library`, refused as a usage error (before anything starts)."""
    try:
        return library(device)
    except RigError as exc:
        raise RigUsageError(str(exc)) from None


def nccl_version(path: Path) -> str:
    try:
        return library_version(path)
    except RigError as exc:
        raise RigUsageError(str(exc)) from None


def rig_job(ns, spec: PerfSpec, world: int) -> RigJob:
    """The rig job `neuronabox perf --backend nccl --device cpu` asks for, checked: real ranks
    (each alone between emulated neighbours), the NCCL release (one the dialect speaks)."""
    if ns.all_real:
        real = list(range(world))
    elif ns.real_ranks or ns.real_nodes:
        flag, raw = ("--real-ranks", ns.real_ranks) if ns.real_ranks else ("--real-nodes", ns.real_nodes)
        count, noun = (world, "rank") if ns.real_ranks else (ns.nnodes, "node")
        listed = index_list(flag, raw, count, noun)
        real = listed if ns.real_ranks else real_ranks_of(listed, ns.nproc_per_node, [])
    else:
        real = list(range(ns.nproc_per_node))
    if not ns.all_real:
        if len(real) > RIG_REAL_MAX:
            raise RigUsageError(f"at most {RIG_REAL_MAX} real rig ranks in an emulated world, got {len(real)}")
    library = rig_library(ns.device)
    version = nccl_version(library)
    if not ns.all_real:
        try:
            layout_for(version)
        except UnsupportedNcclVersion as exc:
            raise RigUsageError(str(exc)) from None
    return RigJob([spec], world, real, channels=ns.nccl_channels, delay_model=ns.delay_model or "alpha-beta",
                  topology=ns.topology or "cpu-25gbe", inject=list(ns.inject or []), policy=ns.data or "zeros",
                  timeout=float(ns.timeout or 300), library=library, nccl=version,
                  nproc_per_node=ns.nproc_per_node, device=ns.device)  # fmt: skip


def run_rig_ladder(job: RigJob, keep: str | None = None) -> list[Row]:
    """`run_rig` in a temporary folder (kept in `keep` if asked): the one spec's rows."""
    folder = Path(tempfile.mkdtemp(prefix="neuronabox-perf-rig-"))
    try:
        return run_rig(job, folder)[0]
    finally:
        if keep:
            shutil.copytree(folder, keep, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.fifo"))
        shutil.rmtree(folder, ignore_errors=True)


def run_rig(job: RigJob, folder: Path) -> list[list[Row]]:
    """Run `job` in `folder` (its results, the trace, each process's output) and return one
    list of rows per spec."""
    library = job.library or rig_library(job.device)
    folder.mkdir(parents=True, exist_ok=True)
    trace = folder / "trace.jsonl"
    fifo = folder / "profile.fifo"
    pins = NcclPins(job.world, channels=job.channels, trace=str(fifo) if job.emulated else "")
    (folder / "job.json").write_text(json.dumps({"specs": [s.to_json() for s in job.specs], "world": job.world,
                                                 "real": job.real, "policy": job.policy, "nccl": str(library),
                                                 "out": str(folder)}))  # fmt: skip
    procs: dict[str, subprocess.Popen] = {}
    logs = []
    try:
        uid = None
        ctl = None
        if job.emulated:
            cmd = [sys.executable, "-m", "neuronabox.controller.nccl_main", "--world", str(job.world),
                   "--real", ",".join(map(str, job.real)), "--channels", str(job.channels), "--profile", str(fifo),
                   "--trace", str(trace), "--delay-model", job.delay_model, "--topology", job.topology,
                   "--timeout", str(job.timeout), "--nccl", job.nccl,
                   "--nproc-per-node", str(job.nproc_per_node), "--redop", job.redop,
                   "--silence", str(job.silence_s)]  # fmt: skip
            for spec in job.inject:
                cmd += ["--inject", spec]
            log = open(folder / "controller.log", "wb")
            logs.append(log)
            ctl = procs["the controller"] = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                             stderr=log, start_new_session=True)  # fmt: skip
            ready = _line(ctl.stdout, ctl, 60.0, "the controller", folder / "controller.log")
            if ready.startswith("ready uid="):
                uid = ready.split("=", 1)[1]
        for rank in sorted(job.real):  # rank 0 first: it makes the unique id the others need
            env = {**os.environ, **rank_env(rank, pins, job.device), "PYTHONUNBUFFERED": "1"}
            inherited = os.environ.get("LD_LIBRARY_PATH")
            if job.device == "cpu":
                env["LD_LIBRARY_PATH"] = ":".join(p for p in (env["LD_LIBRARY_PATH"], inherited) if p)
            if job.emulated and job.announce:
                env["NEURONABOX_NCCL_TRACE_START"] = "1"
            cmd = [sys.executable, "-m", "neuronabox.perf.rig_worker", str(folder / "job.json"), str(rank)]
            log = open(folder / f"rank{rank}.log", "wb")
            logs.append(log)
            if rank == 0:
                rfd, wfd = os.pipe()
                env["NBX_RIG_ID_FD"] = str(wfd)
                p = procs[f"rank {rank}"] = subprocess.Popen(cmd, env=env, pass_fds=(wfd,), stdout=log, stderr=log,
                                                             start_new_session=True)  # fmt: skip
                os.close(wfd)
                with os.fdopen(rfd, "rb", buffering=0) as r:
                    uid = _line(r, p, 60.0, "rank 0", folder / "rank0.log")
                if ctl is not None:
                    ctl.stdin.write(f"uid {uid}\n".encode())
                    ctl.stdin.flush()
            else:
                env["NBX_RIG_UNIQUE_ID"] = uid or ""
                procs[f"rank {rank}"] = subprocess.Popen(cmd, env=env, stdout=log, stderr=log, start_new_session=True)
        _wait(procs, job.timeout, folder)
        if ctl is not None:
            ctl.send_signal(signal.SIGTERM)
            try:
                ctl.wait(30)
            except subprocess.TimeoutExpired:
                raise RigRunError("the controller did not stop within 30 s of SIGTERM") from None
            if ctl.returncode != 0:
                raise RigRunError(f"the controller exited {ctl.returncode}: {_last(folder / 'controller.log')}")
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for log in logs:
            log.close()
    out = []
    for i, spec in enumerate(job.specs):
        out.append(rows_of(spec, folder / f"spec{i}", trace, emulated=job.emulated))
    return out


def _line(stream, proc: subprocess.Popen, timeout: float, who: str, log: Path) -> str:
    """One line from `stream` within `timeout`, or the process's own last words."""
    deadline = time.monotonic() + timeout
    data = b""
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0:
            raise RigRunError(f"{who} said nothing within {timeout:.0f} s")
        if not select.select([stream], [], [], min(left, 0.5))[0]:
            if proc.poll() is not None:
                raise RigRunError(f"{who} exited {proc.returncode}: {_last(log)}")
            continue
        chunk = os.read(stream.fileno(), 4096)
        if not chunk:
            raise RigRunError(f"{who} exited {proc.wait()}: {_last(log)}")
        data += chunk
    return data.decode().strip()


def _wait(procs: dict[str, subprocess.Popen], timeout: float, folder: Path) -> None:
    """Every rank exits 0; the first failure in time (a rank, or the controller) is named."""
    deadline = time.monotonic() + timeout
    ranks = {k: p for k, p in procs.items() if k != "the controller"}
    while True:
        for who, p in procs.items():
            code = p.poll()
            if code is not None and (code != 0 or who == "the controller"):
                log = folder / ("controller.log" if who == "the controller" else f"{who.replace(' ', '')}.log")
                raise RigRunError(f"{who} exited {code}: {_last(log)}")
        if all(p.poll() == 0 for p in ranks.values()):
            return
        if time.monotonic() > deadline:
            stuck = [k for k, p in ranks.items() if p.poll() is None]
            raise RigRunError(f"{', '.join(stuck)} still running after {timeout:.0f} s")
        time.sleep(0.05)


def _last(path: Path) -> str:
    try:
        tail = read_tail(path, 4096).decode(errors="replace")
    except OSError:
        return "(no output)"
    lines = [ln for ln in tail.splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output)"
