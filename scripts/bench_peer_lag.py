"""How a real rank's collective time depends on when its peer enters, at W = 2.

    python scripts/bench_peer_lag.py [--kinds allreduce] [--sizes 28,1M,4M] [--lags 0,20,50,100]
                                     [--repeat 3] [--calls 1000] [--realtime]

Between two real ranks, either may enter a collective first: the one that leaves the
barrier before it posts its receives first, and its peer's sends then go as that peer's
own call writes them. An emulated peer enters no earlier than the controller hears of the
call: at its first frame (the controller cannot know it before), or, for a ring whose size
the call noted, as the note comes, after the note's Python turn. So the emulated peer
never leads. This measures what that costs: all-real runs in which rank 1 enters each
call `--lags` microseconds after rank 0 (busy, after the barrier both leave), against the
emulated run (rank 1 emulated, zero-delay model), Table 1's placements, every run
interleaved `--repeat` times. Rank 0's best call, its deciles and its CPU a call
(scripts/collective_loop.py --rusage): the lag whose all-real row matches the emulated
one is the lead the emulator gives away.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from bench_allreduce import result, write_pinned_placement
from bench_table1 import all_real_output, emulated_output, label, parse_size, rotated

HERE = Path(__file__).resolve().parent
WORKER = str(HERE / "collective_loop.py")


def worker(kind: str, nbytes: int, calls: int, lag_us: float = 0.0) -> list[str]:
    return [WORKER, "--kinds", kind, "--bytes", str(nbytes), "--reps", str(calls), "--rusage", "--lag-us", str(lag_us)]


def all_real_run(w: list[str], realtime: bool) -> Callable[[], dict]:
    return lambda: result(all_real_output(w, realtime))


def emulated_run(w: list[str], placement: Path, realtime: bool) -> Callable[[], dict]:
    return lambda: result(emulated_output(w, placement, realtime=realtime))


def row(kind: str, nbytes: int, run: str, got: list[dict]) -> str:
    def med(key: str, scale: float = 1e3) -> float:
        return statistics.median(g[key] for g in got) * scale

    p10 = statistics.median(g["deciles_s"][0] for g in got) * 1e3
    return (f"| {kind} | {label(nbytes)} | {run} | {med('min_s'):.3f} | {p10:.3f} | {med('median_s'):.3f} "
            f"| {med('cpu_s'):.3f} | {med('vcsw', 1):.1f} |")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kinds", default="allreduce")
    ap.add_argument("--sizes", default="28,1M,4M")
    ap.add_argument("--lags", default="0,20,50,100", help="rank 1's later entry in the all-real runs, microseconds")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--calls", type=int, default=1000, help="timed calls per run")
    ap.add_argument("--realtime", action="store_true", help="every real rank, both sides, in the real-time class")
    args = ap.parse_args()
    lags = [float(x) for x in args.lags.split(",")]
    if args.repeat < 1 or args.calls < 2 or any(x < 0 for x in lags):
        sys.exit("--repeat must be at least 1, --calls at least 2, and every lag at least 0")
    rt = args.realtime
    print("| collective | size | run | best ms | p10 ms | median ms | CPU ms a call | waits a call |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as d:
        placement = Path(d) / "placement.json"
        write_pinned_placement(placement)
        for kind in args.kinds.split(","):
            for size in args.sizes.split(","):
                n = parse_size(size)
                order = [(f"all-real, peer +{lag:g} us", all_real_run(worker(kind, n, args.calls, lag), rt))
                         for lag in lags]  # fmt: skip
                order.append(("emulated", emulated_run(worker(kind, n, args.calls), placement, rt)))
                runs = rotated(order, args.repeat)
                for run, got in runs.items():
                    print(row(kind, n, run, [g[kind] for g in got]), flush=True)


if __name__ == "__main__":
    main()
