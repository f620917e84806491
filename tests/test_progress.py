"""A long command's status line (neuronabox/progress.py): redrawn in place on a terminal,
absent from a log; and the commands that use it, under a real pseudo-terminal."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
import threading

import pytest
from conftest import ROOT

from neuronabox.progress import CLEAR, StatusLine


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_line_counts_steps_and_the_time_left_and_moves_above_what_stays(capsys):
    now = [0.0]
    tty = Tty()
    with StatusLine("validate: runs", 4, stream=tty, clock=lambda: now[0], redraw_s=60) as status:
        assert status.line() == "validate: runs, 0/4, 0 s"
        now[0] = 10.0
        status.step("rep 0 emulated")
        assert status.line() == "validate: runs, 1/4, ~30 s left, rep 0 emulated, 10 s"
        status.say("  rep 0 all-real 12.00 ms")
        status.set(3, detail="rep 1 all-real")
        now[0] = 30.0
        assert status.line() == "validate: runs, 3/4, ~10 s left, rep 1 all-real, 30 s"
    assert capsys.readouterr().out == "  rep 0 all-real 12.00 ms\n"  # the command's own line, on stdout
    drawn = tty.getvalue()
    assert drawn.startswith(CLEAR + "validate: runs, 0/4") and drawn.endswith(CLEAR)  # erased at the end
    assert not any(t.name == "status-line" for t in threading.enumerate())  # its redraw thread is stopped


def test_a_log_gets_nothing_and_no_thread_runs():
    log = io.StringIO()
    with StatusLine("perf", stream=log, redraw_s=0.01) as status:
        assert status._thread is None
        status.step("x")
    assert log.getvalue() == ""


@pytest.mark.skipif(shutil.which("script") is None, reason="no script(1) to give the command a terminal")
def test_perf_draws_its_line_on_a_terminal_and_not_into_a_pipe(tmp_path):
    cmd = [sys.executable, "-m", "neuronabox.cli", "perf", "all_reduce", "--nnodes", "64", "--simulate",
           "-b", "1K", "-e", "4K", "-f", "4"]  # fmt: skip
    typescript = tmp_path / "typescript"
    tty = subprocess.run(["script", "-qec", " ".join(cmd), str(typescript)], capture_output=True, timeout=120,
                         cwd=ROOT)  # fmt: skip
    assert tty.returncode == 0, tty.stdout[-2000:]
    screen = typescript.read_bytes().decode(errors="replace")
    assert "\r\033[Kperf allreduce: 2 sizes, 64 ranks, simulated" in screen and "# NeuronaBox perf" in screen
    piped = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert piped.returncode == 0 and piped.stderr == "" and "\033[K" not in piped.stdout
