"""A toy tensor x data parallel job: a 2-D device mesh ("dp", "tp") from
init_device_mesh("cpu", ...) (or, with --groups new_group, the same groups built
by hand with dist.new_group), and a Megatron-style MLP: a column-parallel Linear
(each tp rank holds a slice of the hidden units), ReLU, a row-parallel Linear
whose partial outputs are all_reduced in the tp group (identity in backward),
then a replicated bias. Gradients are averaged over the dp group; SGD steps.
The tp ranks of a replica see the same batch. Each step prints the loss; the run
ends with "rank R: toy trained".

Checks that hold with emulated ranks (zero contributions; an allgather's
emulated blocks copy a real rank's): every loss is finite, the tp ranks of a
replica agree on the loss (all_gather in the tp group), and every parameter
shard moves."""

import argparse
import math
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from checks import expect

IN, HIDDEN, OUT = 16, 32, 8


class ReduceFromTP(torch.autograd.Function):
    """all_reduce over the tp group in forward, identity in backward."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class ParallelMLP(nn.Module):
    def __init__(self, tp_rank: int, tp: int, tp_group) -> None:
        super().__init__()
        torch.manual_seed(0)  # the full weights, equal everywhere; keep this rank's slices
        w1, b1 = torch.randn(HIDDEN, IN) / IN**0.5, torch.zeros(HIDDEN)
        w2, b2 = torch.randn(OUT, HIDDEN) / HIDDEN**0.5, torch.zeros(OUT)
        cols = slice(tp_rank * HIDDEN // tp, (tp_rank + 1) * HIDDEN // tp)
        self.w1 = nn.Parameter(w1[cols].clone())  # column parallel: a slice of the outputs
        self.b1 = nn.Parameter(b1[cols].clone())
        self.w2 = nn.Parameter(w2[:, cols].clone())  # row parallel: a slice of the inputs
        self.b2 = nn.Parameter(b2.clone())  # replicated, added once after the reduction
        self.tp_group = tp_group

    def forward(self, x):
        h = torch.relu(x @ self.w1.t() + self.b1)
        return ReduceFromTP.apply(h @ self.w2.t(), self.tp_group) + self.b2


def groups(mode: str, dp: int, tp: int, rank: int):
    if mode == "mesh":
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
        return mesh.get_group("dp"), mesh.get_group("tp")
    dp_group = tp_group = None
    for d in range(dp):  # every rank creates every group, in the same order: the tp groups, then the dp groups
        g = dist.new_group([d * tp + t for t in range(tp)])
        if rank // tp == d:
            tp_group = g
    for t in range(tp):
        g = dist.new_group([d * tp + t for d in range(dp)])
        if rank % tp == t:
            dp_group = g
    return dp_group, tp_group


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--groups", choices=("mesh", "new_group"), default="mesh")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    tp = args.tp
    assert world % tp == 0, f"world {world} is not a multiple of tp {tp}"
    dp = world // tp
    dp_rank, tp_rank = divmod(rank, tp)
    dp_group, tp_group = groups(args.groups, dp, tp, rank)
    expect(dist.get_world_size(dp_group) == dp and dist.get_rank(dp_group) == dp_rank, "dp group")
    expect(dist.get_world_size(tp_group) == tp and dist.get_rank(tp_group) == tp_rank, "tp group")

    model = ParallelMLP(tp_rank, tp, tp_group)
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1000 + dp_rank)  # one batch per replica, shared by its tp ranks
    x, y = torch.randn(8, IN, generator=gen), torch.randn(8, OUT, generator=gen)
    for step in range(args.steps):
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad, group=dp_group)
            p.grad /= dp
        opt.step()
        opt.zero_grad()
        expect(math.isfinite(loss.item()), f"step {step}: loss {loss.item()}")
        seen = [torch.empty(1) for _ in range(tp)]
        dist.all_gather(seen, loss.detach().reshape(1), group=tp_group)
        expect(all(torch.equal(s, seen[0]) for s in seen), f"step {step}: tp ranks disagree on the loss {seen}")
        print(f"rank {rank}: dp {dp_rank} tp {tp_rank} step {step} loss {loss.item():.6f}", flush=True)

    for name, b, p in zip(("w1", "b1", "w2", "b2"), before, model.parameters(), strict=True):
        expect(not torch.equal(b, p.detach()), f"{name} did not move")
    print(f"rank {rank}: toy trained", flush=True)
    sys.stdout.flush()
    os._exit(0)  # see collectives.py: stock Gloo teardown aborts now and then


if __name__ == "__main__":
    main()
