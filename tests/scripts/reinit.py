"""Makes the default process group more than once: `--rounds N` destroys it and
inits again N-1 times; `--fail-first-attempt` exits 3 in torchrun's first attempt,
so `--max-restarts` starts the worker again. Each round's allreduce is printed."""

import argparse
import os
import sys

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--rounds", type=int, default=1)
p.add_argument("--fail-first-attempt", action="store_true")
args = p.parse_args()
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
for round_ in range(args.rounds):
    dist.init_process_group("gloo")
    t = torch.ones(1000)
    dist.all_reduce(t)
    dist.barrier()
    print(f"attempt {attempt} round {round_}: allreduce gave {t[0].item():g}", flush=True)
    if args.fail_first_attempt and attempt == 0:
        sys.exit(3)
    dist.destroy_process_group()
