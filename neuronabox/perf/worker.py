"""The benchmark loop each real rank runs (`neuronabox perf` starts it under torchrun,
emulated or all real): nccl-tests' loop in torch.distributed.

    python worker.py SPEC_JSON RESULTS_DIR BACKEND

Per size: `warmup` untimed iterations, a barrier, `iters` back-to-back timed ones
(the row's time is their mean, as nccl-tests reports it), then `check` iterations
on filled buffers whose outputs are compared with what the data policy predicts
(`expect.py`). Each real rank writes RESULTS_DIR/rank<R>.json: one row per size.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist

from neuronabox.perf.expect import BLOCKED, expected, mirror_source, value
from neuronabox.perf.ladder import PerfSpec
from neuronabox.schedules import Kind

TOLERANCE = {"float16": 1e-2, "bfloat16": 4e-2, "float32": 1e-5, "float64": 1e-12}  # relative; integers exact
OPS = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "max": dist.ReduceOp.MAX,
       "min": dist.ReduceOp.MIN, "avg": dist.ReduceOp.AVG}  # fmt: skip


class Buffers:
    """One size's input and output tensors, and the call that runs the collective on them."""

    def __init__(self, spec: PerfSpec, nbytes: int, rank: int, world: int, device: str) -> None:
        self.spec, self.rank, self.world = spec, rank, world
        dtype = getattr(torch, spec.dtype)
        n = nbytes // spec.elem
        kind = spec.coll
        in_n = n // world if kind in (Kind.ALLGATHER, Kind.REDUCE_SCATTER) else n
        out_n = n // world if kind == Kind.REDUCE_SCATTER else n
        self.input = torch.empty(in_n, dtype=dtype, device=device)
        self.output = self.input if kind in (Kind.ALLREDUCE, Kind.BROADCAST, Kind.REDUCE) else \
            torch.empty(out_n, dtype=dtype, device=device)  # fmt: skip
        self.count = n

    def run(self) -> None:
        s, kind = self.spec, self.spec.coll
        if kind == Kind.ALLREDUCE:
            dist.all_reduce(self.input, op=OPS[s.op])
        elif kind == Kind.REDUCE:
            dist.reduce(self.input, dst=s.root, op=OPS[s.op])
        elif kind == Kind.BROADCAST:
            dist.broadcast(self.input, src=s.root)
        elif kind == Kind.ALLGATHER:
            dist.all_gather_into_tensor(self.output, self.input)
        elif kind == Kind.REDUCE_SCATTER:
            dist.reduce_scatter_tensor(self.output, self.input, op=OPS[s.op])
        elif kind == Kind.ALLTOALL:
            dist.all_to_all_single(self.output, self.input)

    def fill(self, real: list[int]) -> None:
        """Inputs that name their rank; a broadcast's receivers start from a value no rank
        sends, but the mirror source, whose buffer an emulated root sends under mirror."""
        mine = value(self.rank)
        root = self.spec.root
        if self.spec.coll == Kind.BROADCAST and self.rank != root:
            mine = mine if root not in real and self.rank == mirror_source(self.world, real) else -1.0
        self.input.fill_(mine)
        if self.output is not self.input:
            self.output.fill_(-1.0)

    def wrong(self, real: list[int], policy: str) -> int:
        """Elements of the output that differ from the prediction (beyond the dtype's rounding)."""
        want = expected(self.spec.coll, self.spec.op, self.rank, self.world, real, policy, self.spec.root)
        if want is None:
            return 0
        out = self.output.to("cpu", torch.float64)
        blocks = out.chunk(self.world) if self.spec.coll in BLOCKED else [out]
        tol = TOLERANCE.get(self.spec.dtype, 0.0)
        bad = 0
        for block, w in zip(blocks, want, strict=True):
            bad += int(((block - w).abs() > tol * abs(w)).sum())
        return bad


def run_size(spec: PerfSpec, nbytes: int, rank: int, world: int, real: list[int], policy: str, device: str) -> dict:
    buf = Buffers(spec, nbytes, rank, world, device)
    buf.fill(real)
    for _ in range(spec.warmup):
        buf.run()
    sync = (lambda: torch.cuda.synchronize()) if device == "cuda" else (lambda: None)  # noqa: E731
    sync()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(spec.iters):
        buf.run()
    sync()
    seconds = (time.perf_counter() - t0) / spec.iters
    wrong = 0
    for _ in range(spec.check):
        buf.fill(real)
        buf.run()
        sync()
        wrong += buf.wrong(real, policy)
    return {"bytes": nbytes, "count": buf.count, "time_s": seconds, "wrong": wrong}


def main(argv: list[str]) -> int:
    spec_path, out_dir, backend = argv
    with open(spec_path) as f:
        spec = PerfSpec.from_json(json.loads(f.read(1 << 20)))
    device = "cuda" if backend == "nccl" and torch.cuda.is_available() else "cpu"
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    listed = os.environ.get("NEURONABOX_REAL_RANKS")  # set by the launcher; all real without it
    real = [int(r) for r in listed.split(",")] if listed else list(range(world))
    policy = os.environ.get("NEURONABOX_DATA", "zeros")  # the launcher's --data
    rows = [run_size(spec, n, rank, world, real, policy, device) for n in spec.sizes]
    tmp = os.path.join(out_dir, f".rank{rank}.json")
    with open(tmp, "w") as f:
        json.dump({"rank": rank, "world": world, "rows": rows}, f)
    os.replace(tmp, os.path.join(out_dir, f"rank{rank}.json"))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
