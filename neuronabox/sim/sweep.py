"""`neuronabox whatif --sweep KEY=V1,V2,... [launch flags] -- script.py [args]`, or
`neuronabox whatif --simulate TRACE --sweep KEY=V1,V2,...` in simulation (KEY may
then be nnodes too: the recorded job at each world size).

Runs the job once per value, with `--inject KEY=V` (plus `--with` options such as
per=collective,op=allreduce), and writes a CSV table and a PNG plot of the
iteration time against the injected value.
"""

from __future__ import annotations

import re
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
