"""`neuronabox whatif`: one run (or one replay) per value of a what-if, a CSV and a plot."""

from __future__ import annotations

import csv
import os
import sys
from pathlib import Path

from neuronabox.args import ArgParser
from neuronabox.errors import NeuronaBoxError
from neuronabox.limits import output_problem
from neuronabox.sim.points import (
    EXECUTORS,
    RAY_MISSING,
    ExecutorError,
    Point,
    Progress,
    Row,
    SweepTable,
    live_cpus,
    live_point,
    ray_available,
    run_local,
    run_ray,
    simulated_point,
)
from neuronabox.sim.sweep import SweepError, plan, plot, trace_name

NAME = "whatif"
SUMMARY = "sweep a what-if (latency, bandwidth, jitter, world size) live or in simulation: a CSV and a plot"


def build_parser() -> ArgParser:
    p = ArgParser(
        prog="neuronabox whatif",
        usage="neuronabox whatif --sweep KEY=V1,V2,... [--with OPTS] [--out PREFIX] [--executor local|ray] "
        "[launch flags] -- script.py [args]",
        description="Run the job once per value with --inject KEY=VALUE (or replay a trace per value, --simulate) "
        "and write a CSV table, a row per point as it finishes, and a PNG plot of the iteration time against the "
        "value. A sweep run again skips the points its CSV holds done. Launch flags are those of "
        "`neuronabox torchrun`.",
    )
    p.add_argument("--sweep", required=True,
                   help="KEY=V1,V2,... (latency, bandwidth or jitter; nnodes with --simulate)")
    p.add_argument("--with", dest="extra", default="", help="options added to every spec, e.g. per=collective")
    p.add_argument("--out", default="whatif", help="output prefix: PREFIX.csv, PREFIX.png, each point's trace and log")
    p.add_argument("--simulate", metavar="TRACE", help="sweep in simulation, replaying a recorded run's trace")
    p.add_argument("--executor", default="local", help="local (one point after another, default) or ray (each "
                   "point a Ray task; a live one asks for a CPU per real rank and one for the controller)")
    p.add_argument("--ray-address", metavar="ADDR", help="the Ray cluster's address (default: a Ray instance of "
                   "this machine's own, on loopback, for the sweep's length)")
    return p


def main(argv: list[str]) -> int:
    i = argv.index("--") if "--" in argv else len(argv)
    ours, script = argv[:i], argv[i + 1 :]
    p = build_parser()
    if "-h" in ours or "--help" in ours:
        p.print_help()
        return 0
    simulated = "--simulate" in ours or any(a.startswith("--simulate=") for a in ours)
    if simulated:
        ns, launch = p.parse_args(ours), []
    elif "--" not in argv:
        print("neuronabox: error: whatif needs the script after --", file=sys.stderr)
        return 2
    else:
        ns, launch = p.parse_known_args(ours)
    cause = refusal(ns, simulated, script)
    if cause:
        print(f"neuronabox: error: {cause}", file=sys.stderr)
        return 2
    try:
        key, plan_points = plan(ns.sweep, ns.extra, simulated=simulated)
        if simulated:
            from neuronabox.sim.simulate import load_trace

            load_trace(ns.simulate)  # a bad trace is refused before any point runs
    except (SweepError, NeuronaBoxError) as exc:
        print(f"neuronabox: error: {exc}", file=sys.stderr)
        return 2
    points = [
        Point(n, label, value, spec, str(trace_name(ns.out, n, label)),
              "" if simulated else str(trace_name(ns.out, n, label).with_suffix(".log")))
        for n, (label, value, spec) in enumerate(plan_points)
    ]  # fmt: skip
    unit = "value" if simulated else ("s" if key in ("latency", "jitter") else "x")
    header = [key, f"{key}_{unit}", "iteration_s", *(["communication_share"] if simulated else []),
              "status", "cause", "trace", "log"]  # fmt: skip
    try:
        table = SweepTable(Path(f"{ns.out}.csv"), header)
    except (ExecutorError, OSError) as exc:
        print(f"neuronabox: error: {exc}", file=sys.stderr)
        return 2
    todo = [pt for pt in points if pt.label not in table.done]
    if len(todo) < len(points):
        print(f"resuming: {len(points) - len(todo)} of {len(points)} points are in {table.path} already", flush=True)
    if simulated:
        fn, args, cpus = simulated_point, (key, ns.simulate), 1
    else:
        fn, args, cpus = live_point, (launch, script), live_cpus(launch)
    progress = Progress(len(todo), os.cpu_count() // cpus if ns.executor == "ray" else 1)
    failed = 0
    try:
        if ns.executor == "ray":
            rows = run_ray(todo, fn, args, ns.ray_address, cpus, on_start=progress.started)
        else:
            rows = run_local(todo, fn, args, on_start=progress.started)
        for row in rows:
            table.add(cells(row, simulated))
            failed += row.status != "ok"
            progress.finished(row.status == "ok", row_text(row, key, simulated))
    except ExecutorError as exc:
        progress.close()
        print(f"neuronabox: error: {exc}", file=sys.stderr)
        return 2
    finally:
        table.close()
    progress.close()
    done = sorted(read_rows(table.path, header, simulated), key=lambda r: r[1])
    png = Path(f"{ns.out}.png")
    if done:
        plot([r[:3] for r in done], key, ns.extra, png, [r[3] for r in done] if simulated else None)
    print(f"wrote {table.path}" + (f" and {png}" if done else "") + (f"; {failed} point(s) failed" if failed else ""))
    return 1 if failed else 0


def refusal(ns, simulated: bool, script: list[str]) -> str | None:
    if ns.executor not in EXECUTORS:
        return f"--executor is {' or '.join(EXECUTORS)}, got {ns.executor!r}"
    if ns.executor == "ray" and not ray_available():
        return RAY_MISSING
    if ns.ray_address and ns.executor != "ray":
        return "--ray-address goes with --executor ray"
    for target in (f"{ns.out}.csv", f"{ns.out}.png"):
        problem = output_problem(target)
        if problem:
            return f"--out {problem}"
    if not simulated and not script:
        return "no training script given after --"
    return None


def cells(row: Row, simulated: bool) -> list:
    p = row.point
    it = "" if row.iteration_s is None else row.iteration_s
    share = ["" if row.share is None else row.share] if simulated else []
    return [p.label, p.value, it, *share, row.status, row.cause.splitlines()[0] if row.cause else "", p.trace, p.log]


def row_text(row: Row, key: str, simulated: bool) -> str:
    p = row.point
    if row.status != "ok":
        return f"  {key}={p.label:<12} failed: {row.cause}"
    if simulated:
        return (f"  {key}={p.label:<12} world {row.world:>6}  iteration {row.iteration_s * 1e3:10.3f} ms  "
                f"communication {100 * row.share:5.1f}%  ({row.wall_s:.2f} s)  trace {p.trace}")  # fmt: skip
    return f"  {p.spec:<40} iteration {row.iteration_s * 1e3:9.3f} ms   trace {p.trace}"


def read_rows(path: Path, header: list[str], simulated: bool) -> list[tuple]:
    """(label, value, iteration_s[, share]) of every point done, this run's and earlier ones'."""
    with path.open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["status"] == "ok"]
    out = []
    for r in rows:
        base = (r[header[0]], float(r[header[1]]), float(r["iteration_s"]))
        out.append((*base, float(r["communication_share"])) if simulated else base)
    return out
