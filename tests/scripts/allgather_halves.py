"""Allgathers whose blocks share their first half and differ in the second, alternating:
Gloo splits a block of 2h or 2h + 1 bytes into chunks of h and h or h + 1, so both shapes'
first send notice is the same h bytes and only the notice of chunk 1 tells them apart. At
W = 2 the controller may post the receive of chunk 0 on that first notice, before it knows
which shape comes (controller/starts.py, `posts_ahead`). Checks every block each rank gets
(an emulated rank's block mirrors the first real rank's) and prints "all checks passed".

    python allgather_halves.py [ROUNDS] [H]
"""

import os
import sys

import torch
import torch.distributed as dist
from checks import expect, passed


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    h = int(sys.argv[2]) if len(sys.argv) > 2 else 40_000
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    real = [int(r) for r in os.environ.get("NEURONABOX_REAL_RANKS", ",".join(map(str, range(world)))).split(",")]
    for i in range(rounds):
        for n in (2 * h, 2 * h + 1):
            x = ((torch.arange(n) * (rank + 3) + i) % 251).to(torch.uint8)
            out = [torch.empty_like(x) for _ in range(world)]
            dist.all_gather(out, x)
            for r in range(world):
                src = r if r in real else real[0]  # an emulated rank's block mirrors the first real rank's
                want = ((torch.arange(n) * (src + 3) + i) % 251).to(torch.uint8)
                expect(torch.equal(out[r], want), f"allgather round {i} of {n} bytes: block of rank {r}")
    passed()


if __name__ == "__main__":
    main()
