"""Simulation against the live run it was recorded from.

    python scripts/simulate_fidelity.py [--workloads mlp,gpt,cnn] [--nnodes 8,64,512]
        [--topology scripts/lab-1gbe.yaml] [--repeat 1] [--steps 8] [--keep DIR]

For each workload and world size: one live run (one real rank, alpha-beta on the
topology) writes its trace; `neuronabox simulate` replays that trace at the same
world size, topology and model (all read from the trace); the table gives both
iteration times (the median interval between the real rank's optimizer steps) and
the simulation's error against the live run. Repetitions are interleaved, each a
fresh live run; the error column gives the median and the range.

The simulation charges the real rank its recorded software cost per collective (the
median per kind, from the same trace); the last column is the error of the
`--punctual` simulation, the network's times alone, so the table shows how much of
the live iteration the model explains and how much the rank's own cost adds.

The default topology is one whose hop this machine's real rank and controller
keep up with (see docs/benchmarks.md, "Model tracking"): on a faster one the live run
itself misses the model, and the simulation (which gives the model's times)
misses the live run by the same amount.
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
ITERATION = re.compile(r"iteration time ([0-9.]+) ms")


def nbx(*args: str) -> str:
    res = subprocess.run([sys.executable, "-m", "neuronabox.cli", *args], capture_output=True, text=True, cwd=ROOT)
    if res.returncode != 0:
        raise SystemExit(f"neuronabox {' '.join(args[:4])} ...: exit {res.returncode}\n{res.stderr[-2000:]}")
    return res.stdout


def iteration_ms(text: str) -> float:
    m = ITERATION.search(text)
    if m is None:
        raise SystemExit(f"no iteration time in:\n{text[-2000:]}")
    return float(m.group(1))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default="mlp,gpt,cnn")
    p.add_argument("--nnodes", default="8,64,512")
    p.add_argument("--topology", default="scripts/lab-1gbe.yaml")
    p.add_argument("--delay-model", default="alpha-beta")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--keep", help="keep the live traces in this folder")
    ns = p.parse_args()
    folder = Path(ns.keep or tempfile.mkdtemp(prefix="nbx-simfid-"))
    folder.mkdir(parents=True, exist_ok=True)
    cells = [(w, int(n)) for w in ns.workloads.split(",") for n in ns.nnodes.split(",")]
    results: dict[tuple[str, int], list[tuple[float, float, float, float]]] = {c: [] for c in cells}
    for rep in range(ns.repeat):
        for work, n in cells:
            trace = folder / f"{work}-{n}-{rep}.jsonl"
            live = iteration_ms(nbx("torchrun", "--nnodes", str(n), "--topology", ns.topology,
                                    "--delay-model", ns.delay_model, "--trace", str(trace),
                                    f"examples/{work}.py", "--steps", str(ns.steps)))  # fmt: skip
            t0 = time.perf_counter()
            sim = iteration_ms(nbx("simulate", str(trace)))
            wall = time.perf_counter() - t0
            punctual = iteration_ms(nbx("simulate", str(trace), "--punctual"))
            results[work, n].append((live, sim, wall, punctual))
            print(f"# {work} W={n} rep {rep}: live {live:.2f} ms, simulated {sim:.2f} ms, punctual {punctual:.2f} ms",
                  file=sys.stderr, flush=True)  # fmt: skip
    print(f"topology {ns.topology}, {ns.delay_model}, one real rank, {ns.steps} steps, {ns.repeat} repetition(s)")
    print("| workload | W | live iteration (ms) | simulated (ms) | error (median) | error (range) "
          "| simulate wall (s) | punctual error (median) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for work, n in cells:
        rows = results[work, n]
        errs = [(s - li) / li * 100 for li, s, _, _ in rows]
        bare = statistics.median((p - li) / li * 100 for li, _, _, p in rows)
        live = statistics.median(r[0] for r in rows)
        sim = statistics.median(r[1] for r in rows)
        wall = statistics.median(r[2] for r in rows)
        print(f"| {work} | {n} | {live:.2f} | {sim:.2f} | {statistics.median(errs):+.2f}% "
              f"| {min(errs):+.2f}% .. {max(errs):+.2f}% | {wall:.2f} | {bare:+.2f}% |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
