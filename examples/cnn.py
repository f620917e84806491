"""Residual CNN training workload: one of the fidelity workloads for `neuronabox validate`.

A small ResNet-style network on 32x32 RGB images, 10 classes: a 3x3 stem conv, then 3 stages
of residual blocks (conv-bn-relu-conv-bn plus a skip connection, 1x1 projection where the
shape changes), channels 16/32/64 by default, each later stage halving the resolution, then
global average pooling and a Linear classifier. Trained with SGD (momentum) under DDP over
Gloo on the CPU, on random images and labels; DDP also broadcasts the BatchNorm buffers every
forward. An ordinary script: torchrun runs it unchanged. Every rank prints one
`neuronabox-iteration` line with its iteration times (see _bench.py).
"""

import _bench
import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

CLASSES = 10
SIZE = 32


class Block(nn.Module):
    """conv-bn-relu-conv-bn, plus the input (projected by a 1x1 conv if the shape changes), relu."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.skip = nn.Identity()
        if stride != 1 or cin != cout:
            self.skip = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.skip(x))


def build(width: int, blocks: int, stages: int) -> nn.Sequential:
    """Stem to `width` channels, `stages` stages of `blocks` blocks (width, 2*width, ...), head."""
    mods: list[nn.Module] = [nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU()]
    cin = width
    for s in range(stages):
        cout = width << s
        for b in range(blocks):
            mods.append(Block(cin, cout, 2 if s and not b else 1))
            cin = cout
    mods += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, CLASSES)]
    return nn.Sequential(*mods)


def main() -> None:
    p = _bench.parser(__doc__, batch=16)
    p.add_argument("--width", type=int, default=16, help="channels of the first stage, doubled per stage (default 16)")
    p.add_argument("--blocks", type=int, default=1, help="residual blocks per stage (default 1)")
    p.add_argument("--stages", type=int, default=3, help="stages (default 3)")
    p.add_argument("--lr", type=float, default=0.05)
    args = p.parse_args()

    rank, world, gen = _bench.setup(args)
    model = build(args.width, args.blocks, args.stages)
    if rank == 0:
        _bench.note(f"cnn: {_bench.param_count(model)} parameters")
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)

    def make_batch() -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(args.batch, 3, SIZE, SIZE, generator=gen)
        return x, torch.randint(0, CLASSES, (args.batch,), generator=gen)

    _bench.run("cnn", args, rank, world, make_batch, _bench.classifier_step(ddp, opt))


if __name__ == "__main__":
    main()
