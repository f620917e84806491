"""Release-time scheduling: when each emulated message may leave for a real rank.

The engine asks for one `Timeline` per collective instance (the schedules' timing
model, priced by the run's delay model and what-if modifiers); the driver's timers
write each message at its release time, and the lateness of every timed release is
kept so a run can say how precise it was. Emulated ranks are charged the local work
a real rank does (the model's `local_work`, from the topology), so that they keep a
real rank's pace (DESIGN.md, "Timing semantics").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from neuronabox.delay_models.whatif import WhatIf
from neuronabox.topology import HostWork, LinkClass

from neuronabox.errors import NeuronaBoxError
from neuronabox.schedules import Kind
from neuronabox.schedules.gloo import RealRanks, Schedule
from neuronabox.schedules.timing import Timeline, timeline_for

from .skew import Skew
from .work_meter import Sample, WorkMeter, moved, trimmed_mean

LATENESS_SAMPLES = 200_000
MEASURED_KINDS = (Kind.ALLREDUCE, Kind.ALLGATHER, Kind.REDUCE)  # rings: a real rank's send follows its receive


class BeyondTimeout(NeuronaBoxError, RuntimeError):
    """The delay model holds a message longer than the run's timeout: the real ranks would
    wait past it, and the watchdog would blame them for a stall the emulator made."""


class ReleaseTiming:
    def __init__(
        self,
        model,
        whatif: WhatIf | None = None,
        modeled_boundary: bool = True,
        limit_s: float = math.inf,
        skew: Skew | None = None,
        measure_work: bool = False,
    ) -> None:
        """`measure_work`: when the model charges no local work (a preset topology), charge
        the emulated ranks the real rank's own, measured from the run's instances
        (`observe`, controller/work_meter.py)."""
        self.model = model
        self.skew = skew or Skew()  # the emulated ranks' drawn entry delays (--skew; none: no draws)
        self.limit_s = limit_s  # a live run's timeout: no modeled time may reach it
        self.whatif = whatif or WhatIf()
        self.modeled = modeled_boundary
        self.work: HostWork = getattr(model, "local_work", HostWork())  # a plugin may not say
        # The topology's work wins; none given, the run measures the real rank's.
        self.meter = WorkMeter() if measure_work and not self.work.any() else None
        self.work_source = "topology" if self.work.any() else "measured" if self.meter is not None else "none"
        # A replay's: (group, tag) -> the local work its live instance charged (set before the instance starts).
        self.replayed: dict[tuple[str, int], HostWork] | None = None
        self._hops: dict[tuple, LinkClass] = {}
        self.lateness: list[float] = []
        self.late_count = 0

    @property
    def active(self) -> bool:
        """False for the zero model without modifiers: messages leave as soon as they can."""
        return self.model.name != "zero" or self.whatif.any()

    def set_whatif(self, whatif: WhatIf) -> None:
        """From the control service's threads: one reference swap, which the loop reads whole."""
        self.whatif = whatif

    def hop(self, kind: Kind, nbytes: int, world: int, schedule: Schedule) -> LinkClass:
        key = (kind, nbytes, world, getattr(schedule, "geo", None))  # an allreduce's segmentation prices its hop
        link = self._hops.get(key)
        if link is None:
            link = self._hops[key] = self.model.hop(kind, nbytes, world, schedule)
        return self.whatif.hop(kind, link)

    def timeline(
        self,
        kind: Kind,
        nbytes: int,
        schedule: Schedule,
        real: RealRanks,
        t0: float,
        group: str = "0",
        tag: int = 0,
        work: HostWork | None = None,
        started: float | None = None,
    ) -> Timeline | None:
        """The instance's timeline; `group` and `tag` name it (its recurring collective and
        the seed of its skew draws); `started`: a native start's word on the books not yet
        adopted (Skew.entry)."""
        if not self.active:
            return None
        hop = self.hop(kind, nbytes, schedule.world, schedule)
        later = self.whatif.entry_delay(kind)  # the collective starts later for every rank, the real ones too
        entry = self.skew.entry(t0 + later, self.whatif.stragglers(kind), (group, str(kind), nbytes), f"{group}/{tag}",
                                schedule.world, real.members,
                                hold_real=bool(later), started=started)  # fmt: skip
        edge = schedule.edge_work(self.work if work is None else work)
        return timeline_for(schedule, hop, entry, real, self.modeled, edge)

    def ended(self, group: str, tag: int, rank_times: dict, lag: float = 0.0) -> None:
        """An instance's book completed; `rank_times`: each real rank's (first, last message);
        `lag`: the emulator's (Book.lag). Only drawn skew reads them: nothing is done per
        instance otherwise."""
        if rank_times and self.skew.mode != "none":
            self.skew.ended(f"{group}/{tag}", max(last for _, last in rank_times.values()), lag)

    def predicted(self, kind: Kind, nbytes: int, schedule: Schedule, rank: int, work: HostWork | None = None) -> float:
        """The model's time for the instance as real `rank` sees it (every other rank
        emulated), modifiers included."""
        if not self.active:
            return 0.0
        hop = self.hop(kind, nbytes, schedule.world, schedule)
        edge = schedule.edge_work(self.work if work is None else work)
        return schedule.rank_time(hop, rank, edge) + self.whatif.entry_delay(kind)

    def within_limit(self, what: str, seconds: float) -> float:
        """`seconds`, the model's time for `what`, if it is below the run's timeout."""
        if not seconds < self.limit_s:  # NaN too
            whatif = ", ".join(self.whatif.specs()) or "none"
            raise BeyondTimeout(
                f"the delay model gives {what} {seconds:g} s, not less than --timeout ({self.limit_s:g} s): "
                f"the run cannot go on (model {self.model.name}, what-if now: {whatif})"
            )
        return seconds

    def message(self, kind: Kind, src: int, dst: int, nbytes: int) -> float:
        """One point-to-point message under the model, what-if modifiers included: its
        path time splits into a latency and a bandwidth that the modifiers scale; the
        emulated sender spends one message's work first, as in a pairwise collective."""
        lat = self.model.message_time(src, dst, 0)
        rest = self.model.message_time(src, dst, nbytes) - lat
        bw = nbytes / rest if rest > 0 else float("inf")
        link = self.whatif.hop(kind, LinkClass("message", bw, lat))
        serial = nbytes / link.bandwidth if nbytes else 0.0
        work = self.work.message
        return work + link.latency + serial + self.whatif.entry_delay(kind) + self.whatif.jitter(kind)

    def observe(self, kind: Kind, schedule: Schedule, turnarounds: list[float]) -> None:
        """A finished ring instance's real-rank turnarounds (each send notice's time since
        the controller's latest write to that rank: its receive, its own work, its call to
        send), as a sample for the meter. A turnaround does not include when the emulated
        side released, so what-if delays, jitter and drawn skew leave it alone."""
        if self.meter is None or not self.active or kind not in MEASURED_KINDS or len(turnarounds) < 2:
            return
        messages = schedule.edge_work(HostWork(message=1.0))  # per edge of the DAG
        if messages <= 0:
            return
        reduced = schedule.edge_work(HostWork(reduce_bandwidth=1.0)) / messages  # bytes reduced per message
        fitted = self.meter.add(Sample(1.0, reduced, trimmed_mean(turnarounds), len(turnarounds)))
        if fitted is not None and moved(self.work, fitted):
            self.work = fitted  # instances that start from now on charge it

    def work_at(self, group: str, tag: int) -> HostWork:
        """The local work instance `tag` of `group` charges: a replay's recorded one for it,
        else the run's now."""
        if self.replayed is not None:
            return self.replayed.pop((group, tag), HostWork())
        return self.work

    def measured(self, work: HostWork) -> tuple[float, float] | None:
        """`work` as the trace records it, (seconds per message, per reduced byte), when it is
        measured (or a replay of measured); None otherwise."""
        if self.work_source not in ("measured", "recorded") or not work.any():
            return None
        return (work.message, work.reduce_per_byte)

    def work_summary(self) -> dict:
        """Where the emulated ranks' local work came from, and what it is (the trace's footer)."""
        bw = self.work.reduce_bandwidth
        doc = {"source": self.work_source, "message_us": self.work.message * 1e6,
               "reduce_gbps": None if math.isinf(bw) else bw / 1e9}  # fmt: skip
        if self.meter is not None:
            doc["samples"] = self.meter.count
        return doc

    def jitter(self, kind: Kind) -> float:
        return self.whatif.jitter(kind)

    def record_lateness(self, *seconds: float) -> None:
        """How late timed releases left (the first LATENESS_SAMPLES kept, all counted)."""
        self.late_count += len(seconds)
        room = LATENESS_SAMPLES - len(self.lateness)
        if room > 0:
            self.lateness.extend(seconds[:room])

    def lateness_summary(self) -> dict:
        xs = sorted(self.lateness)
        if not xs:
            return {"timed_releases": 0}
        return {
            "timed_releases": self.late_count,
            "median_us": xs[len(xs) // 2] * 1e6,
            "p99_us": xs[min(len(xs) - 1, int(len(xs) * 0.99))] * 1e6,
            "max_us": xs[-1] * 1e6,
        }


class Jittered:
    """A timeline whose releases each get the what-if's random extra delay."""

    def __init__(self, timeline, timing: ReleaseTiming, kind: Kind) -> None:
        self.timeline, self.timing, self.kind = timeline, timing, kind

    def release(self, emu: int, step: int) -> float:
        return self.timeline.release(emu, step) + self.timing.jitter(self.kind)

    def real_sent(self, rank: int, step: int, t: float) -> None:
        self.timeline.real_sent(rank, step, t)


@dataclass(frozen=True)
class DrawnStart:
    """A native starter's timeline under drawn skew: each start makes its own, with its own
    entry and draws (seeded by its tag), in the core's call, as `Instance._install` would."""

    timing: ReleaseTiming
    kind: Kind
    nbytes: int
    schedule: Schedule
    real: RealRanks
    group: str

    def at(self, t0: float, tag: int, started: float = -1.0) -> Timeline | None:
        """The start's timeline; None once the timing is inactive (the zero model's what-if
        cleared since the offer): the core then starts the book untimed. `started`: the
        core's word on the books it started that Python has not adopted (Skew.entry)."""
        timing = self.timing
        work = timing.work_at(self.group, tag)
        return timing.timeline(self.kind, self.nbytes, self.schedule, self.real, t0, self.group, tag, work, started)
