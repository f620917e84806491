"""This host's tick stalls, and the real-time class that removes them: all-real, W = 2.

    python scripts/bench_realtime.py [--repeat K] [--bytes N] [--reps R] [--idle-spinners]

Two stock torchrun agents on a static rendezvous, rank 0 pinned to core 0 and rank 1 to
core 1, time R allreduces of N bytes (scripts/collective_loop.py), K times per mode,
the modes interleaved (order rotated every round):
- `normal`: the ranks in the normal class, as any job runs;
- `realtime`: the agents, and so the ranks and every thread of theirs, in SCHED_RR
  priority 1, as `neuronabox torchrun --realtime` runs real ranks;
- `idle spinners` (with --idle-spinners): normal ranks, and a busy loop in the idle class
  (SCHED_IDLE) on each core, so that no core ever idles.
Prints a markdown table: per mode the medians of the runs' median, mean and p90 times
and their ranges. On a kernel that leaves a woken thread for the next tick (this VM:
HZ = 250), the normal class has means far above its medians; the real-time class not.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from bench_table1 import all_real_output

HERE = Path(__file__).resolve().parent
WORKER = str(HERE / "collective_loop.py")


def idle_spinners() -> list[subprocess.Popen]:
    def enter(cpu: int):
        def step() -> None:
            os.sched_setaffinity(0, {cpu})
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))

        return step

    loop = [sys.executable, "-c", "while True: pass"]
    return [subprocess.Popen(loop, preexec_fn=enter(cpu)) for cpu in (0, 1)]


def run(nbytes: int, reps: int, realtime: bool) -> list[float]:
    """Rank 0's repetition times, in ms."""
    worker = [WORKER, "--kinds", "allreduce", "--bytes", str(nbytes), "--reps", str(reps), "--announce"]
    try:
        out = all_real_output(worker, realtime)
    except RuntimeError as exc:
        sys.exit(str(exc))
    return [float(ln.split()[2]) * 1e3 for ln in out.splitlines() if ln.startswith("REP ")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=4)
    p.add_argument("--bytes", type=int, default=4096)
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--idle-spinners", action="store_true")
    ns = p.parse_args()
    modes = ["normal", "realtime"] + (["idle spinners"] if ns.idle_spinners else [])
    stats: dict[str, list[tuple[float, float, float]]] = {m: [] for m in modes}
    for k in range(ns.repeat):
        for mode in modes[k % len(modes) :] + modes[: k % len(modes)]:
            spinners = idle_spinners() if mode == "idle spinners" else []
            try:
                xs = run(ns.bytes, ns.reps, realtime=mode == "realtime")
            finally:
                for s in spinners:
                    s.kill()
                    s.wait()
            p90 = statistics.quantiles(xs, n=10)[-1]
            stats[mode].append((statistics.median(xs), statistics.fmean(xs), p90))
            print(f"round {k} {mode:<13} " + json.dumps([round(v, 3) for v in stats[mode][-1]]), file=sys.stderr)

    def cell(vals: list[float]) -> str:
        return f"{statistics.median(vals):.3f} ({min(vals):.3f}-{max(vals):.3f})"

    print(f"| ranks ({ns.bytes} B allreduce, W = 2, {ns.reps} reps, {ns.repeat} runs) | median ms | mean ms | p90 ms |")
    print("| --- | ---: | ---: | ---: |")
    for mode in modes:
        cols = list(zip(*stats[mode], strict=True))
        print(f"| {mode} | {cell(list(cols[0]))} | {cell(list(cols[1]))} | {cell(list(cols[2]))} |")


if __name__ == "__main__":
    main()
