"""How a real node failed, from what its process says on stderr.

torchrun's own exit status is 1 whatever became of the worker; the worker's status
(or the signal that killed it) and its rank are only in the "Root Cause (first
observed failure)" block torchrun prints on stderr before it exits. So each real
node's stderr comes to the launcher through a pipe: `NodeOutput` forwards every byte
to where it would have gone as it arrives (progress bars included, not a line late)
and notes that block and when it came, so the launcher can name the node, the rank
and its status, and tell which of several failed nodes failed first (the others
most likely failed because of it). `root_cause` is the parsing, a pure function."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import BinaryIO

ROOT_CAUSE = "Root Cause (first observed failure):"
_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)")
_EXITCODE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
_RULE = re.compile(r"^\s*={10,}\s*$")  # the block's last line
MAX_BLOCK_LINES = 40  # rank and exitcode come in the block's first few lines
MAX_LINE = 64 * 1024  # a longer partial line is dropped from the parsing (it is still forwarded)
SETTLE_S = 3.0  # how long the launcher waits for a failed torchrun's block


@dataclass(frozen=True)
class WorkerExit:
    """The worker torchrun names as the first to fail: its global and local rank (None
    when the block does not say) and its own exit status, negative for the signal that
    killed it."""

    rank: int | None
    local_rank: int | None
    exitcode: int

    def describe(self) -> str:
        who = f"rank {self.rank}" if self.rank is not None else "a worker"
        return f"{who}'s process {ended(self.exitcode)}"


def root_cause(lines: Iterable[str]) -> WorkerExit | None:
    """The worker of the last root-cause block in `lines` (torchrun's stderr), or None
    when there is none or it lacks an exit code. The "Failures:" list before it is not
    read: those failed after the root cause."""
    found: WorkerExit | None = None
    inside = False
    rank = local = None
    for line in lines:
        if ROOT_CAUSE in line:
            inside, rank, local = True, None, None
        elif inside and _RULE.match(line):
            inside = False
        elif inside and (m := _RANK.match(line)):
            rank, local = int(m[1]), int(m[2])
        elif inside and (m := _EXITCODE.match(line)):
            found, inside = WorkerExit(rank, local, int(m[1])), False
    return found


def ended(status: int | None) -> str:
    """'exited with status 3', or 'was killed by signal 9 (SIGKILL)' for a negative
    status (how both Popen and torchrun say a signal ended a process)."""
    if status is None:
        return "failed"
    if status >= 0:
        return f"exited with status {status}"
    try:
        name = f" ({signal.Signals(-status).name})"
    except ValueError:
        name = ""
    return f"was killed by signal {-status}{name}"


def stderr_sink(output: str | os.PathLike | None) -> BinaryIO:
    """Where a real node's stderr went before it came through the launcher: the run's
    `output` file, else the launcher's own stderr (fd 2, which the child inherited)."""
    if output is not None:
        return open(output, "ab")  # noqa: SIM115 - the reader thread closes it at EOF
    try:
        return os.fdopen(os.dup(2), "wb")
    except OSError:
        return open(os.devnull, "wb")  # noqa: SIM115 - as above


class NodeOutput:
    """A real node's process (its torchrun, or a real rank started without an agent:
    `rank` set) whose stderr is a pipe to the launcher. A thread forwards what arrives
    to `sink` and reads torchrun's root-cause block; `failed_at` is the monotonic time
    the node's failure was first seen (the block's arrival or the process's exit)."""

    def __init__(self, proc: subprocess.Popen, node: int, sink: BinaryIO, rank: int | None = None) -> None:
        self.proc, self.node, self.rank = proc, node, rank
        self.cause: WorkerExit | None = None
        self.block_at: float | None = None
        self.exit_seen_at: float | None = None
        self._block: list[str] | None = None
        self._settled = threading.Event()  # the block is read, or the pipe is at EOF
        self._thread = threading.Thread(target=self._pump, args=(sink,), name=f"node {node} stderr", daemon=True)
        self._thread.start()

    # -- the reader thread ----------------------------------------------------------------
    def _pump(self, sink: BinaryIO | None) -> None:
        """Forward every chunk as it comes; a sink that fails (a closed terminal) is
        dropped, but the pipe is still drained so the node never blocks on it."""
        pipe, partial = self.proc.stderr, b""
        try:
            while chunk := pipe.read1(65536):
                sink = _forward(sink, chunk)
                *lines, partial = (partial + chunk).split(b"\n")
                partial = partial if len(partial) <= MAX_LINE else b""
                for line in lines:
                    self._see(line.decode(errors="replace"))
        except (OSError, ValueError):
            pass  # the pipe closed under us: nothing more will come
        finally:
            if partial:
                self._see(partial.decode(errors="replace"))
            self._end_block()
            for f in (sink, pipe):
                _close(f)
            self._settled.set()

    def _see(self, line: str) -> None:
        if self._block is None:
            if ROOT_CAUSE in line:
                self.block_at, self._block = time.monotonic(), [line]
            return
        self._block.append(line)
        if _RULE.match(line) or len(self._block) >= MAX_BLOCK_LINES:
            self._end_block()
            self._settled.set()

    def _end_block(self) -> None:
        if self._block is not None:
            self.cause, self._block = root_cause(self._block), None

    # -- the launcher's side --------------------------------------------------------------
    def failed(self) -> bool:
        """Whether the node has failed (its process exited non-zero, or torchrun has
        begun to say why); notes when the exit was first seen."""
        code = self.proc.poll()
        if code not in (None, 0) and self.exit_seen_at is None:
            self.exit_seen_at = time.monotonic()
        return code not in (None, 0) or self.block_at is not None

    @property
    def failed_at(self) -> float:
        seen = [t for t in (self.block_at, self.exit_seen_at) if t is not None]
        return min(seen) if seen else float("inf")

    def settle(self, deadline: float) -> None:
        """Wait, until `deadline` at most, for the root-cause block of a failed torchrun
        (a torchrun killed by a signal prints none, nor does a rank started directly)."""
        code = self.proc.poll()
        if self.rank is None and not (code is not None and code < 0):
            self._settled.wait(max(0.0, deadline - time.monotonic()))

    def what(self) -> str:
        """How the node failed, as the launcher's message says it."""
        code = self.proc.poll()
        if self.rank is not None:
            return f"rank {self.rank}'s process {ended(code)}"
        if self.cause is not None:
            return self.cause.describe()
        return f"its torchrun process {ended(code)}"

    def at_eof(self, timeout: float) -> bool:
        """Whether the pipe reached EOF within `timeout` (a process the node left behind
        may hold it open)."""
        self._thread.join(max(0.0, timeout))
        return not self._thread.is_alive()


def first_failure(nodes: Iterable[NodeOutput], settle_s: float = SETTLE_S) -> NodeOutput | None:
    """The node that failed first in time, or None: with several real nodes the first
    failure is the cause and the rest its consequences, whatever their order in the list."""
    failed = [n for n in nodes if n.failed()]
    deadline = time.monotonic() + settle_s
    for n in failed:
        n.settle(deadline)
    return min(failed, key=lambda n: n.failed_at, default=None)


def _forward(sink: BinaryIO | None, chunk: bytes) -> BinaryIO | None:
    if sink is None:
        return None
    try:
        sink.write(chunk)
        sink.flush()
        return sink
    except (OSError, ValueError):
        _close(sink)
        return None


def _close(f: BinaryIO | None) -> None:
    try:
        if f is not None:
            f.close()
    except OSError:
        pass
