"""Bytes of emulated messages under `--data mirror`: every emulated rank holds the
mirror source's input, and a message is the real bytes it builds on with that input
folded in once per emulated rank on the way, by the collective's reduce op.

Folds run one at a time, in ring order, as Gloo's ranks would apply them, so the
floating-point result is Gloo's own (k additions are not k x input). torch is
imported on the first fold: at start-up it would cost the controller (and so every
run) a second or two before the real ranks can start.
"""

from __future__ import annotations

from dataclasses import dataclass

from neuronabox.schedules.gloo import MirrorPlan

DTYPES = ("float32", "float64", "float16", "bfloat16", "int8", "uint8", "int16", "int32", "int64", "bool")


@dataclass
class MirrorInput:
    """The mirror source's input for one instance, as its observer recorded it."""

    data: bytes
    dtype: str
    op: str  # ReduceOp name
    splits: list[int] | None = None  # alltoall: bytes per destination group rank

    def block(self, plan: MirrorPlan, n: int) -> bytes | None:
        """The input bytes the plan folds in (None: not known, the message stays zeros)."""
        off = plan.offset
        if plan.block_for is not None:
            if self.splits is None or plan.block_for >= len(self.splits) or self.splits[plan.block_for] != n:
                return None
            off = sum(self.splits[: plan.block_for])
        if off + n > len(self.data):
            return None
        return self.data[off : off + n]


def fold(base: bytes | None, block: bytes, times: int, op: str, dtype: str) -> bytes:
    """`base` (or nothing) with `block` folded in `times` times by `op`."""
    if times == 0:
        return base if base is not None else bytes(len(block))
    import torch

    t = getattr(torch, dtype)
    b = torch.frombuffer(bytearray(block), dtype=t) if block else torch.empty(0, dtype=t)
    if base is None:
        acc, times = b.clone(), times - 1
    else:
        acc = torch.frombuffer(bytearray(base), dtype=t) if base else torch.empty(0, dtype=t)
    if op in ("SUM", "AVG"):  # Gloo sums; AVG divides once at the end
        for _ in range(times):
            acc.add_(b)
    elif op == "PRODUCT":
        for _ in range(times):
            acc.mul_(b)
    elif times > 0 and op == "MAX":
        acc = torch.maximum(acc, b)
    elif times > 0 and op == "MIN":
        acc = torch.minimum(acc, b)
    elif times > 0 and op == "BAND":
        acc = acc & b
    elif times > 0 and op == "BOR":
        acc = acc | b
    elif op == "BXOR" and times % 2:
        acc = acc ^ b
    return acc.numpy().tobytes() if acc.dtype != torch.bfloat16 else acc.view(torch.int16).numpy().tobytes()
