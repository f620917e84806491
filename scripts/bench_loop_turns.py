"""Where the controller's Python turns fall against the real rank's calls, at W = 2.

    python scripts/bench_loop_turns.py [--kinds allreduce] [--sizes 4M] [--runs 3] [--calls 200]
                                       [--realtime] [--reference]

The controller's loop serves the pair sockets natively and comes back to Python for its
own events and its idle work: adopting the books it started natively, publishing records
(0.1-0.4 ms a turn, its caches cold from the call's own copies). A turn that falls inside
one of the real rank's calls, while the real rank still has messages to send, makes them
wait. Each run here is Table 1's emulated run (the real rank on core 0, the launcher and the
controller on core 1, zero-delay model): the controller logs each Python turn
(NEURONABOX_TURN_LOG) and the real rank each timed call (scripts/collective_loop.py
--calls-out), on one clock. Per run: the calls a turn overlaps, the Python time inside calls
per call, where in the call those turns began (the share of the call before them), and the
calls' medians with a turn inside and without. `--reference` alternates each run with one
whose loop holds idle work off by the busy window alone (NEURONABOX_HOLD_IN_FLIGHT=0, as
before books in flight held it: docs/architecture.md, "Books in flight").
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from bench_allreduce import write_pinned_placement
from bench_table1 import emulated_output, label, parse_size

HERE = Path(__file__).resolve().parent
TURN_S = 20e-6  # a turn shorter than this is the loop's own bookkeeping (a Python event), not idle work

HEADER = (
    "| collective | size | loop | run | calls | calls with a turn inside | Python us inside, a call | "
    "turns began at (share of the call) | median ms, turn inside / none |\n"
    "|---|---:|---|---:|---:|---:|---:|---:|---:|"
)


def overlaps(calls: list[list[float]], turns: list[list[float]]) -> list[tuple[float, float, list[float]]]:
    """Per call: its length, the Python time of turns inside it, and where each such turn
    began (its share of the call; 0 for one begun before the call)."""
    turns = sorted((a, b) for a, b, _ in turns if b - a >= TURN_S)
    out, k = [], 0
    for t0, t1 in calls:
        while k < len(turns) and turns[k][1] <= t0:
            k += 1
        inside, at, j = 0.0, [], k
        while j < len(turns) and turns[j][0] < t1:
            a, b = turns[j]
            inside += min(b, t1) - max(a, t0)
            at.append(max(0.0, (a - t0) / (t1 - t0)))
            j += 1
        out.append((t1 - t0, inside, at))
    return out


def run_once(kinds: str, nbytes: int, calls: int, placement: Path, realtime: bool, hold: bool, tmp: Path) -> list:
    calls_path, turns_path = tmp / "calls.json", tmp / "turns.json"
    worker = [str(HERE / "collective_loop.py"), "--kinds", kinds, "--bytes", str(nbytes), "--reps", str(calls)]
    env = {"NEURONABOX_TURN_LOG": str(turns_path), "NEURONABOX_HOLD_IN_FLIGHT": "1" if hold else "0"}
    emulated_output([*worker, "--calls-out", str(calls_path)], placement, env, realtime)
    return overlaps(json.loads(calls_path.read_text()), json.loads(turns_path.read_text()))


def row(kind: str, nbytes: int, loop: str, run: int, per_call: list) -> str:
    hit = [c for c in per_call if c[1] > 0]
    clear = [c for c in per_call if c[1] == 0]
    began = sorted(a for c in hit for a in c[2])
    began_s = f"{began[len(began) // 2]:.2f} ({began[0]:.2f} .. {began[-1]:.2f})" if began else "-"

    def med(cs: list) -> str:
        return f"{statistics.median(c[0] for c in cs) * 1e3:.3f}" if cs else "-"

    inside = sum(c[1] for c in per_call) / len(per_call) * 1e6
    return (
        f"| {kind} | {label(nbytes)} | {loop} | {run} | {len(per_call)} | {len(hit)} | {inside:.0f} | {began_s} | "
        f"{med(hit)} / {med(clear)} |"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kinds", default="allreduce")
    p.add_argument("--sizes", default="4M")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--realtime", action="store_true", help="the real rank in the real-time class")
    p.add_argument("--reference", action="store_true", help="alternate with the busy window alone")
    args = p.parse_args()
    loops = [("held in flight", True), ("busy window alone", False)] if args.reference else [("held in flight", True)]
    print(HEADER)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        placement = tmp / "placement.json"
        write_pinned_placement(placement)
        for kind in args.kinds.split(","):
            for nbytes in map(parse_size, args.sizes.split(",")):
                for run in range(args.runs):
                    order = loops if run % 2 == 0 else loops[::-1]  # interleaved, the order flipped
                    for name, hold in order:
                        per_call = run_once(kind, nbytes, args.calls, placement, args.realtime, hold, tmp)
                        print(row(kind, nbytes, name, run, per_call), flush=True)


if __name__ == "__main__":
    main()
