"""Rings whose size Gloo's wire does not carry (full 1 MiB segments, or tiny ones at
a large world), between point-to-point exchanges that move the group's sequence number
but not Gloo's tag. Every result is checked against the zero policy: the real ranks'
sum, emulated ranks adding nothing."""

import argparse
import os
import sys

import torch
import torch.distributed as dist
from checks import expect


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--elements", default="2359296,1310720,1400001", help="float32 element counts")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--no-reduce", action="store_true", help="allreduces only, one after another")
    p.add_argument(
        "--past-p2p",
        action="store_true",
        help="also exchange through ProcessGroup's own send/recv past any wrapper of them, as a "
        "C++ caller would: the observer's count of point-to-point operations misses them",
    )
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    real = [int(r) for r in os.environ["NEURONABOX_REAL_RANKS"].split(",")]
    total = float(sum(r + 1 for r in real))
    for it in range(args.repeat):
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        s = dist.isend(torch.full((5,), float(rank)), nxt, tag=3)
        got = torch.empty(5)
        dist.recv(got, prv, tag=3)
        s.wait()
        expect(torch.equal(got, torch.full((5,), float(prv)) if prv in real else torch.zeros(5)), "send/recv")
        if args.past_p2p:
            pg_class = type(dist.group.WORLD)
            send, recv = (getattr(getattr(pg_class, m), "__wrapped__", getattr(pg_class, m)) for m in ("send", "recv"))
            s = send(dist.group.WORLD, [torch.ones(3)], nxt, 5)
            recv(dist.group.WORLD, [torch.empty(3)], prv, 5).wait()
            s.wait()
        for n in map(int, args.elements.split(",")):
            t = torch.full((n,), float(rank + 1))
            dist.all_reduce(t)
            expect(torch.equal(t, torch.full((n,), total)), f"all_reduce n={n}")
            if args.no_reduce:
                continue
            t = torch.full((n,), float(rank + 1))
            dist.reduce(t, dst=real[0])
            expect(rank != real[0] or torch.equal(t, torch.full((n,), total)), f"reduce n={n}")
        print(f"rank {rank}: iteration {it} done", flush=True)
    print(f"rank {rank}: all checks passed", flush=True)
    sys.stdout.flush()
    os._exit(0)  # without Gloo's teardown, which can abort (see collectives.py)


if __name__ == "__main__":
    main()
