"""What one `neuronabox perf` run measures: the collective, the ladder of sizes and
nccl-tests' loop settings, as nccl-tests' own flags say them (`-b -e -f -i -n -w -c
-o -d -r`), checked once. Pure: no process, no torch.

nccl-tests' semantics kept: sizes are bytes of the whole buffer (an allgather's
output, an alltoall's send buffer); `-f` multiplies from `-b` up to `-e`, `-i` adds
instead; each size is rounded down to a whole number of elements per rank; the time
of a size is the mean of `-n` back-to-back iterations after `-w` warm-up ones.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from neuronabox.errors import NeuronaBoxError
from neuronabox.schedules import Kind

# nccl-tests' binaries and our kinds. `reduce_scatter` has no Gloo schedule.
COLLECTIVES: dict[str, Kind] = {
    "all_reduce": Kind.ALLREDUCE,
    "all_gather": Kind.ALLGATHER,
    "reduce_scatter": Kind.REDUCE_SCATTER,
    "broadcast": Kind.BROADCAST,
    "reduce": Kind.REDUCE,
    "alltoall": Kind.ALLTOALL,
}
# nccl-tests' -d names -> (torch dtype name, bytes per element)
DTYPES: dict[str, tuple[str, int]] = {
    "float": ("float32", 4), "float32": ("float32", 4), "half": ("float16", 2), "float16": ("float16", 2),
    "bfloat16": ("bfloat16", 2), "double": ("float64", 8), "float64": ("float64", 8),
    "int32": ("int32", 4), "int": ("int32", 4), "int64": ("int64", 8), "int8": ("int8", 1), "uint8": ("uint8", 1),
}  # fmt: skip
OPS = ("sum", "prod", "max", "min", "avg")
REDUCING = (Kind.ALLREDUCE, Kind.REDUCE, Kind.REDUCE_SCATTER)
UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
MAX_BYTES = 1 << 34  # 16 GiB: past this a buffer is not a benchmark row on one host
MAX_ROWS = 64
MAX_ITERS = 1_000_000


class PerfError(NeuronaBoxError, ValueError):
    """A perf request that cannot run; the message is the one-line cause."""


@dataclass(frozen=True)
class PerfSpec:
    """One ladder: what each real rank runs and checks (serialised for the worker)."""

    coll: Kind
    sizes: tuple[int, ...]  # bytes per row, already whole elements per rank
    dtype: str  # torch's name
    elem: int  # bytes per element
    op: str  # sum, prod, max, min, avg (reductions); "none" otherwise
    root: int
    iters: int
    warmup: int
    check: int  # iterations whose values are checked per size (nccl-tests -c)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict) -> PerfSpec:
        return cls(**{**doc, "coll": Kind(doc["coll"]), "sizes": tuple(doc["sizes"])})


def coll_of(name: str) -> Kind:
    """nccl-tests' name (`all_reduce`, `all_reduce_perf`) or ours (`allreduce`) -> the kind."""
    key = name.removesuffix("_perf")
    for nccl_name, kind in COLLECTIVES.items():
        if key in (nccl_name, kind.value):
            return kind
    known = ", ".join(COLLECTIVES)
    raise PerfError(f"unknown collective {name!r} (nccl-tests' names: {known}; with or without _perf)")


def parse_size(text: str, flag: str) -> int:
    """`8`, `1K`, `128M`, `1G` (nccl-tests' suffixes, powers of 1024) -> bytes."""
    raw = text.strip().upper()
    mult = UNITS.get(raw[-1:], 1)
    digits = raw[:-1] if raw[-1:] in UNITS else raw
    if not digits.isdigit():
        raise PerfError(f"{flag} takes a size such as 8, 1K, 128M or 1G, got {text!r}")
    value = int(digits) * mult
    if not 0 < value <= MAX_BYTES:
        raise PerfError(f"{flag} is 1 byte to {MAX_BYTES >> 30} GiB, got {text!r}")
    return value


def ladder(minbytes: int, maxbytes: int, factor: int | None, step: int | None) -> list[int]:
    """The sizes nccl-tests walks: times `factor` (default 2), or plus `step`."""
    if minbytes > maxbytes:
        raise PerfError(f"the size range is empty: -b {minbytes} is above -e {maxbytes}")
    if factor is not None and step is not None:
        raise PerfError("give -f (a factor) or -i (an increment), not both")
    if step is not None and step < 1:
        raise PerfError(f"-i is at least 1, got {step}")
    if factor is not None and factor < 2:
        raise PerfError(f"-f is at least 2, got {factor}")
    sizes, size = [], minbytes
    while size <= maxbytes:
        sizes.append(size)
        if len(sizes) > MAX_ROWS:
            raise PerfError(f"the ladder has more than {MAX_ROWS} sizes; use a larger -f or -i")
        size = size + step if step is not None else size * (factor or 2)
    return sizes


def whole_elements(kind: Kind, size: int, elem: int, world: int) -> int:
    """`size` rounded down as nccl-tests does: whole elements, and for the kinds that
    split the buffer by rank, a whole number of them per rank (0: too small to run)."""
    per = elem * (world if kind in (Kind.ALLGATHER, Kind.REDUCE_SCATTER, Kind.ALLTOALL) else 1)
    return size // per * per


def nccl_count(kind: Kind, size: int, elem: int, world: int) -> int:
    """NCCL's count for a row of `size` bytes: per rank for allgather and reduce-scatter."""
    return size // elem // (world if kind in (Kind.ALLGATHER, Kind.REDUCE_SCATTER) else 1)


def make_spec(coll: str, world: int, *, minbytes: str = "32M", maxbytes: str = "32M", factor: int | None = None,
              step: str | None = None, iters: int = 20, warmup: int = 5, check: int = 1, op: str = "sum",
              dtype: str = "float", root: int = 0) -> PerfSpec:  # fmt: skip
    """The spec nccl-tests' flags describe for a world of `world` ranks, or PerfError."""
    kind = coll_of(coll)
    if dtype not in DTYPES:
        raise PerfError(f"-d: unknown type {dtype!r} (known: {', '.join(DTYPES)})")
    torch_dtype, elem = DTYPES[dtype]
    if kind in REDUCING:
        if op not in OPS:
            raise PerfError(f"-o is one of {', '.join(OPS)}, got {op!r}")
    else:
        op = "none"
    for flag, value, low in (("-n", iters, 1), ("-w", warmup, 0), ("-c", check, 0)):
        if not low <= value <= MAX_ITERS:
            raise PerfError(f"{flag} is {low} to {MAX_ITERS}, got {value}")
    if not 0 <= root < world:
        raise PerfError(f"-r names rank {root}, outside the world of {world} ranks (0..{world - 1})")
    low, high = parse_size(minbytes, "-b"), parse_size(maxbytes, "-e")
    sizes = ladder(low, high, factor, parse_size(step, "-i") if step is not None else None)
    rounded = tuple(dict.fromkeys(s for s in (whole_elements(kind, s, elem, world) for s in sizes) if s))
    if not rounded:
        raise PerfError(f"every size from {low} to {high} bytes is below one {dtype} element per rank at {world} ranks")
    return PerfSpec(kind, rounded, torch_dtype, elem, op, root, iters, warmup, check)
