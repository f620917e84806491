"""Every process a run starts ends with the run, on every exit path.

Three mechanisms, each for a path the others miss:

- each child starts in its own session, so one signal to its process group
  reaches what it started in the same group;
- the launcher is a child subreaper: torchrun starts each worker in a session
  of its own, so a worker whose agent is killed outright is reparented to the
  launcher, not to init, and is found among the launcher's descendants;
- each child dies with the launcher (a parent-death signal), for the path
  where the launcher itself is killed outright and runs no cleanup;
- every process a real rank starts carries the run's mark in its environment
  (`RUN_MARK`), so one that left the real ranks' process tree (a daemon that
  forked twice and was reparented here) is still found and stopped at the end.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psutil

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37
RUN_MARK = "NEURONABOX_RUN"  # in the environment of every real rank's process: the run's folder

_libc = ctypes.CDLL(None, use_errno=True)


def become_subreaper() -> bool:
    """Orphans among this process's descendants are reparented to it (Linux >= 3.4)."""
    return _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def is_subreaper() -> bool:
    flag = ctypes.c_int(0)
    return _libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0 and flag.value != 0


@contextmanager
def subreaper() -> Iterator[bool]:
    """This process is a subreaper inside the block (yields whether it could be), and
    what it was before afterwards: a notebook kernel that ran a job must not go on
    collecting every orphan of its other children."""
    was = is_subreaper()
    try:
        yield become_subreaper()
    finally:
        if not was:
            _libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


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


def marked_descendants(mark: str) -> list[psutil.Process]:
    """This process's descendants whose environment carries `RUN_MARK=mark` (those of
    other users, or gone meanwhile, are passed over)."""
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.environ().get(RUN_MARK) == mark:
                found.append(p)
        except psutil.Error:
            continue
    return found


def stop_marked(mark: str, grace: float, hurry: Callable[[], bool] = lambda: False) -> None:
    """Stop what a run's real ranks started and left outside their process tree (a
    daemon reparented to this subreaper): SIGTERM, SIGKILL after `grace` seconds (at
    once when `hurry()` turns true), and reap those that became this process's children."""
    procs = marked_descendants(mark) if mark else []
    _send(procs, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while procs and time.monotonic() < deadline and not hurry():
        _, procs = psutil.wait_procs(procs, timeout=0.05)  # reaps our children among them
    _send(procs, signal.SIGKILL)
    psutil.wait_procs(procs, timeout=5)


def _send(procs: list[psutil.Process], sig: int) -> None:
    for p in procs:
        try:
            p.send_signal(sig)
        except psutil.Error:
            pass


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
