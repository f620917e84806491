"""The job a run starts is one frozen description (`launcher.job.Job`), built from
torchrun-style flags by one function: the command line and the Python API describe the
same job the same way, and the controller is configured from it field for field."""

import dataclasses

import pytest
from conftest import EXAMPLE

from neuronabox.launcher.api import job_of
from neuronabox.launcher.job import Job, job_from_args
from neuronabox.launcher.run import Run
from neuronabox.launcher.torchrun_args import UsageError, parse


def cli_job(*argv: str) -> Job:
    return job_from_args(parse(list(argv), environ={}))


def test_the_api_and_the_command_line_build_the_same_job():
    cli = cli_job(
        "--nnodes", "4", "--nproc-per-node", "2", "--real-ranks", "1,3", "--delay-model", "zero",
        "--inject", "latency=+1ms", "--inject", "jitter=1us", "--no-observer", "--master-port", "29123",
        "--max-restarts", "2", EXAMPLE, "--steps", "1",
    )  # fmt: skip
    api = job_of(
        EXAMPLE, "--steps", "1", nnodes=4, nproc_per_node=2, real_ranks="1,3", delay_model="zero",
        inject=["latency=+1ms", "jitter=1us"], no_observer=True, master_port=29123, max_restarts=2,
    )  # fmt: skip
    assert api == cli
    assert cli.world_size == 8 and cli.real_ranks == [1, 3] and cli.direct_ranks == (1, 3)
    assert cli.torchrun_flags == (("--max-restarts", "2"),)  # the flags the launcher sets are not passed through
    with pytest.raises(dataclasses.FrozenInstanceError):
        cli.nnodes = 2  # type: ignore[misc]


def test_the_api_refuses_as_the_command_line_does():
    with pytest.raises(UsageError, match="--delay-model: unknown model 'nonesuch'"):
        job_of(EXAMPLE, nnodes=2, delay_model="nonesuch")


def test_the_controller_is_configured_from_the_job_by_the_same_names():
    job = cli_job("--nnodes", "100", "--delay-model", "zero", "--timeout", "30", "--gloo-mode", "auto", EXAMPLE)
    run = Run(job)
    try:
        cfg = run.controller_config()
    finally:
        run.dir.rmdir()
    shared = {f.name for f in dataclasses.fields(Job)} & {f.name for f in dataclasses.fields(cfg)}
    assert {"nnodes", "nproc_per_node", "delay_model", "timeout_s", "topology", "data", "boundary"} <= shared
    for name in shared:
        mine, theirs = getattr(job, name), getattr(cfg, name)
        assert (list(mine) if isinstance(mine, tuple) else mine) == theirs, name
    assert cfg.delay_model == "zero" and cfg.timeout_s == 30.0 and cfg.lazy  # 100 ranks: lazy


def test_a_controller_that_died_of_a_traceback_is_named_by_its_last_line():
    """The launcher's one line for a controller that exited at start: its `error:` line, or
    else the exception a traceback ended on, never just an exit status when the log says more."""
    run = Run(cli_job("--nnodes", "2", EXAMPLE))
    log = run.dir / "controller.log"
    try:
        log.write_text('Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n'
                       "neuronabox.controller.dialects.nccl.errors.NcclError: every rank is real\n")  # fmt: skip
        assert run.controller_cause() == "NcclError: every rank is real"
        log.write_text("controller: error: --trace t.jsonl is being written by another run\n")
        assert run.controller_cause() == "--trace t.jsonl is being written by another run"
        log.write_text("")
        assert run.controller_cause() == "the controller exited with status None"
    finally:
        log.unlink()
        run.dir.rmdir()


def test_a_controller_refused_at_start_says_why_in_its_error_line(tmp_path):
    """A refusal while the controller is made (here an NCCL release it does not speak) is its
    one `error:` line and exit 1, which the launcher shows, not a traceback."""
    import subprocess
    import sys

    from conftest import ROOT

    run = Run(cli_job("--nnodes", "4", EXAMPLE))
    try:
        cfg = dataclasses.replace(run.controller_config(), backend="nccl", nccl_release="9.9.9",
                                  nccl_profile=str(tmp_path / "profile.fifo"), ready_file=str(tmp_path / "ready"))
    finally:
        run.dir.rmdir()
    path = tmp_path / "controller.json"
    path.write_text(cfg.dumps())
    res = subprocess.run([sys.executable, "-m", "neuronabox.controller.main", str(path)], capture_output=True,
                         text=True, timeout=120, cwd=ROOT)  # fmt: skip
    assert res.returncode == 1, res.stderr[-2000:]
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("neuronabox controller: error: NCCL 9.9.9 is not spoken by this controller"), res.stderr
    assert "Traceback" not in res.stderr
