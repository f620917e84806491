"""Real ranks in the real-time scheduling class (`--realtime`).

Some kernels leave a woken thread waiting for the next scheduler tick. This VM's does
(6.18, PREEMPT_NONE, EEVDF, HZ = 250): a Gloo thread that a rank's own thread wakes can
wait up to 4 ms with its core idle (docs/fidelity.md, "Tick stalls"). A real rank's
collectives then take whole ticks now and then, all-real or emulated, and a what-if of
0.5 ms drowns in them. A thread in the real-time class runs as soon as it wakes: a
4 KiB allreduce at W = 2, all-real, 200 repetitions a run, averaged 1.50 ms in the
normal class and 0.12 ms under SCHED_RR, its median 0.22 against 0.12 ms
(scripts/bench_realtime.py).

The class applies to the real ranks (through their torchrun agents, whose children
inherit it), never to the controller, which polls its core. A rank that computes more
than the kernel's real-time share of a second (`sched_rt_runtime_us`, 95% by default)
is held back for the rest of it, so a compute-bound job meets that throttle; the
launcher names the share it runs under.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

from neuronabox.limits import read_bounded

POLICY = os.SCHED_RR
PRIORITY = 1  # the lowest real-time priority: above every normal thread, below the kernel's own
RUNTIME = Path("/proc/sys/kernel/sched_rt_runtime_us")
PERIOD = Path("/proc/sys/kernel/sched_rt_period_us")


def problem() -> str | None:
    """Why this process cannot put its children in the real-time class, or None. Tried
    on a thread of its own that ends at once (Linux sets a policy per thread)."""
    failed: list[OSError] = []

    def attempt() -> None:
        try:
            os.sched_setscheduler(0, POLICY, os.sched_param(PRIORITY))
        except OSError as exc:
            failed.append(exc)

    probe = threading.Thread(target=attempt, name="realtime-probe")
    probe.start()
    probe.join()
    if failed:
        why = failed[0].strerror
        return f"--realtime: this process may not use the real-time class ({why}): run as root or with CAP_SYS_NICE"
    return None


def share() -> str:
    """The kernel's real-time share, as the launcher reports it."""
    try:
        runtime, period = int(read_bounded(RUNTIME, 64)), int(read_bounded(PERIOD, 64))
    except (OSError, ValueError):
        return "the kernel's real-time share unknown"
    if runtime < 0:
        return "the kernel does not throttle the class"
    return f"the kernel throttles the class past {runtime / period:.0%} of each {period / 1e6:g} s"


def entering(then: Callable[[], None] | None) -> Callable[[], None]:
    """A child's preexec step: into the real-time class, then `then` (its placement)."""

    def enter() -> None:
        os.sched_setscheduler(0, POLICY, os.sched_param(PRIORITY))
        if then is not None:
            then()

    return enter
