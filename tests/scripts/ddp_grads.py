"""DDP gradients under the data policies: one backward through a DDP model, then each
parameter's gradient is compared with the same model's gradient computed locally.
Prints whether the model came through DDP's construction broadcasts (from rank 0,
emulated or not) unchanged, "rank R: grad ratio X" (allreduced over local gradient,
one number for every parameter) and "rank R: after step: max |param - local| = Y"
after an SGD step on both copies; exits 1 if the model changed or the ratio is not
one number. `--own-hook` registers the script's own comm hook.
"""

import copy
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from checks import expect
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    # BatchNorm: buffers DDP broadcasts from rank 0 at construction and every forward,
    # float and int64 (num_batches_tracked) in separate buckets.
    local = nn.Sequential(nn.Linear(32, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 8))
    model = DDP(copy.deepcopy(local), bucket_cap_mb=0.005)  # several buckets
    state = {k: v for k, v in local.state_dict().items()}
    kept = all(torch.equal(v, state[k]) for k, v in model.module.state_dict().items())
    print(f"rank {rank}: model kept through DDP construction: {kept}", flush=True)
    expect(kept, "the model changed in DDP's construction broadcasts")
    if "--own-hook" in sys.argv:  # the script's own comm hook (PyTorch's fp16 compression)
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook

        model.register_comm_hook(None, fp16_compress_hook)
    x, y = torch.randn(16, 32), torch.randn(16, 8)
    for m in (model, local):
        nn.functional.mse_loss(m(x), y).backward()
    tol = 4e-3 if "--own-hook" in sys.argv else 1e-5  # fp16 on the wire
    ratios = []
    for p, q in zip(model.parameters(), local.parameters(), strict=True):
        a, b = p.grad.double().flatten(), q.grad.double().flatten()
        if b.norm() < 1e-6:
            continue  # no gradient here to compare
        ratios.append((a @ b / (b @ b)).item())  # the multiple of the local gradient
        expect(torch.allclose(p.grad, q.grad * ratios[-1], rtol=tol, atol=tol / 100), "gradient not a multiple")
    expect(bool(ratios) and max(ratios) - min(ratios) <= tol, f"ratios differ {ratios}")
    for m in (model, local):
        torch.optim.SGD(m.parameters(), lr=0.1).step()
    gap = max((p - q).abs().max().item() for p, q in zip(model.parameters(), local.parameters(), strict=True))
    print(f"rank {rank}: grad ratio {ratios[0]:.6f}", flush=True)
    print(f"rank {rank}: after step: max |param - local| = {gap:.3g}", flush=True)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
