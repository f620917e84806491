"""Benchmark worker: times dist.all_reduce of one size on the real rank."""

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--bytes", type=int, required=True)
p.add_argument("--warmup", type=int, default=3)
p.add_argument("--reps", type=int, default=10)
args = p.parse_args()
dist.init_process_group("gloo")
t = torch.ones(args.bytes // 4)
times = []
for i in range(args.warmup + args.reps):
    dist.barrier()
    t0 = time.perf_counter()
    dist.all_reduce(t)
    if i >= args.warmup:
        times.append(time.perf_counter() - t0)
if dist.get_rank() == 0:
    print("RESULT " + json.dumps({"median_s": statistics.median(times), "min_s": min(times)}), flush=True)
dist.barrier()
# Skip interpreter teardown: stock torch 2.13 sometimes aborts in Gloo's destructors.
os._exit(0)
