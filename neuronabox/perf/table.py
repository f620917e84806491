"""nccl-tests' table for a perf run: one row per size, nccl-tests' columns and
bus-bandwidth factors, plus the delay model's time for the same collective. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from neuronabox.perf.ladder import DTYPES
from neuronabox.trace.busbw import bandwidths

# torch's dtype names -> nccl-tests' type column: the first of -d's names for each
TYPES: dict[str, str] = {}
for _name, (_torch, _) in DTYPES.items():
    TYPES.setdefault(_torch, _name)


@dataclass(frozen=True)
class Row:
    bytes: int
    count: int
    time_s: float  # the real ranks' mean of the mean iteration
    wrong: int | None  # over every real rank's checked outputs (None: nothing checked, a simulation)
    model_s: float | None  # the delay model's mean for the timed iterations (None: all real)


def render(rows: list[Row], *, coll: str, dtype: str, op: str, root: int, world: int, title: str) -> str:
    """The table as nccl-tests prints it (out-of-place only), with a `model` column."""
    rooted = coll in ("broadcast", "reduce")
    lines = [
        f"# {title}",
        "#",
        f"# {'size':>10} {'count':>12} {'type':>8} {'redop':>6} {'root':>5} {'time':>10} {'algbw':>7} {'busbw':>7}"
        f" {'#wrong':>6} {'model':>10}",
        f"# {'(B)':>10} {'(elements)':>12} {'':>8} {'':>6} {'':>5} {'(us)':>10} {'(GB/s)':>7} {'(GB/s)':>7}"
        f" {'':>6} {'(us)':>10}",
    ]
    busbws = []
    for r in rows:
        alg, bus = bandwidths(coll, r.bytes, r.time_s, world)
        busbws.append(bus)
        model = f"{r.model_s * 1e6:>10.2f}" if r.model_s is not None else f"{'-':>10}"
        lines.append(
            f"  {r.bytes:>10} {r.count:>12} {TYPES.get(dtype, dtype):>8} {op:>6} {root if rooted else -1:>5}"
            f" {r.time_s * 1e6:>10.2f} {alg:>7.3f} {bus:>7.3f} {'-' if r.wrong is None else r.wrong:>6} {model}"
        )
    if all(r.wrong is not None for r in rows):
        wrong = sum(r.wrong for r in rows)
        lines.append(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}")
    lines.append(f"# Avg bus bandwidth    : {sum(busbws) / len(busbws) if busbws else 0.0:.4f}")
    return "\n".join(lines) + "\n"
