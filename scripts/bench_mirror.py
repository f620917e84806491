"""What `--data mirror` costs: allreduce on the real rank under zeros and mirror.

Mirror ships the source rank's input to the controller and builds every emulated
message by folding it in once per emulated reducer, so its cost grows with the
bytes and the world. Prints a table (zero-delay model, one real rank).
Usage: python scripts/bench_mirror.py [--reps N]
"""

from __future__ import annotations

import argparse
import sys

from bench_allreduce import emulated

SIZES = [("4 KiB", 4 << 10), ("1 MiB", 1 << 20), ("8 MiB", 8 << 20)]
WORLDS = [8, 32]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    print("| allreduce | --nnodes | zeros (median) | mirror (median) | mirror / zeros |")
    print("|---|---:|---:|---:|---:|")
    for label, nbytes in SIZES:
        for w in WORLDS:
            zeros = emulated(w, nbytes, args.reps, flags=("--data", "zeros"))[0]
            mirror = emulated(w, nbytes, args.reps, flags=("--data", "mirror"))[0]
            row = f"| {label} | {w} | {zeros * 1e3:.2f} ms | {mirror * 1e3:.2f} ms | {mirror / zeros:.1f}x |"
            print(row, flush=True)
            print(f"  done {label} nnodes={w}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
