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
# The most ranks that really run. Each is a process of its own that imports torch (a few
# hundred MB and seconds of CPU), and each is listed in every real rank's
# NEURONABOX_REAL_RANKS. A big host runs a few hundred ranks; 1024 leaves room past that
# and keeps the list under 8 KiB (Linux refuses one variable past 128 KiB: 100000 real
# ranks failed with "Argument list too long" after the controller had started).
MAX_REAL_RANKS = 1024


def check_world(nnodes: int, nproc_per_node: int) -> str | None:
    """Why a world of nnodes x nproc_per_node ranks is refused, or None."""
    if nnodes < 1 or nproc_per_node < 1:
        return f"--nnodes and --nproc-per-node must be at least 1, got {nnodes} and {nproc_per_node}"
    if nnodes * nproc_per_node > MAX_WORLD:
        return f"a world of {nnodes * nproc_per_node} ranks is past the largest the tool runs ({MAX_WORLD})"
    return None


def check_real_ranks(count: int) -> str | None:
    """Why starting `count` real ranks is refused, or None."""
    if count > MAX_REAL_RANKS:
        return (
            f"{count} real ranks is past the most the tool starts ({MAX_REAL_RANKS}, each a process of its own); "
            "give fewer with --nproc-per-node, --real-nodes or --real-ranks"
        )
    return None


def read_bounded(path: str | os.PathLike, limit: int, what: str = "file") -> bytes:
    """A whole file of at most `limit` bytes, or ValueError naming it: a file the user
    names may be a device or a log that grew without bound, and reading it whole would
    grow this process with it. Every whole-file read of the tool goes through here
    (tests/test_rules.py walks the code for any that does not)."""
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{path}: larger than {limit} bytes, too large for a {what}")
    return data


def read_tail(path: str | os.PathLike, limit: int) -> bytes:
    """The last `limit` bytes of a file (a log's end says why it ended)."""
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - limit))
        return f.read(limit)


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
