"""`neuronabox whatif`: one run (or one replay) per value of a what-if, a CSV and a plot."""

from __future__ import annotations

import csv
import shutil
import sys
import tempfile
from pathlib import Path

from neuronabox.args import ArgParser
from neuronabox.limits import output_problem
from neuronabox.sim.sweep import SweepError, plan, plot, run_one, trace_name

NAME = "whatif"
SUMMARY = "sweep a what-if (latency, bandwidth, jitter, world size) live or in simulation: a CSV and a plot"


def refuse_outputs(prefix: str) -> int:
    """2 (after one line) if the sweep could not write its table and plot, checked before any run."""
    for target in (f"{prefix}.csv", f"{prefix}.png"):
        problem = output_problem(target)
        if problem:
            print(f"neuronabox: error: --out {problem}", file=sys.stderr)
            return 2
    return 0


def build_parser() -> ArgParser:
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
    return p


def main(argv: list[str]) -> int:
    i = argv.index("--") if "--" in argv else len(argv)
    ours, script = argv[:i], argv[i + 1 :]
    p = build_parser()
    if "-h" in ours or "--help" in ours:
        p.print_help()
        return 0
    if "--simulate" in ours or any(a.startswith("--simulate=") for a in ours):
        ns = p.parse_args(ours)
        return refuse_outputs(ns.out) or simulated_sweep(ns)
    if "--" not in argv:
        print("neuronabox: error: whatif needs the script after --", file=sys.stderr)
        return 2
    ns, launch = p.parse_known_args(ours)
    if refuse_outputs(ns.out):
        return 2
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
