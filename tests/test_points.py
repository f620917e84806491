"""A sweep's bookkeeping (neuronabox/sim/points.py): the progress line and what a live
point asks of an executor."""

import io

from neuronabox.sim.points import Progress, live_cpus


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_progress_line_counts_points_and_the_time_left(capsys):
    now = [0.0]
    tty = Tty()
    progress = Progress(4, parallel=2, clock=lambda: now[0], stream=tty)
    progress.started(2)
    assert progress.line() == "points 0/4: 0 done, 2 running, 0 failed"
    now[0] = 10.0
    progress.finished(True, "row one")
    now[0] = 20.0
    progress.finished(False, "row two")
    # 10 s a point, 2 left, 2 at a time: ~10 s
    assert progress.line() == "points 2/4: 1 done, 0 running, 1 failed, ~10 s left"
    assert capsys.readouterr().out == "row one\nrow two\n"  # the rows' own lines, on stdout
    assert "\r\033[K" in tty.getvalue() and "1 failed" in tty.getvalue()


def test_a_log_gets_only_the_rows():
    log = io.StringIO()
    progress = Progress(1, 1, stream=log)
    progress.started(1)
    progress.finished(True, "row")
    progress.close()
    assert log.getvalue() == ""


def test_a_live_point_holds_a_core_per_real_rank_and_one_for_the_controller():
    assert live_cpus(["--nnodes", "16"]) == 2
    assert live_cpus(["--nnodes", "16", "--real-nodes", "0,3", "--nproc-per-node", "2"]) == 5
    assert live_cpus(["--nproc-per-node=4", "--real-nodes=1"]) == 5
