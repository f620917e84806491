"""The Python API: `neuronabox.launch` runs a job in-process and returns its result
(a notebook or a sweep script reads numbers, not stdout)."""

import json
import os
import subprocess
import sys
import uuid

import psutil
import pytest
from conftest import EXAMPLE, ROOT, SCRIPTS, tagged_processes

import neuronabox
from neuronabox.launcher.run import LaunchError
from neuronabox.launcher.torchrun_args import UsageError
from neuronabox.trace.records import load


def no_children_left() -> None:
    _, alive = psutil.wait_procs(psutil.Process().children(recursive=True), timeout=10)
    assert not alive, [p.cmdline() for p in alive]


def test_launch_returns_the_iteration_time_the_kinds_and_the_trace(tmp_path):
    """The result, and the miss split: under a delay model each instance's lag (how long
    the controller held its latest send past the send's release and inputs) is in the
    trace, the per-kind means agree with it, and what is left of the real rank's time is
    its own."""
    log = tmp_path / "ranks.log"
    res = neuronabox.launch(EXAMPLE, "--steps", "3", nnodes=8, delay_model="alpha-beta", output=log)
    no_children_left()
    assert res.world_size == 8 and res.real_ranks == [0]
    assert res.steps == 3 and res.iteration_s > 0
    ar = res.kinds["allreduce"]
    assert ar.count > 0 and ar.nbytes > 0 and ar.mean_s > 0 and ar.boundary_messages > 0
    assert "step 2 loss" in log.read_text()  # the real rank's output went where it was asked
    doc = load(res.trace_path)
    assert doc["complete"] and doc["world_size"] == 8
    assert sum(1 for i in doc["instances"] if i["kind"] == "allreduce") == ar.count
    assert list(res.trace_path.parent.iterdir()) == [res.trace_path]  # the rest of the run folder is gone
    assert "NeuronaBox summary" in res.summary
    lags = [i["lag_us"] for i in doc["instances"] if i["kind"] == "allreduce"]
    assert len(lags) == ar.count and all(x >= 0 for x in lags)
    assert ar.lag_mean_s == pytest.approx(sum(lags) / len(lags) / 1e6, rel=1e-6, abs=1e-9)
    # its own: per instance of the trace, the real rank's span less the model and the lag, averaged
    own = [(b - a - i["model_us"] - i["lag_us"]) / 1e6 for i in doc["instances"] if i["kind"] == "allreduce"
           for a, b in i["per_rank"].values()]  # fmt: skip
    assert ar.own_mean_s == pytest.approx(sum(own) / len(own), abs=1e-6)  # the trace's epoch us: ~0.25 us apart
    assert ar.model_mean_s > 0
    row = next(line for line in res.summary.splitlines() if line.split()[:1] == ["allreduce"])
    numbers = [float(x) for x in row.split() if x.replace(".", "").replace("-", "").isdigit()]
    assert numbers[2:6] == pytest.approx([ar.mean_s * 1e3, ar.model_mean_s * 1e3, ar.lag_mean_s * 1e3,
                                          ar.own_mean_s * 1e3], abs=2e-3)  # fmt: skip


def test_launch_raises_the_cause(tmp_path):
    with pytest.raises(UsageError, match="--delay-model: unknown model"):
        neuronabox.launch(EXAMPLE, nnodes=2, delay_model="nonesuch")
    with pytest.raises(LaunchError, match="exited with status"):
        neuronabox.launch(
            str(SCRIPTS / "collectives.py"), "--crash-at", "0", nnodes=2, output=tmp_path / "log"
        )  # fmt: skip
    no_children_left()


# Runs in a fresh interpreter, which is no subreaper to begin with: launch a job whose rank 0
# leaves a daemon, then say what became of the daemon and whether this is a subreaper still.
AFTER_LAUNCH = """
import ctypes, json, sys
import psutil
import neuronabox
script, pid_file, log = sys.argv[1:]
neuronabox.launch(script, "--pid-file", pid_file, nnodes=2, output=log)
flag = ctypes.c_int(-1)
ctypes.CDLL(None).prctl(37, ctypes.byref(flag), 0, 0, 0)  # PR_GET_CHILD_SUBREAPER
try:
    daemon = psutil.Process(int(open(pid_file).read())).status()
except psutil.NoSuchProcess:
    daemon = "gone"
print(json.dumps({"subreaper": flag.value, "daemon": daemon}))
"""


def test_a_rank_s_daemon_ends_with_the_run_and_the_caller_is_no_subreaper_after(tmp_path):
    """A daemon a real rank starts (forked twice, so outside its process tree) is stopped
    and reaped with the run, not left running nor a zombie of the caller; and a caller
    that was no subreaper is none after the run (a notebook kernel must not go on
    collecting every orphan of its other children)."""
    pid_file, tag = tmp_path / "daemon.pid", uuid.uuid4().hex
    try:
        out = subprocess.run(
            [sys.executable, "-c", AFTER_LAUNCH, str(SCRIPTS / "daemon.py"), str(pid_file), str(tmp_path / "log")],
            capture_output=True, text=True, timeout=120, cwd=ROOT, env=dict(os.environ, NEURONABOX_TEST_TAG=tag),
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-2000:]
        assert json.loads(out.stdout.splitlines()[-1]) == {"subreaper": 0, "daemon": "gone"}
    finally:
        for p in tagged_processes(tag):  # a daemon the run failed to stop must not outlive the test
            p.kill()


def test_options_become_flags():
    from neuronabox.launcher.api import options_to_argv

    argv = options_to_argv({"delay_model": "zero", "inject": ["latency=+1ms", "jitter=1us"], "no_observer": True})
    assert argv == ["--delay-model", "zero", "--inject", "latency=+1ms", "--inject", "jitter=1us", "--no-observer"]
