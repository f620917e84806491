"""A large allreduce at W = 2 in steady state: all-real against emulated, busy and sleeping loop.

    python scripts/bench_large_allreduce.py [--repeat K] [--bytes N] [--reps R]

Every real rank in the real-time class (`--realtime`: no tick stalls, so the medians
hold still), each on a core of its own; zero-delay model. Per round, interleaved and
rotated: all-real (bench_table1's pinned pair), emulated with the controller polling its
core while frames come (the default busy window), and emulated with its loop sleeping
between frames (NEURONABOX_BUSY_POLL=0). Each run times R allreduces of N bytes on rank
0; the table gives the medians over rounds of each run's median over its first 30
repetitions (what Table 1's 30 see) and over the rest (steady state), and of its best.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from bench_allreduce import write_pinned_placement
from bench_table1 import all_real_output, emulated_output

HERE = Path(__file__).resolve().parent
WORKER = str(HERE / "collective_loop.py")
FIRST = 30


def times_ms(out: str) -> list[float]:
    return [float(ln.split()[2]) * 1e3 for ln in out.splitlines() if ln.startswith("REP ")]


def emulated(worker: list[str], placement: Path, busy: bool) -> list[float]:
    try:
        out = emulated_output(worker, placement, {"NEURONABOX_BUSY_POLL": "1" if busy else "0"}, realtime=True)
    except RuntimeError as exc:
        sys.exit(f"emulated run failed: {(str(exc).strip().splitlines() or ['?'])[-1]}")
    return times_ms(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--bytes", type=int, default=4 << 20)
    p.add_argument("--reps", type=int, default=200)
    ns = p.parse_args()
    if ns.reps <= FIRST:
        sys.exit(f"--reps must exceed {FIRST}: the steady state is what comes after them")
    worker = [WORKER, "--kinds", "allreduce", "--bytes", str(ns.bytes), "--reps", str(ns.reps), "--announce"]
    modes = ["all-real", "emulated, busy window", "emulated, sleeping loop"]
    got: dict[str, list[tuple[float, float, float]]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as d:
        placement = Path(d) / "placement.json"
        write_pinned_placement(placement)
        for k in range(ns.repeat):
            for mode in modes[k % len(modes) :] + modes[: k % len(modes)]:
                if mode == "all-real":
                    xs = times_ms(all_real_output(worker, realtime=True))
                else:
                    xs = emulated(worker, placement, busy=mode.endswith("busy window"))
                got[mode].append((statistics.median(xs[:FIRST]), statistics.median(xs[FIRST:]), min(xs)))
                print(f"round {k} {mode:<24} " + " ".join(f"{v:.3f}" for v in got[mode][-1]), file=sys.stderr)

    def cell(vals: list[float]) -> str:
        return f"{statistics.median(vals):.3f} ({min(vals):.3f}-{max(vals):.3f})"

    print(f"| {ns.bytes} B allreduce, W = 2, real-time class | first {FIRST} ms | the rest ms | best ms |")
    print("| --- | ---: | ---: | ---: |")
    for mode in modes:
        first, rest, best = (list(c) for c in zip(*got[mode], strict=True))
        print(f"| {mode} | {cell(first)} | {cell(rest)} | {cell(best)} |")


if __name__ == "__main__":
    main()
