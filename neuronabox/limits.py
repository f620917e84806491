"""The ranges the tool's numbers are checked against, and what a file it writes must be,
in one place, so the launcher, the Python API, the simulation and the exports refuse the
same things the same way."""

from __future__ import annotations

import os
from pathlib import Path

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


def output_problem(target: str | os.PathLike) -> str | None:
    """Why the tool may not write its output to `target`, or None: a regular file (or none
    yet) in a folder that exists and takes it. A device or a /proc file would swallow the
    output, or give back something else if it is read again."""
    path = Path(target)
    if path.is_dir():
        return f"{target}: is a folder"
    if path.exists() and not path.is_file() or str(path.resolve()).startswith("/proc/"):
        return f"{target}: not a regular file"
    folder = path.parent
    if not folder.is_dir():
        return f"{target}: no folder {str(folder)!r} to write into"
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        return f"{target}: not writable"
    return None
