"""`--data mirror`'s folds are numpy's; torch's own kernels are the reference, fold by fold,
for every dtype and reduce op the mirror covers (the live tests check whole collectives)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from neuronabox.controller.mirror import DTYPES, fold

OPS = ("SUM", "AVG", "PRODUCT", "MAX", "MIN", "BAND", "BOR", "BXOR")
BITWISE = ("BAND", "BOR", "BXOR")


def torch_fold(base: bytes | None, block: bytes, times: int, op: str, dtype: str) -> bytes:
    """Gloo's ranks' folds with torch's CPU kernels, one at a time."""
    t = getattr(torch, dtype)
    b = torch.frombuffer(bytearray(block), dtype=t)
    acc = b.clone() if base is None else torch.frombuffer(bytearray(base), dtype=t)
    for _ in range(times - (base is None)):
        acc = {
            "SUM": torch.add, "AVG": torch.add, "PRODUCT": torch.mul, "MAX": torch.maximum,
            "MIN": torch.minimum, "BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor,
        }[op](acc, b)  # fmt: skip
    return acc.view(torch.int16).numpy().tobytes() if t == torch.bfloat16 else acc.numpy().tobytes()


def values(dtype: str, n: int, seed: int) -> bytes:
    """Values that stress the dtype: fractions that round, large ones that overflow or wrap,
    negatives, zeros, infinities and NaNs for floats."""
    rng = np.random.default_rng(seed)
    t = getattr(torch, dtype)
    if dtype == "bool":
        x = torch.from_numpy(rng.integers(0, 2, n).astype(bool))
    elif t.is_floating_point:
        x = torch.from_numpy(rng.normal(0, 1e3, n)).to(t)
        x[:4] = torch.tensor([float("inf"), -float("inf"), float("nan"), 0.0]).to(t)
        x[4:12] = (torch.from_numpy(rng.uniform(0.999, 1.001, 8)) * 3.3).to(t)  # products that round
    else:
        info = torch.iinfo(t)
        x = torch.from_numpy(rng.integers(info.min, info.max, n, endpoint=True)).to(t)
    return x.view(torch.int16).numpy().tobytes() if t == torch.bfloat16 else x.numpy().tobytes()


FLOATS = ("float32", "float64", "float16", "bfloat16")
CASES = [(d, o) for d in DTYPES for o in OPS if not (o in BITWISE and d in FLOATS)]  # Gloo has no bitwise float ops


@pytest.mark.parametrize("dtype,op", CASES)
def test_a_fold_is_torchs_to_the_bit(dtype, op):
    block, base = values(dtype, 256, 1), values(dtype, 256, 2)
    for times in (1, 2, 5):
        for start in (None, base):
            ours, ref = fold(start, block, times, op, dtype), torch_fold(start, block, times, op, dtype)
            assert len(ours) == len(ref)
            if dtype.startswith("float") or dtype == "bfloat16":  # NaN == NaN, bit for bit elsewhere
                view = {"float32": np.uint32, "float64": np.uint64}.get(dtype, np.uint16)
                a, r = np.frombuffer(ours, view), np.frombuffer(ref, view)
                fdt = {"float32": np.float32, "float64": np.float64, "float16": np.float16}.get(dtype)
                nan = np.isnan(np.frombuffer(ref, fdt)) if fdt else (r & 0x7FFF) > 0x7F80
                assert np.array_equal(a[~nan], r[~nan]), (op, dtype, times, start is None)
                assert nan.sum() == (np.isnan(np.frombuffer(ours, fdt)) if fdt else (a & 0x7FFF) > 0x7F80).sum()
            else:
                assert ours == ref, (op, dtype, times, start is None)


def test_no_fold_is_the_base_or_zeros():
    assert fold(b"\x01\x02", b"\x03\x04", 0, "SUM", "uint8") == b"\x01\x02"
    assert fold(None, b"\x03\x04", 0, "SUM", "uint8") == bytes(2)
