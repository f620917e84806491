"""The ranges the tool's numbers are checked against, in one place, so the launcher, the
Python API and the simulation refuse the same things the same way."""

from __future__ import annotations

# The largest world the tool emulates or simulates: a controller or a simulation holds
# schedules of O(world) entries per collective, so a world far past this grows memory
# without bound before anything useful runs (16384 ranks simulate in seconds; NCCL's
# own worlds reach tens of thousands).
MAX_WORLD = 1 << 18


def check_world(nnodes: int, nproc_per_node: int) -> str | None:
    """Why a world of nnodes x nproc_per_node ranks is refused, or None."""
    if nnodes < 1 or nproc_per_node < 1:
        return f"--nnodes and --nproc-per-node must be at least 1, got {nnodes} and {nproc_per_node}"
    if nnodes * nproc_per_node > MAX_WORLD:
        return f"a world of {nnodes * nproc_per_node} ranks is past the largest the tool runs ({MAX_WORLD})"
    return None
