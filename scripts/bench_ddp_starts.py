"""DDP's buckets started natively against every book started from Python, interleaved.

    python scripts/bench_ddp_starts.py [--repeat K] [--steps N] [--workload mlp] [--skew none|auto|FILE]

The MLP example at W = 2 (its buckets, 4.2 and 6.3 MB, have segments the wire cannot
count: the controller sizes them from the model's buckets, a standing answer, so a bucket
seen before starts natively; docs/architecture.md, "Native starts"), the real rank on
core 0 and the launcher and controller on core 1. Each round runs it twice, default and
with NEURONABOX_NATIVE_START=0, the order flipped every round. From each run's trace,
past the first 5 optimizer steps: the iteration time (median of the real rank's steps),
the bucket allreduces started natively, the real rank's median span in a bucket (its
first to last boundary message), and the controller loop's CPU per step. Prints a
markdown table of the medians over rounds with their ranges.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_allreduce import write_pinned_placement

ROOT = Path(__file__).resolve().parent.parent
WARM_STEPS = 5
MODES = {"native starts (default)": {}, "every book from Python": {"NEURONABOX_NATIVE_START": "0"}}


def measure(trace: Path) -> dict[str, float]:
    """One run's figures, past its warm-up steps."""
    steps, buckets, cpu = [], [], []
    for line in trace.read_text().splitlines():
        rec = json.loads(line)
        if "step" in rec:
            steps.append(rec["step"][1])
        inst = rec.get("instance")
        if inst and len(steps) > WARM_STEPS and inst["kind"] == "allreduce" and inst["nbytes"] > 1 << 20:
            buckets.append(inst)
            cpu.append((len(steps), inst["loop_cpu_s"]))
    if len(steps) <= WARM_STEPS + 2 or len(cpu) < 2:
        sys.exit(f"{trace}: too few steps or buckets past the warm-up")
    gaps = [b - a for a, b in zip(steps[WARM_STEPS:], steps[WARM_STEPS + 1 :], strict=False)]
    spans = [last - first for i in buckets for first, last in i["per_rank"].values()]
    (s0, c0), (s1, c1) = cpu[0], cpu[-1]
    return {
        "iteration_ms": statistics.median(gaps) / 1e3,
        "native": sum(bool(i.get("native_start")) for i in buckets) / len(buckets),
        "span_us": statistics.median(spans),
        "cpu_ms": (c1 - c0) / max(1, s1 - s0) * 1e3,
    }


def run(steps: int, workload: str, placement: Path, trace: Path, env: dict[str, str], skew: str) -> dict[str, float]:
    cmd = [
        sys.executable, "-m", "neuronabox.cli", "torchrun", "--nnodes", "2", "--placement", str(placement),
        "--skew", skew, "--trace", str(trace), f"examples/{workload}.py", "--steps", str(steps),
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, capture_output=True, text=True, cwd=ROOT, timeout=600, env=dict(os.environ, **env),
        preexec_fn=lambda: os.sched_setaffinity(0, {1}),
    )  # fmt: skip
    if proc.returncode != 0:
        sys.exit(f"run failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    return measure(trace)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--workload", default="mlp")
    p.add_argument("--skew", default="none", help="the runs' --skew (none, auto or a file)")
    args = p.parse_args()
    got: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory() as d:
        placement = Path(d) / "placement.json"
        write_pinned_placement(placement)
        for rep in range(args.repeat):
            order = list(MODES) if rep % 2 == 0 else list(MODES)[::-1]
            for mode in order:
                fig = run(args.steps, args.workload, placement, Path(d) / "trace.jsonl", MODES[mode], args.skew)
                got[mode].append(fig)
                print(f"rep {rep} {mode}: {fig}", file=sys.stderr, flush=True)

    def cell(mode: str, key: str, fmt: str) -> str:
        xs = [f[key] for f in got[mode]]
        return f"{format(statistics.median(xs), fmt)} [{format(min(xs), fmt)}-{format(max(xs), fmt)}]"

    head = "iteration ms | buckets started natively | real rank's span in a bucket (us) | loop CPU per step (ms)"
    print(f"| books | {head} |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for mode in MODES:
        print(f"| {mode} | {cell(mode, 'iteration_ms', '.2f')} | {cell(mode, 'native', '.0%')} | "
              f"{cell(mode, 'span_us', '.0f')} | {cell(mode, 'cpu_ms', '.3f')} |")  # fmt: skip


if __name__ == "__main__":
    main()
