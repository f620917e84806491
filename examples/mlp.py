"""MLP training workload: one of the fidelity workloads for `neuronabox validate`.

A plain multilayer perceptron (by default 4 Linear layers, 512 -> 1024 -> 1024 -> 1024 -> 10
with ReLU between, about 2.6M parameters) trained with SGD under DDP over Gloo on the CPU,
on random inputs and labels. An ordinary script: torchrun runs it unchanged. Every rank prints
one `neuronabox-iteration` line with its iteration times (see _bench.py).
"""

import _bench
import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

CLASSES = 10


def build(inputs: int, hidden: int, layers: int) -> nn.Sequential:
    """`layers` Linear layers: inputs -> hidden -> ... -> hidden -> CLASSES, ReLU between."""
    if layers < 2:
        raise SystemExit("--layers must be at least 2")
    widths = [inputs] + [hidden] * (layers - 1) + [CLASSES]
    mods: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(widths, widths[1:], strict=False)):
        if i:
            mods.append(nn.ReLU())
        mods.append(nn.Linear(a, b))
    return nn.Sequential(*mods)


def main() -> None:
    p = _bench.parser(__doc__, batch=64)
    p.add_argument("--inputs", type=int, default=512, help="input features (default 512)")
    p.add_argument("--hidden", type=int, default=1024, help="hidden width (default 1024)")
    p.add_argument("--layers", type=int, default=4, help="Linear layers (default 4)")
    p.add_argument("--lr", type=float, default=0.01)
    args = p.parse_args()

    rank, world, gen = _bench.setup(args)
    model = build(args.inputs, args.hidden, args.layers)
    if rank == 0:
        _bench.note(f"mlp: {_bench.param_count(model)} parameters")
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)

    def make_batch() -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(args.batch, args.inputs, generator=gen)
        return x, torch.randint(0, CLASSES, (args.batch,), generator=gen)

    _bench.run("mlp", args, rank, world, make_batch, _bench.classifier_step(ddp, opt))


if __name__ == "__main__":
    main()
