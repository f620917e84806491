"""A toy FSDP2 job: a small MLP, each Linear and then the root `fully_shard`ed over
the whole world, trained a few steps with Adam on fixed data. Each step prints
the loss; the run ends with "rank R: toy trained".

The checks hold with every other rank emulated (zero contributions, so the
averaged gradient is a fraction of the real ranks' own, and an allgather's
emulated blocks copy a real rank's, so the unsharded weights repeat this rank's
rows and whole layers can be dead ReLUs): every loss and gradient is finite,
Adam moves exactly the local shards that ever had a nonzero gradient, and at
least one."""

import argparse
import math
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from checks import expect
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))

    torch.manual_seed(0)  # the same full model on every rank before sharding
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    before = [p.to_local().detach().clone() for p in model.parameters()]
    had_grad = [False] * len(before)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)

    gen = torch.Generator().manual_seed(1000 + rank)  # each rank its own batch, the same on every run
    x = torch.randn(8, 16, generator=gen)
    y = torch.randn(8, 4, generator=gen)
    for step in range(args.steps):
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        expect(math.isfinite(loss.item()), f"step {step}: loss {loss.item()}")
        grads = [p.grad.to_local() if p.grad is not None else torch.zeros(0) for p in model.parameters()]
        expect(all(torch.isfinite(g).all() for g in grads), f"step {step}: non-finite gradient")
        for i, g in enumerate(grads):
            had_grad[i] |= bool(g.abs().sum() > 0)
        opt.step()
        opt.zero_grad()
        print(f"rank {rank}: step {step} loss {loss.item():.6f}", flush=True)

    after = [p.to_local().detach() for p in model.parameters()]
    moved = [not torch.equal(a, b) for a, b in zip(after, before, strict=True)]
    expect(moved == had_grad, f"shards moved {moved}, shards with a gradient {had_grad}")
    expect(any(moved), "no local shard moved")
    print(f"rank {rank}: toy trained", flush=True)
    sys.stdout.flush()
    os._exit(0)  # see collectives.py: stock Gloo teardown aborts now and then


if __name__ == "__main__":
    main()
