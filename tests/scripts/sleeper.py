"""A rank that joins the job, says so, and then computes (sleeps) for a long time
without a collective: nothing on the wire tells it the run has ended."""

import time

import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
print(f"rank {dist.get_rank()}: ready", flush=True)
time.sleep(600)
