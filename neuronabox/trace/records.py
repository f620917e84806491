"""The run's trace (schema version 2, docs/trace.md): JSON lines streamed to disk
while the run goes, on one clock, epoch microseconds.

A run of a million collectives must neither hold its records in memory nor
carry them in one reply (gRPC refuses messages over 4 MiB), so the controller
writes each record as it completes: a header line; a group line the first time
a group's collective completes (`{"group": {...}}`); one line per collective
instance or point-to-point message (`{"instance": {...}}`); a real rank's compute
gap once no collective it may still be in began before the gap ended
(`{"gap": [rank, from_us, to_us]}`); an optimizer step (`{"step": [rank, t_us]}`); the
time a real rank's observer held its core, and the CPU it used there (`{"held": [rank, from_us, to_us,
cpu_us]}`);
the dtypes the real ranks' flight recorders give for collectives (`{"dtypes":
[[group, seq, dtype], ...]}`, joined to their instances by `load`); and a footer
line (`{"end": {...}}`) when the run stops. A trace without a footer is a run
that was cut off; its lines up to the cut are still good.

`load` reads a whole trace into one document (for tests and short runs);
`events` streams it; `ends` reads only the header and footer.
"""

from __future__ import annotations

import errno
import fcntl
import heapq
import json
import os
import stat
from collections import defaultdict, deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import IO, Protocol

from neuronabox.errors import NeuronaBoxError
from neuronabox.schedules.kinds import POINT_TO_POINT

FORMAT = "neuronabox-trace"
VERSION = 2
# Every read of a trace is bounded: a line (the header's group table is the largest) may
# not pass this, so a file that is not a trace (/dev/zero, a binary, a 3 GB line) ends in
# one TraceError instead of growing the reader without bound.
MAX_LINE_BYTES = 64 << 20
STEP_WINDOW = 4096  # intervals kept per real rank for the iteration time's median
DTYPE_OF_SIZE = {1: "Byte", 2: "Half", 4: "Float", 8: "Double"}  # the wire's guess when the observer did not say
SIZE_OF_DTYPE = {"Byte": 1, "Char": 1, "Bool": 1, "Short": 2, "Half": 2, "BFloat16": 2, "Int": 4, "Float": 4,
                 "Long": 8, "Double": 8, "ComplexFloat": 8, "ComplexDouble": 16}  # c10's names  # fmt: skip


class TraceError(NeuronaBoxError, ValueError):
    """A file that is not a NeuronaBox trace."""


class TraceBusy(NeuronaBoxError, BlockingIOError):
    """Another writer holds the trace: two runs writing one file would interleave it."""


def _open_locked(path: Path) -> IO[str]:
    """`path` for writing, under an exclusive lock held until the file is closed (a run
    holds it for its whole life). Emptied only once the lock is held, so a run that
    finds the file busy leaves the other run's trace as it is."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise TraceBusy(errno.EWOULDBLOCK, "is being written by another run", str(path)) from None
    except OSError:  # a file system without locks: written unlocked
        pass
    os.ftruncate(fd, 0)
    return os.fdopen(fd, "w", buffering=1 << 16)


def being_written(path: str | os.PathLike) -> bool:
    """Whether a writer holds `path`'s lock now (the launcher asks before it starts a run)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:  # none yet, or not ours to read: no run of ours writes it
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:  # a file system without locks: nobody can tell
        return False
    finally:
        os.close(fd)  # and with it the shared lock
    return False


class Record(Protocol):
    """What the engine reports of one instance (controller/outcomes.py's InstanceRecord),
    its times in the writer's clock, seconds."""

    group: str
    tag: int
    kind: str
    nbytes: int
    boundary_messages: int
    start: float
    end: float
    per_rank: Mapping[int, tuple[float, float]]
    geometry: str
    loop_cpu: float
    predicted: float
    world: int
    ranks: list[int]
    root: int | None
    numel: int | None
    elem: int | None
    dtype: str | None
    lag: float | None
    work: tuple[float, float] | None  # measured local work charged: (seconds per message, seconds per reduced byte)


def instance_line(rec: Record, us) -> dict:
    """The trace line of one instance; `us` maps the record's clock to epoch microseconds.
    `per_rank` is keyed by global rank."""
    ranks = rec.ranks
    numel = rec.numel if rec.numel is not None else (rec.nbytes // rec.elem if rec.elem else None)
    return {
        "kind": str(rec.kind),
        "group": rec.group,
        "seq": rec.tag,
        "world": rec.world,
        "root": rec.root,
        "dtype": rec.dtype or (DTYPE_OF_SIZE.get(rec.elem) if rec.elem else None),
        "numel": numel,
        "nbytes": rec.nbytes,
        "start_us": us(rec.start),
        "end_us": us(rec.end),
        "per_rank": {str(ranks[r] if ranks else r): [us(a), us(b)] for r, (a, b) in rec.per_rank.items()},
        "model_us": rec.predicted * 1e6,
        "boundary_messages": rec.boundary_messages,
        "geometry": rec.geometry,
        "loop_cpu_s": rec.loop_cpu,
        **({"lag_us": rec.lag * 1e6} if rec.lag is not None else {}),
        **({"work": {"message_us": rec.work[0] * 1e6, "reduce_ns_per_byte": rec.work[1] * 1e9}} if rec.work else {}),
        **({"native_start": True} if getattr(rec, "native", False) else {}),
        **({"posted_ahead": True} if getattr(rec, "posted_ahead", False) else {}),
        **({"started_on_note": True} if getattr(rec, "on_note", False) else {}),
    }


class GapTracker:
    """Each real rank's compute gaps (the time it is in no collective), found as records
    complete, which they do out of entry order when collectives overlap. A gap is final
    once no collective the rank is still in began before it ended: `settle` takes each
    rank's earliest entry into a collective still open (the watermark)."""

    def __init__(self) -> None:
        self._pending: dict[int, list[tuple[float, float]]] = {}  # rank -> heap of (entered, left)
        self._busy_until: dict[int, float] = {}  # rank -> the end of what is settled

    def add(self, rank: int, entered: float, left: float) -> None:
        heapq.heappush(self._pending.setdefault(rank, []), (entered, left))

    def settle(self, open_entries: Mapping[int, float] | None = None) -> list[tuple[int, float, float]]:
        """The gaps now final, as (rank, from, to)."""
        gaps = []
        for rank, heap in self._pending.items():
            mark = (open_entries or {}).get(rank)
            while heap and (mark is None or heap[0][0] <= mark):
                a, b = heapq.heappop(heap)
                last = self._busy_until.get(rank)
                if last is not None and a > last:
                    gaps.append((rank, last, a))
                self._busy_until[rank] = b if last is None else max(last, b)
        return gaps


class TraceWriter:
    """Appends the run's records to `path` as they come; buffered, flushed on `close`.
    Holds `path`'s lock until then: a second writer gets `TraceBusy`.
    `epoch_offset`: seconds from the records' clock to epoch seconds (the controller's
    monotonic clock; 0 for a simulation, whose clock starts at 0)."""

    def __init__(self, path: str | os.PathLike, header: dict, epoch_offset: float = 0.0) -> None:
        self.path = Path(path)
        self._offset = epoch_offset
        self._groups: set[str] = set()
        self._dtyped: dict[str, int] = {}  # group -> the last tag whose dtype is written
        self._gaps = GapTracker()
        self._f: IO[str] | None = _open_locked(self.path)  # closed in close(), and the lock with it
        self._write({"format": FORMAT, "version": VERSION, "clock": "epoch_us", **header})

    def _us(self, t: float) -> float:
        return round((t + self._offset) * 1e6, 3)

    def _write(self, doc: dict) -> None:
        if self._f is not None:
            self._f.write(json.dumps(doc, separators=(",", ":")) + "\n")

    def instance(self, rec: Record, open_entries: Mapping[int, float] | None = None) -> None:
        """One completed instance; `open_entries`: each real rank's earliest entry (global
        rank -> the records' clock) into a collective still in flight, which holds back
        the gaps it may still fill."""
        if rec.group not in self._groups:
            self._groups.add(rec.group)
            self._write({"group": {"name": rec.group, "world": rec.world, "ranks": list(rec.ranks) or None}})
        line = instance_line(rec, self._us)
        self._write({"instance": line})
        for r, (a, b) in rec.per_rank.items():
            self._gaps.add(rec.ranks[r] if rec.ranks else r, a, b)
        self._write_gaps(open_entries)

    def _write_gaps(self, open_entries: Mapping[int, float] | None) -> None:
        for rank, a, b in self._gaps.settle(open_entries):
            self._write({"gap": [rank, self._us(a), self._us(b)]})

    def dtypes(self, found: list[list]) -> None:
        """[group, seq, dtype] of collectives an observer read from its flight recorder;
        each once (every real rank reports its groups'), whether or not its instance
        line is written yet (`load` joins them)."""
        new = [d for d in found if d[1] > self._dtyped.get(d[0], -1)]
        for group, seq, _ in new:
            self._dtyped[group] = max(self._dtyped.get(group, -1), seq)
        if new:
            self._write({"dtypes": new})

    def step(self, rank: int, t_epoch: float) -> None:
        """An optimizer step at `t_epoch` (epoch seconds: the observer reads the wall clock)."""
        self._write({"step": [rank, round(t_epoch * 1e6, 3)]})

    def held(self, rank: int, start: float, end: float, cpu: float) -> None:
        """A real rank's observer used `cpu` seconds of its core between `start` and `end`
        (the records' clock)."""
        self._write({"held": [rank, self._us(start), self._us(end), round(cpu * 1e6, 3)]})

    def close(self, footer: dict) -> None:
        if self._f is None:
            return
        self._write_gaps(None)  # nothing is in flight any more
        self._write({"end": footer})
        self._f.close()
        self._f = None


def check_readable(path: str | os.PathLike) -> None:
    """A trace is a regular file: a device or a pipe (/dev/zero, /dev/stdin) never ends."""
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise TraceError(f"{path}: not a regular file, so not a trace")


def bounded_lines(f: IO[bytes], path: str | os.PathLike) -> Iterator[bytes]:
    """The file's lines, none longer than MAX_LINE_BYTES (TraceError names the first that is)."""
    n = 0
    while True:
        line = f.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        n += 1
        if len(line) > MAX_LINE_BYTES:
            limit = MAX_LINE_BYTES >> 20
            raise TraceError(f"{path}: line {n} is longer than {limit} MiB: not a trace, or a damaged one")
        yield line


def events(path: str | os.PathLike) -> Iterator[tuple[str, object]]:
    """(what, value) for each line: ("header", dict), ("group", dict), ("instance", dict),
    ("gap", [rank, from_us, to_us]), ("step", [rank, t_us]), ("held", [rank, from_us, to_us, cpu_us]),
    ("dtypes", [[group, seq, dtype], ...]), ("end", dict). Raises
    TraceError on a file that is not a trace of this version."""
    check_readable(path)
    with open(path, "rb") as f:
        lines = bounded_lines(f, path)
        first = next(lines, b"")
        try:
            header = json.loads(first)
        except (ValueError, UnicodeDecodeError):
            header = None
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise TraceError(f"{path}: not a NeuronaBox trace (no header line)")
        if header.get("version") != VERSION:
            raise TraceError(
                f"{path}: trace version {header.get('version')}, this NeuronaBox reads version {VERSION}"
                " (record the run again)"
            )
        yield "header", header
        for n, line in enumerate(lines, start=2):
            try:
                doc = json.loads(line)
            except (ValueError, UnicodeDecodeError):  # a run cut off mid-line: what came before stands
                return
            if not isinstance(doc, dict) or len(doc) != 1:
                raise TraceError(f"{path}: line {n} is not a trace record")
            ((what, value),) = doc.items()
            yield what, value


# What a reader relies on in each instance record (instance_record writes them all).
INSTANCE_KEYS = {"kind": str, "group": str, "seq": int, "world": int, "nbytes": int, "per_rank": dict}


def check_instance(path: str | os.PathLike, n: int, rec: object) -> None:
    """An instance record a reader can use, or TraceError naming the record."""
    if not isinstance(rec, dict):
        raise TraceError(f"{path}: instance {n} is not a record")
    for key, kind in INSTANCE_KEYS.items():
        if not isinstance(rec.get(key), kind):
            raise TraceError(f"{path}: instance {n} has no {kind.__name__} {key!r}: a damaged trace")
    for rank, span in rec["per_rank"].items():
        if not (isinstance(span, list) and len(span) == 2 and all(isinstance(t, (int, float)) for t in span)):
            raise TraceError(f"{path}: instance {n} has a malformed span for rank {rank}: a damaged trace")


def held_record(path: str | os.PathLike, value: object) -> list:
    """A `held` line's [rank, from_us, to_us, cpu_us]; a line of the first traces that had
    them, without the CPU, counts its whole window."""
    if not (isinstance(value, list) and len(value) in (3, 4) and all(isinstance(v, (int, float)) for v in value)):
        raise TraceError(f"{path}: a malformed held record: a damaged trace")
    return value if len(value) == 4 else [*value, value[2] - value[1]]


def load(path: str | os.PathLike) -> dict:
    """The whole trace as one document: the header's fields, `groups` (name -> global
    ranks; the default group's are the world's), `instances`, `gaps`, `steps`, `held`, and the
    footer's fields (`complete` says whether the run wrote its footer). A collective's
    dtype from a `dtypes` line fills its instance, and its element count with it."""
    doc: dict = {"instances": [], "gaps": [], "steps": [], "held": [], "groups": {}, "complete": False}
    dtypes: dict[tuple[str, int], str] = {}
    for what, value in events(path):
        if what == "header":
            doc.update({k: v for k, v in value.items() if k not in ("format", "version")})
        elif what == "group":
            try:
                doc["groups"][value["name"]] = value["ranks"] or list(range(value["world"]))
            except (KeyError, TypeError):
                raise TraceError(f"{path}: a malformed group record: a damaged trace") from None
        elif what == "instance":
            check_instance(path, len(doc["instances"]), value)
            doc["instances"].append(value)
        elif what == "gap":
            doc["gaps"].append(value)
        elif what == "step":
            doc["steps"].append(value)
        elif what == "held":
            doc["held"].append(held_record(path, value))
        elif what == "dtypes":
            try:
                dtypes.update(((group, seq), dtype) for group, seq, dtype in value)
            except (TypeError, ValueError):
                raise TraceError(f"{path}: a malformed dtypes record: a damaged trace") from None
        elif what == "end":
            doc.update(value)
            doc["complete"] = True
    if dtypes:
        for rec in doc["instances"]:
            dtype = dtypes.get((rec["group"], rec["seq"])) if rec["kind"] not in POINT_TO_POINT else None
            if dtype is not None:
                rec["dtype"] = dtype
                size = SIZE_OF_DTYPE.get(dtype)
                rec["numel"] = rec["nbytes"] // size if size else rec["numel"]
    return doc


def cut_off(doc: dict, path: str | os.PathLike) -> str | None:
    """A warning for a trace without its footer (`load`'s `complete`): its run was cut off
    (killed, or the trace copied mid-run), so what comes of it covers only part of the run."""
    if doc.get("complete"):
        return None
    return (f"{path} has no footer: its run was cut off, and only what it recorded is used "
            f"({len(doc.get('instances', []))} instances, {len(doc.get('steps', []))} optimizer steps)")  # fmt: skip


def ends(path: str | os.PathLike, tail_bytes: int = 1 << 16) -> tuple[dict, dict]:
    """The header and the footer ({} when the run was cut off), without reading the
    records between them."""
    check_readable(path)
    with open(path, "rb") as f:
        header = json.loads(next(bounded_lines(f, path), b"{}"))
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - tail_bytes))
        lines = f.read(tail_bytes).rstrip(b"\n").rsplit(b"\n", 1)
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
    lag: float = 0.0  # summed emulator lag (InstanceRecord.lag), over `lagged` instances
    lagged: int = 0


@dataclass
class RunTotals:
    """What the status and the summary need, kept in constant memory as records stream by."""

    kinds: defaultdict[str, KindTotals] = field(default_factory=lambda: defaultdict(KindTotals))
    _last_step: dict[int, float] = field(default_factory=dict)
    _intervals: dict[int, deque[float]] = field(default_factory=dict)
    _steps: dict[int, int] = field(default_factory=dict)

    def add(
        self, kind: str, nbytes: int, per_rank: dict, boundary: int, predicted: float, lag: float | None = None
    ) -> None:
        k = self.kinds[kind]
        k.count += 1
        k.nbytes += nbytes
        k.seconds += sum(b - a for a, b in per_rank.values()) / max(1, len(per_rank))
        k.boundary_messages += boundary
        k.predicted += predicted
        if lag is not None:
            k.lag += lag
            k.lagged += 1

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
