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


_again: list[int] = []  # signals that came while the first one's exception unwound


def _raise(signum: int, _frame) -> None:
    # Only the first signal raises: a second one before the run's cleanup takes the signals
    # (Run.cleanup) is noted, not raised into the `except` that handles the first.
    for s in SIGNALS:
        signal.signal(s, _note)
    raise Interrupted(signum)


def _note(signum: int, _frame) -> None:
    _again.append(signum)


def interrupted_again() -> bool:
    """Whether a signal came after the first one and before the cleanup took them over."""
    return bool(_again)


@contextmanager
def raised_as_interrupted() -> Iterator[None]:
    """Within the block, SIGINT, SIGTERM and SIGHUP raise Interrupted; the old handlers after."""
    _again.clear()
    old = {s: signal.signal(s, _raise) for s in SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def signum_of(exc: BaseException) -> int:
    """The signal an Interrupted or a KeyboardInterrupt stands for."""
    return exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
