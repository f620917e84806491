"""Benchmark worker: times collectives on the real rank.

Each repetition starts after a barrier, so every rank enters together (after `--work-ms`
of compute each, if given; `--lag-us` more for every rank but the first real one); the first
real rank prints one line, RESULT {kind: {median_s,
min_s, mean_s}}. `--rusage` adds what the rank's process spent per timed call (getrusage
around it, all its threads): the median CPU (cpu_s), voluntary context switches (waits,
vcsw) and page faults (minflt), and the calls' deciles (deciles_s). `--calls-out FILE`: the
first real rank writes each timed call's [start, end] there (JSON; perf_counter, which is
CLOCK_MONOTONIC on Linux, as the controller's turn log is: scripts/bench_loop_turns.py).
"""

import argparse
import json
import os
import resource
import statistics
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--kinds", default="allreduce")
p.add_argument("--bytes", type=int, default=4096)
p.add_argument("--root", type=int, default=0, help="broadcast root")
p.add_argument("--warmup", type=int, default=3)
p.add_argument("--reps", type=int, default=10)
p.add_argument("--announce", action="store_true", help="print each timed repetition as it ends")
p.add_argument("--work-ms", type=float, default=0.0, help="each rank computes this long before each collective")
p.add_argument("--rusage", action="store_true", help="also the process's CPU, waits and faults per call")
p.add_argument("--calls-out", help="the first real rank writes each timed call's [start, end] here (JSON)")
p.add_argument("--lag-us", type=float, default=0.0, help="every rank but the first real one enters each call this late")
args = p.parse_args()
dist.init_process_group("gloo")
real = [int(r) for r in os.environ.get("NEURONABOX_REAL_RANKS", "0").split(",")]
lags = args.lag_us > 0 and dist.get_rank() != real[0]
world = dist.get_world_size()
t = torch.ones(max(1, args.bytes // 4))
block = torch.ones(max(1, args.bytes // 4 // world))
gathered = [torch.empty_like(block) for _ in range(world)]
ops = {
    "allreduce": lambda: dist.all_reduce(t),
    "allgather": lambda: dist.all_gather(gathered, block),
    "broadcast": lambda: dist.broadcast(t, src=args.root),
    "barrier": lambda: dist.barrier(),
}
out = {}
spans: list[tuple[float, float]] = []  # each timed call's (start, end), for --calls-out
for kind in args.kinds.split(","):
    times, used = [], []
    for i in range(args.warmup + args.reps):
        dist.barrier()
        if args.work_ms:  # a training step's compute: busy, as a model's kernels keep the core
            until = time.perf_counter() + args.work_ms / 1e3
            while time.perf_counter() < until:
                pass
        if lags:  # a peer that leaves the barrier later (busy, as a rank still in its own work)
            until = time.perf_counter() + args.lag_us / 1e6
            while time.perf_counter() < until:
                pass
        r0 = resource.getrusage(resource.RUSAGE_SELF) if args.rusage else None  # outside the timed call
        t0 = time.perf_counter()
        ops[kind]()
        if i >= args.warmup:
            t1 = time.perf_counter()
            times.append(t1 - t0)
            spans.append((t0, t1))
            if r0 is not None:
                r1 = resource.getrusage(resource.RUSAGE_SELF)
                used.append((r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime, r1.ru_nvcsw - r0.ru_nvcsw,
                             r1.ru_minflt - r0.ru_minflt))  # fmt: skip
            if args.announce and dist.get_rank() == 0:
                print(f"REP {kind} {times[-1]:.6f}", flush=True)
    out[kind] = {"median_s": statistics.median(times), "min_s": min(times), "mean_s": statistics.fmean(times)}
    if args.rusage:
        for k, name in enumerate(("cpu_s", "vcsw", "minflt")):
            out[kind][name] = statistics.median(u[k] for u in used)
        out[kind]["deciles_s"] = statistics.quantiles(times, n=10, method="inclusive") if len(times) > 1 else times
if dist.get_rank() == real[0] and args.calls_out:
    with open(args.calls_out, "w") as f:
        json.dump(spans, f)
if dist.get_rank() == real[0]:
    print("RESULT " + json.dumps(out), flush=True)
dist.barrier()
# Skip interpreter teardown: stock torch 2.13 sometimes aborts in Gloo's destructors.
os._exit(0)
