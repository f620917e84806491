"""A rank that joins the job, says so, and then computes (sleeps) for a long time
without a collective: nothing on the wire tells it the run has ended. With
--stall-rank R only rank R sleeps; the others enter a barrier and wait there for it."""

import argparse
import time

import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--stall-rank", type=int, default=-1)
args = p.parse_args()
dist.init_process_group("gloo")
dist.barrier()
print(f"rank {dist.get_rank()}: ready", flush=True)
if args.stall_rank >= 0 and dist.get_rank() != args.stall_rank:
    dist.barrier()
time.sleep(600)
