"""The loop's busy window (`Core.wait(until, idle, busy, spin)`): for `busy` seconds after
a pair event the core polls rather than sleeps, and Python's idle work waits for the
window to close; then it polls on until `spin`, its idle work done. The time it polled
with nothing ready is counted apart (`Core.polled`), so the loop's CPU at work (each
record's `loop_cpu_s`) leaves it out. Real sockets, the native core and pair. The times
compared are bounds the core enforces (the idle turn comes no sooner than the window's
end), which load can only push further out. And the order of one epoll answer: Python's
events before the pairs'."""

from __future__ import annotations

import json
import select
import socket
import time

from neuronabox.controller import _native
from neuronabox.controller.dialects.gloo import driver
from neuronabox.controller.dialects.gloo.driver import ADOPT_PUT_OFF_MAX, Adoption
from neuronabox.controller.dialects.gloo.protocol import GlooPair
from neuronabox.controller.groups import Conn, Group

from neuronabox.schedules.gloo import RealRanks

WINDOW_S = 0.2  # long against a scheduling delay under load: the window is still open when wait begins
IN_FLIGHT_QUIET_S = 0.001  # the core's kQuietInFlightS: a collective in flight holds idle work off this long


def closed_pair_event(core: _native.Core) -> float:
    """A watched pair socket whose peer closes: the core serves it (a pair event, which
    opens the window) and hands Python the close. Returns a time before the event."""
    mine, peer = socket.socketpair()
    conn = Conn(Group("0", 2, RealRanks([0], 2)), 0, 1, GlooPair())
    core.watch(mine.fileno(), conn, "rank 0 <-> emulated 1")
    before = time.monotonic()
    peer.close()
    frames, _ = core.wait(before + 30, False, WINDOW_S)
    assert frames == [(conn, None)]
    assert core.unwatch(mine.fileno())
    mine.close()
    return before


def test_idle_work_waits_for_the_busy_window_to_close_and_its_polls_are_counted_apart():
    core = _native.Core(done=lambda owner: None, emit=lambda conn: None)
    assert core.polled() == 0.0
    before = closed_pair_event(core)
    entered = time.monotonic()
    frames, python = core.wait(entered + 30, True, WINDOW_S)  # idle work pending
    back = time.monotonic()
    assert frames == [] and python is False
    assert back >= before + WINDOW_S  # not before the window closed
    assert 0.0 < core.polled() <= back - entered  # it polled with nothing ready meanwhile


def test_without_a_window_idle_work_runs_once_nothing_is_ready_and_a_closed_window_sleeps():
    core = _native.Core(done=lambda owner: None, emit=lambda conn: None)
    closed_pair_event(core)
    frames, python = core.wait(time.monotonic() + 30, True, 0.0)  # no window: the idle turn at once
    assert frames == [] and python is False
    assert core.polled() == 0.0
    closed_pair_event(core)
    core.wait(time.monotonic() + 30, True, WINDOW_S)  # returns for the idle turn as the window closes
    polled = core.polled()
    assert polled > 0.0
    t0 = time.monotonic()
    frames, _ = core.wait(t0 + 0.01, False, WINDOW_S)  # the window is over and nothing is idle work
    assert frames == [] and time.monotonic() >= t0 + 0.01
    assert core.polled() == polled  # it slept to `until`


def test_books_in_flight_are_counted_from_begun_to_complete_closed_or_freed():
    """What holds Python's idle work off: a book made (or started natively) and not yet
    complete. A closed book, or one freed unclosed, no longer counts."""
    core = _native.Core(done=lambda owner: None, emit=lambda conn: None)
    assert core.in_flight() == 0
    first = _native.Book(core, object(), "allreduce 1", 1, None)
    second = _native.Book(core, object(), "allreduce 2", 2, None)
    assert core.in_flight() == 2
    first.close()
    first.close()  # once
    assert core.in_flight() == 1
    del second  # freed unclosed (a run torn down mid-collective)
    assert core.in_flight() == 0


def test_idle_work_waits_for_a_longer_quiet_while_a_collective_is_in_flight():
    """A quiet gap inside one collective is the real rank reducing what it received (or a
    release the model puts later): a Python turn there would hold its next message. With a
    book in flight the idle turn comes no sooner than IN_FLIGHT_QUIET_S after the last pair
    event, even with no busy window; once the book closes, the idle turn comes as soon as
    nothing is ready, as before. A bound the core enforces, which load only pushes out."""
    core = _native.Core(done=lambda owner: None, emit=lambda conn: None)
    book = _native.Book(core, object(), "allreduce 1", 1, None)
    before = closed_pair_event(core)
    cpu = time.thread_time()
    frames, python = core.wait(time.monotonic() + 30, True, 0.0)  # no window: only the book holds it off
    assert frames == [] and python is False
    assert time.monotonic() >= before + IN_FLIGHT_QUIET_S
    # A loop with no window of its own may share a real rank's core: it slept the hold out
    # rather than polling it (load only takes CPU away from a poll, never adds to a sleep).
    assert time.thread_time() - cpu < IN_FLIGHT_QUIET_S / 2
    book.close()
    closed_pair_event(core)
    t0 = time.monotonic()
    frames, python = core.wait(t0 + 30, True, 0.0)
    assert frames == [] and python is False and core.polled() == 0.0  # at once: no poll, no sleep to `until`


def test_after_the_window_the_loop_spins_with_its_idle_work_done_then_sleeps():
    """`spin`: past the busy window the loop keeps polling, so the next collective's first
    frame after the real rank's compute finds it awake, and Python's idle work is no longer
    put off; the polls are counted apart. Once `spin` is over it sleeps. The times compared
    are bounds the core enforces (the idle turn not before the window closes, `until`
    reached), which load only pushes further out; spinning and sleeping differ in what
    `polled` counts, not in time."""
    core = _native.Core(done=lambda owner: None, emit=lambda conn: None)
    before = closed_pair_event(core)
    frames, python = core.wait(time.monotonic() + 30, True, WINDOW_S, 30.0)  # idle work: after the window
    assert frames == [] and python is False and time.monotonic() >= before + WINDOW_S
    polled = core.polled()
    t0 = time.monotonic()
    frames, _ = core.wait(t0 + 0.05, False, WINDOW_S, 30.0)  # nothing to do: it spins to `until`
    spent = time.monotonic() - t0
    assert frames == [] and spent >= 0.05
    assert 0.0 < core.polled() - polled <= spent  # it polled, not slept (a sleeping loop counts none)
    polled = core.polled()
    frames, _ = core.wait(time.monotonic() + 0.02, False, WINDOW_S, 0.0)  # the spin over: it sleeps
    assert core.polled() == polled


def test_python_goes_first_when_its_events_come_with_pair_events():
    """An observer's note of a call's size is written before the call's first frame: when
    both are in one epoll answer, Python's turn comes before the pair is served, so a frame
    a native starter would take cannot start a book the note rules out. A Python that stays
    readable cannot starve the pairs: after 8 such answers in a row they are served."""
    core = _native.Core(done=lambda owner: None, emit=lambda conn: None)
    note, note_peer = socket.socketpair()
    py = select.epoll()
    py.register(note.fileno(), select.EPOLLIN)
    core.also(py.fileno())
    mine, peer = socket.socketpair()
    conn = Conn(Group("0", 2, RealRanks([0], 2)), 0, 1, GlooPair())
    core.watch(mine.fileno(), conn, "rank 0 <-> emulated 1")
    try:
        note_peer.send(b"note")
        peer.close()  # both readable before any wait: the order is the property, no time is compared
        for _ in range(8):  # the note left unread: Python stays readable
            assert core.wait(time.monotonic() + 30, False, 0.0) == ([], True)
        frames, _ = core.wait(time.monotonic() + 30, False, 0.0)
        assert frames == [(conn, None)]
    finally:
        core.unwatch(mine.fileno())
        for s in (note, note_peer, mine):
            s.close()
        py.close()


def test_the_loop_adopts_started_books_before_frames_and_puts_it_off_only_for_pythons_events():
    """A turn that served Python's events alone (a call's note, which may start or arm the
    next instance) leaves the natively started books for a later turn, at most
    ADOPT_PUT_OFF_MAX in a row; frames for Python, or a turn with nothing ready (the core
    returns then once its busy window closed), adopt them first."""
    adopted: list[int] = []
    noted: list[int] = []
    adoption = Adoption(lambda: adopted.append(1), lambda: noted.append(1))
    adoption.turn(frames=False, python=True)
    assert not adopted  # the note's frames are next: no Python turn before them
    assert noted == [1]  # a note the core could not act on is Python's to arm before them
    adoption.turn(frames=True, python=True)
    assert len(adopted) == 1  # the frames no book took may be a started book's
    adoption.turn(frames=False, python=False)
    assert len(adopted) == 2  # the idle turn
    for _ in range(ADOPT_PUT_OFF_MAX):
        adoption.turn(frames=False, python=True)
    assert len(adopted) == 2
    adoption.turn(frames=False, python=True)
    assert len(adopted) == 3  # a stream of notes holds them back a few turns at most


def test_the_turn_log_keeps_at_most_its_bound_and_names_a_file_it_cannot_write(tmp_path, monkeypatch):
    """NEURONABOX_TURN_LOG's log of the loop's Python turns: bounded however long the run,
    written as one JSON list as the loop ends; a path it cannot write is named in one line,
    and the run goes on."""
    monkeypatch.setattr(driver, "TURN_LOG_MAX", 3)
    log = driver.TurnLog(str(tmp_path / "turns.json"))
    for k in range(5):
        log.add(float(k), k + 0.5, k % 2 == 0)
    log.write(lambda line: None)
    assert json.loads((tmp_path / "turns.json").read_text()) == [[0.0, 0.5, True], [1.0, 1.5, False], [2.0, 2.5, True]]
    said: list[str] = []
    driver.TurnLog(str(tmp_path / "no-such-dir" / "turns.json")).write(said.append)
    assert len(said) == 1 and "no-such-dir" in said[0]
