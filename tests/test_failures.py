"""Bad input and failures end the run with one line and a non-zero status, in
bounded time (each run's subprocess timeout is far inside Gloo's 30-minute
process-group timeout, so a hang fails the test), and leave no process behind
(the `run` fixture checks that)."""

import os
import signal
import subprocess
import sys
import time

import psutil
from conftest import EXAMPLE, ROOT, SCRIPTS, spawn, tagged_processes

COLLECTIVES = str(SCRIPTS / "collectives.py")


def test_real_node_outside_the_world(run):
    res = run("torchrun", "--nnodes", "4", "--real-nodes", "0,4", EXAMPLE, timeout=60)
    assert res.rc == 2
    assert (
        res.last_error == "neuronabox: error: --real-nodes names node 4, outside the emulated world of 4 nodes (0..3)"
    )


def test_elastic_node_range_is_refused(run):
    res = run("torchrun", "--nnodes", "1:4", EXAMPLE, timeout=60)
    assert res.rc == 2 and "--nnodes must be a fixed whole number" in res.last_error


def test_torch_with_an_unsupported_rank_record_layout(run, tmp_path):
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text('__version__ = "2.1.2"\n')
    res = run("torchrun", "--nnodes", "4", EXAMPLE, env={"PYTHONPATH": str(tmp_path)}, timeout=60)
    assert res.rc == 1
    assert "rank-record layout is not supported" in res.last_error


def test_a_frame_that_does_not_match_the_collective(run):
    # Without the observer a 25 MiB allreduce's segmentation is not on the wire; the
    # guess is wrong, and the first frame that contradicts it ends the run.
    res = run("torchrun", "--nnodes", "2", "--no-observer", COLLECTIVES, "--sizes", "6553600", "--dtypes", "float32")
    assert res.rc == 1
    err = res.last_error
    assert "allreduce #0 of group '0'" in err and "rank pair 0<->1" in err and "step" in err


def test_a_collective_the_dialect_does_not_know(run):
    res = run("torchrun", "--nnodes", "3", COLLECTIVES, "--sizes", "8", "--dtypes", "float32", "--alltoall")
    assert res.rc == 1
    assert "slot prefix 8 (alltoall)" in res.last_error and "group '0'" in res.last_error


def test_a_real_rank_that_crashes_mid_run(run):
    res = run("torchrun", "--nnodes", "8", COLLECTIVES, "--repeat", "5", "--crash-at", "2", "--sizes", "1024")
    assert res.rc == 1
    assert "torchrun exited with status" in res.last_error


def live_status() -> str:
    st = subprocess.run(
        [sys.executable, "-m", "neuronabox.cli", "status"], capture_output=True, text=True, cwd=ROOT, timeout=30
    )
    return st.stdout if st.returncode == 0 and "state running" in st.stdout else ""


def test_a_controller_that_dies_fails_the_real_ranks():
    proc, tag = spawn(
        "torchrun",
        "--nnodes",
        "4",
        COLLECTIVES,
        "--repeat",
        "100000",
        "--sleep",
        "0.02",
        "--sizes",
        "1024",
        "--dtypes",
        "float32",
    )
    try:
        controller = None
        deadline = time.monotonic() + 120
        while controller is None and time.monotonic() < deadline:
            for p in tagged_processes(tag):
                if "neuronabox.controller.main" in " ".join(p.cmdline()):
                    controller = p
            time.sleep(0.2)
        assert controller is not None
        # wait until collectives flow, then kill the controller outright
        while time.monotonic() < deadline and "allreduce" not in live_status():
            time.sleep(0.2)
        assert proc.poll() is None
        os.kill(controller.pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    assert "neuronabox: error: controller failed: the controller died (signal 9)" in err
    # the real rank's own Gloo noticed: it failed, it did not hang
    assert "Connection reset by peer" in err or "Connection closed by peer" in err
    _, left = psutil.wait_procs(tagged_processes(tag), timeout=10)
    assert not left


def test_status_of_a_live_run():
    proc, _ = spawn(
        "torchrun",
        "--nnodes",
        "16",
        COLLECTIVES,
        "--repeat",
        "60",
        "--sleep",
        "0.1",
        "--sizes",
        "4096",
        "--dtypes",
        "float32",
    )
    try:
        seen = ""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            seen = live_status()
            if "allreduce" in seen:
                break
            time.sleep(0.5)
        assert "world 16" in seen and "real ranks [0]" in seen
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-2000:]
    assert "allreduce" in out and "barrier" in out
    assert not psutil.pid_exists(proc.pid) or proc.poll() is not None
