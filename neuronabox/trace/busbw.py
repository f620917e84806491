"""Algorithm and bus bandwidth, as nccl-tests reports them.

algbw is the bytes of the operation over its time (for allgather, gather and
alltoall the whole output); busbw scales it by the fraction of the data each
rank must move on the busiest link of an optimal algorithm, so that it compares
with the hardware's link bandwidth whatever the collective (nccl-tests,
doc/PERFORMANCE.md): allreduce 2(n-1)/n; allgather, reduce-scatter, alltoall
(n-1)/n; broadcast, reduce, gather, scatter, send and receive 1.
"""

from __future__ import annotations

from neuronabox.schedules import Kind


def bus_factor(kind: str, ranks: int) -> float:
    """busbw / algbw for `kind` over `ranks` ranks (0 for a barrier, which moves no data)."""
    n = max(ranks, 1)
    if kind == Kind.ALLREDUCE:
        return 2 * (n - 1) / n
    if kind in (Kind.ALLGATHER, Kind.ALLTOALL, "reduce_scatter"):
        return (n - 1) / n
    if kind == Kind.BARRIER:
        return 0.0
    return 1.0


def bandwidths(kind: str, nbytes: float, seconds: float, ranks: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (10^9 bytes per second, nccl-tests' unit)."""
    if seconds <= 0:
        return 0.0, 0.0
    alg = nbytes / seconds / 1e9
    return alg, alg * bus_factor(kind, ranks)
