"""What the real rank spends in one collective call, all-real against emulated, at W = 2.

    python scripts/bench_call_cost.py [--kinds allgather,allreduce] [--sizes 1M,16M,64M] [--repeat 3]
                                      [--calls 60] [--realtime] [--huge-pages transparent|reserved]

Table 1 (scripts/bench_table1.py) gives a call's time; this says where it goes. The
placements are Table 1's (all-real: rank 0 on core 0, rank 1 on core 1; emulated: the
real rank on core 0, the launcher and the controller on core 1, zero-delay model), the
two alternating `--repeat` times. Rank 0 times `--calls` calls of each kind
(scripts/collective_loop.py --rusage) and its process's getrusage around each: the CPU it
used in the call (all its threads: Gloo's reads run on a thread of its own), how often it
waited (voluntary context switches) and the pages it faulted in. A call that takes longer
than its CPU waited for its peer; the deciles show whether a best repetition is the
common case or a rare tail.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from bench_allreduce import result, write_pinned_placement
from bench_table1 import all_real_output, emulated_output, label, parse_size, rotated, use_huge_pages

from neuronabox.fidelity.huge_pages import MODES

HERE = Path(__file__).resolve().parent
WORKER = str(HERE / "collective_loop.py")


def worker(kinds: str, nbytes: int, calls: int, lag_us: float = 0.0) -> list[str]:
    """collective_loop.py with --rusage; `lag_us`: every rank but the first real one enters each call this late."""
    return [WORKER, "--kinds", kinds, "--bytes", str(nbytes), "--reps", str(calls), "--rusage", "--lag-us", str(lag_us)]


HEADER = (  # the columns of `row`
    "| collective | size | run | best ms | p10 / p50 / p90 ms | median ms | CPU ms a call | median less CPU "
    "| waits a call | faults a call |\n|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"
)


def row(kind: str, nbytes: int, mode: str, runs: list[dict]) -> str:
    """One line of the table: medians over the runs of each run's figures."""

    def med(key: str, scale: float = 1e3) -> float:
        return statistics.median(r[key] for r in runs) * scale

    deciles = [statistics.median(r["deciles_s"][k] for r in runs) * 1e3 for k in (0, 4, 8)]
    wall = med("median_s")
    return (
        f"| {kind} | {label(nbytes)} | {mode} | {med('min_s'):.3f} | {deciles[0]:.3f} / {deciles[1]:.3f} / "
        f"{deciles[2]:.3f} | {wall:.3f} | {med('cpu_s'):.3f} | {wall - med('cpu_s'):+.3f} | "
        f"{med('vcsw', 1):.1f} | {med('minflt', 1):.0f} |"
    )


def print_table(
    kinds: str, sizes: str, repeat: int, runs_of: Callable[[int, Path], list[tuple[str, Callable[[], dict]]]]
) -> None:
    """HEADER, then for each of `sizes` the runs `runs_of(nbytes, placement)` names (Table 1's
    placements), rotated `repeat` times, a row per kind and run."""
    print(HEADER)
    with tempfile.TemporaryDirectory() as d:
        placement = Path(d) / "placement.json"
        write_pinned_placement(placement)
        for size in sizes.split(","):
            n = parse_size(size)
            runs = rotated(runs_of(n, placement), repeat)
            for kind in kinds.split(","):
                for mode, got in runs.items():
                    print(row(kind, n, mode, [g[kind] for g in got]), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kinds", default="allgather,allreduce")
    ap.add_argument("--sizes", default="1M,16M,64M")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--calls", type=int, default=60, help="timed calls per run")
    ap.add_argument("--realtime", action="store_true", help="every real rank, both sides, in the real-time class")
    ap.add_argument("--huge-pages", choices=sorted(MODES), help="both sides on 2 MiB pages (validate's)")
    args = ap.parse_args()
    if args.repeat < 1 or args.calls < 2:
        sys.exit("--repeat must be at least 1 and --calls at least 2")
    use_huge_pages(args.huge_pages)
    rt = args.realtime

    def runs_of(n: int, placement: Path) -> list[tuple[str, Callable[[], dict]]]:
        w = worker(args.kinds, n, args.calls)
        return [("all-real", lambda: result(all_real_output(w, rt))),
                ("emulated", lambda: result(emulated_output(w, placement, realtime=rt)))]  # fmt: skip

    print_table(args.kinds, args.sizes, args.repeat, runs_of)


if __name__ == "__main__":
    main()
