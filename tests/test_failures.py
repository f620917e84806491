"""Bad input and failures end the run with one line and a non-zero status, in
bounded time (each run's subprocess timeout is far inside Gloo's 30-minute
process-group timeout, so a hang fails the test), and leave no process behind
(the `run` fixture checks that)."""

import os
import signal
import subprocess
import sys

import psutil
from conftest import EXAMPLE, ROOT, SCRIPTS, Live, tagged_processes

COLLECTIVES = str(SCRIPTS / "collectives.py")
CRASHER = str(SCRIPTS / "crasher.py")


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


def test_alltoall_is_carried_now(run):
    """alltoall once ended the run as unknown; the dialect carries it (an unknown slot
    prefix, which stock torch cannot produce, is covered in test_engine)."""
    res = run("torchrun", "--nnodes", "3", COLLECTIVES, "--sizes", "8", "--dtypes", "float32", "--alltoall")
    assert res.rc == 0, res.err[-2000:]


def test_a_real_rank_that_crashes_mid_run(run, tmp_path):
    trace = tmp_path / "trace.jsonl"
    res = run("torchrun", "--nnodes", "8", "--trace", str(trace), COLLECTIVES, "--repeat", "5", "--crash-at", "2",
              "--sizes", "1024")  # fmt: skip
    assert res.rc == 1
    # the worker's own status (17), not torchrun's (1), and where it ran
    assert res.last_error == "neuronabox: error: the job failed on real node 0: rank 0's process exited with status 17"
    from neuronabox.trace.records import ends

    _, footer = ends(trace)  # the trace says the run did not end as a success does
    assert footer["stopped_because"] == "real node 0 failed: rank 0's process exited with status 17", footer


def test_the_first_real_node_to_fail_is_named_and_said_last(run, tmp_path):
    """Rank 1 (node 1) is killed; rank 0 (node 0, first in the list) fails or is stopped
    after it. The cause named is node 1's, with the signal, and our lines come after
    everything torchrun prints (node 0's agent prints a traceback as it is stopped)."""
    trace = tmp_path / "trace.jsonl"
    res = run("torchrun", "--nnodes", "3", "--real-nodes", "0,1", "--trace", str(trace), CRASHER, "--rank", "1",
              "--kill", "9", timeout=120)  # fmt: skip
    assert res.rc == 1
    what = "rank 1's process was killed by signal 9 (SIGKILL)"
    last = res.err.strip().splitlines()[-2:]
    assert last[0] == f"neuronabox: error: the job failed on real node 1: {what}", res.err[-2000:]
    assert last[1].startswith("neuronabox: the run's logs are in ")
    from neuronabox.trace.records import ends

    _, footer = ends(trace)
    assert footer["stopped_because"] == f"real node 1 failed: {what}"


def live_status() -> str:
    st = subprocess.run(
        [sys.executable, "-m", "neuronabox.cli", "status"], capture_output=True, text=True, cwd=ROOT, timeout=30
    )
    return st.stdout if st.returncode == 0 and "state running" in st.stdout else ""


def test_a_controller_that_dies_fails_the_real_ranks():
    live = Live(
        "torchrun", "--nnodes", "4", COLLECTIVES, "--repeat", "100000", "--sizes", "1024", "--dtypes", "float32",
    )  # fmt: skip
    try:
        live.wait_line(r"iteration 0 done")  # collectives flow: kill the controller outright
        controllers = [p for p in tagged_processes(live.tag) if "neuronabox.controller.main" in " ".join(p.cmdline())]
        assert len(controllers) == 1
        assert "allreduce" in live_status()
        assert live.proc.poll() is None
        os.kill(controllers[0].pid, signal.SIGKILL)
        live.finish(timeout=90)
    finally:
        live.stop()
    assert live.proc.returncode == 1
    assert "neuronabox: error: controller failed: the controller died (signal 9)" in live.err
    # the real rank's own Gloo noticed: it failed, it did not hang
    assert "Connection reset by peer" in live.err or "Connection closed by peer" in live.err


def test_status_of_a_live_run(tmp_path):
    go_on = tmp_path / "done"
    live = Live(
        "torchrun", "--nnodes", "16", COLLECTIVES, "--repeat", "1", "--until-file", str(go_on),
        "--sizes", "4096", "--dtypes", "float32",
    )  # fmt: skip
    try:
        live.wait_line(r"iteration 0 done")
        seen = live_status()
        assert "world 16" in seen and "real ranks [0]" in seen and "allreduce" in seen
        go_on.touch()
        live.finish(timeout=180)
    finally:
        live.stop()
    assert live.proc.returncode == 0, live.err[-2000:]
    out = "".join(live.out)
    assert "allreduce" in out and "barrier" in out
    assert not psutil.pid_exists(live.proc.pid) or live.proc.poll() is not None


def test_store_ports_are_never_ephemeral():
    """The launcher picks the store's port seconds before a process binds it; a port from
    the kernel's ephemeral range can be taken by any connect() in between (CI saw
    EADDRINUSE), so the pick stays below that range and is free when picked."""
    import socket

    from neuronabox.launcher.ports import ephemeral_range, free_port

    low, high = ephemeral_range()
    ports = [free_port() for _ in range(20)]
    assert not [p for p in ports if low <= p <= high]
    assert len(set(ports)) > 1  # random, so two concurrent runs rarely collide
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[0]))
