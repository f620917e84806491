"""A toy pipeline-parallel job: world = stages x replicas, stage-major (rank =
stage * replicas + replica). Each rank holds one Linear block of its replica's
pipeline; per step, GPipe style, every microbatch's activations go forward with
dist.send/recv, the last stage computes an MSE loss, and the gradients w.r.t. the
activations come back with dist.send/recv. Then each stage's data-parallel group
(the stage's ranks across replicas; every rank creates every group, in the same
order) all_reduces the stage's gradients and SGD steps. The last stage prints the
loss of every step; the run ends with "rank R: toy trained".

Checks that hold with emulated ranks (which send zero tensors and add zeros to
the reductions): every loss and gradient is finite, and a stage moves its
parameters wherever some replica's ranks from it to the last stage are all real
(the last stage always: its loss has a nonzero gradient whatever its input). With
every rank real (NEURONABOX_REAL_RANKS unset) every stage must move."""

import argparse
import math
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from checks import expect

WIDTH = 16


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stages", type=int, default=4)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--microbatches", type=int, default=2)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    stages = args.stages
    assert world % stages == 0, f"world {world} is not a multiple of {stages} stages"
    replicas = world // stages
    stage, replica = divmod(rank, replicas)
    prev = rank - replicas if stage > 0 else None
    nxt = rank + replicas if stage < stages - 1 else None
    last = nxt is None

    dp_group = None
    for s in range(stages):  # every rank, every group, the same order
        g = dist.new_group([s * replicas + r for r in range(replicas)])
        if s == stage:
            dp_group = g

    torch.manual_seed(stage)  # the replicas of a stage start equal
    block = nn.Linear(WIDTH, WIDTH) if last else nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh())
    before = [p.detach().clone() for p in block.parameters()]
    opt = torch.optim.SGD(block.parameters(), lr=0.1)

    for step in range(args.steps):
        gen = torch.Generator().manual_seed(100 * step + replica)  # the replica's batch, known to stage 0 and last
        batches = [
            (torch.randn(4, WIDTH, generator=gen), torch.randn(4, WIDTH, generator=gen))
            for _ in range(args.microbatches)
        ]
        inputs, outputs, losses = [], [], []
        for m in range(args.microbatches):  # forward, every microbatch
            if prev is None:
                x = batches[m][0]
            else:
                x = torch.empty(4, WIDTH)
                dist.recv(x, prev, tag=0)
                x.requires_grad_(True)
            y = block(x)
            inputs.append(x)
            outputs.append(y)
            if last:
                losses.append(nn.functional.mse_loss(y, batches[m][1]) / args.microbatches)
            else:
                dist.send(y.detach(), nxt, tag=0)
        for m in reversed(range(args.microbatches)):  # backward, last microbatch first
            if last:
                losses[m].backward()
            else:
                dy = torch.empty(4, WIDTH)
                dist.recv(dy, nxt, tag=1)
                outputs[m].backward(dy)
            if prev is not None:
                expect(torch.isfinite(inputs[m].grad).all(), f"step {step}: non-finite input gradient")
                dist.send(inputs[m].grad, prev, tag=1)
        for p in block.parameters():
            dist.all_reduce(p.grad, group=dp_group)
            p.grad /= replicas
            expect(torch.isfinite(p.grad).all(), f"step {step}: non-finite parameter gradient")
        opt.step()
        opt.zero_grad()
        if last:
            loss = sum(v.item() for v in losses)
            expect(math.isfinite(loss), f"step {step}: loss {loss}")
            print(f"rank {rank}: stage {stage} replica {replica} step {step} loss {loss:.6f}", flush=True)

    moved = any(not torch.equal(b, p.detach()) for b, p in zip(before, block.parameters(), strict=True))
    # A stage's bias gets a gradient in a replica whose ranks from this stage to the last
    # are all real (an emulated rank sends zero gradients back); the dp average keeps it.
    real = {int(r) for r in os.environ.get("NEURONABOX_REAL_RANKS", ",".join(map(str, range(world)))).split(",")}
    chained = any(all(t * replicas + q in real for t in range(stage, stages)) for q in range(replicas))
    if chained:
        expect(moved, f"stage {stage}: parameters did not move")
    print(f"rank {rank}: stage {stage} toy trained", flush=True)
    sys.stdout.flush()
    os._exit(0)  # see collectives.py: stock Gloo teardown aborts now and then


if __name__ == "__main__":
    main()
