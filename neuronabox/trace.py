"""The run's trace: JSON lines streamed to disk while the run goes.

A run of a million collectives must neither hold its records in memory nor
carry them in one reply (gRPC refuses messages over 4 MiB), so the controller
writes each record as it completes: a header line, one line per collective
instance (`{"instance": {...}}`) or optimizer step (`{"step": [rank, t]}`), and a
footer line (`{"end": {...}}`) when the run stops. A trace without a footer is
a run that was cut off; its lines up to the cut are still good.

`load` reads a whole trace into one document (for tests and short runs);
`events` streams it; `ends` reads only the header and footer.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import IO

from neuronabox.errors import NeuronaBoxError

FORMAT = "neuronabox-trace"
VERSION = 1
STEP_WINDOW = 4096  # intervals kept per real rank for the iteration time's median


class TraceError(NeuronaBoxError, ValueError):
    """A file that is not a NeuronaBox trace."""


class TraceWriter:
    """Appends the run's records to `path` as they come; buffered, flushed on `close`."""

    def __init__(self, path: str | os.PathLike, header: dict) -> None:
        self.path = Path(path)
        self._f: IO[str] | None = open(self.path, "w", buffering=1 << 16)  # noqa: SIM115 - closed in close()
        self._write({"format": FORMAT, "version": VERSION, **header})

    def _write(self, doc: dict) -> None:
        if self._f is not None:
            self._f.write(json.dumps(doc, separators=(",", ":")) + "\n")

    def instance(self, record: dict) -> None:
        self._write({"instance": record})

    def step(self, rank: int, t: float) -> None:
        self._write({"step": [rank, t]})

    def close(self, footer: dict) -> None:
        if self._f is None:
            return
        self._write({"end": footer})
        self._f.close()
        self._f = None


def events(path: str | os.PathLike) -> Iterator[tuple[str, object]]:
    """(what, value) for each line: ("header", dict), ("instance", dict), ("step",
    [rank, t]), ("end", dict). Raises TraceError on a file that is not a trace."""
    with open(path) as f:
        first = f.readline()
        try:
            header = json.loads(first)
        except ValueError:
            header = None
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise TraceError(f"{path}: not a NeuronaBox trace (no header line)")
        if header.get("version") != VERSION:
            raise TraceError(f"{path}: trace version {header.get('version')}, this NeuronaBox reads {VERSION}")
        yield "header", header
        for line in f:
            try:
                doc = json.loads(line)
            except ValueError:  # a run cut off mid-line: what came before stands
                return
            (what, value), = doc.items()
            yield what, value


def load(path: str | os.PathLike) -> dict:
    """The whole trace as one document: the header's fields, `instances`, `steps`, and
    the footer's fields (`complete` says whether the run wrote its footer)."""
    doc: dict = {"instances": [], "steps": [], "complete": False}
    for what, value in events(path):
        if what == "header":
            doc.update({k: v for k, v in value.items() if k not in ("format", "version")})
        elif what == "instance":
            doc["instances"].append(value)
        elif what == "step":
            doc["steps"].append(value)
        elif what == "end":
            doc.update(value)
            doc["complete"] = True
    return doc


def ends(path: str | os.PathLike, tail_bytes: int = 1 << 16) -> tuple[dict, dict]:
    """The header and the footer ({} when the run was cut off), without reading the
    records between them."""
    with open(path, "rb") as f:
        header = json.loads(f.readline())
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - tail_bytes))
        lines = f.read().rstrip(b"\n").rsplit(b"\n", 1)
    try:
        last = json.loads(lines[-1])
    except ValueError:
        last = {}
    return header, last.get("end", {}) if isinstance(last, dict) else {}


@dataclass
class KindTotals:
    count: int = 0
    nbytes: int = 0
    seconds: float = 0.0  # summed mean time on the real ranks
    boundary_messages: int = 0
    predicted: float = 0.0  # summed model time


@dataclass
class RunTotals:
    """What the status and the summary need, kept in constant memory as records stream by."""

    kinds: defaultdict[str, KindTotals] = field(default_factory=lambda: defaultdict(KindTotals))
    _last_step: dict[int, float] = field(default_factory=dict)
    _intervals: dict[int, deque[float]] = field(default_factory=dict)
    _steps: dict[int, int] = field(default_factory=dict)

    def add(self, kind: str, nbytes: int, per_rank: dict, boundary: int, predicted: float) -> None:
        k = self.kinds[kind]
        k.count += 1
        k.nbytes += nbytes
        k.seconds += sum(b - a for a, b in per_rank.values()) / max(1, len(per_rank))
        k.boundary_messages += boundary
        k.predicted += predicted

    def step(self, rank: int, t: float) -> None:
        self._steps[rank] = self._steps.get(rank, 0) + 1
        last = self._last_step.get(rank)
        self._last_step[rank] = t
        if last is not None:
            self._intervals.setdefault(rank, deque(maxlen=STEP_WINDOW)).append(t - last)

    def iteration(self) -> tuple[int, float]:
        """Optimizer steps of the lowest real rank that reported any, and the median time
        between them (over the last STEP_WINDOW): a first step that builds buckets, or a
        warm-up, does not drag it."""
        if not self._steps:
            return 0, 0.0
        rank = min(self._steps)
        xs = self._intervals.get(rank)
        return self._steps[rank], median(xs) if xs else 0.0
