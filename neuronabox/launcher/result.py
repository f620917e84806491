"""A finished run's result: what `neuronabox.launch` returns and the command line prints.
Apart from the API because the run (`run.Run`) makes it, and the API runs the run."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from neuronabox.trace.summary import format_summary


@dataclass(frozen=True)
class KindStats:
    count: int
    nbytes: int  # summed over the instances
    mean_s: float  # mean time on the real ranks
    model_mean_s: float  # mean time the delay model gave
    boundary_messages: int
    lag_mean_s: float | None = None  # the emulator's mean lag (None: the delay model priced nothing)

    @property
    def own_mean_s(self) -> float | None:
        """What is left of the real rank's time once the model and the emulator's lag are
        taken out: the real rank's own work (its library's calls, its reductions)."""
        return None if self.lag_mean_s is None else self.mean_s - self.model_mean_s - self.lag_mean_s


@dataclass(frozen=True)
class RunResult:
    world_size: int
    real_ranks: list[int]
    steps: int  # optimizer steps the observer saw on the lowest real rank
    iteration_s: float  # their median interval (0 when none were seen)
    kinds: dict[str, KindStats]
    boundary_messages: int
    controller_cpu_s: float
    trace_path: Path
    summary: str = field(repr=False)  # what the command line prints


def result_of(reply, header: dict, footer: dict, trace_path: str) -> RunResult:
    """A finished run's result from the controller's final status and the trace's ends."""
    kinds = {
        k.kind: KindStats(
            k.count,
            k.bytes,
            k.seconds / k.count if k.count else 0.0,
            k.predicted_s / k.count if k.count else 0.0,
            k.boundary_messages,
            k.lag_s / k.lagged if k.lagged else None,
        )
        for k in reply.kinds
    }
    return RunResult(
        world_size=reply.world_size,
        real_ranks=list(reply.real_ranks),
        steps=reply.steps,
        iteration_s=reply.iteration_s,
        kinds=kinds,
        boundary_messages=reply.boundary_messages,
        controller_cpu_s=reply.cpu_s,
        trace_path=Path(trace_path),
        summary=format_summary(reply, header, footer),
    )
