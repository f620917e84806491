"""`neuronabox torchrun`: start the controller, run the stock torchrun for each
real node, watch them all, and print the run's summary.

Every process it starts is stopped on every exit path (success, failure, Ctrl-C
once or twice, SIGTERM, a child killed outright, the launcher killed outright):
see `reaping`. Exit status: 0 the job finished, 1 the job or the emulation
failed, 2 bad usage, 130 interrupted (SIGINT), 143 terminated (SIGTERM).
"""

from __future__ import annotations

import errno
import importlib.machinery
import json
import math
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

from neuronabox import delay_models, topology
from neuronabox.controller.config import ControllerConfig, real_ranks_of
from neuronabox.controller.dialects.nccl.errors import UnsupportedNcclVersion
from neuronabox.controller.dialects.nccl.versions import layout_for
from neuronabox.delay_models.whatif import WhatIf, WhatIfError
from neuronabox.errors import NeuronaBoxError
from neuronabox.fidelity.testbed import Host, Placement
from neuronabox.launcher.api import RunResult, result_of
from neuronabox.launcher.nccl_pins import NcclPins, NcclSetupError, check_user_env, probe_nccl
from neuronabox.launcher.reaping import Family, become_subreaper, die_with_parent
from neuronabox.launcher.torchrun_args import (
    HELP,
    LaunchArgs,
    UsageError,
    index_list,
    int_flag,
    master_endpoint,
    parse,
    port_number,
    without_pet,
)
from neuronabox.trace import records as tracefile

LAZY_ABOVE = 64  # worlds larger than this use Gloo's lazy connection mode
READY_TIMEOUT_S = 120
CONTROLLER_STALLED = 4  # the controller's exit status when its watchdog ended the run
CONTROLLER_STORE_LOST = 5  # ... when the store a real node's agent hosts went away
DEFAULT_TIMEOUT_S = 1800.0  # the watchdog's default: torch's default process-group timeout
OBSERVER_DIR = Path(__file__).resolve().parents[1] / "observer"
RUNS_DIR = Path(tempfile.gettempdir()) / "neuronabox-runs"
MIN_TORCH = (2, 2)


class LaunchError(NeuronaBoxError, RuntimeError):
    """The run failed; the message is its one-line cause."""


STORE_PORTS = (20000, 32768)  # below Linux's default ephemeral range


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port(host: str = "127.0.0.1", rng: random.Random | None = None) -> int:
    """A port that nothing listens on now and that the kernel will not hand out to an
    outgoing connection before the store binds it: the store binds seconds later (after
    its process imports torch), and a port from the ephemeral range can be taken in
    between by any connect() on the machine (CI saw EADDRINUSE)."""
    rng = rng or random.Random()
    low, high = _ephemeral_range()
    candidates = [p for p in range(*STORE_PORTS) if not low <= p <= high]
    for port in rng.sample(candidates, min(64, len(candidates))):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # every candidate taken: fall back to the kernel's choice
        s.bind((host, 0))
        return s.getsockname()[1]


def register(path: Path, entry: dict) -> None:
    """A run's registry entry, readable by this user only (it holds the control token).
    The temporary file is this process's own: runs started together all write
    latest.json, and a shared temporary name lets one rename the other's away."""
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp")
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        json.dump(entry, f)
    os.replace(tmp, path)


def check_port_free(addr: str, port: int) -> None:
    """Refuse a store port something already listens on here: a second run on it would
    talk to the first run's store and ranks. An address that is not this host's (a
    testbed node's) is not checked."""
    try:
        infos = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return
    for family, kind, proto, _, sockaddr in infos[:1]:
        with socket.socket(family, kind, proto) as s:
            # As the store binds: a listener refuses the bind, a closed run's TIME_WAIT does not
            # (a rerun on the same --master-port right after the last one is fine).
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(sockaddr)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise UsageError(f"--master-port {port} is in use on {addr} (another run?)") from None


def check_script(args: LaunchArgs) -> None:
    """The script exists and compiles (a module is found), so a typo fails here and
    not after the whole job started."""
    flags = {f for f, _ in args.torchrun}
    target = args.script[0]
    if flags & {"--no-python", "--no_python"}:
        return
    if flags & {"-m", "--module"}:
        top = target.split(".")[0]  # a submodule's spec would import its package
        if not top or importlib.machinery.PathFinder.find_spec(top, [os.getcwd(), *sys.path]) is None:
            if top not in sys.builtin_module_names:
                raise UsageError(f"-m {target}: no module named {top!r}")
        return
    path = Path(target)
    if path.is_dir():
        if not (path / "__main__.py").is_file():
            raise UsageError(f"{target}: a folder without __main__.py, not a script")
        path = path / "__main__.py"
    elif not path.is_file():
        raise UsageError(f"no script {target!r} to run")
    try:
        source = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {target}: {exc.strerror}") from None
    if source[:4] == b"PK\x03\x04":  # a zip application: python runs its __main__
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            compile(source, str(path), "exec", dont_inherit=True)
        except SyntaxError as exc:
            where = f" at line {exc.lineno}" if exc.lineno else ""
            raise UsageError(f"{path}: syntax error{where}: {exc.msg}") from None
        except ValueError as exc:  # null bytes (before Python 3.12)
            raise UsageError(f"{path}: not a Python script ({exc})") from None


def check_writable(flag: str, target: str) -> None:
    """A file the run writes at its end: its folder exists and takes it, checked now."""
    path = Path(target)
    folder = path.parent
    if path.is_dir():
        raise UsageError(f"{flag} {target}: is a folder")
    if not folder.is_dir():
        raise UsageError(f"{flag} {target}: no folder {str(folder)!r} to write into")
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UsageError(f"{flag} {target}: not writable")


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


class Interrupted(BaseException):
    """SIGINT or SIGTERM reached the launcher: stop the run, exit 128 + the signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Run:
    def __init__(self, args: LaunchArgs) -> None:
        self.args = args
        check_script(args)
        self.nnodes = int_flag(args, ("--nnodes",), 1)
        self.nproc = int_flag(args, ("--nproc-per-node",), 1)
        self.world = self.nnodes * self.nproc
        self.real_nodes, self.direct_ranks = self._real_ranks(args)
        self.data = args.ours.get("--data", "zeros")
        if self.data not in ("zeros", "mirror"):
            raise UsageError(f"--data is zeros or mirror, got {self.data!r}")
        if self.data == "mirror" and "--no-observer" in args.switches:
            raise UsageError("--data mirror needs the observer (it reads the real rank's inputs); drop --no-observer")
        if args.get("--rdzv-backend") not in (None, "static"):
            raise UsageError("only the static rendezvous (--master-addr/--master-port) can be emulated")
        mode = args.ours.get("--gloo-mode", "auto")
        if mode not in ("auto", "full", "lazy"):
            raise UsageError(f"--gloo-mode is auto, full or lazy, got {mode!r}")
        self.lazy = mode == "lazy" or (mode == "auto" and self.world > LAZY_ABOVE)
        addr, port = master_endpoint(args)
        self.master_addr = addr or "127.0.0.1"
        port_flag = "--rdzv-endpoint" if args.get("--rdzv-endpoint") else "--master-port"
        self.master_port = port_number(args, port_flag, port) if port else free_port(self.master_addr)
        self.run_id = args.get("--rdzv-id") or f"nbx{os.getpid()}"
        self.observer = "--no-observer" not in args.switches
        self.topology = args.ours.get("--topology", "cpu-25gbe")
        if Path(self.topology).is_file():  # the controller may run elsewhere in the tree
            self.topology = str(Path(self.topology).resolve())
        try:
            topology.load(self.topology).with_nodes(self.nnodes, self.nproc)
        except topology.TopologyError as exc:
            raise UsageError(f"--topology: {exc}") from None
        self.delay_model = args.ours.get("--delay-model", "alpha-beta")
        if self.delay_model not in delay_models.available():
            known = ", ".join(delay_models.available())
            raise UsageError(f"--delay-model: unknown model {self.delay_model!r} (available: {known})")
        self.timeout = self._timeout(args.ours.get("--timeout"))
        self.boundary = args.ours.get("--boundary", "modeled")
        if self.boundary not in ("modeled", "real"):
            raise UsageError(f"--boundary is modeled or real, got {self.boundary!r}")
        self.inject = args.repeated.get("--inject", [])
        try:
            whatif = WhatIf.from_specs(self.inject)
        except WhatIfError as exc:
            raise UsageError(f"--inject {exc}") from None
        real = set(self.real_ranks)
        for m in whatif.mods:
            if m.what == "straggler" and (m.rank >= self.world or m.rank in real):
                raise UsageError(f"--inject {m.spec!r}: a straggler must be an emulated rank of the world")
        self.placement = self._placement(args.ours.get("--placement"))
        self.nccl = self._nccl_pins(args)
        if args.ours.get("--trace"):
            check_writable("--trace", args.ours["--trace"])
        check_port_free(self.master_addr, self.master_port)
        if self.nccl is not None:
            self.check_nccl(dict(os.environ))
        self.dir = Path(tempfile.mkdtemp(prefix="neuronabox-"))
        self.controller: subprocess.Popen | None = None
        self.torchruns: list[subprocess.Popen] = []
        self.jobs, self.control = Family(), Family()  # the real ranks' processes; the controller
        self.hurry = False  # a second interrupt while stopping: kill at once
        self.output: Path | None = None  # where the real ranks' stdout and stderr go (None: ours)
        self.shutdown_error = ""  # why the final status did not come, when it did not
        self.control_token = ""  # what the control service asks of every call
        self.control_addr = ""

    def _nccl_pins(self, args: LaunchArgs) -> NcclPins | None:
        """What NCCL is pinned to (`--backend nccl`), or None for Gloo."""
        backend = args.ours.get("--backend", "gloo")
        if backend not in ("gloo", "nccl"):
            raise UsageError(f"--backend is gloo or nccl, got {backend!r}")
        nccl_flags = [f for f in ("--nccl-algo", "--nccl-channels", "--nccl-route") if f in args.ours]
        if backend == "gloo":
            if nccl_flags:
                raise UsageError(f"{nccl_flags[0]} needs --backend nccl")
            return None
        channels = args.ours.get("--nccl-channels", "1")
        if not channels.isdigit():
            raise UsageError(f"--nccl-channels takes a whole number, got {channels!r}")
        try:
            return NcclPins(
                self.world,
                algo=args.ours.get("--nccl-algo", "ring"),
                channels=int(channels),
                route=args.ours.get("--nccl-route", "socket"),
            )
        except NcclSetupError as exc:
            raise UsageError(str(exc)) from None

    def check_nccl(self, env: dict[str, str]) -> None:
        """Refuse, in one line and before anything starts, an NCCL setup the dialect does
        not speak: a choice the user forced, a torch without NCCL, an unread NCCL release."""
        assert self.nccl is not None
        try:
            check_user_env(env, self.nccl)
            version = probe_nccl(sys.executable, env)
            layout_for(version)
        except (NcclSetupError, UnsupportedNcclVersion) as exc:
            raise UsageError(str(exc)) from None
        print(self.nccl.summary(), flush=True)
        # The sans-IO layers (versions, layouts, bootstrap, setup, schedules, plugins) exist and
        # are tested on CPU; the live controller that drives them waits for a run on a GPU.
        raise UsageError(
            f"NCCL {version} is spoken, but the NCCL dialect's live controller is not built yet "
            "(it needs its bootstrap checked on a GPU first; see docs/nccl_wire.md): nothing was started"
        )

    def _real_ranks(self, args: LaunchArgs) -> tuple[list[int], list[int]]:
        """(nodes run by a stock torchrun, ranks started directly). Whole nodes get their
        own torchrun; when the real ranks cover only part of some node, every real rank
        starts as its own process with the environment torchrun would give it, and the
        controller plays every agent (it hosts the store)."""
        if "--real-ranks" in args.ours and "--real-nodes" in args.ours:
            raise UsageError("give --real-ranks or --real-nodes, not both")
        if "--real-ranks" not in args.ours:
            return index_list("--real-nodes", args.ours.get("--real-nodes", "0"), self.nnodes, "node"), []
        ranks = index_list("--real-ranks", args.ours["--real-ranks"], self.world, "rank")
        nodes = sorted({r // self.nproc for r in ranks})
        if len(ranks) == len(nodes) * self.nproc:
            return nodes, []
        return [], ranks

    @staticmethod
    def _timeout(raw: str | None) -> float:
        if raw is None:
            return DEFAULT_TIMEOUT_S
        try:
            value = float(raw)
        except ValueError:
            value = float("nan")
        if not math.isfinite(value) or value <= 0:
            raise UsageError(f"--timeout takes a positive number of seconds, got {raw!r}")
        return value

    def _placement(self, path: str | None) -> Placement | None:
        """Where the real nodes and the controller live on a testbed (`neuronabox validate`
        writes it); without one, everything runs here on loopback."""
        if path is None:
            return None
        try:
            placement = Placement.loads(Path(path).read_text())
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UsageError(f"--placement {path}: not a placement file ({exc})") from None
        nodes = set(self.real_nodes) | {r // self.nproc for r in self.direct_ranks}
        missing = sorted(nodes - set(placement.nodes))
        if missing:
            raise UsageError(f"--placement {path}: no host for real node {missing[0]}")
        return placement

    def host_of(self, node: int) -> Host:
        return self.placement.nodes[node] if self.placement else Host(f"node{node}", self.master_addr)

    @property
    def trace_path(self) -> str:
        """Where the controller streams the trace: the user's --trace file, or the run folder."""
        given = self.args.ours.get("--trace")
        return str(Path(given).resolve()) if given else str(self.dir / "trace.jsonl")

    @property
    def real_ranks(self) -> list[int]:
        return real_ranks_of(self.real_nodes, self.nproc, self.direct_ranks)

    # -- children ----------------------------------------------------------------------
    def start_controller(self) -> dict:
        here = self.placement.controller if self.placement else None  # the launcher runs on the controller's host
        cfg = ControllerConfig(
            nnodes=self.nnodes,
            nproc_per_node=self.nproc,
            real_nodes=self.real_nodes,
            master_addr=self.master_addr,
            master_port=self.master_port,
            run_id=self.run_id,
            lazy=self.lazy,
            gloo_host=here.address if here else self.args.ours.get("--gloo-host", "127.0.0.2"),
            observer_host=here.address if here else "127.0.0.1",
            ready_file=str(self.dir / "ready.json"),
            trace_file=self.trace_path,
            observer=self.observer,
            data=self.data,
            topology=self.topology,
            delay_model=self.delay_model,
            boundary=self.boundary,
            inject=self.inject,
            direct_ranks=self.direct_ranks,
            timeout_s=self.timeout,
        )
        (self.dir / "controller.json").write_text(cfg.dumps())
        log = open(self.dir / "controller.log", "w")
        self.controller = self.control.add(
            subprocess.Popen(
                [sys.executable, "-m", "neuronabox.controller.main", str(self.dir / "controller.json")],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent(),
            )
        )
        ready = Path(cfg.ready_file)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not ready.exists():
            if self.controller.poll() is not None:
                raise LaunchError(f"controller exited at start: {self.controller_cause()}")
            if time.monotonic() > deadline:
                raise LaunchError("controller did not become ready")
            time.sleep(0.05)
        info = json.loads(ready.read_text())
        self.control_addr = info["control"]
        self.control_token = info["control_token"]
        RUNS_DIR.mkdir(mode=0o700, exist_ok=True)
        entry = {"control": self.control_addr, "pid": os.getpid(), "dir": str(self.dir), "token": self.control_token}
        register(RUNS_DIR / f"{os.getpid()}.json", entry)  # `neuronabox status` lists every live run
        register(RUNS_DIR / "latest.json", entry)
        return info

    def controller_cause(self) -> str:
        try:
            lines = (self.dir / "controller.log").read_text().strip().splitlines()
        except OSError:
            lines = []
        errs = [ln for ln in lines if "error:" in ln]
        if errs:
            return errs[-1].split("error: ", 1)[-1]
        code = self.controller.returncode if self.controller else None
        if code is not None and code < 0:
            return f"the controller died (signal {-code})"
        return f"the controller exited with status {code}"

    def torchrun_env(self, observer_addr: str, observer_secret: str = "") -> dict[str, str]:
        env = without_pet(os.environ)  # read into self.args; torchrun would take them over our flags
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        env["NEURONABOX_REAL_RANKS"] = ",".join(map(str, self.real_ranks))
        env["NEURONABOX_WORLD_SIZE"] = str(self.world)
        if self.lazy:
            env["TORCH_GLOO_LAZY_INIT"] = "1"
        else:
            env.pop("TORCH_GLOO_LAZY_INIT", None)
        if self.observer:
            env["NEURONABOX_OBSERVER"] = observer_addr
            env["NEURONABOX_OBSERVER_SECRET"] = observer_secret  # the hello the controller's observer port takes
            env["NEURONABOX_DATA"] = self.data
            # The observer reads recent entries only; a dump of 64 costs ~0.5 ms, of 1024 ~18 ms.
            env.setdefault("TORCH_FR_BUFFER_SIZE", "64")
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(OBSERVER_DIR), env.get("PYTHONPATH")]))
        return env

    def start_torchruns(self, env: dict[str, str]) -> None:
        self.args.drop(
            "--master-addr", "--master-port", "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id", "--nnodes",
            "--nproc-per-node",
        )  # fmt: skip
        passthrough = [f"{f}={v}" if v is not None else f for f, v in self.args.torchrun]
        for node in self.real_nodes:
            cmd = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                f"--nnodes={self.nnodes}",
                f"--nproc-per-node={self.nproc}",
                f"--node-rank={node}",
                f"--master-addr={self.master_addr}",
                f"--master-port={self.master_port}",
                "--rdzv-backend=static",
                f"--rdzv-id={self.run_id}",
                *passthrough,
                *self.args.script,
            ]
            self.torchruns.append(self.spawn(self.host_of(node), cmd, env))
        for rank in self.direct_ranks:
            self.torchruns.append(
                self.spawn(self.host_of(rank // self.nproc), self.direct_command(), self.direct_env(env, rank))
            )

    def spawn(self, host: Host, cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
        """A real node's process, on its testbed host when there is one."""
        enter = None
        if self.placement is not None:
            env = dict(env, GLOO_SOCKET_IFNAME=host.ifname)
            enter = host.preexec()
        out = open(self.output, "a") if self.output is not None else None  # noqa: SIM115 - the child holds it
        try:
            return self.jobs.add(
                subprocess.Popen(
                    cmd,
                    env=env,
                    preexec_fn=die_with_parent(then=enter),
                    start_new_session=True,
                    stdout=out,
                    stderr=subprocess.STDOUT if out is not None else None,
                )
            )
        finally:
            if out is not None:
                out.close()

    def direct_command(self) -> list[str]:
        """The worker command torchrun would run: `python script args`, `python -m mod
        args`, or the program itself with --no-python."""
        flags = {f for f, _ in self.args.torchrun}
        if flags & {"--no-python", "--no_python"}:
            return list(self.args.script)
        if flags & {"-m", "--module"}:
            return [sys.executable, "-m", *self.args.script]
        return [sys.executable, "-u", *self.args.script]

    def direct_env(self, base: dict[str, str], rank: int) -> dict[str, str]:
        """What torchrun's agent sets for a worker; the store is the controller's."""
        node, local = divmod(rank, self.nproc)
        env = dict(base)
        env.update(
            RANK=str(rank),
            LOCAL_RANK=str(local),
            GROUP_RANK=str(node),
            ROLE_RANK=str(rank),
            ROLE_NAME="default",
            LOCAL_WORLD_SIZE=str(self.nproc),
            WORLD_SIZE=str(self.world),
            GROUP_WORLD_SIZE=str(self.nnodes),
            ROLE_WORLD_SIZE=str(self.world),
            MASTER_ADDR=self.master_addr,
            MASTER_PORT=str(self.master_port),
            TORCHELASTIC_RESTART_COUNT="0",
            TORCHELASTIC_MAX_RESTARTS="0",
            TORCHELASTIC_RUN_ID=self.run_id,
            TORCHELASTIC_USE_AGENT_STORE="True",
            OMP_NUM_THREADS=base.get("OMP_NUM_THREADS", "1"),
        )
        return env

    # -- the run ------------------------------------------------------------------------
    def execute(self) -> RunResult:
        env = dict(os.environ)
        if torch_version(sys.executable, env) < MIN_TORCH:
            raise LaunchError("this torch's Gloo rank-record layout is not supported: NeuronaBox needs torch >= 2.2")
        info = self.start_controller()
        self.start_torchruns(self.torchrun_env(info["observer"], info["observer_secret"]))
        while True:
            if self.controller.poll() is not None:
                status = self.controller.returncode
                if status != CONTROLLER_STALLED:  # a hung rank would not fail
                    self.let_real_ranks_fail()
                failed = [c for c in (p.poll() for p in self.torchruns) if c not in (None, 0)]
                if status == CONTROLLER_STORE_LOST and failed:  # the node's own exit is the cause
                    raise LaunchError(f"the job failed on a real node: its process exited with status {failed[0]}")
                raise LaunchError(f"controller failed: {self.controller_cause()}")
            codes = [p.poll() for p in self.torchruns]
            failed = [c for c in codes if c not in (None, 0)]
            if failed:
                reply = self.shutdown("a real node failed")
                if reply is not None and reply.error:
                    raise LaunchError(f"{reply.error} (a real node's process exited with status {failed[0]})")
                raise LaunchError(f"the job failed on a real node: its process exited with status {failed[0]}")
            if all(c == 0 for c in codes):
                break
            self.jobs.refresh()  # a worker torchrun started is known before its agent can die
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
        return result_of(reply, header, footer, self.trace_path)

    def let_real_ranks_fail(self, grace: float = 15.0) -> None:
        """With the controller gone the real ranks' next collective fails on its own;
        give them that chance (their errors are the useful log) before stopping them."""
        deadline = time.monotonic() + grace
        for p in self.torchruns:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return

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
        their workers), then the controller. A second interrupt meanwhile kills at once
        (`handle_signals` False: from a thread other than the main one, which cannot)."""
        hurry = lambda *_: setattr(self, "hurry", True)  # noqa: E731
        sigs = (signal.SIGINT, signal.SIGTERM) if handle_signals else ()
        old = {s: signal.signal(s, hurry) for s in sigs}
        try:
            self.jobs.stop(grace=5.0, hurry=lambda: self.hurry)
            self.control.stop(grace=10.0, hurry=lambda: self.hurry)
        finally:
            for s, h in old.items():
                signal.signal(s, h)
        (RUNS_DIR / f"{os.getpid()}.json").unlink(missing_ok=True)


def torchrun_main(argv: list[str]) -> int:
    try:
        args = parse(argv)
        if args.help:
            print(HELP)
            return 0
        run = Run(args)
    except UsageError as exc:
        print(f"neuronabox: error: {exc}", file=sys.stderr)
        return 2
    become_subreaper()  # a worker whose agent dies is reparented here, and stopped with the run
    old = {s: signal.signal(s, _interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        result = run.execute()
        print(result.summary, flush=True)
        shutil.rmtree(run.dir, ignore_errors=True)  # kept on failure: controller.log is there
        return 0
    except UsageError as exc:
        print(f"neuronabox: error: {exc}", file=sys.stderr)
        return 2
    except LaunchError as exc:
        print(f"neuronabox: error: {exc}", file=sys.stderr)
        print(f"neuronabox: the run's logs are in {run.dir}", file=sys.stderr)
        return 1
    except (Interrupted, KeyboardInterrupt) as exc:
        signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
        print(f"neuronabox: interrupted ({signal.Signals(signum).name}); stopping the run", file=sys.stderr)
        return 128 + signum
    finally:
        run.cleanup()
        for s, h in old.items():
            signal.signal(s, h)


def _interrupt(signum: int, _frame) -> None:
    raise Interrupted(signum)
