"""A few DDP steps with small buckets: the reducer rebuilds its buckets at the second
forward (in the order gradients became ready, adopting rank 0's). Prints the rebuilt
bucket sizes and the final loss of each rank."""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(*[nn.Linear(48, 48) for _ in range(6)], nn.Linear(48, 4)), bucket_cap_mb=0.02)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(8, 48), torch.randn(8, 4)
    for _ in range(3):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    sizes = model._get_ddp_logging_data().get("rebuilt_bucket_sizes")
    print(f"rank {rank}: rebuilt bucket sizes {sizes} loss {loss.item():.6f}", flush=True)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
