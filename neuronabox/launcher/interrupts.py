"""SIGINT, SIGTERM and SIGHUP as an exception in the main thread, so a command that runs
a job stops it on the way out (its `finally`) and exits 128 + the signal, as a shell
expects. One place for the commands that run jobs (`torchrun`, `perf`)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(BaseException):
    """A signal reached the launcher: stop the run, exit 128 + the signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise(signum: int, _frame) -> None:
    raise Interrupted(signum)


@contextmanager
def raised_as_interrupted() -> Iterator[None]:
    """Within the block, SIGINT, SIGTERM and SIGHUP raise Interrupted; the old handlers after."""
    old = {s: signal.signal(s, _raise) for s in SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def signum_of(exc: BaseException) -> int:
    """The signal an Interrupted or a KeyboardInterrupt stands for."""
    return exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
