"""A PyTorch Lightning job: a small classifier trained by Lightning's Trainer with its DDP
strategy on the CPU, on synthetic data. Nothing is downloaded; torchrun runs it unchanged
(Lightning reads torchrun's environment: its world is the emulated one).

    neuronabox torchrun --nnodes 16 examples/lightning_job.py --steps 20
"""

import argparse
import os
import sys

import lightning as L
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Classifier(L.LightningModule):
    def __init__(self, inputs: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, classes))  # fmt: skip

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("loss", loss, sync_dist=True)  # an allreduce per step, as Lightning users log
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--hidden", type=int, default=512)
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rank = int(os.environ.get("RANK", "0"))
    gen = torch.Generator().manual_seed(rank)
    n = args.batch * args.steps
    data = TensorDataset(torch.randn(n, 256, generator=gen), torch.randint(0, 10, (n,), generator=gen))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    trainer = L.Trainer(
        accelerator="cpu", strategy="ddp", devices=local, num_nodes=int(os.environ.get("WORLD_SIZE", "1")) // local,
        max_steps=args.steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, use_distributed_sampler=False,
    )  # fmt: skip
    trainer.fit(Classifier(256, args.hidden, 10), DataLoader(data, batch_size=args.batch))
    if rank == int(os.environ.get("NEURONABOX_REAL_RANKS", "0").split(",")[0]):  # the first real rank says it
        print(f"lightning rank {rank}: {trainer.global_step} steps, loss {float(trainer.callback_metrics['loss']):.4f}",
              flush=True)  # fmt: skip
    # Stock torch 2.13 aborts now and then while tearing Gloo down at interpreter exit
    # ("terminate called without an active exception"; examples/train_ddp.py), failing a
    # finished job: leave without that teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
