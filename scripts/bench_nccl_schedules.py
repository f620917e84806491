"""NCCL's schedules at scale: what one collective costs to schedule, and what the
nccl-ring and nccl-tree models predict for it.

Prints two tables:
1. per world size, the wall time to build one rank's message list (`sends`) and to walk
   the ring's timing (`free_time`) for a 64 MiB fp32 allreduce, median of --reps;
2. the allreduce time the two NCCL models predict on a topology (default ib-100g, every
   rank its own node), and which algorithm NCCL's tuner would favour by them; beside
   them, NCCL's schedules walked message by message on the same alpha and beta (the
   walk overlaps a pipeline's latencies with its transfers, the formulas add them).

These are the model's numbers, not a measurement of NCCL: no GPU ran here.

    python scripts/bench_nccl_schedules.py [--topology ib-100g] [--reps 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from neuronabox.delay_models import load as load_model  # noqa: E402
from neuronabox.topology import LinkClass  # noqa: E402
from neuronabox.topology import load as load_topology  # noqa: E402

from neuronabox.schedules import Kind  # noqa: E402
from neuronabox.schedules.nccl import NcclRing, NcclTreeAllreduce  # noqa: E402

WORLDS = (8, 64, 512, 4096, 16384)
SIZES = (4 << 10, 1 << 20, 64 << 20, 1 << 30)


def timed(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def human(nbytes: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size:
            return f"{nbytes // size} {unit}"
    return f"{nbytes} B"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--topology", default="ib-100g")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()

    hop = LinkClass("hop", 12.5e9, 5e-6)
    print("| world | messages per rank | sends() | free_time() |")
    print("|---:|---:|---:|---:|")
    count = (64 << 20) // 4
    for w in WORLDS:
        n_msgs = len(NcclRing(Kind.ALLREDUCE, w, count, 4).sends(0))
        build = timed(lambda w=w, count=count: NcclRing(Kind.ALLREDUCE, w, count, 4).sends(0), args.reps)
        walk = timed(lambda w=w, count=count: NcclRing(Kind.ALLREDUCE, w, count, 4).free_time(hop), args.reps)
        print(f"| {w} | {n_msgs} | {build * 1e3:.1f} ms | {walk * 1e3:.1f} ms |")

    print()
    print(f"allreduce on {args.topology}, every rank its own node (model only):")
    print()
    print("| world | size | nccl-ring | nccl-tree | ring walk | tree walk | faster by the formulas |")
    print("|---:|---:|---:|---:|---:|---:|---|")
    for w in WORLDS:
        topo = load_topology(args.topology).with_nodes(w, 1)
        ring_m, tree_m = load_model("nccl-ring", topo), load_model("nccl-tree", topo)
        for nbytes in SIZES:
            ring_sched = NcclRing(Kind.ALLREDUCE, w, nbytes // 4, 4)
            tree_sched = NcclTreeAllreduce(w, nbytes // 4, 4)
            r = ring_m.collective_time("allreduce", nbytes, w, ring_sched)
            t = tree_m.collective_time("allreduce", nbytes, w, tree_sched)
            link = ring_m.hop("allreduce", nbytes, w)  # the formulas' own alpha and beta, unscaled
            rw, tw = ring_sched.free_time(link), tree_sched.free_time(link)
            faster = "tree" if t < r else "ring"
            print(
                f"| {w} | {human(nbytes)} | {r * 1e3:.3f} ms | {t * 1e3:.3f} ms | "
                f"{rw * 1e3:.3f} ms | {tw * 1e3:.3f} ms | {faster} |"
            )


if __name__ == "__main__":
    main()
