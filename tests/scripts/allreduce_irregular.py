"""Allreduces of two sizes in an irregular pattern, with values that change every step: A
every step and B every third, so A's tags come 2, 1, 1, 2, 1, 1 apart and the core's guess
of A's next instance (a steady step twice in a row) lands on B's now and then, a ring of
the same kind on the same slot with another length (controller/native/book_bindings.cc,
"Guesses"). B's come 3 apart, steadily: guessed right. With `broadcast`, B is a broadcast
of B elements from the first real rank: A's wrong guess lands on another kind's tag, no
book takes it, and the core forgets it once the rank's frames are 64 collectives past.
Checks every value each real rank gets (an emulated rank contributes zeros; a broadcast
from a real rank carries its values) and prints "all checks passed".

    python allreduce_irregular.py [STEPS] [A] [B] [allreduce|broadcast]
"""

import os
import sys

import torch
import torch.distributed as dist
from checks import expect, passed


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 24
    a = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
    b = int(sys.argv[3]) if len(sys.argv) > 3 else 3001
    b_kind = sys.argv[4] if len(sys.argv) > 4 else "allreduce"
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    real = [int(r) for r in os.environ.get("NEURONABOX_REAL_RANKS", ",".join(map(str, range(world)))).split(",")]
    for i in range(steps):
        for name, n in (("A", a), ("B", b)) if i % 3 == 0 else (("A", a),):
            base = torch.arange(n, dtype=torch.int64) % 1000 + i
            t = (base + 1000 * rank).to(torch.float64)
            if name == "B" and b_kind == "broadcast":
                dist.broadcast(t, src=real[0])
                want = (base + 1000 * real[0]).to(torch.float64)
            else:
                dist.all_reduce(t)
                want = sum(base + 1000 * r for r in real).to(torch.float64)
            expect(torch.equal(t, want), f"step {i}: {name} of {n} elements")
    passed()


if __name__ == "__main__":
    main()
