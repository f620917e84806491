"""What drawn skew costs the release-time path, per instance and per start.

    python scripts/bench_skew_timelines.py [--worlds 2,256,4096,16384,65536] [--repeat 20]

Part 1: one instance's timeline, made and asked every release to one real rank (rank 0,
every other rank emulated), the real rank's own boundary sends told in step order as the
live engine tells them: a 1 MiB ring allreduce, an 8-byte binomial broadcast rooted at an
emulated rank, and a dissemination barrier, each without draws (`--skew none`) and with 32
drawn entry delays (`--skew auto|FILE`). A barrier's round waits for every rank whose news
it carries, so its drawn windows cost O(W) an instance; the broadcast asks only the
ancestors of the real rank. Part 2: a native start's Python call under `--skew auto`
(`DrawnStart.at`, the skew's entry and the instance's timeline) on a warm interpreter, per
kind at W = 2, with an optimizer step every five instances. Medians of `--repeat` runs, us.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from neuronabox.controller.release import DrawnStart, ReleaseTiming
from neuronabox.controller.skew import Skew
from neuronabox.delay_models import load as load_model
from neuronabox.topology import LinkClass
from neuronabox.topology import load as load_topology

from neuronabox.schedules.gloo import (
    BinomialBroadcast,
    DisseminationBarrier,
    RealRanks,
    RingAllreduce,
    RingGeometry,
    Schedule,
)
from neuronabox.schedules.kinds import Kind
from neuronabox.schedules.timing import Entry, timeline_for

DRAWS = tuple(i * 1e-4 for i in range(1, 33))  # 0.1 .. 3.2 ms


def schedules(world: int) -> dict[str, Schedule]:
    return {
        "allreduce 1 MiB": RingAllreduce(RingGeometry.for_tensor(world, 1 << 20, 4)),
        "broadcast 8 B": BinomialBroadcast(world, world - 1, 8),
        "barrier": DisseminationBarrier(world),
    }


def instance_us(sched: Schedule, draws: tuple[float, ...], seed: int) -> float:
    """One instance: its timeline made, every release to rank 0 asked, its sends told."""
    hop = LinkClass("hop", 3.1e9, 15e-6)
    real = RealRanks([0], sched.world)
    order = sorted([(m.step, 0, m) for m in sched.sends(0)] + [(m.step, 1, m) for m in sched.recvs(0)],
                   key=lambda e: e[:2])  # fmt: skip
    t = time.perf_counter()
    tl = timeline_for(sched, hop, Entry(1.0, {}, draws, 0.0, seed), real, True, 2e-6)
    for step, is_recv, m in order:
        if is_recv:
            tl.release(m.peer, step)
        else:
            tl.real_sent(0, step, 1.0 + step * 1e-5)
    return (time.perf_counter() - t) * 1e6


def drawn_start_us(repeat: int) -> dict[str, float]:
    """`DrawnStart.at` per kind at W = 2 (warm): the skew's entry and the timeline."""
    topo = load_topology("cpu-25gbe").with_nodes(2, 1)
    timing = ReleaseTiming(load_model("alpha-beta", topo), skew=Skew("auto", seed=0), measure_work=True)
    real = RealRanks([0], 2)
    starts = {name: DrawnStart(timing, kind, nbytes, sched, real, "0") for name, kind, nbytes, sched in (
        ("broadcast 8 B", Kind.BROADCAST, 8, BinomialBroadcast(2, 1, 8)),
        ("barrier", Kind.BARRIER, 0, DisseminationBarrier(2)),
        ("allreduce 4 B", Kind.ALLREDUCE, 4, RingAllreduce(RingGeometry.for_tensor(2, 4, 4))),
        ("allreduce 1 MiB", Kind.ALLREDUCE, 1 << 20, RingAllreduce(RingGeometry.for_tensor(2, 1 << 20, 4))),
    )}  # fmt: skip
    rng, t, tag = random.Random(0), 0.0, 0
    took: dict[str, list[float]] = {name: [] for name in starts}
    for step in range(300 + 200 * repeat):
        timing.skew.on_step()
        for name, start in starts.items():
            t += 1e-3 + rng.random() * 3e-4
            c = time.perf_counter()
            start.at(t, tag, -1.0)
            if step >= 300:  # the skew's places warmed up
                took[name].append((time.perf_counter() - c) * 1e6)
            t += 1e-4
            timing.ended("0", tag, {0: (t - 1e-4, t)})
            tag += 1
    return {name: statistics.median(v) for name, v in took.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worlds", default="2,256,4096,16384,65536")
    p.add_argument("--repeat", type=int, default=20)
    args = p.parse_args()
    worlds = [int(w) for w in args.worlds.split(",")]
    print("| W | collective | releases to the real rank | none us | drawn us | drawn / none |")
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    for w in worlds:
        for name, sched in schedules(w).items():
            none = statistics.median(instance_us(sched, (), 0) for _ in range(args.repeat))
            drawn = statistics.median(instance_us(sched, DRAWS, k) for k in range(args.repeat))
            n = len(sched.recvs(0))
            print(f"| {w} | {name} | {n} | {none:.1f} | {drawn:.1f} | {drawn / none:.2f} |", flush=True)
    print("\n| a native start's Python call, W = 2, `--skew auto` (warm) | us |")
    print("| --- | ---: |")
    for name, us in drawn_start_us(args.repeat).items():
        print(f"| {name} | {us:.1f} |")


if __name__ == "__main__":
    main()
