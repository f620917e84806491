"""How a real rank's collective time depends on when its peer enters, at W = 2.

    python scripts/bench_peer_lag.py [--kinds allreduce] [--sizes 28,1M,4M] [--lags 0,20,50,100]
                                     [--repeat 3] [--calls 1000] [--realtime]

Between two real ranks, either may enter a collective first: the one that leaves the
barrier before it posts its receives first, and its peer's sends then go as that peer's
own call writes them. An emulated peer enters no earlier than the controller hears of the
call: at its first frame (the controller cannot know it before), or, for a ring whose size
the call noted, as the note comes (read by the controller's core: such a peer leads, and
costs the real rank's one core a wake-up; docs/fidelity.md, "A note the core reads").
This measures what a peer's entry costs: all-real runs in which rank 1 enters each
call `--lags` microseconds after rank 0 (busy, after the barrier both leave), against the
emulated run (rank 1 emulated, zero-delay model), Table 1's placements, every run
interleaved `--repeat` times. Rank 0's calls in bench_call_cost.py's columns (the best,
the deciles, the CPU and waits a call): the lag whose all-real row matches the emulated
one is how late a peer the emulated one reads as.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from bench_allreduce import result
from bench_call_cost import print_table, worker
from bench_table1 import all_real_output, emulated_output


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

    def runs_of(n: int, placement: Path) -> list[tuple[str, Callable[[], dict]]]:
        late = {lag: worker(args.kinds, n, args.calls, lag) for lag in lags}
        order = [(f"all-real, peer +{lag:g} us", lambda w=w: result(all_real_output(w, rt))) for lag, w in late.items()]
        w = worker(args.kinds, n, args.calls)
        return [*order, ("emulated", lambda: result(emulated_output(w, placement, realtime=rt)))]

    print_table(args.kinds, args.sizes, args.repeat, runs_of)


if __name__ == "__main__":
    main()
