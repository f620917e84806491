"""Simulation cost against the world size.

    python scripts/bench_simulate.py [--script examples/gpt.py] [--steps 3] [--repeat 3]
        [--worlds 16,64,256,1024,4096,16384] [--trace FILE]

Records one live run (8 nodes, one real rank, alpha-beta on cpu-25gbe), or takes
`--trace`, then runs `neuronabox simulate` on it at each world size, `--repeat` times
(the sizes interleaved), and prints a markdown table per world size: the simulated
iteration time; the whole command's wall time per iteration (the trace's iterations:
its optimizer steps, `--warmup` ones included), as the median and range of the
repeats; the simulation's own wall time (the command's report, without the
interpreter's start and exit); and the boundary messages it simulated, with their
rate over the simulation's own time.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def record(script: str, steps: int) -> Path:
    trace = Path(tempfile.mkdtemp(prefix="nbx-sim-")) / "live.jsonl"
    live = subprocess.run(
        [sys.executable, "-m", "neuronabox.cli", "torchrun", "--nnodes", "8", "--trace", str(trace),
         script, "--steps", str(steps)],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    if live.returncode != 0:
        sys.exit(f"the live run failed: {(live.stderr.strip().splitlines() or ['?'])[-1]}")
    m = re.search(r"iteration time ([0-9.]+) ms", live.stdout)
    print(f"live run: {script} --steps {steps}, 8 nodes: iteration {m.group(1) if m else '?'} ms")
    return trace


def simulate(trace: Path, world: int) -> dict:
    t0 = time.perf_counter()
    sim = subprocess.run([sys.executable, "-m", "neuronabox.cli", "simulate", str(trace), "--nnodes", str(world)],
                         capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    wall = time.perf_counter() - t0
    if sim.returncode != 0:
        sys.exit(f"simulate at {world} failed: {(sim.stderr.strip().splitlines() or ['?'])[-1]}")
    steps = re.search(r"optimizer steps (\d+)\s+iteration time ([0-9.]+) ms", sim.stdout)
    own = re.search(r"simulated in\s+([0-9.]+) s of wall time: (\d+) boundary messages", sim.stdout)
    if steps is None or own is None:
        sys.exit(f"simulate at {world}: no iteration time or wall time in its report")
    return {"wall": wall, "iterations": int(steps.group(1)), "iteration_ms": float(steps.group(2)),
            "own": float(own.group(1)), "boundary": int(own.group(2))}  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--script", default="examples/gpt.py")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--worlds", default="16,64,256,1024,4096,16384")
    p.add_argument("--trace", help="simulate this recording instead of making one")
    ns = p.parse_args()
    trace = Path(ns.trace) if ns.trace else record(ns.script, ns.steps)
    worlds = [int(w) for w in ns.worlds.split(",")]
    runs: dict[int, list[dict]] = {w: [] for w in worlds}
    for _ in range(ns.repeat):
        for w in worlds:
            runs[w].append(simulate(trace, w))
    print(f"trace: {runs[worlds[0]][0]['iterations']} iterations; {ns.repeat} runs per world size, interleaved\n")
    print("| world | iteration (ms, simulated) | wall per iteration (s) | simulation's own wall (s) "
          "| boundary messages | messages per second |")
    print("|---:|---:|---:|---:|---:|---:|")
    for w in worlds:
        rs = runs[w]
        per = [r["wall"] / r["iterations"] for r in rs]
        own = statistics.median(r["own"] for r in rs)
        rate = rs[0]["boundary"] / own if own > 0 else float("inf")
        print(f"| {w} | {rs[0]['iteration_ms']:.2f} | {statistics.median(per):.3f} ({min(per):.3f}-{max(per):.3f})"
              f" | {own:.2f} | {rs[0]['boundary']} | {rate / 1e6:.2f}M |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
