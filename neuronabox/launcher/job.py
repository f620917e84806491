"""The job: a frozen, validated description of one emulated run (its world, which ranks
are real, the emulation's settings, the script), built from torchrun-style flags by
`job_from_args`. The command line (`neuronabox torchrun`) and the Python API
(`neuronabox.launch`) both build it there, so they describe the same job the same way.

Every refusal of bad input (one line, exit status 2) happens while it is built, before
anything starts; what runs the job (`run.Run`) reads nothing but the Job."""

from __future__ import annotations

import errno
import importlib.machinery
import math
import os
import socket
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

from neuronabox import delay_models, topology
from neuronabox.controller.config import real_ranks_of
from neuronabox.controller.dialects.nccl.errors import UnsupportedNcclVersion
from neuronabox.controller.dialects.nccl.versions import layout_for
from neuronabox.controller.skew import DEFAULT as DEFAULT_SKEW
from neuronabox.controller.skew import SkewError, checked_spec
from neuronabox.delay_models.whatif import WhatIf, WhatIfError
from neuronabox.fidelity.testbed import Host, Placement
from neuronabox.launcher.cores import CorePlan, plan_cores, this_machine
from neuronabox.launcher.nccl_pins import NcclPins, NcclSetupError, check_user_env, probe_nccl
from neuronabox.launcher.nccl_rig import RigError, library, library_version
from neuronabox.launcher.ports import free_port
from neuronabox.launcher.realtime import problem as realtime_problem
from neuronabox.launcher.realtime import share as realtime_share
from neuronabox.launcher.torchrun_args import (
    LaunchArgs,
    UsageError,
    index_list,
    int_flag,
    master_endpoint,
    port_number,
)
from neuronabox.limits import check_real_ranks, check_world, output_problem, read_bounded
from neuronabox.trace.records import being_written

MAX_SCRIPT_BYTES = 64 << 20  # compiled here to catch a syntax error before anything starts
LAZY_ABOVE = 64  # worlds larger than this use Gloo's lazy connection mode
LOCAL_WORK = ("measured", "topology")  # --local-work
DEFAULT_TIMEOUT_S = 1800.0  # the watchdog's default: torch's default process-group timeout
# torchrun flags the launcher gives each real node itself, from the Job: not passed through.
SET_BY_LAUNCHER = (
    "--master-addr", "--master-port", "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id", "--nnodes", "--nproc-per-node",
    "--node-rank",
)  # fmt: skip
DEFAULT_JOIN_TIMEOUT_S = 300.0  # several hosts: how long the head waits for the others (torchrun's join timeout)


@dataclass(frozen=True)
class Job:
    """One run, as the launcher starts it. The names the controller's configuration
    shares (nnodes, nproc_per_node, delay_model, timeout_s, ...) are the same there."""

    # The world: nnodes x nproc_per_node ranks, of which these run for real.
    nnodes: int
    nproc_per_node: int
    real_nodes: tuple[int, ...]  # nodes whose ranks all run for real, each under a stock torchrun
    direct_ranks: tuple[int, ...]  # real ranks started without an agent (they cover part of a node)
    # The store (torchrun's static rendezvous), which the controller hosts.
    master_addr: str
    master_port: int
    run_id: str
    # The emulation.
    gloo_mode: str  # auto, full or lazy: Gloo's connection mode (see `lazy`)
    gloo_host: str  # the address the emulated ranks listen on
    backend: str  # gloo or nccl
    nccl: NcclPins | None  # what NCCL is pinned to (backend nccl), else None
    topology: str  # a preset's name or a topology file's absolute path
    delay_model: str
    inject: tuple[str, ...]  # what-if modifier specs
    data: str  # zeros or mirror: what the emulated ranks send
    boundary: str  # modeled or real: who pays the hop to a real rank
    timeout_s: float  # the watchdog: a real rank without progress this long ends the run
    observer: bool  # the observer runs in the real ranks
    placement: Placement | None  # where real nodes and the controller live (a testbed), else None: here
    # The script, how torchrun runs it, and where the run's outputs go.
    script: tuple[str, ...]  # the script (or module, or program) and its arguments
    torchrun_flags: tuple[tuple[str, str | None], ...]  # torchrun's own flags, passed through to each node
    trace: str | None  # --trace, an absolute path; None: trace.jsonl in the run's folder
    output: Path | None = None  # a file for the real ranks' stdout and stderr; None: the launcher's
    nccl_device: str = "cuda"  # backend nccl: cuda (the machine's GPUs) or cpu (the rig's driver)
    nccl_release: str = ""  # backend nccl: the real ranks' NCCL release, as they report it
    cores: CorePlan | None = None  # without --placement: the cores of the real nodes and the controller here
    placement_note: str = ""  # the one line the launcher prints about where the processes run
    realtime: bool = False  # the real ranks in the real-time class (launcher/realtime.py)
    skew: str = DEFAULT_SKEW  # the emulated ranks' entry delays: none, auto, or a file's absolute path
    local_work: str = "measured"  # the emulated ranks' own work: measured (no topology's), or the topology's only
    # Several hosts (hosts.py): this host's real node (--node-rank), or the controller alone.
    node_rank: int | None = None  # None: every real node runs here
    controller_only: bool = False  # `neuronabox controller`: the head, with no real node here
    join_timeout_s: float = DEFAULT_JOIN_TIMEOUT_S

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    @property
    def real_ranks(self) -> list[int]:
        return real_ranks_of(list(self.real_nodes), self.nproc_per_node, list(self.direct_ranks))

    @property
    def lazy(self) -> bool:
        """Gloo's lazy connection mode: asked for, or (auto) a world above LAZY_ABOVE ranks."""
        return self.gloo_mode == "lazy" or (self.gloo_mode == "auto" and self.world_size > LAZY_ABOVE)

    @property
    def runs_as(self) -> str:
        """How torchrun starts the script: "program" (--no-python), "module" (-m) or "script"."""
        return _runs_as(self.torchrun_flags)

    @property
    def multi_host(self) -> bool:
        """Real nodes on several hosts, each host's launcher running its own."""
        return several_hosts(self.node_rank, self.controller_only)

    @property
    def local_nodes(self) -> tuple[int, ...]:
        """The real nodes this launcher starts."""
        if self.controller_only:
            return ()
        return self.real_nodes if self.node_rank is None else (self.node_rank,)

    @property
    def runs_controller(self) -> bool:
        """This launcher is the head: it runs the controller (node 0's, or the controller alone)."""
        return is_head(self.node_rank, self.controller_only)

    @property
    def remote_nodes(self) -> list[int]:
        """The real nodes other hosts' launchers start (the head's members)."""
        return [n for n in self.real_nodes if n not in self.local_nodes]

    def host_of(self, node: int) -> Host:
        """Where a real node runs: its testbed host, or here."""
        return self.placement.nodes[node] if self.placement else Host(f"node{node}", self.master_addr)


def several_hosts(node_rank: int | None, controller_only: bool) -> bool:
    """The real nodes run on several hosts: this launcher runs one (--node-rank) or none."""
    return node_rank is not None or controller_only


def is_head(node_rank: int | None, controller_only: bool) -> bool:
    """This launcher runs the controller: on one host always; on several, node 0's or the lone one."""
    return controller_only or node_rank in (None, 0)


def job_from_args(args: LaunchArgs, output: str | os.PathLike | None = None, controller_only: bool = False) -> Job:
    """The job a `neuronabox torchrun` command line describes, checked: a `UsageError`
    with the one-line cause for the first thing wrong, in the order the flags are read.
    `controller_only`: `neuronabox controller`'s (the same flags, no script, no real node here)."""
    if not controller_only:
        check_script(args)
    nnodes = int_flag(args, ("--nnodes",), 1)
    nproc = int_flag(args, ("--nproc-per-node",), 1)
    refused = check_world(nnodes, nproc)
    if refused:
        raise UsageError(refused)
    world = nnodes * nproc
    real_nodes, direct_ranks = _real_ranks(args, nnodes, nproc)
    refused = check_real_ranks(len(real_nodes) * nproc + len(direct_ranks))
    if refused:
        raise UsageError(refused)
    data = args.ours.get("--data", "zeros")
    if data not in ("zeros", "mirror"):
        raise UsageError(f"--data is zeros or mirror, got {data!r}")
    if data == "mirror" and "--no-observer" in args.switches:
        raise UsageError("--data mirror needs the observer (it reads the real rank's inputs); drop --no-observer")
    if args.get("--rdzv-backend") not in (None, "static"):
        raise UsageError("only the static rendezvous (--master-addr/--master-port) can be emulated")
    gloo_mode = args.ours.get("--gloo-mode", "auto")
    if gloo_mode not in ("auto", "full", "lazy"):
        raise UsageError(f"--gloo-mode is auto, full or lazy, got {gloo_mode!r}")
    master_addr, master_port = _store(args)
    topo = _topology(args.ours.get("--topology", "cpu-25gbe"), nnodes, nproc)
    delay_model = args.ours.get("--delay-model", "alpha-beta")
    if delay_model not in delay_models.available():
        known = ", ".join(delay_models.available())
        raise UsageError(f"--delay-model: unknown model {delay_model!r} (available: {known})")
    timeout_s = _timeout(args.ours.get("--timeout"))
    boundary = args.ours.get("--boundary", "modeled")
    if boundary not in ("modeled", "real"):
        raise UsageError(f"--boundary is modeled or real, got {boundary!r}")
    local_work = args.ours.get("--local-work", "measured")
    if local_work not in LOCAL_WORK:
        raise UsageError(f"--local-work is {' or '.join(LOCAL_WORK)}, got {local_work!r}")
    inject = tuple(args.repeated.get("--inject", []))
    _check_inject(inject, world, real_ranks_of(real_nodes, nproc, direct_ranks), timeout_s)
    placement_arg = args.ours.get("--placement")
    node_rank = _node_rank(args, nnodes, real_nodes, direct_ranks, controller_only)
    multi_host = several_hosts(node_rank, controller_only)
    here = real_nodes if node_rank is None else [node_rank]
    placement = _placement(placement_arg, set(real_nodes) | {r // nproc for r in direct_ranks})
    cores, note = None, ""
    if placement_arg is None and not controller_only:
        ranks_on = {n: nproc for n in here}
        for r in direct_ranks:
            ranks_on[r // nproc] = ranks_on.get(r // nproc, 0) + 1
        cores, note = plan_cores(ranks_on, this_machine())
    realtime = "--realtime" in args.switches
    if realtime and (refused := realtime_problem()):
        raise UsageError(refused)
    if realtime and not controller_only:
        note = "; ".join(filter(None, [note, f"real ranks in the real-time class ({realtime_share()})"]))
    backend = args.ours.get("--backend", "gloo")
    nccl = _nccl_pins(args, backend, world)
    device = _nccl_device(args, backend)
    if nccl is not None and args.ours.get("--skew", "none") != "none":
        raise UsageError("--skew is drawn by the Gloo dialect's timelines; the NCCL relay does not draw yet: drop it")
    skew = "none" if nccl is not None else _skew(args.ours.get("--skew"))  # not given: auto (skew.DEFAULT)
    if nccl is not None and data == "mirror":
        raise UsageError("--data mirror is Gloo's (the observer reads the real rank's inputs); drop it for NCCL")
    trace = args.ours.get("--trace")
    runs_controller = is_head(node_rank, controller_only)
    if trace and runs_controller:  # the head's host writes it; the others take the same flags
        check_writable("--trace", trace)
        check_not_the_script("--trace", trace, args)
        check_not_being_written("--trace", trace)
    if output is not None and str(output) != os.devnull:  # the ranks' output is only appended to: a sink will do
        check_writable("output", str(output))
    if runs_controller:
        check_port_free(master_addr, master_port)
    release = check_nccl(nccl, dict(os.environ), device) if nccl is not None else ""
    return Job(
        nnodes=nnodes,
        nproc_per_node=nproc,
        real_nodes=tuple(real_nodes),
        direct_ranks=tuple(direct_ranks),
        master_addr=master_addr,
        master_port=master_port,
        run_id=args.get("--rdzv-id") or (f"nbx-{master_port}" if multi_host else f"nbx{os.getpid()}"),
        gloo_mode=gloo_mode,
        gloo_host=args.ours.get("--gloo-host", master_addr if multi_host else "127.0.0.2"),
        backend=backend,
        nccl=nccl,
        topology=topo,
        delay_model=delay_model,
        inject=inject,
        data=data,
        boundary=boundary,
        timeout_s=timeout_s,
        observer="--no-observer" not in args.switches and nccl is None,  # the observer reads Gloo's groups
        placement=placement,
        script=tuple(args.script),
        torchrun_flags=tuple((f, v) for f, v in args.torchrun if f not in SET_BY_LAUNCHER),
        trace=str(Path(trace).resolve()) if trace and runs_controller else None,
        output=Path(output) if output is not None else None,
        nccl_device=device,
        nccl_release=release,
        cores=cores,
        placement_note=note,
        realtime=realtime,
        skew=skew,
        local_work=local_work,
        node_rank=node_rank,
        controller_only=controller_only,
        join_timeout_s=_timeout(args.ours.get("--join-timeout"), "--join-timeout", DEFAULT_JOIN_TIMEOUT_S),
    )


# -- the parts of the job ------------------------------------------------------------------
def _runs_as(torchrun_flags) -> str:
    flags = {f for f, _ in torchrun_flags}
    if flags & {"--no-python", "--no_python"}:
        return "program"
    if flags & {"-m", "--module"}:
        return "module"
    return "script"


def _real_ranks(args: LaunchArgs, nnodes: int, nproc: int) -> tuple[list[int], list[int]]:
    """(nodes run by a stock torchrun, ranks started directly). Whole nodes get their
    own torchrun; when the real ranks cover only part of some node, every real rank
    starts as its own process with the environment torchrun would give it, and the
    controller plays every agent (it hosts the store)."""
    if "--real-ranks" in args.ours and "--real-nodes" in args.ours:
        raise UsageError("give --real-ranks or --real-nodes, not both")
    if "--real-ranks" not in args.ours:
        return index_list("--real-nodes", args.ours.get("--real-nodes", "0"), nnodes, "node"), []
    ranks = index_list("--real-ranks", args.ours["--real-ranks"], nnodes * nproc, "rank")
    nodes = sorted({r // nproc for r in ranks})
    if len(ranks) == len(nodes) * nproc:
        return nodes, []
    return [], ranks


def _store(args: LaunchArgs) -> tuple[str, int]:
    """The store's address and port: as given (--rdzv-endpoint, --master-addr/--master-port,
    their PET_* variables), else loopback and a free port."""
    addr, port = master_endpoint(args)
    addr = addr or "127.0.0.1"
    port_flag = "--rdzv-endpoint" if args.get("--rdzv-endpoint") else "--master-port"
    return addr, port_number(args, port_flag, port) if port else free_port(addr)


def _topology(name: str, nnodes: int, nproc: int) -> str:
    if Path(name).is_file():  # the controller may run elsewhere in the tree
        name = str(Path(name).resolve())
    try:
        topology.load(name).with_nodes(nnodes, nproc)
    except topology.TopologyError as exc:
        raise UsageError(f"--topology: {exc}") from None
    return name


def _timeout(raw: str | None, flag: str = "--timeout", default: float = DEFAULT_TIMEOUT_S) -> float:
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or value <= 0:
        raise UsageError(f"{flag} takes a positive number of seconds, got {raw!r}")
    return value


def _node_rank(
    args: LaunchArgs, nnodes: int, real_nodes: list[int], direct_ranks: list[int], controller_only: bool
) -> int | None:
    """This host's real node when the real nodes run on several hosts (--node-rank, as each
    host's torchrun takes it), else None; refused, in one line, where several hosts cannot
    work: without the store's address agreed, with a part of a node, on a testbed."""
    raw = args.get("--node-rank")
    if raw is None and not controller_only:
        return None
    addr, port = master_endpoint(args)
    where = "--node-rank" if raw is not None else "neuronabox controller"
    if not addr or not port:
        raise UsageError(f"{where} needs --master-addr and --master-port: every host names the same store")
    if direct_ranks:
        raise UsageError(f"{where} runs whole real nodes, one a host: give --real-nodes, not --real-ranks")
    if args.ours.get("--placement") not in (None, "off"):
        raise UsageError(f"{where} places each real node on its own host: drop --placement")
    if args.ours.get("--backend", "gloo") != "gloo":
        raise UsageError(f"{where}: several hosts run Gloo jobs (NCCL's profiler lines reach the controller by a FIFO)")
    if controller_only:
        if raw is not None:
            raise UsageError("neuronabox controller runs no real node: drop --node-rank")
        if 0 in real_nodes:
            raise UsageError("node 0 is real: the controller runs with node 0's launcher (--node-rank 0), not alone")
        return None
    try:
        node = int(raw)
    except ValueError:
        raise UsageError(f"{args.origin('--node-rank')} takes a node index, got {raw!r}") from None
    if not 0 <= node < nnodes:
        raise UsageError(f"{args.origin('--node-rank')} {node} is outside the world's {nnodes} nodes (0..{nnodes - 1})")
    if node not in real_nodes:
        nodes = ",".join(map(str, real_nodes))
        raise UsageError(f"{args.origin('--node-rank')} {node} is not a real node (--real-nodes {nodes})")
    return node


def _check_inject(specs: tuple[str, ...], world: int, real_ranks: list[int], timeout_s: float) -> None:
    try:
        WhatIf.from_specs(list(specs)).check(world, real_ranks, timeout_s)
    except WhatIfError as exc:
        raise UsageError(f"--inject {exc}") from None


def _placement(path: str | None, nodes: set[int]) -> Placement | None:
    """Where the real nodes and the controller live on a testbed (`neuronabox validate`
    writes it); without one, everything runs here on loopback (on cores of its own when
    there are enough: `cores.plan_cores`; `off`: where the OS puts it)."""
    if path is None or path == "off":
        return None
    try:
        placement = Placement.loads(read_bounded(path, 1 << 20, "placement file").decode())
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"--placement {path}: not a placement file ({exc})") from None
    missing = sorted(nodes - set(placement.nodes))
    if missing:
        raise UsageError(f"--placement {path}: no host for real node {missing[0]}")
    return placement


def _nccl_pins(args: LaunchArgs, backend: str, world: int) -> NcclPins | None:
    """What NCCL is pinned to (`--backend nccl`), or None for Gloo."""
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
            world,
            algo=args.ours.get("--nccl-algo", "ring"),
            channels=int(channels),
            route=args.ours.get("--nccl-route", "socket"),
        )
    except NcclSetupError as exc:
        raise UsageError(str(exc)) from None


def _skew(spec: str | None) -> str:
    try:
        return checked_spec(spec)
    except SkewError as exc:
        raise UsageError(str(exc)) from None


def _nccl_device(args: LaunchArgs, backend: str) -> str:
    """Where NCCL's ranks run: cuda (this machine's GPUs) or cpu (the rig: the wheel's libnccl
    on the rig's driver, for a script that calls NCCL itself; torch's CPU build has no
    ProcessGroupNCCL)."""
    device = args.ours.get("--device")
    if device is None:
        return "cuda"
    if backend != "nccl":
        raise UsageError("--device picks where NCCL runs; it needs --backend nccl")
    if device not in ("cuda", "cpu"):
        raise UsageError(f"--device is cuda or cpu (the rig), got {device!r}")
    return device


# -- checks of this host, before anything starts ----------------------------------------
def check_script(args: LaunchArgs) -> None:
    """The script exists and compiles (a module is found), so a typo fails here and
    not after the whole job started."""
    target = args.script[0]
    runs_as = _runs_as(args.torchrun)
    if runs_as == "program":
        return
    if runs_as == "module":
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
        with open(path, "rb") as f:
            if f.read(4) == b"PK\x03\x04":  # a zip application: python runs its __main__
                return
        source = read_bounded(path, MAX_SCRIPT_BYTES, "Python script")
    except OSError as exc:
        raise UsageError(f"cannot read {target}: {exc.strerror}") from None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
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
    """A file the run writes and reads back at its end: what every output of the tool must
    be (`limits.output_problem`), checked now."""
    problem = output_problem(target)
    if problem:
        raise UsageError(f"{flag} {problem}")


def check_not_the_script(flag: str, target: str, args: LaunchArgs) -> None:
    """An output that is the user's own script (or any file the command names) would overwrite it."""
    out = Path(target).resolve()
    for named in args.script:
        if Path(named).exists() and Path(named).resolve() == out:
            raise UsageError(f"{flag} {target} is {named}, which the run reads; choose another file")


def check_not_being_written(flag: str, target: str) -> None:
    """Two runs writing one trace would interleave it: the controller holds the trace's
    lock for the whole run (`records.TraceWriter`), so a locked trace is another run's."""
    if being_written(target):
        raise UsageError(f"{flag} {target} is being written by another run")


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


def check_nccl(nccl: NcclPins, env: dict[str, str], device: str = "cuda") -> str:
    """Refuse, in one line and before anything starts, an NCCL setup the live controller
    does not play: a choice the user forced, a torch without NCCL (cuda), an unbuilt rig or
    a changed library (cpu), an unread NCCL release. The release it plays, when spoken."""
    if nccl.algo != "ring":
        raise UsageError("--nccl-algo tree: the live controller plays NCCL's Ring; drop --nccl-algo")
    if nccl.route != "socket":
        raise UsageError("--nccl-route plugin: the live controller plays NCCL's Socket net; drop --nccl-route")
    try:
        check_user_env(env, nccl)
        if device == "cpu":
            try:
                version = library_version(library("cpu"))
            except RigError as exc:
                raise NcclSetupError(str(exc)) from None
        else:
            version = probe_nccl(sys.executable, env)
        layout_for(version)
    except (NcclSetupError, UnsupportedNcclVersion) as exc:
        raise UsageError(str(exc)) from None
    print(nccl.summary(), flush=True)
    return version
