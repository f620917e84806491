"""Joining, leaving and joining again: the emulated world follows a real rank that
makes the default process group again (destroy then init, or a worker torchrun
restarts), waits for a real rank's first init only as long as a real peer would,
and lets a script end before any collective."""

from conftest import SCRIPTS

from neuronabox.trace.records import load

REINIT = str(SCRIPTS / "reinit.py")


def kinds(trace) -> list[str]:
    return [r["kind"] for r in load(trace)["instances"]]


def test_destroy_then_init_again_and_a_worker_torchrun_restarts(run, tmp_path):
    """Attempt 0 makes the default group, runs, then exits 3; torchrun starts the worker
    again (--max-restarts), and attempt 1 makes the group three times over (destroy, init)."""
    trace = tmp_path / "t.jsonl"
    res = run("torchrun", "--nnodes", "3", "--max-restarts", "1", "--timeout", "60", "--trace", str(trace),
              REINIT, "--rounds", "3", "--fail-first-attempt")  # fmt: skip
    assert res.rc == 0, res.err[-3000:]
    assert "attempt 0 round 0: allreduce gave 1" in res.out and "attempt 0 round 1" not in res.out
    for round_ in range(3):
        assert f"attempt 1 round {round_}: allreduce gave 1" in res.out
    assert kinds(trace).count("allreduce") == 4 and kinds(trace).count("barrier") == 4


def test_a_script_that_ends_before_init_is_a_success(run, tmp_path):
    script = tmp_path / "hello.py"
    script.write_text("print('no collective here')\n")
    res = run("torchrun", "--nnodes", "2", str(script))
    assert res.rc == 0, res.err[-3000:]
    assert "no collective here" in res.out and "collectives     none" in res.out


def test_a_rank_that_never_calls_init_is_named(run, tmp_path):
    script = tmp_path / "late.py"
    script.write_text("import time\nimport torch.distributed\ntime.sleep(600)\n")
    res = run("torchrun", "--nnodes", "2", "--timeout", "2", str(script), timeout=120)
    assert res.rc == 1, res.err[-3000:]
    assert res.last_error.endswith(
        "real rank 0 did not join the default process group within 2 s "
        "(it never called init_process_group; --timeout sets the limit)"
    ), res.last_error
