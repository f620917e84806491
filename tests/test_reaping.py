"""Every process a run starts is gone when the run is, on each exit path that used
to leave some behind: Ctrl-C twice with two real nodes, a torchrun agent killed
outright (its worker, in a session of its own, was orphaned), and the launcher
itself killed outright. `Live.stop` fails the test if a process of the run is left.
A run that ends well leaves no folder either."""

import os
import signal
import time
from pathlib import Path

import psutil
from conftest import SCRIPTS, Live, left_in, tagged_processes

COLLECTIVES = str(SCRIPTS / "collectives.py")
SLEEPER = str(SCRIPTS / "sleeper.py")  # its rank sits in compute: only a signal ends it
FOREVER = ("--repeat", "1000000", "--sizes", "1024", "--dtypes", "float32")


def processes(live: Live, marker: str) -> list[psutil.Process]:
    return [p for p in tagged_processes(live.tag) if marker in " ".join(p.cmdline())]


def test_a_finished_run_leaves_no_folder_its_torchrun_agents_logs_included(run, tmp_path):
    """Stock torchrun keeps its agents' logs in a fresh /tmp/torchelastic_* folder a run
    that nothing removes (a day of benchmarks here left 2,000); the launcher gives them
    the run's folder, which goes when the run ends well. The runs registry stays (one
    folder, its entries removed)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    res = run("torchrun", "--nnodes", "3", "--real-nodes", "0,1", COLLECTIVES, "--repeat", "2", "--sizes", "1024",
              "--dtypes", "float32", env={"TMPDIR": str(tmp)})  # fmt: skip
    assert res.rc == 0, res.err[-2000:]
    assert left_in(tmp) == []


def test_a_users_log_dir_is_torchruns_and_the_launchers_otherwise():
    """The user's --log-dir goes to torchrun as given, once; PET_LOG_DIR is torchrun's to
    read, so the launcher passes none; without either, the run's folder."""
    from neuronabox.launcher.job import job_from_args
    from neuronabox.launcher.ranks import node_command, node_log_dir
    from neuronabox.launcher.torchrun_args import parse

    def log_dirs(*argv: str, env: dict[str, str] | None = None) -> list[str]:
        job = job_from_args(parse([*argv, "--nnodes", "2", COLLECTIVES], environ={}))
        logs = node_log_dir(job, env or {}, Path("/run/folder"))
        return [a for a in node_command(job, 0, logs) if a.startswith("--log")]

    assert log_dirs() == ["--log-dir=/run/folder/torchelastic"]
    assert log_dirs("--log-dir", "/mine") == ["--log-dir=/mine"]
    assert log_dirs("--log_dir=/mine") == ["--log-dir=/mine"]
    assert log_dirs(env={"PET_LOG_DIR": "/mine"}) == []


def test_ctrl_c_twice_with_two_real_nodes_leaves_nothing():
    live = Live("torchrun", "--nnodes", "3", "--real-nodes", "0,1", COLLECTIVES, *FOREVER)
    try:
        live.wait_line(r"rank 1: iteration 0 done")
        live.proc.send_signal(signal.SIGINT)
        time.sleep(0.3)  # inside the launcher's cleanup now, most often
        live.proc.send_signal(signal.SIGINT)
        # 130: the second one hurried the cleanup; -SIGINT: the cleanup was already done (the
        # ranks stopped at once) and the second one ended the exiting launcher, as a shell's would.
        assert live.finish(timeout=60) in (130, -signal.SIGINT)
    finally:
        live.stop()
    assert "interrupted (SIGINT)" in live.err


def test_an_agent_killed_outright_takes_its_worker_along():
    live = Live("torchrun", "--nnodes", "2", SLEEPER)
    try:
        live.wait_line(r"rank 0: ready")
        agents = processes(live, "torch.distributed.run")
        workers = processes(live, "sleeper.py")
        workers = [w for w in workers if w.pid not in {a.pid for a in agents}]
        assert len(agents) == 1 and workers
        os.kill(agents[0].pid, signal.SIGKILL)
        assert live.finish(timeout=90) == 1
    finally:
        live.stop()
    assert "the job failed on real node 0: its torchrun process was killed by signal 9 (SIGKILL)" in live.err
    gone, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive


def test_the_launcher_killed_outright_takes_the_run_along():
    live = Live("torchrun", "--nnodes", "2", SLEEPER)
    try:
        live.wait_line(r"rank 0: ready")
        family = tagged_processes(live.tag)
        assert len(family) >= 4  # launcher, controller, agent, worker
        os.kill(live.proc.pid, signal.SIGKILL)
        live.finish(timeout=30)
        _, alive = psutil.wait_procs([p for p in family if p.pid != live.proc.pid], timeout=60)
        assert not alive, [p.cmdline() for p in alive]
    finally:
        live.stop()


def test_a_closed_terminal_stops_the_run_and_unlists_it():
    """SIGHUP (the terminal closed) ends the run as an interrupt does: nothing left running,
    the registry entry gone, the exit status 128 + 1, and the folder it keeps named in
    the last line, after what torchrun prints as it is stopped."""
    from neuronabox.launcher.registry import RUNS_DIR

    live = Live("torchrun", "--nnodes", "2", COLLECTIVES, *FOREVER)
    try:
        live.wait_line(r"rank 0: iteration 0 done")
        assert (RUNS_DIR / f"{live.proc.pid}.json").is_file()
        live.proc.send_signal(signal.SIGHUP)
        assert live.finish(timeout=60) == 129
    finally:
        live.stop()
    last = live.err.strip().splitlines()[-1]  # said last, after torchrun's traceback as it is stopped
    assert last.startswith("neuronabox: interrupted (SIGHUP); the run is stopped (its logs: "), live.err[-2000:]
    assert not (RUNS_DIR / f"{live.proc.pid}.json").exists()
