"""Every process a run starts ends with the run, on every exit path.

Three mechanisms, each for a path the others miss:

- each child starts in its own session, so one signal to its process group
  reaches what it started in the same group;
- the launcher is a child subreaper: torchrun starts each worker in a session
  of its own, so a worker whose agent is killed outright is reparented to the
  launcher, not to init, and is found among the launcher's descendants;
- each child dies with the launcher (a parent-death signal), for the path
  where the launcher itself is killed outright and runs no cleanup.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Callable

import psutil

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36

_libc = ctypes.CDLL(None, use_errno=True)


def become_subreaper() -> bool:
    """Orphans among this process's descendants are reparented to it (Linux >= 3.4)."""
    return _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def die_with_parent(sig: int = signal.SIGTERM, then: Callable[[], None] | None = None) -> Callable[[], None]:
    """A preexec_fn: the child gets `sig` when the process that started it dies (then
    runs `then`, e.g. entering a testbed's namespaces). A parent already gone before
    the signal was armed is caught by comparing the parent's pid."""
    parent = os.getpid()

    def arm() -> None:
        _libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)
        if then is not None:
            then()

    return arm


class Family:
    """The processes one run started: its children, and every descendant seen under
    them (a worker stays in the family after its agent dies and it is reparented).
    Only these are signalled, never another child of the process that launches."""

    def __init__(self) -> None:
        self.children: list[subprocess.Popen] = []
        self._known: dict[int, psutil.Process] = {}  # psutil checks a pid's start time before it signals

    def add(self, child: subprocess.Popen) -> subprocess.Popen:
        self.children.append(child)
        self.refresh()
        return child

    def refresh(self) -> None:
        """Note the descendants each child has now (the launcher calls it while it waits)."""
        for child in self.children:
            try:
                for d in psutil.Process(child.pid).children(recursive=True):
                    self._known.setdefault(d.pid, d)
            except psutil.Error:
                continue

    def _members(self) -> list[psutil.Process]:
        self.refresh()
        return [p for p in self._known.values() if _running(p)]

    def stop(self, grace: float, hurry: Callable[[], bool] = lambda: False) -> None:
        """SIGTERM to every child's process group and to every known descendant, then
        SIGKILL to what is left after `grace` seconds (at once when `hurry()` turns
        true, as on a second Ctrl-C); reaps them all. A group is signalled even when
        its leader is gone: what the leader started may still be in it."""
        self._signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and not hurry():
            if all(c.poll() is not None for c in self.children) and not self._members():
                break
            time.sleep(0.05)
        self._signal(signal.SIGKILL)
        for c in self.children:
            try:
                c.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        psutil.wait_procs(list(self._known.values()), timeout=5)  # reaps those reparented to us

    def _signal(self, sig: int) -> None:
        for c in self.children:
            try:
                os.killpg(c.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        for p in self._members():
            try:
                p.send_signal(sig)
            except psutil.Error:
                pass


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
