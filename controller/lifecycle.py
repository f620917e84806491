"""The run's state as the controller reports it: where the run is, the error that
ended it, and the exit status the process returns.

The loop, the store threads and the gRPC threads all move it, so each move is one
of RUN_MOVES, taken under a lock. A move the table does not have is refused, not
raised: the threads race (a stop asked while the rendezvous ends, a store thread's
error after the loop stopped), and the state already reached stands.
"""

from __future__ import annotations

import sys
import threading
import traceback
from enum import Enum

from neuronabox.errors import NeuronaBoxError

from .dialects.gloo.wire import UnsupportedRecord
from .outcomes import ProtocolError

FAILED = 3  # exit status: an error ended the run
STALLED = 4  # exit status: the watchdog ended the run (a real rank is hung; it will not fail on its own)
STORE_LOST = 5  # exit status: the store a real node's agent hosts went away (that node ended)


class StoreLost(NeuronaBoxError, ConnectionError):
    """The run's store, hosted by a real node's torchrun agent, went away."""


class RanksBlocked(NeuronaBoxError, RuntimeError):
    """An error the real ranks cannot fail from on their own (they wait for peers nobody
    plays): the run ends as a stall does, and the launcher stops them at once."""


class RunState(Enum):
    """The values are what the status reply and the trace's footer say."""

    STARTING = "starting"  # the store, the emulated agents and records are being set up
    RUNNING = "running"  # the emulated agents joined: real ranks' records are read, pairs open
    STOPPING = "stopping"  # a stop was asked: the loop ends
    STOPPED = "stopped"  # the loop ended without an error
    FAILED = "failed"  # an error ended the run (its first one is the cause)


RUN_MOVES: dict[RunState, set[RunState]] = {
    RunState.STARTING: {RunState.RUNNING, RunState.STOPPING, RunState.STOPPED, RunState.FAILED},
    RunState.RUNNING: {RunState.STOPPING, RunState.STOPPED, RunState.FAILED},
    RunState.STOPPING: {RunState.STOPPED, RunState.FAILED},
    RunState.STOPPED: set(),
    RunState.FAILED: {RunState.FAILED},  # a later error keeps the first one's words
}


class Lifecycle:
    def __init__(self) -> None:
        self.state = RunState.STARTING
        self.error = ""  # the first error's one-line cause (stderr, the status reply, the trace's footer)
        self.exit_status = FAILED  # when the run ends on an error
        self._lock = threading.Lock()

    def move(self, to: RunState) -> bool:
        """Take the move to `to` if RUN_MOVES has it; False (and no change) if not."""
        with self._lock:
            return self._move(to)

    def _move(self, to: RunState) -> bool:
        if to not in RUN_MOVES[self.state]:
            return False
        self.state = to
        return True

    def fail(self, exc: BaseException) -> None:
        """An error ends the run: the first one names the cause; a lost store sets its exit status."""
        with self._lock:
            if not self._move(RunState.FAILED):
                return
            if isinstance(exc, StoreLost):
                self.exit_status = STORE_LOST
            elif isinstance(exc, RanksBlocked):
                self.exit_status = STALLED
            if self.error:
                return
            if not isinstance(exc, (ProtocolError, UnsupportedRecord, ConnectionError, RuntimeError)):
                # not one of ours: the traceback goes to controller.log, which the launcher keeps
                traceback.print_exception(exc, file=sys.stderr)
            self.error = f"{type(exc).__name__}: {exc}" if not str(exc) or isinstance(exc, LookupError) else str(exc)

    def end(self) -> RunState:
        """The loop has stopped: the run ends failed if an error came, stopped if not."""
        self.move(RunState.FAILED if self.error else RunState.STOPPED)
        return self.state
