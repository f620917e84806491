"""Shared plumbing of the fidelity workloads (mlp.py, cnn.py, gpt.py) for `neuronabox validate`.

Not a workload itself. The scripts import it as `_bench`: a script's own folder is first on
sys.path when Python (or torchrun) runs it, from whatever working directory.

Each workload builds its model and a batch maker, then hands both to `run`, which times the
iterations and prints the one line per rank that validation parses:

    neuronabox-iteration workload=<name> rank=<R> world=<W> median_ms=<f> min_ms=<f> max_ms=<f> steps=<N>
"""

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist


def parser(doc: str | None, batch: int) -> argparse.ArgumentParser:
    """The flags every workload takes; a workload adds its own model flags to it."""
    p = argparse.ArgumentParser(description=doc.strip().splitlines()[0] if doc else None)
    p.add_argument("--steps", type=int, default=20, help="timed iterations (default 20)")
    p.add_argument("--warmup", type=int, default=5, help="untimed iterations before them (default 5)")
    p.add_argument("--seed", type=int, default=0, help="weights from SEED; rank R's data from SEED+R")
    p.add_argument("--batch", type=int, default=batch, help=f"per-rank batch size (default {batch})")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default 1)")
    return p


def setup(args: argparse.Namespace) -> tuple[int, int, torch.Generator]:
    """Join the Gloo group, pin the thread count and seed the weights.

    Returns (rank, world, data generator). Call it before building the model: every rank then
    draws the same initial weights, and its own data stream from seed + rank.
    """
    if args.steps < 1 or args.warmup < 0:
        raise SystemExit("--steps must be at least 1 and --warmup at least 0")
    dist.init_process_group("gloo")
    torch.set_num_threads(args.threads or 1)  # validation runs give each rank one core
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    return rank, world, torch.Generator().manual_seed(args.seed + rank)


def run(
    workload: str,
    args: argparse.Namespace,
    rank: int,
    world: int,
    make_batch: Callable[[], Any],
    step: Callable[[Any], None],
) -> None:
    """Run the warmup, then the timed iterations, print this rank's line and leave the process.

    `step(batch)` is one whole iteration: zero_grad, forward, loss, backward, optimizer step.
    The timed batches are all drawn before the first timed iteration, so drawing data is never
    timed, and the clock is read only at the iteration boundaries: iteration i lasts from the
    start of i to the start of i + 1, so work that one iteration leaves running (and the next
    waits for) is still counted.
    """
    for _ in range(args.warmup):
        step(make_batch())
    batches = [make_batch() for _ in range(args.steps)]
    marks = [time.perf_counter()]
    for batch in batches:
        step(batch)
        marks.append(time.perf_counter())
    ms = [1e3 * (b - a) for a, b in zip(marks, marks[1:], strict=False)]
    line = (
        f"neuronabox-iteration workload={workload} rank={rank} world={world} "
        f"median_ms={statistics.median(ms):.3f} min_ms={min(ms):.3f} max_ms={max(ms):.3f} steps={len(ms)}\n"
    )
    # One write call: the ranks usually share torchrun's stdout, and print() may issue the text
    # and its newline as two writes (under PYTHONUNBUFFERED), which other ranks' lines can split.
    sys.stdout.flush()
    data = line.encode()
    while data:
        data = data[os.write(sys.stdout.fileno(), data) :]
    leave()


def classifier_step(model: torch.nn.Module, opt: torch.optim.Optimizer) -> Callable[[Any], None]:
    """One iteration of a classifier on an (inputs, labels) batch: zero_grad, forward,
    cross-entropy, backward, optimizer step."""

    def step(batch: tuple[torch.Tensor, torch.Tensor]) -> None:
        x, y = batch
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    return step


def leave() -> None:
    """Exit without tearing Gloo down.

    Stock torch 2.13 aborts now and then while tearing Gloo down, in destroy_process_group()
    or at interpreter exit ("terminate called without an active exception"), failing a job that
    has finished. Flush and leave without that teardown.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def note(msg: str) -> None:
    """An informational line, on stderr: stdout carries only the parseable line."""
    print(msg, file=sys.stderr, flush=True)


def param_count(model: torch.nn.Module) -> int:
    """Parameters, each shared tensor counted once."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
