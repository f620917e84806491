"""DDP with `find_unused_parameters=True`, a branch used every other step: besides the
gradient buckets, DDP's reducer allreduces its map of used parameters (one int32 per
parameter) every step from C++, past every Python function. Trains STEPS steps, checks
that the unused branch's parameters kept their values on the steps that left it out, and
prints "all checks passed".

    python ddp_unused.py [STEPS]
"""

import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from checks import expect, passed
from torch.nn.parallel import DistributedDataParallel as DDP


class TwoBranches(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
        self.head = nn.Linear(32, 4)
        self.extra = nn.Linear(32, 4)  # on even steps only

    def forward(self, x: torch.Tensor, step: int) -> torch.Tensor:
        h = self.trunk(x)
        return self.head(h) + (self.extra(h) if step % 2 == 0 else 0)


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 12
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(TwoBranches(), find_unused_parameters=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(steps):
        before = model.module.extra.weight.detach().clone()
        x, y = torch.randn(8, 16), torch.randn(8, 4)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(x, step), y)
        loss.backward()
        opt.step()
        expect(bool(torch.isfinite(loss)), f"step {step}: loss {loss.item()}")
        if step % 2 == 1:
            expect(torch.equal(model.module.extra.weight, before), f"step {step}: the unused branch moved")
    passed()


if __name__ == "__main__":
    main()
