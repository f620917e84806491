"""The watchdog: a real rank that makes no progress for --timeout ends the run with
a cause naming the rank and where it is stuck (a hung rank used to keep the run,
and `neuronabox status`'s "running", alive forever)."""

import pytest
from conftest import SCRIPTS

SLEEPER = str(SCRIPTS / "sleeper.py")


def test_a_rank_hung_in_compute_ends_the_run(run):
    res = run("torchrun", "--nnodes", "2", "--timeout", "3", SLEEPER, timeout=120)
    assert res.rc == 1, res.err[-2000:]
    assert "real rank 0 made no progress for 3 s" in res.last_error
    assert "its last collective was barrier #0 of group '0'" in res.last_error
    # said last: after torchrun's traceback as it is stopped, not above it
    last = res.err.strip().splitlines()[-2:]
    assert last[0] == res.last_error and last[1].startswith("neuronabox: the run's logs are in "), res.err[-2000:]


def test_the_rank_that_holds_a_collective_up_is_named(run):
    res = run("torchrun", "--nnodes", "3", "--real-nodes", "0,1", "--timeout", "3", SLEEPER, "--stall-rank", "1")
    assert res.rc == 1, res.err[-2000:]
    assert "real rank 1 made no progress for 3 s: it has not entered barrier #1 of group '0'" in res.last_error
    assert "which real rank 0 is in" in res.last_error


@pytest.mark.parametrize("bad", ["0", "-1", "abc", "nan"])
def test_timeout_must_be_positive_seconds(run, bad):
    res = run("torchrun", "--nnodes", "2", "--timeout", bad, SLEEPER, timeout=60)
    assert res.rc == 2 and "--timeout takes a positive number of seconds" in res.last_error
