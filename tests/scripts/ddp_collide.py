"""A DDP bucket and plain allreduces whose first segments are the bucket's: at W = 2 a
6,299,648-byte bucket rings in 8 segments of 787,456 bytes, and so do 1,574,911 floats
(a shorter last segment) while 1,181,184 floats ring in 6 of them. Each step runs the
bucket, then both allreduces. Checks every allreduce's result (the emulated ranks
contribute zeros, so a tensor of ones sums to one per real rank) and prints "all checks
passed".
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from checks import expect, passed
from torch.nn.parallel import DistributedDataParallel as DDP

BUCKET = 1_574_912  # floats: 6,299,648 bytes
SAME_FIRST_SEGMENT = (1_574_911, 1_181_184)


def main() -> None:
    dist.init_process_group("gloo")
    real = len(os.environ.get("NEURONABOX_REAL_RANKS", "0").split(","))
    model = DDP(nn.Linear(BUCKET, 1, bias=False), bucket_cap_mb=64)
    x = torch.randn(2, BUCKET)
    for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 6):
        model(x).sum().backward()
        for n in SAME_FIRST_SEGMENT:
            t = torch.ones(n)
            dist.all_reduce(t)
            expect(bool((t == real).all()), f"allreduce of {n} floats: {t[:3].tolist()} ... (expected {real})")
    passed()


if __name__ == "__main__":
    main()
