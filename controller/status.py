"""What the run's gRPC control calls answer (controller/service.py serves them): the
status (state, per-kind totals, pairs, what is in flight), a stop, and what-if changes.

The calls run in gRPC's threads while the loop goes on, so what they read is taken
in single steps under the GIL. A Shutdown call waits for the run's final status, and
the controller waits (briefly) for that reply to leave before the server goes.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable

from neuronabox.delay_models.whatif import WhatIf

from neuronabox.trace.records import RunTotals

from . import control_pb2
from .config import ControllerConfig
from .lifecycle import Lifecycle, RunState
from .release import ReleaseTiming
from .service import ControlService, serve


class StatusService:
    """`connections`: how many pairs are open; `pending`: the instances in flight, each
    with what it waits for; `stop`: ends the loop (a Shutdown call); `clock` and `started`:
    the uptime's."""

    def __init__(
        self,
        cfg: ControllerConfig,
        lifecycle: Lifecycle,
        totals: RunTotals,
        timing: ReleaseTiming,
        connections: Callable[[], int],
        pending: Callable[[], list[str]],
        stop: Callable[[str], None],
        log: Callable[[str], None],
        clock: Callable[[], float],
        started: float,
        cpu: Callable[[], float] = time.process_time,
    ) -> None:
        """`cpu`: the controller's CPU seconds at work (less its loop's empty polls)."""
        self.cfg = cfg
        self.lifecycle = lifecycle
        self.totals = totals
        self.timing = timing
        self.connections = connections
        self.pending = pending
        self._stop = stop
        self.log = log
        self.clock = clock
        self.started = started
        self.cpu = cpu
        self.finished = threading.Event()  # the loop has stopped and the state is final
        self._stop_asked = False
        self._reply_done = threading.Event()  # the Shutdown call's final status is out
        self.token = secrets.token_hex(16)  # every control call carries it (the ready file has it)
        service = ControlService(self.snapshot, self.shutdown, self.inject, self.finished, token=self.token)
        self.server, self.port = serve(service, cfg.control_host)

    def snapshot(self, final: bool) -> control_pb2.StatusReply:
        kinds = list(self.totals.kinds.items())  # one step under the GIL: the loop adds meanwhile
        steps, iteration = self.totals.iteration()
        state = self.lifecycle.state
        reply = control_pb2.StatusReply(
            state=state.value,
            world_size=self.cfg.world_size,
            real_ranks=self.cfg.real_ranks,
            kinds=[
                control_pb2.KindCounters(
                    kind=n,
                    count=k.count,
                    bytes=k.nbytes,
                    seconds=k.seconds,
                    boundary_messages=k.boundary_messages,
                    predicted_s=k.predicted,
                    lag_s=k.lag,
                    lagged=k.lagged,
                )
                for n, k in sorted(kinds)
            ],
            boundary_messages=sum(k.boundary_messages for _, k in kinds),
            connections=self.connections(),
            pending=self.pending(),
            error=self.lifecycle.error,
            uptime_s=self.clock() - self.started,
            cpu_s=self.cpu(),
            steps=steps,
            iteration_s=iteration,
        )
        if final and state in (RunState.STOPPED, RunState.FAILED):
            self._reply_done.set()
        return reply

    def shutdown(self, reason: str) -> None:
        """A Shutdown call: the run stops, and its reply (the final status) is awaited at the end."""
        self._stop_asked = True
        self._stop(reason)

    def inject(self, specs: list[str], clear: bool) -> list[str]:
        """Change the what-if modifiers during the run: instances that start from now on
        see them. Raises WhatIfError on a bad spec."""
        mods = [] if clear else list(self.timing.whatif.mods)
        added = WhatIf.from_specs(specs)
        added.check(self.cfg.world_size, self.cfg.real_ranks, self.cfg.timeout_s)  # as the launcher checks --inject
        mods += added.mods
        self.timing.set_whatif(WhatIf(mods))
        self.log(f"what-if now: {', '.join(m.spec for m in mods) or 'none'}")
        return [m.spec for m in mods]

    def close(self) -> None:
        """The run's state is final: answer a waiting Shutdown call, then stop serving."""
        self.finished.set()
        if self._stop_asked:  # the Shutdown call that asked waits for the final status
            self._reply_done.wait(timeout=3)
        self.server.stop(grace=1).wait(2)
