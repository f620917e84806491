"""The note link as the controller's core reads it, with real sockets and a bare Core: a
known shape's note is taken natively and handed to Python later, an unknown one wakes
Python before any frame, and a line that is no note, or one past the bound, is a clear
error naming the rank (never a buffer that grows)."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from neuronabox.controller import _native

# Each wait returns once the core has served what the test sent (Python's turn, or nothing
# more ready while notes wait for Python): the deadline bounds only a core that never does.
DEADLINE_S = 30.0


def linked(rank: int = 3) -> tuple[_native.Core, socket.socket, socket.socket]:
    core = _native.Core(done=lambda owner: None, emit=lambda conn: None)
    mine, observer = socket.socketpair()
    mine.setblocking(False)
    core.watch_notes(mine.fileno(), rank)
    return core, mine, observer


def test_a_known_shape_is_taken_in_the_core_and_an_unknown_one_wakes_python():
    core, mine, observer = linked()
    try:
        core.know_note("0", "all_reduce", 7, "Float", -1, -1)  # told: nothing to start or arm
        observer.sendall(b"0\t12\tall_reduce\t7\tFloat\n")
        frames, python = core.wait(time.monotonic() + DEADLINE_S)
        assert frames == [] and not python  # nothing for Python before the frames
        assert core.take_notes() == [(3, "0", 12, "all_reduce", 7, "Float", True)]
        assert core.take_notes() == ()
        observer.sendall(b"0\t13\tall_reduce\t6\tFloat\n")  # a shape the core was not told of
        frames, python = core.wait(time.monotonic() + DEADLINE_S)
        assert python
        assert core.take_notes() == [(3, "0", 13, "all_reduce", 6, "Float", False)]
        core.clear_starters()  # the known shapes go with the starters
        observer.sendall(b"0\t14\tall_reduce\t7\tFloat\n")
        assert core.wait(time.monotonic() + DEADLINE_S)[1]
        assert core.take_notes()[0][-1] is False
    finally:
        assert core.unwatch_notes(mine.fileno())
        mine.close()
        observer.close()


def test_a_stream_of_known_notes_goes_to_python_in_bounded_batches():
    """Known shapes need no Python before the frames, but the notes read wait for it: a
    stream of them returns the loop to Python every few dozen, never a list that grows."""
    core, mine, observer = linked()
    try:
        core.know_note("0", "all_reduce", 7, "Float", -1, -1)
        lines = b"".join(b"0\t%d\tall_reduce\t7\tFloat\n" % tag for tag in range(20000))  # 560 KB
        sender = threading.Thread(target=observer.sendall, args=(lines,))
        sender.start()
        taken: list[tuple] = []
        batches = 0
        while len(taken) < 20000:
            core.wait(time.monotonic() + DEADLINE_S)
            batch = core.take_notes()
            assert len(batch) <= 64 + (64 << 10) // 25, len(batch)  # the bound, and one pass's read past it
            taken += batch
            batches += 1
        sender.join()
        assert batches >= 8 and [t[2] for t in taken] == list(range(20000)) and all(t[-1] for t in taken)
    finally:
        core.unwatch_notes(mine.fileno())
        mine.close()
        observer.close()


@pytest.mark.parametrize(
    "sent,cause",
    [
        (b"0\tseven\tall_reduce\t7\tFloat\n", "not a note: 0\tseven"),
        (b"0\t1\tall_reduce\t7\n", "not a note"),
        (b"0\t1\tall_reduce\t7\tFloat\textra\n", "not a note"),
        (b"x" * 600, "longer than 512 bytes"),
    ],
    ids=["tag", "fields", "extra-field", "unbounded"],
)
def test_a_line_that_is_no_note_is_a_clear_error_naming_the_rank(sent, cause):
    core, mine, observer = linked(rank=5)
    try:
        observer.sendall(sent)
        with pytest.raises(ValueError) as err:
            core.wait(time.monotonic() + DEADLINE_S)
        assert "note link of real rank 5" in str(err.value) and cause in str(err.value), err.value
    finally:
        core.unwatch_notes(mine.fileno())
        mine.close()
        observer.close()


def test_a_closed_note_link_leaves_the_loop():
    core, mine, observer = linked()
    observer.sendall(b"0\t2\tall_reduce\t7\tFloat\n")
    observer.close()
    frames, python = core.wait(time.monotonic() + DEADLINE_S)
    assert python  # the last note, of an unknown shape, still reaches Python
    assert core.take_notes() == [(3, "0", 2, "all_reduce", 7, "Float", False)]
    core.wait(time.monotonic() + DEADLINE_S, True)  # the close, read at the next pass (idle: back once it is)
    assert not core.unwatch_notes(mine.fileno())  # the core let go of it
    mine.close()
