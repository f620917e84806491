"""GPT-style transformer training workload: one of the fidelity workloads for `neuronabox validate`.

A small decoder-only transformer: token and position embeddings, N pre-LayerNorm blocks of
causal self-attention (plain nn.Linear projections and F.scaled_dot_product_attention with
is_causal=True) and a 4x GELU MLP, a final LayerNorm and an LM head (untied; `--tied` shares
the token embedding). Trained on random tokens with the next-token loss, AdamW by default
(`--optim sgd`), under DDP over Gloo on the CPU; `--fsdp` instead shards it with FSDP2
(`fully_shard` on each block, then on the root), reported as workload gpt-fsdp. An ordinary
script: torchrun runs it unchanged. Every rank prints one `neuronabox-iteration` line with
its iteration times (see _bench.py).
"""

import _bench
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class Attention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        if d % heads:
            raise SystemExit("--d-model must be a multiple of --heads")
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    """Pre-LN: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = Attention(d, heads)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, seq: int, d: int, layers: int, heads: int, tied: bool) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        if tied:
            self.head.weight = self.tok.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def main() -> None:
    p = _bench.parser(__doc__, batch=4)
    p.add_argument("--vocab", type=int, default=2048, help="vocabulary size (default 2048)")
    p.add_argument("--seq", type=int, default=64, help="sequence length (default 64)")
    p.add_argument("--d-model", type=int, default=128, help="model width (default 128)")
    p.add_argument("--layers", type=int, default=2, help="transformer blocks (default 2)")
    p.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    p.add_argument("--tied", action="store_true", help="share the token embedding with the LM head")
    p.add_argument("--optim", choices=["adamw", "sgd"], default="adamw")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--fsdp", action="store_true", help="shard with FSDP2 (fully_shard) instead of DDP")
    args = p.parse_args()

    rank, world, gen = _bench.setup(args)
    model = GPT(args.vocab, args.seq, args.d_model, args.layers, args.heads, args.tied)
    if rank == 0:
        _bench.note(f"gpt: {_bench.param_count(model)} parameters")
    if args.fsdp:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        net = fully_shard(model, mesh=mesh)
    else:
        net = DDP(model)
    if args.optim == "adamw":
        opt = torch.optim.AdamW(net.parameters(), lr=args.lr)
    else:
        opt = torch.optim.SGD(net.parameters(), lr=args.lr)

    def make_batch() -> torch.Tensor:
        return torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=gen)

    def step(tokens: torch.Tensor) -> None:
        opt.zero_grad()
        logits = net(tokens[:, :-1])
        F.cross_entropy(logits.reshape(-1, args.vocab), tokens[:, 1:].reshape(-1)).backward()
        opt.step()

    _bench.run("gpt-fsdp" if args.fsdp else "gpt", args, rank, world, make_batch, step)


if __name__ == "__main__":
    main()
