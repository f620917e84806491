"""Object collectives with the source anywhere: broadcast_object_list and
scatter_object_list from rank 0, gather_object to rank 0 (real or emulated).

Every rank passes objects of its own (on a non-source rank the list a script
passes is usually placeholders). When rank 0 is real it sends them; when it is
emulated it sends what the real rank passed in, so each real rank must get its
own objects back, unpickled whole. Prints "rank R: <call> got <repr>" per call and
"rank R: objects done"; exits 1 at the first check that fails."""

import os
import sys

import torch
import torch.distributed as dist
from checks import expect


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = [{"rank": rank, "items": list(range(rank + 3))}, "text " * 50, None, bytes(range(256)) * 300]
    objs = list(mine)
    dist.broadcast_object_list(objs, src=0)
    print(f"rank {rank}: broadcast_object_list got {objs[:3]!r} and {len(objs[3])} bytes", flush=True)
    expect(objs == mine, "broadcast_object_list")
    one = [None]
    dist.broadcast_object_list(one, src=0)  # the usual placeholder
    print(f"rank {rank}: broadcast_object_list got {one!r}", flush=True)
    expect(one == [None], "broadcast_object_list of a placeholder")
    got = [{"placeholder": rank}]
    dist.scatter_object_list(got, [{"to": r} for r in range(world)] if rank == 0 else None, src=0)
    print(f"rank {rank}: scatter_object_list got {got!r}", flush=True)
    expect(got == [{"to": 0} if rank == 0 else {"placeholder": rank}], "scatter_object_list")
    out = [None] * world if rank == 0 else None
    dist.gather_object({"rank": rank}, out, dst=0)
    print(f"rank {rank}: gather_object got {out!r}", flush=True)
    expect(out is None if rank else out[0] == {"rank": 0} and all(isinstance(o, dict) for o in out), "gather_object")
    t = torch.ones(4)
    dist.all_reduce(t)  # the collectives after them still line up
    expect(t[0].item() >= 1, "all_reduce after the object collectives")
    print(f"rank {rank}: objects done", flush=True)
    sys.stdout.flush()
    os._exit(0)  # see collectives.py: stock Gloo teardown aborts now and then


if __name__ == "__main__":
    main()
