"""`neuronabox whatif --sweep KEY=V1,V2,... [launch flags] -- script.py [args]`

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

from neuronabox.errors import NeuronaBoxError

from .api import RunResult, run_argv
from .launcher import LaunchError
from .torchrun_args import UsageError
from .whatif import WhatIfError, parse

SWEEPABLE = {"latency": "injected latency", "bandwidth": "bandwidth factor", "jitter": "injected jitter"}


class SweepError(NeuronaBoxError, ValueError):
    pass


def plan(sweep: str, extra: str) -> tuple[str, list[tuple[str, float, str]]]:
    """(key, [(label, numeric value, spec)]) for a --sweep argument; bad input raises SweepError."""
    key, eq, values = sweep.partition("=")
    if not eq or key not in SWEEPABLE or not values:
        raise SweepError(f"--sweep takes KEY=V1,V2,... with KEY one of {', '.join(SWEEPABLE)}, got {sweep!r}")
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
    from .cli import ArgParser

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
    if "-h" in ours or "--help" in ours:
        p.print_help()
        return 0
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


def plot(rows: list[tuple[str, float, float]], key: str, extra: str, path: Path) -> tuple[str, str]:
    """Iteration time against the swept value; returns the axis labels it wrote."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scale, unit = (1e3, "ms") if key in ("latency", "jitter") else (1.0, "x")
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([v * scale for _, v, _ in rows], [it * 1e3 for _, _, it in rows], marker="o")
    ax.set_xlabel(f"{SWEEPABLE[key]} ({unit})" + (f", {extra}" if extra else ""))
    ax.set_ylabel("iteration time (ms)")
    ax.set_title("NeuronaBox what-if sweep")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    labels = (ax.get_xlabel(), ax.get_ylabel())
    plt.close(fig)
    return labels
