"""A collective right after compute, at W = 2: where a training step's collectives come.

Each repetition: a barrier, then `--work-ms` of busy compute on every rank, then the
timed collective (scripts/collective_loop.py --work-ms). Table 1 times collectives back
to back, so the controller's loop is always awake; here it has been idle for the whole
compute, as in a training step. Three runs alternate `--repeat` times, the order rotated:
all-real (two stock torchrun agents, each rank on a core of its own), emulated (the real
rank on core 0, the launcher and controller on core 1, zero-delay model), and emulated with
the loop sleeping once its busy window closes (NEURONABOX_SPIN_POLL=0, the loop before the
spin). Medians of the per-run medians with their range, and of each run's best repetition.
`--realtime`: every real rank of every run in the real-time class, as Table 1's.

Usage: python scripts/bench_after_compute.py [--repeat K] [--work-ms 2] [--sizes 1K,64K] [--realtime]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from bench_allreduce import result, write_pinned_placement
from bench_table1 import (
    KINDS,
    WORKER,
    all_real_output,
    emulated_output,
    label,
    overhead,
    parse_size,
    per_kind,
    rotated,
)

SLEEPING = {"NEURONABOX_SPIN_POLL": "0"}
REPS = 300


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--work-ms", type=float, default=2.0)
    ap.add_argument("--sizes", default="1K,64K")
    ap.add_argument("--realtime", action="store_true", help="every real rank in the real-time class")
    args = ap.parse_args()
    rt, rows = args.realtime, []
    with tempfile.TemporaryDirectory() as d:
        placement = Path(d) / "placement.json"
        write_pinned_placement(placement)
        for nbytes in (parse_size(s) for s in args.sizes.split(",")):
            worker = [WORKER, "--kinds", KINDS, "--bytes", str(nbytes), "--reps", str(REPS)]
            worker += ["--work-ms", str(args.work_ms)]
            order = [
                ("all-real", lambda w=worker: result(all_real_output(w, rt))),
                ("emulated", lambda w=worker: result(emulated_output(w, placement, None, rt))),
                ("sleeping", lambda w=worker: result(emulated_output(w, placement, SLEEPING, rt))),
            ]
            rows += [(kind, nbytes, got) for kind, got in per_kind(rotated(order, args.repeat)).items()]
            print(f"  done {label(nbytes)}", file=sys.stderr, flush=True)

    def us(xs: list[float]) -> str:
        return f"{statistics.median(xs) * 1e6:.1f} ({min(xs) * 1e6:.1f}-{max(xs) * 1e6:.1f})"

    print(f"after {args.work_ms:g} ms of compute; medians of {args.repeat} runs' medians (range), us")
    print("| collective | size | all-real | emulated | overhead | sleeping loop | overhead "
          "| best: all-real / emulated / sleeping | overhead, emulated / sleeping |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for kind, nbytes, got in sorted(rows, key=lambda r: (r[0], r[1])):
        med = {m: [r["median_s"] for r in rs] for m, rs in got.items()}
        best = {m: [r["min_s"] for r in rs] for m, rs in got.items()}
        a, e, s = med["all-real"], med["emulated"], med["sleeping"]
        ba, be, bs = best["all-real"], best["emulated"], best["sleeping"]
        b = " / ".join(f"{statistics.median(x) * 1e6:.1f}" for x in (ba, be, bs))
        print(f"| {kind} | {label(nbytes)} | {us(a)} | {us(e)} | {overhead(a, e)} | {us(s)} | {overhead(a, s)} "
              f"| {b} | {overhead(ba, be)} / {overhead(ba, bs)} |")  # fmt: skip


if __name__ == "__main__":
    main()
