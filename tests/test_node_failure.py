"""How a real node failed, read from its torchrun's stderr: the rank and the worker's own
exit status (torchrun's is 1 whatever happened), from output captured of stock torchrun
(tests/fixtures/torchrun_stderr), and the first failure in time among several nodes."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

from neuronabox.launcher.node_failure import NodeOutput, WorkerExit, first_failure, root_cause

CAPTURED = Path(__file__).parent / "fixtures" / "torchrun_stderr"


def captured(name: str) -> str:
    return (CAPTURED / name).read_text()


@pytest.mark.parametrize(
    ("name", "worker", "said"),
    [
        ("exit17.txt", WorkerExit(0, 0, 17), "rank 0's process exited with status 17"),
        ("sigkill.txt", WorkerExit(0, 0, -9), "rank 0's process was killed by signal 9 (SIGKILL)"),
        # rank 1, listed under "Failures:", was stopped by torchrun after rank 0 died
        ("two_failures.txt", WorkerExit(0, 0, -9), "rank 0's process was killed by signal 9 (SIGKILL)"),
        ("recorded_traceback.txt", WorkerExit(0, 0, 1), "rank 0's process exited with status 1"),
    ],
)
def test_the_root_cause_block_names_the_rank_and_its_own_status(name, worker, said):
    cause = root_cause(captured(name).splitlines())
    assert cause == worker
    assert cause.describe() == said


def test_no_root_cause_without_the_whole_block():
    lines = captured("exit17.txt").splitlines()
    assert root_cause(lines[:20]) is None  # the traceback only
    cut = next(i for i, ln in enumerate(lines) if "exitcode  :" in ln)
    assert root_cause(lines[:cut]) is None  # the block, cut before its exit code
    assert root_cause(["rank      : 3 (local_rank: 0)", "exitcode  : 9 (pid: 1)"]) is None  # not in a block


def node(tmp_path: Path, n: int, code: str) -> NodeOutput:
    """A real process standing in for node n's torchrun: it runs `code` with its stderr
    piped to the launcher's reader, which forwards it to node<n>.err."""
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE)
    return NodeOutput(proc, n, open(tmp_path / f"node{n}.err", "ab"))


def says(path: Path) -> str:
    return f"import sys; sys.stderr.write(open({str(path)!r}).read()); sys.exit(1)"


def test_the_first_failure_in_time_is_named_whatever_the_order(tmp_path):
    """Node 1 fails first, node 0 after (as a consequence); both have failed by the time
    the launcher looks: node 1 is named, though node 0 comes first in the list."""
    rank1 = tmp_path / "rank1.txt"
    rank1.write_text(captured("sigkill.txt").replace("rank      : 0 (local_rank: 0)", "rank      : 1 (local_rank: 0)"))
    node1 = node(tmp_path, 1, says(rank1))
    node1.proc.wait()
    assert node1.at_eof(10)
    node0 = node(tmp_path, 0, says(CAPTURED / "exit17.txt"))
    node0.proc.wait()
    assert node0.at_eof(10)
    first = first_failure([node0, node1])
    assert first is node1 and first.what() == "rank 1's process was killed by signal 9 (SIGKILL)"
    assert node0.what() == "rank 0's process exited with status 17"
    assert (tmp_path / "node1.err").read_text() == rank1.read_text()  # forwarded as it came, all of it
    assert (tmp_path / "node0.err").read_text() == captured("exit17.txt")


def test_a_node_without_a_block_is_named_by_its_own_status(tmp_path):
    """A torchrun killed outright prints no block; a partial line (a progress bar's) is
    forwarded at once, not when its line ends."""
    killed = node(tmp_path, 0, "import os, sys, time; sys.stderr.write('50%\\r'); sys.stderr.flush(); time.sleep(30)")
    try:
        deadline = time.monotonic() + 20
        while (tmp_path / "node0.err").read_bytes() != b"50%\r" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert (tmp_path / "node0.err").read_bytes() == b"50%\r"
        assert first_failure([killed]) is None
    finally:
        killed.proc.kill()
        killed.proc.wait()
    assert first_failure([killed]) is killed
    assert killed.what() == "its torchrun process was killed by signal 9 (SIGKILL)"
    assert killed.at_eof(10)
