"""Running a Job: start the controller, run the stock torchrun for each real node (or the
real ranks directly), watch them all, and stop everything at the end. No flags are read
here: the Job (`job.py`) is the whole input, whoever built it (`neuronabox torchrun`,
`neuronabox.launch`).

Every process a Run starts is stopped on every exit path (success, failure, Ctrl-C
once or twice, SIGTERM, a child killed outright, the launcher killed outright) when
its caller calls `cleanup`: see `reaping`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from neuronabox.controller.config import ControllerConfig
from neuronabox.errors import NeuronaBoxError
from neuronabox.fidelity.testbed import Host
from neuronabox.launcher import registry
from neuronabox.launcher.controller_proc import controller_cause, controller_config, spawn
from neuronabox.launcher.cores import pin
from neuronabox.launcher.hosts import HeadLink, MemberLink, job_facts
from neuronabox.launcher.interrupts import interrupted_again
from neuronabox.launcher.job import Job
from neuronabox.launcher.node_failure import NodeOutput, first_failure, stderr_sink
from neuronabox.launcher.ranks import direct_env, node_command, node_log_dir, ranks_env, worker_command
from neuronabox.launcher.realtime import entering
from neuronabox.launcher.reaping import Family, die_with_parent, stop_marked
from neuronabox.launcher.result import RunResult, result_of
from neuronabox.limits import read_bounded
from neuronabox.trace import records as tracefile

READY_TIMEOUT_S = 120
CONTROLLER_STALLED = 4  # the controller's exit status when its watchdog ended the run
CONTROLLER_STORE_LOST = 5  # ... when the store a real node's agent hosts went away
MIN_TORCH = (2, 2)
OUTPUT_EOF_S = 3.0  # at the end, how long to wait for the real nodes' stderr to close
HOST_SETTLE_S = 1.0  # a node's failure may follow another host's loss: how long the head waits to hear of it
CONTROLLER_END_S = 5.0  # a node's failure may follow the controller's own error: how long to wait for its exit


class LaunchError(NeuronaBoxError, RuntimeError):
    """The run failed; the message is its one-line cause."""


# Finds the torch the ranks will import and reads its version without importing it
# (an import costs seconds of CPU per run): torch/version.py, else __init__.py.
_TORCH_VERSION_PROBE = r"""
import importlib.util, pathlib, re, sys
spec = importlib.util.find_spec("torch")
if spec is None or spec.origin is None:
    sys.exit("No module named 'torch'")
root = pathlib.Path(spec.origin).parent
for f in (root / "version.py", root / "__init__.py"):
    m = f.exists() and re.search(r"^__version__\s*(?::[^=]*)?=\s*['\"]([^'\"]+)", f.read_text(), re.M)
    if m:
        print(m.group(1))
        break
else:
    sys.exit(f"no __version__ in {root}")
"""


def torch_version(python: str, env: dict[str, str]) -> tuple[int, int]:
    """The (major, minor) of the torch that `python` imports with `env`."""
    out = subprocess.run([python, "-c", _TORCH_VERSION_PROBE], capture_output=True, text=True, env=env, timeout=60)
    if out.returncode != 0:
        raise LaunchError(f"cannot find torch: {(out.stderr.strip().splitlines() or ['no output'])[-1]}")
    try:
        major, minor = out.stdout.strip().split("+")[0].split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        raise LaunchError(f"cannot read torch's version {out.stdout.strip()!r}") from None


class Run:
    """One job's processes: `execute` starts them and watches them to the job's end (its
    result, or a `LaunchError` with the cause); `cleanup` stops whatever is left and must
    follow on every path. The run's folder (`dir`) keeps the controller's configuration
    and log."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.dir = Path(tempfile.mkdtemp(prefix="neuronabox-"))
        self.controller: subprocess.Popen | None = None
        self.torchruns: list[subprocess.Popen] = []
        self.nodes: list[NodeOutput] = []  # each real node's process with its stderr, as it came
        self.ranks, self.control = Family(), Family()  # the real ranks' processes; the controller
        self.hurry = False  # a second interrupt while stopping: kill at once
        self.shutdown_error = ""  # why the final status did not come, when it did not
        self.control_token = ""  # what the control service asks of every call
        self.control_addr = ""
        self.link: HeadLink | None = None  # several hosts, the head: the other hosts' launchers
        self.member: MemberLink | None = None  # several hosts, a member (`member.MemberRun`): the head

    @property
    def mark(self) -> str:
        """The run's mark (`reaping.RUN_MARK`) in its real ranks' environment: its folder,
        which names the run to whoever finds a stray process of it."""
        return str(self.dir)

    @property
    def trace_path(self) -> str:
        """Where the controller streams the trace: the user's --trace file, or the run folder."""
        return self.job.trace or str(self.dir / "trace.jsonl")

    # -- children ----------------------------------------------------------------------
    def controller_config(self) -> ControllerConfig:
        member_link = self.link.address if self.link else ""
        return controller_config(self.job, self.dir, self.trace_path, self.nccl_profile, member_link)

    @property
    def nccl_profile(self) -> str:
        """Backend nccl: the FIFO the controller makes for the real ranks' profiler lines."""
        return str(self.dir / "nccl-profile.fifo")

    def start_controller(self) -> tuple[str, str]:
        """Start the controller; return the real ranks' observer port and the hello it takes
        (`controller_proc.spawn`: the agents can start beside it)."""
        cores = self.job.cores.controller if self.job.cores else None
        proc, observer, secret = spawn(self.controller_config(), self.dir, cores)
        self.controller = self.control.add(proc)
        return observer, secret

    def await_controller(self) -> None:
        """Wait for the controller's ready file: its control port and token, then the
        run's entry in the registry (`neuronabox status` lists every live run)."""
        ready = self.dir / "ready.json"
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not ready.exists():
            if self.controller.poll() is not None:
                raise LaunchError(f"controller exited at start: {self.controller_cause()}")
            if time.monotonic() > deadline:
                raise LaunchError("controller did not become ready")
            time.sleep(0.02)
        info = json.loads(read_bounded(ready, 1 << 16, "ready file"))
        self.control_addr = info["control"]
        self.control_token = info["control_token"]
        entry = {"control": self.control_addr, "pid": os.getpid(), "dir": str(self.dir), "token": self.control_token}
        registry.enter(entry)

    def controller_cause(self) -> str:
        return controller_cause(self.dir / "controller.log", self.controller.returncode if self.controller else None)

    def start_ranks(self, env: dict[str, str]) -> None:
        """A stock torchrun for each real node here, and each real rank started directly."""
        self.start_nodes(env)
        self.start_direct_ranks(env)

    def start_nodes(self, env: dict[str, str]) -> None:
        """A stock torchrun for each real node here, its logs in the run's folder (the
        user's --log-dir or PET_LOG_DIR aside)."""
        logs = node_log_dir(self.job, env, self.dir)
        for node in self.job.local_nodes:
            self.torchruns.append(self.spawn(self.job.host_of(node), node_command(self.job, node, logs), env, node))

    def start_direct_ranks(self, env: dict[str, str]) -> None:
        """Each real rank started without an agent."""
        job = self.job
        for rank in job.direct_ranks:
            cmd = worker_command(job)
            node = rank // job.nproc_per_node
            self.torchruns.append(self.spawn(job.host_of(node), cmd, direct_env(job, env, rank), node, rank))

    def spawn(
        self, host: Host, cmd: list[str], env: dict[str, str], node: int, rank: int | None = None
    ) -> subprocess.Popen:
        """A real node's process, on its testbed host when there is one. Its stdout goes
        straight to the run's output; its stderr comes through the launcher on its way
        there (`NodeOutput`), which reads how the node failed."""
        enter = None
        if self.job.placement is not None:
            env = dict(env, GLOO_SOCKET_IFNAME=host.ifname)
            enter = host.preexec()
        elif self.job.cores is not None:
            enter = pin(self.job.cores.nodes.get(node))
        if self.job.realtime:
            enter = entering(enter)
        output = self.job.output
        out = open(output, "a") if output is not None else None  # noqa: SIM115 - the child holds it
        sink = stderr_sink(output)
        try:
            proc = self.ranks.add(
                subprocess.Popen(
                    cmd,
                    env=env,
                    preexec_fn=die_with_parent(then=enter),
                    start_new_session=True,
                    stdout=out,
                    stderr=subprocess.PIPE,
                )
            )
        except BaseException:
            sink.close()
            raise
        finally:
            if out is not None:
                out.close()
        self.nodes.append(NodeOutput(proc, node, sink, rank))
        return proc

    # -- the run ------------------------------------------------------------------------
    def execute(self) -> RunResult:
        """The whole run, from this host: the head's (the controller with it). A LaunchError
        on the way is told to the other hosts' launchers, when there are any."""
        try:
            return self._execute()
        except LaunchError as exc:
            if self.link is not None:
                self.link.end(str(exc))
            raise

    def _execute(self) -> RunResult:
        job = self.job
        env = dict(os.environ)
        if torch_version(sys.executable, env) < MIN_TORCH:
            raise LaunchError("this torch's Gloo rank-record layout is not supported: NeuronaBox needs torch >= 2.2")
        if job.placement_note:
            print(job.placement_note, flush=True)
        if job.multi_host:
            self.link = HeadLink(job.master_addr, job.remote_nodes, job_facts(job), job.join_timeout_s,
                                 time.monotonic())  # fmt: skip
        observer, secret = self.start_controller()
        if self.link is not None:
            self.link.welcome = {"observer": observer, "observer_secret": secret}
        env = ranks_env(job, observer, secret, mark=self.mark, nccl_profile=self.nccl_profile)
        # The agents start beside the controller (their workers wait for it in the store);
        # NCCL's ranks open the FIFO the controller makes, and a direct rank's script runs
        # at once: those only once the controller is up.
        if job.nccl is None:
            self.start_nodes(env)
        self.await_controller()
        if self.link is not None:
            print(f"neuronabox: waiting for real nodes {_nodes(job.remote_nodes)} at {self.link.address}", flush=True)
        if job.nccl is not None:
            self.start_nodes(env)
        self.start_direct_ranks(env)
        while True:
            if self.controller.poll() is not None:
                status = self.controller.returncode
                if status != CONTROLLER_STALLED:  # a hung rank would not fail
                    self.let_real_ranks_fail()
                first = first_failure(self.nodes) if status == CONTROLLER_STORE_LOST else None
                if first is not None:  # the node's own failure is the cause
                    raise LaunchError(f"the job failed on real node {first.node}: {first.what()}")
                raise LaunchError(f"controller failed: {self.controller_cause()}")
            first = first_failure(self.nodes)
            if first is not None:
                if self.link is not None:
                    self.watch_hosts(local_failure=True)  # a host lost meanwhile is the cause
                reply = self.shutdown(f"real node {first.node} failed: {first.what()}")
                if reply is not None and reply.error:
                    raise LaunchError(f"{reply.error} (real node {first.node}: {first.what()})")
                if reply is None and self.controller_failed_first():
                    raise LaunchError(f"controller failed: {self.controller_cause()}")
                raise LaunchError(f"the job failed on real node {first.node}: {first.what()}")
            if self.link is not None:
                self.watch_hosts()
            if all(p.poll() == 0 for p in self.torchruns) and (self.link is None or self.link.all_done):
                break
            self.ranks.refresh()  # a worker torchrun started is known before its agent can die
            time.sleep(0.1)
        reply = self.shutdown("job finished")
        try:
            self.controller.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        if reply is None:
            cause = self.shutdown_error or self.controller_cause()
            raise LaunchError(f"controller failed: its final status did not arrive ({cause})")
        if reply.state == "failed":
            raise LaunchError(f"controller failed: {reply.error}")
        header, footer = tracefile.ends(self.trace_path)
        result = result_of(reply, header, footer, self.trace_path)
        if self.link is not None:
            self.link.end("", result.summary)
        return result

    def controller_failed_first(self) -> bool:
        """A node failed and the controller did not answer the stop: it may be ending on
        its own error, which closed the node's sockets (a protocol error ends the run that
        way). Wait for its exit (CONTROLLER_END_S at most): an error status other than a
        lost store (that node's own end) means its error came first."""
        try:
            status = self.controller.wait(timeout=CONTROLLER_END_S)
        except subprocess.TimeoutExpired:
            return False
        return status not in (0, CONTROLLER_STORE_LOST)

    def watch_hosts(self, local_failure: bool = False) -> None:
        """The head: say who joined; end the run (LaunchError, once the controller is told)
        when another host's node failed, its host is gone, or it never joined
        (`HeadLink.verdict`; `local_failure`: a node here failed, and only a host's loss
        can be the cause instead)."""
        assert self.link is not None
        joined = lambda ev: print(f"neuronabox: real node {ev.node} joined from {ev.cause}", flush=True)  # noqa: E731
        cause = self.link.verdict(time.monotonic, local_failure, HOST_SETTLE_S, on_join=joined)
        if cause:
            self.shutdown(cause)
            raise LaunchError(cause)

    def let_real_ranks_fail(self, grace: float = 15.0) -> None:
        """With the controller gone the real ranks' next collective fails on its own;
        give them that chance (their errors are the useful log) before stopping them."""
        deadline = time.monotonic() + grace
        for p in self.torchruns:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return

    def await_output(self, timeout: float) -> None:
        """Until every real node's stderr is at EOF, `timeout` at most: a process the run
        could not stop may hold a pipe open."""
        deadline = time.monotonic() + timeout
        for n in self.nodes:
            n.at_eof(deadline - time.monotonic())

    def shutdown(self, reason: str):
        if self.controller is None or self.controller.poll() is not None or not self.control_addr:
            return None
        from neuronabox.controller import control_pb2
        from neuronabox.controller.service import connect

        try:
            stub = connect(self.control_addr, timeout=5, token=self.control_token)
            return stub.Shutdown(control_pb2.ShutdownRequest(reason=reason), timeout=20)
        except Exception as exc:  # noqa: BLE001 - gRPC raises several kinds; the cause is kept
            details = getattr(exc, "details", None)
            self.shutdown_error = (details() if callable(details) else "") or f"{type(exc).__name__}: {exc}"
            return None

    def cleanup(self, handle_signals: bool = True) -> None:
        """Stop every process the run started: the real ranks first (their agents stop
        their workers), then what they started outside their tree, then the controller;
        then wait (bounded) for the real nodes' stderr to end, so what the caller says
        next comes after their last words. A second interrupt meanwhile kills at once
        (`handle_signals` False: from a thread other than the main one, which cannot)."""
        hurry = lambda *_: setattr(self, "hurry", True)  # noqa: E731
        self.hurry = self.hurry or interrupted_again()
        sigs = (signal.SIGINT, signal.SIGTERM) if handle_signals else ()
        old = {s: signal.signal(s, hurry) for s in sigs}
        try:
            self.ranks.stop(grace=5.0, hurry=lambda: self.hurry)
            stop_marked(self.mark, grace=5.0, hurry=lambda: self.hurry)
            self.control.stop(grace=10.0, hurry=lambda: self.hurry)
            self.await_output(OUTPUT_EOF_S)
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            if self.link is not None:  # idempotent: a run that ended told the hosts already
                self.link.end("the head's launcher stopped")
            if self.member is not None:
                self.member.close()
        registry.leave()


def _nodes(nodes: list[int]) -> str:
    return ",".join(map(str, nodes))
