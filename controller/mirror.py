"""Bytes of emulated messages under `--data mirror`: every emulated rank holds the
mirror source's input, and a message is the real bytes it builds on with that input
folded in once per emulated rank on the way, by the collective's reduce op.

Folds run one at a time, in ring order, as Gloo's ranks would apply them, so the
floating-point result is Gloo's own (k additions are not k x input). The folds are
numpy's, each step rounded to the dtype as torch's CPU kernels round it (bfloat16, which
numpy lacks, is computed in float32 and rounded to nearest even): importing torch took
the controller a second of CPU, on the path of the first collective that folds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

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


_NUMPY = {"float32": np.float32, "float64": np.float64, "float16": np.float16, "int8": np.int8, "uint8": np.uint8,
          "int16": np.int16, "int32": np.int32, "int64": np.int64, "bool": np.bool_}  # fmt: skip
_STEP: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "SUM": np.add, "AVG": np.add, "PRODUCT": np.multiply, "MAX": np.maximum, "MIN": np.minimum,
    "BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor,
}  # fmt: skip
_REPEATS = ("SUM", "AVG", "PRODUCT", "BXOR")  # ops whose k-fold result is not the 1-fold one


def _bf16_to_f32(raw: np.ndarray) -> np.ndarray:
    return (raw.astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round to nearest even, NaN kept a (quiet) NaN, as c10::BFloat16 rounds."""
    bits = x.astype(np.float32).view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), rounded)


def fold(base: bytes | None, block: bytes, times: int, op: str, dtype: str) -> bytes:
    """`base` (or nothing) with `block` folded in `times` times by `op`."""
    if times == 0:
        return base if base is not None else bytes(len(block))
    step = _STEP[op]
    if dtype == "bfloat16":
        b = _bf16_to_f32(np.frombuffer(block, np.uint16))
        acc = b.copy() if base is None else _bf16_to_f32(np.frombuffer(base, np.uint16))
        fn = lambda a: _bf16_to_f32(_f32_to_bf16(step(a, b)))  # noqa: E731  # each step rounded, as torch's
    else:
        t = _NUMPY[dtype]
        b = np.frombuffer(block, t)
        acc = b.copy() if base is None else np.frombuffer(base, t).copy()
        fn = lambda a: step(a, b)  # noqa: E731  # on bool, add is or and multiply and, as torch's
    if base is None:
        times -= 1
    with np.errstate(all="ignore"):  # overflows wrap or go to infinity, as torch's do
        for _ in range(times if op in _REPEATS else min(times, 1)):
            acc = fn(acc)
    if dtype == "bfloat16":
        return _f32_to_bf16(acc).tobytes()
    return acc.tobytes()
