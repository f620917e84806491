"""A Hugging Face Trainer job: a tiny GPT-2 built from a config (no download), trained on
synthetic tokens by `transformers.Trainer` with DDP over Gloo on the CPU. torchrun runs it
unchanged (the Trainer reads torchrun's environment: its world is the emulated one).

    neuronabox torchrun --nnodes 16 examples/hf_trainer_job.py --steps 20
"""

import argparse
import os
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing to fetch: the model comes from a config
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import torch  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402


class Tokens(Dataset):
    """Random token sequences, each its own labels (causal language modelling)."""

    def __init__(self, n: int, length: int, vocab: int, seed: int) -> None:
        self.ids = torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--length", type=int, default=64)
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=512, n_positions=args.length, n_embd=128, n_layer=2, n_head=4)
    model = GPT2LMHeadModel(config)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))  # the Trainer's sampler gives each rank 1/world of it
    data = Tokens(args.batch * args.steps * world, args.length, config.vocab_size, seed=rank)
    with tempfile.TemporaryDirectory(prefix="hf-trainer-job-") as out:
        training = TrainingArguments(
            output_dir=out, max_steps=args.steps, per_device_train_batch_size=args.batch, learning_rate=1e-3,
            use_cpu=True, ddp_backend="gloo", report_to=[], save_strategy="no", logging_strategy="no",
            disable_tqdm=True, dataloader_num_workers=0, seed=0,
        )  # fmt: skip
        result = Trainer(model=model, args=training, train_dataset=data).train()
    if rank == int(os.environ.get("NEURONABOX_REAL_RANKS", "0").split(",")[0]):  # the first real rank says it
        print(f"hf-trainer rank {rank}: {result.global_step} steps, loss {result.training_loss:.4f}", flush=True)
    # Stock torch 2.13 aborts now and then while tearing Gloo down at interpreter exit
    # ("terminate called without an active exception"; examples/train_ddp.py), failing a
    # finished job: leave without that teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
