"""A rank that ends badly once the job runs: rank --rank exits with --status, or kills
itself with signal --kill. The other ranks then wait in a barrier, which fails (or hangs)
without it: their failures are the consequence, not the cause."""

import argparse
import os
import sys

import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--rank", type=int, default=0)
p.add_argument("--status", type=int, default=3)
p.add_argument("--kill", type=int, default=0)
args = p.parse_args()
dist.init_process_group("gloo")
dist.barrier()
if dist.get_rank() == args.rank:
    sys.stdout.flush()
    if args.kill:
        os.kill(os.getpid(), args.kill)
    os._exit(args.status)  # no interpreter teardown: stock torch may abort in it
dist.barrier()
