"""`neuronabox whatif --sweep KEY=V1,V2,... [launch flags] -- script.py [args]`, or
`neuronabox whatif --simulate TRACE --sweep KEY=V1,V2,...` in simulation (KEY may
then be nnodes too: the recorded job at each world size).

Runs the job once per value, with `--inject KEY=V` (plus `--with` options such as
per=collective,op=allreduce), and writes a CSV table and a PNG plot of the
iteration time against the injected value.
"""

from __future__ import annotations

import csv
import re
import shutil
import sys
import tempfile
from pathlib import Path

from neuronabox.delay_models.whatif import WhatIfError, parse
from neuronabox.errors import NeuronaBoxError
from neuronabox.launcher.api import RunResult, run_argv
from neuronabox.launcher.run import LaunchError
from neuronabox.launcher.torchrun_args import UsageError

SWEEPABLE = {"latency": "injected latency", "bandwidth": "bandwidth factor", "jitter": "injected jitter"}
SIMULATE_ONLY = {"nnodes": "emulated nodes"}  # a live sweep cannot change the world: a simulated one can


class SweepError(NeuronaBoxError, ValueError):
    pass


def plan(sweep: str, extra: str, simulated: bool = False) -> tuple[str, list[tuple[str, float, str]]]:
    """(key, [(label, numeric value, spec)]) for a --sweep argument; bad input raises SweepError."""
    key, eq, values = sweep.partition("=")
    keys = {**SWEEPABLE, **SIMULATE_ONLY} if simulated else SWEEPABLE
    if not eq or key not in keys or not values:
        only = " (nnodes with --simulate)" if not simulated else ""
        raise SweepError(f"--sweep takes KEY=V1,V2,... with KEY one of {', '.join(keys)}{only}, got {sweep!r}")
    if key == "nnodes":
        try:
            nodes = [int(v) for v in values.split(",")]
        except ValueError:
            raise SweepError(f"--sweep nnodes takes whole numbers, got {values!r}") from None
        if min(nodes) < 1:
            raise SweepError(f"--sweep nnodes: at least 1 node, got {min(nodes)}")
        return key, [(str(n), float(n), extra) for n in nodes]
    out = []
    for raw in values.split(","):
        spec = f"{key}={raw.strip()}" + (f",{extra}" if extra else "")
        try:
            mod = parse(spec)
        except WhatIfError as exc:
            raise SweepError(f"--sweep value {raw!r}: {exc}") from None
        out.append((raw.strip(), mod.value, spec))
    return key, out


def run_one(spec: str, launch: list[str], script: list[str], trace: Path, log: Path) -> RunResult:
    """One point of the sweep through the Python API; the real ranks' output goes to `log`."""
    try:
        return run_argv([*launch, "--inject", spec, "--trace", str(trace), "--", *script], output=log)
    except (LaunchError, UsageError) as exc:
        raise SweepError(f"the run with {spec} failed: {exc} (its output: {log})") from None


def trace_name(out: str, n: int, label: str) -> Path:
    """Each value's trace, kept beside the table: PREFIX-N-LABEL.jsonl."""
    return Path(f"{out}-{n}-{re.sub(r'[^A-Za-z0-9.+-]', '_', label)}.jsonl")


def sweep_main(argv: list[str]) -> int:
    from neuronabox.cli import ArgParser

    i = argv.index("--") if "--" in argv else len(argv)
    ours, script = argv[:i], argv[i + 1 :]
    p = ArgParser(
        prog="neuronabox whatif",
        usage="neuronabox whatif --sweep KEY=V1,V2,... [--with OPTS] [--out PREFIX] [launch flags] -- script.py [args]",
        description="Run the job once per value with --inject KEY=VALUE and write a CSV table and a PNG plot of "
        "the iteration time against the value. Launch flags are those of `neuronabox torchrun`.",
    )
    p.add_argument("--sweep", required=True, help="KEY=V1,V2,... (latency, bandwidth or jitter)")
    p.add_argument("--with", dest="extra", default="", help="options added to every spec, e.g. per=collective")
    p.add_argument("--out", default="whatif", help="output prefix: PREFIX.csv and PREFIX.png")
    p.add_argument("--simulate", metavar="TRACE", help="sweep in simulation, replaying a recorded run's trace")
    if "-h" in ours or "--help" in ours:
        p.print_help()
        return 0
    if "--simulate" in ours or any(a.startswith("--simulate=") for a in ours):
        return simulated_sweep(p.parse_args(ours))
    if "--" not in argv:
        print("neuronabox: error: whatif needs the script after --", file=sys.stderr)
        return 2
    ns, launch = p.parse_known_args(ours)
    if not script:
        print("neuronabox: error: no training script given after --", file=sys.stderr)
        return 2
    try:
        key, points = plan(ns.sweep, ns.extra)
    except SweepError as exc:
        print(f"neuronabox: error: {exc}", file=sys.stderr)
        return 2
    rows = []
    logs = Path(tempfile.mkdtemp(prefix="neuronabox-sweep-"))
    for n, (label, value, spec) in enumerate(points):
        trace = trace_name(ns.out, n, label)
        try:
            result = run_one(spec, launch, script, trace, logs / f"run{n}.log")
        except SweepError as exc:
            print(f"neuronabox: error: {exc}", file=sys.stderr)
            return 1
        if result.steps < 2:
            print("neuronabox: error: no optimizer steps observed; the sweep needs the observer", file=sys.stderr)
            return 1
        rows.append((label, value, result.iteration_s))
        print(f"  {spec:<40} iteration {result.iteration_s * 1e3:9.3f} ms   trace {trace}", flush=True)
    shutil.rmtree(logs, ignore_errors=True)
    csv_path, png_path = Path(f"{ns.out}.csv"), Path(f"{ns.out}.png")
    unit = "s" if key in ("latency", "jitter") else "x"
    with csv_path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow([key, f"{key}_{unit}", "iteration_s"])
        w.writerows(rows)
    plot(rows, key, ns.extra, png_path)
    print(f"wrote {csv_path} and {png_path}")
    return 0


def simulated_sweep(ns) -> int:
    """The sweep in simulation: one replay of the trace per value, no process run."""
    from neuronabox.sim.simulate import SimulateError, load_trace, run_simulation

    try:
        key, points = plan(ns.sweep, ns.extra, simulated=True)
        doc = load_trace(ns.simulate)
    except (SweepError, SimulateError) as exc:
        print(f"neuronabox: error: {exc}", file=sys.stderr)
        return 2
    rows, shares = [], []
    for n, (label, value, spec) in enumerate(points):
        trace = trace_name(ns.out, n, label)
        nodes = int(value) if key == "nnodes" else None
        inject = ([spec] if spec else None) if key == "nnodes" else [spec]
        try:
            sim, totals, _ = run_simulation(doc, ns.simulate, nnodes=nodes, inject=inject, out=str(trace))
        except (SimulateError, RuntimeError) as exc:
            print(f"neuronabox: error: the simulation with {key}={label} failed: {exc}", file=sys.stderr)
            return 1
        steps, it = totals.iteration()
        if steps < 2:
            print("neuronabox: error: the trace has fewer than two optimizer steps", file=sys.stderr)
            return 1
        rows.append((label, value, it))
        shares.append(sim.comm_share)
        print(f"  {key}={label:<12} world {sim.world:>6}  iteration {it * 1e3:10.3f} ms  communication"
              f" {100 * sim.comm_share:5.1f}%  ({sim.wall_s:.2f} s)  trace {trace}", flush=True)  # fmt: skip
    csv_path, png_path = Path(f"{ns.out}.csv"), Path(f"{ns.out}.png")
    with csv_path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow([key, f"{key}_value", "iteration_s", "communication_share"])
        w.writerows((*row, share) for row, share in zip(rows, shares, strict=True))
    plot(rows, key, ns.extra, png_path, shares)
    print(f"wrote {csv_path} and {png_path}")
    return 0


def plot(
    rows: list[tuple[str, float, float]], key: str, extra: str, path: Path, shares: list[float] | None = None
) -> tuple[str, str]:
    """Iteration time (and, in simulation, the communication share) against the swept
    value; returns the axis labels it wrote."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scale, unit = (1e3, "ms") if key in ("latency", "jitter") else (1.0, "x")
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([v * scale for _, v, _ in rows], [it * 1e3 for _, _, it in rows], marker="o")
    if key == "nnodes":
        ax.set_xscale("log", base=2)
        unit = "log scale"
    if shares is not None:
        share_ax = ax.twinx()
        share_ax.plot([v * scale for _, v, _ in rows], [100 * s for s in shares], marker="s", color="tab:red")
        share_ax.set_ylabel("communication share (%)", color="tab:red")
        share_ax.set_ylim(0, 100)
    ax.set_xlabel(f"{({**SWEEPABLE, **SIMULATE_ONLY})[key]} ({unit})" + (f", {extra}" if extra else ""))
    ax.set_ylabel("iteration time (ms)")
    ax.set_title("NeuronaBox what-if sweep")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    labels = (ax.get_xlabel(), ax.get_ylabel())
    plt.close(fig)
    return labels
