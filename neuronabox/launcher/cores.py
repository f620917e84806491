"""Which cores of this machine a plain run's real nodes and controller run on.

An emulated run is compared with an all-real one by the real ranks' time, and a real rank
that shares its core with the controller (or another rank) pays for it: on two cores, an
MLP at W = 2 ran 13 to 21% slower emulated than all-real with the processes left where the
OS put them, and within 2.3% under validate, which gives every process a core of its own.
So the launcher does as validate does when the machine has the cores, and says so; when it
has too few it says that the timings include the sharing. `--placement FILE` places the
run instead (a testbed's hosts), and `--placement off` leaves the OS to it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class CorePlan:
    """Real node -> its cores (its agent and ranks share them); the controller's cores."""

    nodes: dict[int, tuple[int, ...]]
    controller: tuple[int, ...]

    def describe(self) -> str:
        parts = [f"real node {n} on {_cores(c)}" for n, c in sorted(self.nodes.items())]
        return f"placed: {', '.join(parts)}, the controller on {_cores(self.controller)} (--placement off to not pin)"


def _cores(cpus: tuple[int, ...]) -> str:
    return f"core {cpus[0]}" if len(cpus) == 1 else "cores " + ",".join(map(str, cpus))


def plan_cores(ranks_on: dict[int, int], available: list[int]) -> tuple[CorePlan | None, str]:
    """A core per real rank (`ranks_on`: real node -> its real ranks here) and one for the
    controller, from `available`, in order; or None and why not, in one line."""
    need = sum(ranks_on.values()) + 1
    if len(available) < need:
        ranks = sum(ranks_on.values())
        return None, (
            f"not placed: {ranks} real rank{'s' if ranks != 1 else ''} and the controller need {need} cores, "
            f"this machine gives {len(available)}: the timings include their sharing"
        )
    free = iter(sorted(available))
    nodes = {n: tuple(next(free) for _ in range(k)) for n, k in sorted(ranks_on.items())}
    plan = CorePlan(nodes, (next(free),))
    return plan, plan.describe()


def this_machine() -> list[int]:
    """The cores this process may run on."""
    return sorted(os.sched_getaffinity(0))


def pin(cpus: tuple[int, ...] | None) -> Callable[[], None] | None:
    """A child's preexec step that moves it onto `cpus` (None: nothing to do)."""
    if not cpus:
        return None
    return lambda: os.sched_setaffinity(0, cpus)
