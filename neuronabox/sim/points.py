"""A sweep's points, run by an executor, each row in its CSV as soon as it finishes.

A point is one value of the swept key: a live run (`neuronabox torchrun` with the
value injected) or a replay of a recorded trace. Its outcome is a `Row`: the
iteration time, or the one-line cause it failed with; a failed point is a row, not a
lost sweep. Rows go to the table as they come (flushed, so an interrupted sweep
keeps what finished), and a sweep run again skips the points its table holds done.

Executors: `local` runs the points one after another in this process; `ray` makes
each point a Ray task on a cluster (`ray.init(address)`), a live point asking for a
CPU per real rank and one for the controller. Ray is an engine, not ours: the
optional extra `neuronabox[ray]`.
"""

from __future__ import annotations

import csv
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from neuronabox.errors import NeuronaBoxError
from neuronabox.progress import StatusLine

EXECUTORS = ("local", "ray")
RAY_MISSING = "--executor ray needs Ray: pip install 'neuronabox[ray]' (or pip install ray)"


class ExecutorError(NeuronaBoxError, RuntimeError):
    """The executor cannot run the sweep (Ray missing, its cluster unreachable)."""


@dataclass(frozen=True)
class Point:
    index: int
    label: str  # the value as the user wrote it
    value: float
    spec: str  # the what-if spec a live point injects (simulated: the --with options)
    trace: str
    log: str  # a live point's ranks' output ("" for a replay)


@dataclass
class Row:
    point: Point
    status: str  # ok or failed
    iteration_s: float | None = None
    share: float | None = None  # a replay's communication share
    world: int | None = None
    cause: str = ""
    wall_s: float = 0.0


# -- what one point does (top-level functions: a Ray worker imports them) -----------------
def live_point(point: Point, launch: list[str], script: list[str]) -> Row:
    """One live run with the point's what-if injected."""
    from neuronabox.sim.sweep import SweepError, run_one

    t0 = time.monotonic()
    try:
        result = run_one(point.spec, launch, script, Path(point.trace), Path(point.log))
    except SweepError as exc:
        return Row(point, "failed", cause=str(exc), wall_s=time.monotonic() - t0)
    if result.steps < 2:
        return Row(point, "failed", cause="no optimizer steps observed; the sweep needs the observer",
                   wall_s=time.monotonic() - t0)  # fmt: skip
    return Row(point, "ok", result.iteration_s, wall_s=time.monotonic() - t0)


def simulated_point(point: Point, key: str, source: str) -> Row:
    """One replay of the trace at `source` with the point's value."""
    from neuronabox.sim.simulate import SimulateError, load_trace, run_simulation

    t0 = time.monotonic()
    nodes = int(point.value) if key == "nnodes" else None
    inject = ([point.spec] if point.spec else None) if key == "nnodes" else [point.spec]
    try:
        doc = load_trace(source)
        sim, totals, _ = run_simulation(doc, source, nnodes=nodes, inject=inject, out=point.trace)
    except (SimulateError, RuntimeError) as exc:
        return Row(point, "failed", cause=f"the simulation with {key}={point.label} failed: {exc}",
                   wall_s=time.monotonic() - t0)  # fmt: skip
    steps, it = totals.iteration()
    if steps < 2:
        return Row(point, "failed", cause="the trace has fewer than two optimizer steps", wall_s=time.monotonic() - t0)
    return Row(point, "ok", it, sim.comm_share, sim.world, wall_s=time.monotonic() - t0)


# -- executors ------------------------------------------------------------------------
def run_local(points: list[Point], fn: Callable[..., Row], args: tuple,
              on_start: Callable[[int], None] | None = None) -> Iterator[Row]:  # fmt: skip
    """The points one after another in this process."""
    for p in points:
        if on_start:
            on_start(1)
        yield fn(p, *args)


def ray_available() -> bool:
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def run_ray(points: list[Point], fn: Callable[..., Row], args: tuple, address: str | None, cpus: float,
            on_start: Callable[[int], None] | None = None) -> Iterator[Row]:  # fmt: skip
    """Each point a Ray task asking for `cpus`; rows in the order they finish. Without an
    address, a Ray instance of this machine's own, on loopback, for the sweep's length."""
    try:
        import ray
    except ImportError:
        raise ExecutorError(RAY_MISSING) from None
    started_here = not ray.is_initialized()
    if started_here:
        try:
            if address:
                ray.init(address=address, logging_level="ERROR", log_to_driver=False)
            else:
                ray.init(_node_ip_address="127.0.0.1", include_dashboard=False, logging_level="ERROR",
                         log_to_driver=False)  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - Ray raises many kinds for one cause: no cluster
            raise ExecutorError(f"--ray-address {address or '(local)'}: {str(exc).splitlines()[0]}") from None
    try:
        task = ray.remote(num_cpus=cpus, max_retries=0)(fn)
        pending = {task.remote(p, *args): p for p in points}
        if on_start:
            on_start(len(pending))
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            point = pending.pop(done[0])
            try:
                yield ray.get(done[0])
            except Exception as exc:  # noqa: BLE001 - a task's crash (its worker died) is the point's failure
                yield Row(point, "failed", cause=f"its Ray task failed: {str(exc).splitlines()[0]}")
    finally:
        if started_here:
            ray.shutdown()


def live_cpus(launch: list[str]) -> int:
    """What a live point holds: a core per real rank and one for the controller."""
    flags: dict[str, str] = {}
    for k, arg in enumerate(launch):  # --flag value and --flag=value alike
        name, eq, value = arg.partition("=")
        flags[name.replace("_", "-")] = value if eq else (launch[k + 1] if k + 1 < len(launch) else "")
    nproc = flags.get("--nproc-per-node", "1")
    real_nodes = flags.get("--real-nodes", "0").split(",")
    return len(real_nodes) * (int(nproc) if nproc.isdigit() else 1) + 1


# -- the table ---------------------------------------------------------------------------
class SweepTable:
    """The sweep's CSV: the header once, a row per finished point, flushed as it comes.
    Opened on a table of the same sweep, it keeps the rows done and says which labels
    they hold (resume); failed rows are dropped, to be run again."""

    def __init__(self, path: Path, header: list[str]) -> None:
        self.path, self.header = path, header
        self.done: dict[str, dict] = {}  # label -> its row, from an earlier run of the sweep
        if path.exists() and path.stat().st_size:
            with path.open(newline="") as f:
                rows = list(csv.DictReader(f))
            if rows and list(rows[0]) != header:
                raise ExecutorError(f"{path} holds another sweep's table (columns {','.join(rows[0])}): "
                                    "give another --out, or remove it")  # fmt: skip
            self.done = {r[header[0]]: r for r in rows if r.get("status") == "ok"}
        self._f = path.open("w", newline="")
        self._w = csv.writer(self._f)
        self._w.writerow(header)
        for r in self.done.values():
            self._w.writerow([r[h] for h in header])
        self._f.flush()

    def add(self, cells: list) -> None:
        self._w.writerow(cells)
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()


# -- progress --------------------------------------------------------------------------
class Progress(StatusLine):
    """Points done, running and failed, and the time left: the sweep's status line (each
    row's own line, printed above it, says what finished)."""

    def __init__(self, total: int, parallel: int, clock: Callable[[], float] = time.monotonic,
                 stream=None) -> None:  # fmt: skip
        super().__init__("points", total, stream=stream, clock=clock)
        self.parallel = max(1, parallel)
        self.failed = self.running = 0

    def line(self) -> str:
        left = self.total - self.done - self.failed
        eta = ""
        finished = self.done + self.failed
        if finished and left:
            per = (self.clock() - self.t0) / finished
            eta = f", ~{per * left / min(self.parallel, left):.0f} s left"
        return f"points {finished}/{self.total}: {self.done} done, {self.running} running, {self.failed} failed{eta}"

    def started(self, n: int) -> None:
        self.running = n
        self.draw()

    def finished(self, ok: bool, text: str) -> None:
        self.done += ok
        self.failed += not ok
        self.running = max(0, min(self.running - 1, self.total - self.done - self.failed))
        self.say(text)
