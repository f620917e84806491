"""The loop's busy window (`Core.wait(until, idle, busy)`): for `busy` seconds after a
pair event the core polls rather than sleeps, and Python's idle work waits for the window
to close; the time it polled with nothing ready is counted apart (`Core.polled`), so
the loop's CPU at work (each record's `loop_cpu_s`) leaves it out. Real sockets, the
native core and pair; the bounds checked are ones load can only push further out."""

from __future__ import annotations

import socket
import time

from neuronabox.controller import _native
from neuronabox.controller.dialects.gloo.protocol import GlooPair
from neuronabox.controller.groups import Conn, Group

from neuronabox.schedules.gloo import RealRanks

WINDOW_S = 0.05


def closed_pair_event(core: _native.Core) -> tuple[float, float]:
    """A watched pair socket whose peer closes: the core serves it (a pair event) and
    hands Python the close. Returns a time before the event and one after it."""
    mine, peer = socket.socketpair()
    conn = Conn(Group("0", 2, RealRanks([0], 2)), 0, 1, GlooPair())
    core.watch(mine.fileno(), conn, "rank 0 <-> emulated 1")
    before = time.monotonic()
    peer.close()
    frames, _ = core.wait(time.monotonic() + 30, False, WINDOW_S)
    served = time.monotonic()
    assert frames == [(conn, None)]
    assert core.unwatch(mine.fileno())
    mine.close()
    return before, served


def test_idle_work_waits_for_the_busy_window_to_close_and_its_polls_are_counted_apart():
    core = _native.Core(done=lambda owner: None, emit=lambda conn: None)
    assert core.polled() == 0.0
    before, served = closed_pair_event(core)
    frames, python = core.wait(time.monotonic() + 30, True, WINDOW_S)  # idle work pending
    back = time.monotonic()
    assert frames == [] and python is False
    assert back >= before + WINDOW_S  # not before the window closed
    assert 0.0 < core.polled() <= back - served  # polled with nothing ready meanwhile


def test_without_a_window_idle_work_runs_once_nothing_is_ready_and_nothing_is_polled():
    core = _native.Core(done=lambda owner: None, emit=lambda conn: None)
    closed_pair_event(core)
    frames, python = core.wait(time.monotonic() + 30, True, 0.0)
    assert frames == [] and python is False
    assert core.polled() == 0.0
    time.sleep(WINDOW_S)  # the window counts from the last event: it is over now
    t0 = time.monotonic()
    frames, _ = core.wait(t0 + 0.05, False, WINDOW_S)
    assert frames == [] and time.monotonic() >= t0 + 0.05
    assert core.polled() == 0.0  # it slept to `until`
