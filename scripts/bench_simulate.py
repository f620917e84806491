"""Simulation cost against the world size.

    python scripts/bench_simulate.py [--script examples/gpt.py] [--steps 3]

Records one live run (8 nodes, one real rank, alpha-beta on cpu-25gbe), then runs
`neuronabox simulate` on its trace at 16 to 16384 ranks and prints, per world
size, the simulated iteration time and the simulation's wall time.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--script", default="examples/gpt.py")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--worlds", default="16,64,256,1024,4096,16384")
    ns = p.parse_args()
    trace = Path(tempfile.mkdtemp(prefix="nbx-sim-")) / "live.jsonl"
    live = subprocess.run(
        [sys.executable, "-m", "neuronabox.cli", "torchrun", "--nnodes", "8", "--trace", str(trace),
         ns.script, "--steps", str(ns.steps)],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    if live.returncode != 0:
        print(live.stderr[-2000:], file=sys.stderr)
        return 1
    m = re.search(r"iteration time ([0-9.]+) ms", live.stdout)
    print(f"live run: {ns.script} --steps {ns.steps}, 8 nodes: iteration {m.group(1) if m else '?'} ms")
    print(f"{'world':>7} {'iteration (ms)':>15} {'allreduce mean (ms)':>20} {'wall (s)':>9} {'wall / step (s)':>16}")
    for w in map(int, ns.worlds.split(",")):
        t0 = time.perf_counter()
        sim = subprocess.run([sys.executable, "-m", "neuronabox.cli", "simulate", str(trace), "--nnodes", str(w)],
                             capture_output=True, text=True, cwd=ROOT)  # fmt: skip
        wall = time.perf_counter() - t0
        if sim.returncode != 0:
            print(sim.stderr[-2000:], file=sys.stderr)
            return 1
        it = re.search(r"iteration time ([0-9.]+) ms", sim.stdout)
        ar = re.search(r"allreduce\s+\d+\s+\d+\s+([0-9.]+) ms", sim.stdout)
        print(f"{w:>7} {it.group(1) if it else '?':>15} {ar.group(1) if ar else '?':>20} {wall:>9.2f}"
              f" {wall / ns.steps:>16.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
