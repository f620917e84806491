"""`neuronabox validate [torchrun flags] [--real-ranks ...] [--testbed loopback|netns]
[--rate RATE] [--repeat K] -- script.py [args]`

Runs the same script all-real (every rank a process) and emulated (the real ranks
plus the controller), interleaved K times on one testbed, and reports the error of
the emulated iteration time against the all-real one: the measuring stick of
DESIGN.md's "Fidelity". The iteration time is the median interval between the
optimizer steps of the first real rank (`observer/steps.py`, loaded into both runs'
ranks: one clock, one definition), after `--warmup-steps` intervals; any unmodified
script that steps a torch.optim optimizer can be validated. `--iteration line` takes
the script's own figure instead (`neuronabox-iteration ... rank=R ... median_ms=X`, as
the bundled workloads print).

On loopback every rank and the controller have a core of their own; on netns every
node lives in its namespace behind a shaped link with the same CPU quota in both
runs, and the emulated run puts the controller in its own namespace with
`--boundary real`. Without `--topology` the testbed is calibrated first.
"""

from __future__ import annotations

import argparse
import csv
import functools
import os
import random
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from neuronabox.controller.skew import DEFAULT as DEFAULT_SKEW
from neuronabox.controller.skew import SkewError, checked_spec
from neuronabox.fidelity import huge_pages
from neuronabox.fidelity.calibrate import testbed_rate
from neuronabox.fidelity.testbed import (
    Host,
    Placement,
    TestbedError,
)
from neuronabox.launcher.ranks import SITE_DIR
from neuronabox.launcher.realtime import entering
from neuronabox.launcher.realtime import problem as realtime_problem
from neuronabox.launcher.reaping import Family
from neuronabox.launcher.torchrun_args import UsageError, index_list, int_flag, parse, without_pet
from neuronabox.limits import read_bounded, read_tail
from neuronabox.observer.steps import STEP_LOG, step_file
from neuronabox.trace import records as tracefile

LOG_TAIL_BYTES = 1 << 20  # the iteration line comes at a rank's end
ITERATION = re.compile(r"^neuronabox-iteration .*\brank=(\d+)\b.*\bmedian_ms=([0-9.]+)")
RUN_TIMEOUT_S = 900
AGAIN = "all-real-again"  # --noise-floor: the second run of each repetition, all-real too
STEP_FILE_BYTES = 64 << 20  # a step log of a million steps at most
# netns: the nodes' quotas add up to this share of the machine. The rest is for the
# kernel's network work (veth, bridge, tbf), which no quota charges: with every core
# promised to ranks, an all-real run's ranks got less than their share and a CNN ran
# 16% slower all-real than emulated at W=4, 12% with this headroom.
CPU_HEADROOM = 0.8


# ---------------------------------------------------------------------------------
# how many repetitions
# ---------------------------------------------------------------------------------
WIDE = 0.02  # a resolution past this gets the report's hint: the bar fidelity is held to
MAX_REPEAT = 60  # --resolve's default cap: 12 to 15 minutes of a bundled 40-step workload on this project's VM


@dataclass(frozen=True)
class Plan:
    """How many interleaved repetitions a validate runs: `repeat`; under --resolve, then pairs
    more (both orders, so a drift weighs on both sides alike) until the all-real runs resolve
    `target` (their resolution at or under it) or `at_most` are done. Five repetitions resolve
    2% here for some workloads only (a fresh launch runs at a speed of its own for its whole
    life): the error of a fixed count is then a draw, not a finding."""

    repeat: int
    target: float | None = None  # the resolution to reach, a fraction (--resolve)
    at_most: int = MAX_REPEAT

    def more(self, real: list[float]) -> bool:
        """Whether to run another repetition, given each done one's all-real median."""
        done = len(real)
        if done < self.repeat:
            return True
        if self.target is None or done >= self.at_most:
            return False
        if done % 2:
            return True  # the pair's second order
        reached = resolution_of(real)
        return reached is None or reached > self.target

    def outcome(self, resolution: float | None, done: int) -> str | None:
        """The report's line on --resolve, None without it."""
        if self.target is None:
            return None
        want = f"--resolve {self.target * 100:g}%"
        if resolution is not None and resolution <= self.target:
            return f"  resolved   {resolution * 100:.1f}% at {done} repetitions ({want})"
        got = "no resolution" if resolution is None else f"{resolution * 100:.1f}%"
        return f"  not resolved: {got} after {done} repetitions, the --max-repeat ({want}): this testbed is too noisy"


def plan_of(repeat: int, resolve: str | None, at_most: int | None) -> Plan:
    """--repeat, --resolve (a percentage: 2 or 2%) and --max-repeat; UsageError names what is wrong."""
    if repeat < 1:
        raise UsageError(f"--repeat must be at least 1, got {repeat}")
    if resolve is None:
        if at_most is not None:
            raise UsageError("--max-repeat caps --resolve: give --resolve too")
        return Plan(repeat)
    try:
        target = float(resolve.strip().removesuffix("%")) / 100
    except ValueError:
        raise UsageError(f"--resolve is a percentage, e.g. 2%, got {resolve!r}") from None
    if not 0 < target < 1:
        raise UsageError(f"--resolve must be above 0% and below 100%, got {resolve!r}")
    at_most = MAX_REPEAT if at_most is None else at_most
    if at_most < max(repeat, 3):
        raise UsageError(f"--max-repeat must be at least --repeat and 3 (the fewest a resolution needs), got {at_most}")
    return Plan(repeat, target, at_most)


@dataclass
class RunResult:
    mode: str  # all-real | emulated | all-real-again (the noise floor's second run)
    rep: int
    median_ms: float
    seconds: float
    cpu_per_msg_us: float | None = None  # controller CPU per boundary message (emulated runs)
    model_interval_us: float | None = None  # the model's time per boundary message


@dataclass
class Job:
    """The script and the world it runs in; `real_nodes`: the nodes that stay real when emulated."""

    nnodes: int
    nproc: int
    real_nodes: list[int]
    torchrun: list[str]  # the user's other torchrun flags, passed to both runs
    script: list[str]
    iteration: str = "steps"  # steps: timed by the optimizer's steps; line: the script's own line
    warmup_steps: int = 3  # step intervals left out at the start (steps)
    realtime: bool = False  # every real rank of both runs in the real-time class (launcher/realtime.py)
    huge_pages: str | None = None  # every process of both runs on huge pages: transparent | reserved (huge_pages.py)
    plan: Plan = field(default_factory=lambda: Plan(3))
    results: list[RunResult] = field(default_factory=list)

    @property
    def rank(self) -> int:
        """The rank whose iteration time is compared: the first real rank."""
        return self.real_nodes[0] * self.nproc


def job_of(ns: argparse.Namespace, rest: list[str], script: list[str]) -> Job:
    """The job `neuronabox validate` runs, from its own flags (`ns`), the torchrun flags it
    passes through (`rest`) and the script; UsageError names what is wrong."""
    plan = plan_of(ns.repeat, ns.resolve, ns.max_repeat)
    if ns.iteration not in ("steps", "line"):
        raise UsageError(f"--iteration is steps or line, got {ns.iteration!r}")
    if ns.warmup_steps < 0:
        raise UsageError(f"--warmup-steps must be at least 0, got {ns.warmup_steps}")
    given_skew = ns.skew not in (None, "none")
    try:
        ns.skew = checked_spec(ns.skew)
    except SkewError as exc:
        raise UsageError(str(exc)) from None
    if ns.noise_floor:
        unused = [flag for flag, given in (("--skew", given_skew), ("--topology", ns.topology),
                                           ("--delay-model", ns.delay_model)) if given]  # fmt: skip
        if unused:
            raise UsageError(f"--noise-floor runs nothing emulated: {', '.join(unused)} would not be used")
    if ns.cpu_share is not None and ns.cpu_share <= 0:
        raise UsageError(f"--cpu-share must be positive, got {ns.cpu_share}")
    targs = parse([*rest, "--", *script])
    if targs.ours or targs.switches or targs.repeated:
        flag = next(iter([*targs.ours, *targs.switches, *targs.repeated]))
        raise UsageError(f"{flag} is a `neuronabox torchrun` flag; validate runs the emulation itself")
    flags = {f for f, _ in targs.torchrun}
    if not flags & {"-m", "--module", "--no-python", "--no_python"} and not Path(targs.script[0]).is_file():
        raise UsageError(f"no script {targs.script[0]!r} to run")
    nnodes = int_flag(targs, ("--nnodes",), 1)
    nproc = int_flag(targs, ("--nproc-per-node",), 1)
    if nnodes * nproc < 2:
        raise UsageError("validate needs a world of at least 2 ranks (--nnodes, --nproc-per-node)")
    if ns.real_ranks and ns.real_nodes:
        raise UsageError("give --real-ranks or --real-nodes, not both")
    if ns.real_ranks:
        ranks = index_list("--real-ranks", ns.real_ranks, nnodes * nproc, "rank")
        real_nodes = sorted({r // nproc for r in ranks})
        if len(ranks) != len(real_nodes) * nproc:
            raise UsageError("validate places whole nodes: --real-ranks must cover every rank of its nodes")
    else:
        real_nodes = index_list("--real-nodes", ns.real_nodes or "0", nnodes, "node")
    if len(real_nodes) == nnodes:
        raise UsageError("every node is real: leave at least one node for the controller to emulate")
    targs.drop("--nnodes", "--nproc-per-node", "--master-addr", "--master-port", "--rdzv-backend", "--rdzv-id")
    passthrough = [f"{f}={v}" if v is not None else f for f, v in targs.torchrun]
    if ns.topology and not Path(ns.topology).is_file():
        from neuronabox import topology

        try:
            topology.load(ns.topology)
        except topology.TopologyError as exc:
            raise UsageError(f"--topology: {exc}") from None
    if ns.realtime and (refused := realtime_problem()):
        raise UsageError(refused)
    if ns.huge_pages and (lacking := huge_pages.problem(ns.huge_pages)):
        raise UsageError(f"--huge-pages: {lacking}")
    return Job(nnodes, nproc, real_nodes, passthrough, targs.script, ns.iteration, ns.warmup_steps, ns.realtime,
               ns.huge_pages, plan)  # fmt: skip


# ---------------------------------------------------------------------------------
# one run
# ---------------------------------------------------------------------------------
class Runner:
    """Starts the processes of one run on the testbed's hosts, waits, and stops them all."""

    def __init__(self, job: Job, folder: Path, timeout: float, loopback: bool) -> None:
        self.job = job
        self.loopback = loopback
        self.folder = folder
        self.timeout = timeout
        self.family = Family()
        self.port = 29400 + os.getpid() % 500
        self.pool = huge_pages.PoolWatch() if job.huge_pages == "reserved" else None

    def next_port(self) -> int:
        """A fresh store port per run: TIME_WAIT sockets keep the last one a while. In the
        testbed's own namespaces every port is free; on loopback ask the kernel."""
        if self.loopback:
            from neuronabox.launcher.ports import free_port

            return free_port("127.0.0.1")
        self.port += 1
        return self.port

    def spawn(self, host: Host, cmd: list[str], log: Path, env: dict[str, str], realtime: bool = False) -> None:
        """`realtime`: the process (an all-real run's agent, so its ranks) in the real-time class."""
        out = open(log, "w")
        self.family.add(
            subprocess.Popen(
                cmd,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=entering(host.preexec()) if realtime else host.preexec(),
                start_new_session=True,
            )
        )
        out.close()

    def wait(self, what: str, rep: int) -> None:
        print(f"  rep {rep} {what:<9} started", flush=True)  # its processes run on their hosts now
        deadline = time.monotonic() + self.timeout
        try:
            while True:
                codes = [p.poll() for p in self.family.children]
                bad = [c for c in codes if c not in (None, 0)]
                if bad:
                    raise TestbedError(
                        f"the {what} run failed (a process exited with status {bad[0]}); logs in {self.folder}"
                    )
                if self.pool is not None:
                    self.pool.sample(f"rep {rep} {what}")
                if all(c == 0 for c in codes):
                    return
                if time.monotonic() > deadline:
                    raise TestbedError(f"the {what} run took longer than {self.timeout:.0f} s; logs in {self.folder}")
                time.sleep(0.1)
        finally:
            self.stop()

    def stop(self) -> None:
        self.family.stop(grace=3)
        self.family = Family()

    def env(self, host: Host, steps: Path | None = None) -> dict[str, str]:
        """The user's environment without the PET_* variables torchrun would read as flags
        (PET_STANDALONE would make the all-real run ignore its master address); with
        `steps`, the ranks log their optimizer steps there (sitecustomize). The same for
        both runs: the testbed's settings (huge pages) touch every process alike."""
        env = dict(without_pet(os.environ), GLOO_SOCKET_IFNAME=host.ifname, PYTHONUNBUFFERED="1")
        env.setdefault("OMP_NUM_THREADS", "1")
        if self.job.huge_pages:
            env = huge_pages.with_huge_pages(env, self.job.huge_pages)
        if steps is not None:
            steps.mkdir(parents=True, exist_ok=True)
            env[STEP_LOG] = str(steps)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SITE_DIR), env.get("PYTHONPATH")]))
        return env

    def steps_folder(self, mode: str, rep: int) -> Path | None:
        return self.folder / f"rep{rep}-{mode}-steps" if self.job.iteration == "steps" else None

    def iteration_ms(self, logs: list[Path], steps: Path | None) -> float:
        if steps is None:
            return iteration_ms(logs, self.job.rank)
        return step_iteration_ms(steps, self.job.rank, self.job.warmup_steps)

    def log_dir(self) -> list[str]:
        """The all-real torchruns' --log-dir, in this folder, unless the user gave one (as the
        emulated run's launcher does: torchrun's default is a /tmp folder nothing removes)."""
        if any(f.split("=")[0] == "--log-dir" for f in self.job.torchrun):  # as parsed: dashes
            return []
        return [f"--log-dir={self.folder / 'torchelastic'}"]

    def all_real(self, hosts: dict[int, Host], rep: int, mode: str = "all-real") -> RunResult:
        """`mode`: the run's name in the results (all-real, or all-real-again: the noise floor's second)."""
        j, port, t0 = self.job, self.next_port(), time.monotonic()
        logs, steps = [], self.steps_folder(mode, rep)
        for node, host in hosts.items():
            log = self.folder / f"rep{rep}-{mode}-node{node}.log"
            cmd = [
                sys.executable, "-m", "torch.distributed.run", f"--nnodes={j.nnodes}", f"--nproc-per-node={j.nproc}",
                f"--node-rank={node}", f"--master-addr={hosts[0].address}", f"--master-port={port}",
                "--rdzv-backend=static", f"--rdzv-id=validate{rep}", *self.log_dir(), *j.torchrun, *j.script,
            ]  # fmt: skip
            self.spawn(host, cmd, log, self.env(host, steps), realtime=j.realtime)
            logs.append(log)
        self.wait(mode, rep)
        return RunResult(mode, rep, self.iteration_ms(logs, steps), time.monotonic() - t0)

    def emulated(
        self, placement: Placement, topology: str, delay_model: str, rep: int, skew: str = DEFAULT_SKEW
    ) -> RunResult:
        j, port, t0 = self.job, self.next_port(), time.monotonic()
        pfile, trace = self.folder / "placement.json", self.folder / f"rep{rep}-trace.json"
        pfile.write_text(placement.dumps())
        master = placement.nodes[0].address if 0 in placement.nodes else placement.controller.address
        log = self.folder / f"rep{rep}-emulated.log"
        cmd = [
            sys.executable, "-m", "neuronabox.cli", "torchrun", f"--nnodes={j.nnodes}", f"--nproc-per-node={j.nproc}",
            "--real-nodes", ",".join(map(str, j.real_nodes)), "--topology", topology, "--delay-model", delay_model,
            "--boundary", "real", "--placement", str(pfile), "--master-addr", master, "--master-port", str(port),
            "--trace", str(trace), "--skew", skew, *(["--realtime"] if j.realtime else []), *j.torchrun, *j.script,
        ]  # fmt: skip
        steps = self.steps_folder("emulated", rep)
        self.spawn(placement.controller, cmd, log, self.env(placement.controller, steps))
        self.wait("emulated", rep)
        result = RunResult("emulated", rep, self.iteration_ms([log], steps), time.monotonic() - t0)
        result.cpu_per_msg_us, result.model_interval_us = controller_pace(tracefile.load(trace))
        return result


def iteration_ms(logs: list[Path], rank: int) -> float:
    for log in logs:
        for line in read_tail(log, LOG_TAIL_BYTES).decode(errors="replace").splitlines():
            m = ITERATION.match(line)
            if m and int(m.group(1)) == rank:
                return float(m.group(2))
    raise TestbedError(f"rank {rank} printed no `neuronabox-iteration ... median_ms=` line; logs in {logs[0].parent}")


def step_iteration_ms(folder: Path, rank: int, warmup: int) -> float:
    """The median interval between rank `rank`'s optimizer steps, in ms, after `warmup`
    intervals; refused, saying why, when the script stepped no optimizer or too few times."""
    path = step_file(folder, rank)
    text = read_bounded(path, STEP_FILE_BYTES, "step log").decode() if path.exists() else ""
    times = [float(x) for x in text.split()]
    if not times:
        raise TestbedError(
            f"rank {rank} took no optimizer step: validate times iterations by torch.optim's steps "
            "(give --iteration line if the script prints its own `neuronabox-iteration` line)"
        )
    gaps = [1e3 * (b - a) for a, b in zip(times, times[1:], strict=False)][warmup:]
    if len(gaps) < 2:
        raise TestbedError(
            f"rank {rank} took {len(times)} optimizer steps: too few to time after --warmup-steps {warmup} "
            f"(at least {warmup + 3} are needed)"
        )
    return statistics.median(gaps)


def controller_pace(trace: dict) -> tuple[float | None, float | None]:
    """(controller CPU per boundary message, the model's time per boundary message), in
    microseconds, over the run's collectives after the first (start-up) one."""
    recs = sorted(trace.get("instances", []), key=lambda r: r["end_us"])
    if len(recs) < 3:
        return None, None
    msgs = sum(r["boundary_messages"] for r in recs[1:])
    if not msgs:
        return None, None
    cpu = recs[-1]["loop_cpu_s"] - recs[0]["loop_cpu_s"]
    model_us = sum(r["model_us"] for r in recs[1:])
    return cpu / msgs * 1e6, model_us / msgs


# ---------------------------------------------------------------------------------
# the comparison
# ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Comparison:
    """Each repetition's all-real median and its other run's (emulated; under
    --noise-floor, all-real again)."""

    real: list[float]
    other: list[float]

    @property
    def error(self) -> float:
        """Of the medians over the repetitions."""
        return statistics.median(self.other) / statistics.median(self.real) - 1

    @property
    def pair_errors(self) -> list[float]:
        """Each repetition's other run against its own all-real run: the spread."""
        return [e / r - 1 for r, e in zip(self.real, self.other, strict=True)]

    @functools.cached_property
    def resolution(self) -> float | None:
        """The smallest error these repetitions resolve, from the all-real runs alone (see
        `no_difference_error`); None under 3 repetitions."""
        return resolution_of(self.real)


def resolution_of(real: list[float]) -> float | None:
    """The p90 of `no_difference_error` at as many runs as `real` holds; None under 3."""
    if len(real) < 3:
        return None
    return statistics.quantiles(no_difference_error(real, len(real)), n=10)[-1]


def no_difference_error(runs: list[float], k: int, draws: int = 2000, seed: int = 0) -> list[float]:
    """|median(A) / median(B) - 1| for two sets A and B of `k` runs drawn (with replacement)
    from `runs`, `draws` times: what an error of medians reads when both sides are the same
    thing. Every run is a fresh process, and on a shared VM a fresh process of the same
    compute runs a few percent faster or slower than the last, for its whole life
    (scripts/bench_launch_noise.py); its 90th percentile is the error K repetitions cannot
    tell from nothing."""
    rng = random.Random(seed)
    out = []
    for _ in range(draws):
        a, b = rng.choices(runs, k=k), rng.choices(runs, k=k)
        out.append(abs(statistics.median(a) / statistics.median(b) - 1))
    return out


def report(
    job: Job,
    ns: argparse.Namespace,
    cmp: Comparison,
    results: list[RunResult],
    pool: huge_pages.PoolWatch | None = None,
) -> str:
    """`pool`: the hugetlb pool as the runs found it (--huge-pages reserved)."""

    def ms(xs: list[float]) -> str:
        return f"{statistics.median(xs):9.2f} ms   [{min(xs):.2f} .. {max(xs):.2f}]"

    errs = cmp.pair_errors
    floor = any(r.mode == AGAIN for r in results)
    emu = [r for r in results if r.mode == "emulated" and r.cpu_per_msg_us is not None]
    lines = [
        f"neuronabox validate: {' '.join(job.script)}",
        f"  world {job.nnodes} x {job.nproc}, real nodes {job.real_nodes}, testbed {ns.testbed}"
        + (f" at {testbed_rate(ns) / 1e6:g} Mbit/s" if ns.testbed == "netns" else "")
        + f", {len(cmp.real)} interleaved repetitions, iteration time of rank {job.rank} (median [min .. max]), "
        + (f"between optimizer steps after {job.warmup_steps}" if job.iteration == "steps" else "the script's own"),
        *(
            [f"  every process of both runs with malloc on {job.huge_pages} huge pages (--huge-pages {job.huge_pages})"]
            if job.huge_pages
            else []
        ),
        *(pool.lines() if pool is not None else []),
        f"  all-real   {ms(cmp.real)}",
        f"  {'again' if floor else 'emulated':<10} {ms(cmp.other)}",
        f"  error      {cmp.error * 100:+.1f}%   (per repetition: {min(errs) * 100:+.1f}% .. {max(errs) * 100:+.1f}%)",
    ]
    if cmp.resolution is not None:
        lines.append(
            f"  resolution {cmp.resolution * 100:.1f}%   (two sets of {len(cmp.real)} all-real runs drawn from these "
            "differ by this much at p90: a smaller error is not resolved)"
        )
    if cmp.resolution is not None and cmp.resolution > WIDE and job.huge_pages != "reserved":
        lines.append(
            f"  hint       the all-real runs spread past {WIDE * 100:g}%: on reserved huge pages (--huge-pages "
            'reserved, with a hugetlb pool) fresh launches run closer (docs/fidelity.md, "Reserved huge pages")'
        )
    if (outcome := job.plan.outcome(cmp.resolution, len(cmp.real))) is not None:
        lines.append(outcome)
    if floor:
        lines.append(
            f"  the noise floor: all-real against all-real; at {len(cmp.real)} repetitions this testbed "
            "resolves no error smaller than this"
        )
    if emu:
        cpu = statistics.median(r.cpu_per_msg_us for r in emu)
        interval = statistics.median(r.model_interval_us for r in emu)
        lines.append(
            f"  controller {cpu:.1f} us CPU per boundary message; the model's time per message {interval:.1f} us"
        )
    return "\n".join(lines)


def write_csv(path: Path, job: Job, ns: argparse.Namespace, cmp: Comparison, results: list[RunResult]) -> None:
    rate = testbed_rate(ns) if ns.testbed == "netns" else None
    common = [" ".join(job.script), ns.testbed, f"{rate / 1e6:g}" if rate else "", job.nnodes, job.nproc,
              ",".join(map(str, job.real_nodes))]  # fmt: skip
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["script", "testbed", "rate_mbit", "nnodes", "nproc", "real_nodes", "rep", "mode", "median_ms",
                    "controller_cpu_per_msg_us", "model_interval_us", "error_pct"])  # fmt: skip
        for r in results:
            w.writerow(
                [*common, r.rep, r.mode, f"{r.median_ms:.3f}", _opt(r.cpu_per_msg_us), _opt(r.model_interval_us), ""]
            )
        if cmp.resolution is not None:  # (before the error: the last row is the error's)
            w.writerow([*common, "all", "resolution", "", "", "", f"{cmp.resolution * 100:.2f}"])
        w.writerow([*common, "all", "error", "", "", "", f"{cmp.error * 100:.2f}"])


def _opt(x: float | None) -> str:
    return "" if x is None else f"{x:.2f}"
