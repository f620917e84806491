"""How the iteration time grows with the world when emulated ranks vary as real ones do.

    python scripts/bench_skew.py [--script examples/gpt.py] [--steps 3] [--worlds 16,...]

Records one live run (8 nodes, one real rank, alpha-beta on cpu-25gbe, `--trace`), then
simulates its trace at each world size with `--skew none` (every emulated rank on time)
and `--skew auto` (each emulated rank late by draws of the recorded real rank's own
variation between iterations), and prints a markdown table: the iteration time of each,
their ratio, and the simulation's wall time. A ring collective waits for the latest
entry upstream of each message, so the more ranks, the later the latest one.
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


def nbx(*argv: str) -> tuple[str, float]:
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "neuronabox.cli", *argv], capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(argv[:4])} failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    return proc.stdout, time.perf_counter() - t


def iteration_ms(out: str) -> float:
    return float(re.search(r"iteration time ([0-9.]+) ms", out).group(1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--script", default="examples/gpt.py")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--worlds", default="16,64,256,1024,4096")
    ns = p.parse_args()
    trace = Path(tempfile.mkdtemp(prefix="nbx-skew-")) / "live.jsonl"
    out, _ = nbx("torchrun", "--nnodes", "8", "--trace", str(trace), ns.script, "--steps", str(ns.steps))
    print(f"live run: {ns.script} --steps {ns.steps}, 8 nodes, one real rank: iteration {iteration_ms(out):.2f} ms\n")
    print("| W | iteration, --skew none (ms) | iteration, --skew auto (ms) | auto / none | wall none / auto (s) |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for w in ns.worlds.split(","):
        none, t_none = nbx("simulate", str(trace), "--nnodes", w, "--skew", "none")
        auto, t_auto = nbx("simulate", str(trace), "--nnodes", w, "--skew", "auto")
        a, b = iteration_ms(none), iteration_ms(auto)
        print(f"| {w} | {a:.2f} | {b:.2f} | {b / a:.3f} | {t_none:.1f} / {t_auto:.1f} |", flush=True)


if __name__ == "__main__":
    main()
