"""What the run leaves: its per-kind totals (which the status reads) and its trace on
disk (docs/trace.md), written as each instance, step and dtype report comes, so
nothing of a long run is held. A finished instance and an optimizer step are also
the watchdog's evidence that a real rank moves.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from neuronabox.topology import Topology

from neuronabox import topology
from neuronabox.trace.records import RunTotals, TraceBusy, TraceWriter

from .config import ControllerConfig
from .groups import Group
from .outcomes import InstanceRecord
from .release import ReleaseTiming
from .watchdog import Watchdog

HOLD_MAX_S = 60.0  # one hold counts at most this long: a clock's jump is not the rank's cost


def open_trace(path: str, header: dict, offset: float) -> TraceWriter:
    """The run's trace, locked for the whole run. Another run holding it (it took the
    file after the launcher looked) ends this controller at start, in one line the
    launcher reports, before the other run's trace is touched."""
    try:
        return TraceWriter(path, header, offset)
    except TraceBusy:
        print(f"neuronabox controller: error: --trace {path} is being written by another run", file=sys.stderr)
        raise SystemExit(3) from None  # the status of an error (main.py)


class RunRecorder:
    """`group_of`: a group by name (None once unknown); `open_entries`: the engine's, which
    tells the trace which compute gaps are final; `clock`/`epoch`: monotonic and epoch
    time, read once together so the trace's times map to epoch time."""

    def __init__(
        self,
        cfg: ControllerConfig,
        topo: Topology,
        timing: ReleaseTiming,
        watchdog: Watchdog,
        group_of: Callable[[str], Group | None],
        open_entries: Callable[[], dict[int, float]],
        clock: Callable[[], float],
        epoch: Callable[[], float],
    ) -> None:
        self.cfg = cfg
        self.topology = topo
        self.timing = timing
        self.watchdog = watchdog
        self.group_of = group_of
        self.open_entries = open_entries
        self.clock = clock
        self.totals = RunTotals()
        self.starts = {"native": 0, "python": 0}  # how the instances' books started (engine.py, native_start)
        self.held: dict[int, tuple[int, float]] = {}  # real rank -> times and CPU seconds its observer held its core
        # One reading of both clocks: the trace's monotonic times map to epoch time through it.
        self.clock_anchor = {"monotonic": clock(), "epoch": epoch()}
        offset = self.clock_anchor["epoch"] - self.clock_anchor["monotonic"]  # the trace's clock is epoch
        self.trace = open_trace(cfg.trace_file, self._header(), offset) if cfg.trace_file else None

    def on_record(self, rec: InstanceRecord) -> None:
        """A finished instance: into the totals and the trace on disk, and then forgotten."""
        self.totals.add(rec.kind, rec.nbytes, rec.per_rank, rec.boundary_messages, rec.predicted, rec.lag)
        self.starts["native" if rec.native else "python"] += 1
        group = self.group_of(rec.group)
        if group is not None:
            done = f"{rec.kind} #{rec.tag} of group {rec.group!r}"
            for r, (_, end) in rec.per_rank.items():
                self.watchdog.touch(group.global_rank(int(r)), end, done)
        if self.trace is not None:
            self.trace.instance(rec, self.open_entries())

    def on_step(self, rank: int, t: float) -> None:
        """Real rank `rank`'s optimizer stepped at `t` (its observer's report)."""
        self.totals.step(rank, t)
        self.watchdog.touch(rank, self.clock())
        if self.trace is not None:
            self.trace.step(rank, t)

    def on_held(self, rank: int, start: float, end: float, cpu: float, same_clock: bool) -> None:
        """Real rank `rank`'s observer used `cpu` seconds of its core between `start` and
        `end` (monotonic seconds; on this process's clock when `same_clock`, else only
        durations mean anything)."""
        cpu = min(max(cpu, 0.0), max(end - start, 0.0), HOLD_MAX_S)  # one thread's CPU fits its window
        times, seconds = self.held.get(rank, (0, 0.0))
        self.held[rank] = (times + 1, seconds + cpu)
        if self.trace is not None and same_clock:
            self.trace.held(rank, start, end, cpu)

    def on_dtypes(self, dtypes: list[list]) -> None:
        """[[group, tag, dtype], ...] of the collectives the real ranks issued."""
        if self.trace is not None:
            self.trace.dtypes(dtypes)

    def close(self, state: str, error: str, reason: str = "") -> None:
        """The run ended: the trace's footer says how, and why it was stopped (the launcher's
        reason: the job finished, or a real node's process failed)."""
        if self.trace is not None:
            self.trace.close(self._footer(state, error, reason))

    def _header(self) -> dict:
        cfg = self.cfg
        return {
            "world_size": cfg.world_size,
            "nnodes": cfg.nnodes,
            "nproc_per_node": cfg.nproc_per_node,
            "real_ranks": cfg.real_ranks,
            "delay_model": cfg.delay_model,
            "topology": self.topology.name,
            "topology_spec": topology.as_spec(self.topology),
            "boundary": cfg.boundary,
            "inject": self.timing.whatif.specs(),
            "data": cfg.data,
            "observer": cfg.observer,
            "backend": cfg.backend,
            "skew": cfg.skew,
            **({"nccl": cfg.nccl_release} if cfg.backend == "nccl" else {}),
            "started_us": round(self.clock_anchor["epoch"] * 1e6, 3),
        }

    def _footer(self, state: str, error: str, reason: str = "") -> dict:
        return {
            "state": state,
            "error": error,
            "stopped_because": reason,
            "inject": self.timing.whatif.specs(),  # what-if may change during the run
            "release": self.timing.lateness_summary(),
            "local_work": self.timing.work_summary(),  # what the emulated ranks were charged at the end
            "starts": dict(self.starts),
            # The emulator's own work on each real rank's core, which an all-real run never pays.
            "observer_held": {str(r): {"times": n, "seconds": round(s, 6)} for r, (n, s) in sorted(self.held.items())},
        }
