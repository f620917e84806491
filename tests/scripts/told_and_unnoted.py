"""A noted allreduce and an unnoted one with the same first frame, alternating: at W = 2 a
ring of 7 floats and one of 6 both carry 8-byte segments, so their first notices are equal.
The 7-float call goes through `dist.all_reduce` (the observer notes its size as it enters);
the 6-float one calls the process group's own method, past every Python function the
observer wraps, so no note tells its size. Checks every result (the emulated ranks
contribute zeros: a tensor of ones sums to one per real rank) and prints "all checks passed".
"""

import os
import sys

import torch
import torch.distributed as dist
from checks import expect, passed

NOTED, UNNOTED = 7, 6


def main() -> None:
    dist.init_process_group("gloo")
    real = len(os.environ.get("NEURONABOX_REAL_RANKS", "0").split(","))
    pg = dist.distributed_c10d._get_default_group()
    for i in range(int(sys.argv[1]) if len(sys.argv) > 1 else 8):
        t = torch.ones(NOTED)
        dist.all_reduce(t)
        expect(bool((t == real).all()), f"noted allreduce {i}: {t.tolist()} (expected {real})")
        u = torch.ones(UNNOTED)
        pg.allreduce([u]).wait()
        expect(bool((u == real).all()), f"unnoted allreduce {i}: {u.tolist()} (expected {real})")
    passed()


if __name__ == "__main__":
    main()
