"""The Python API: drive runs from a notebook or a sweep script without parsing stdout.

    result = neuronabox.launch("train.py", "--steps", "5", nnodes=64, delay_model="alpha-beta",
                               inject=["latency=+2ms"])
    result.iteration_s, result.kinds["allreduce"].mean_s, result.trace_path

Keyword options are the command line's flags with dashes as underscores: a
string or number is the flag's value, True a switch, a list a repeated flag
(`inject=[...]`). A bad option raises `UsageError`, a failed run `LaunchError`,
both with the one-line cause the command line prints.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Sequence
from pathlib import Path

from neuronabox.launcher.job import Job, job_from_args
from neuronabox.launcher.reaping import subreaper
from neuronabox.launcher.result import KindStats, RunResult
from neuronabox.launcher.run import Run
from neuronabox.launcher.torchrun_args import UsageError, parse


def options_to_argv(options: dict[str, object]) -> list[str]:
    """`delay_model="zero", inject=["a", "b"], no_observer=True` -> the command line's flags."""
    argv: list[str] = []
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            argv.append(flag)
        elif isinstance(value, (list, tuple)):
            for v in value:
                argv += [flag, str(v)]
        else:
            argv += [flag, str(value)]
    return argv


def launch(
    script: str | os.PathLike,
    *args: str,
    nnodes: int = 1,
    nproc_per_node: int = 1,
    output: str | os.PathLike | None = None,
    **options: object,
) -> RunResult:
    """Run `script args` with an emulated world of nnodes x nproc_per_node and return its
    result. `output`: a file for the real ranks' stdout and stderr (default: this
    process's). Without `trace=PATH` the trace is kept as trace.jsonl in the run's folder
    (the rest of the folder is removed when the run succeeds)."""
    return run_job(job_of(script, *args, nnodes=nnodes, nproc_per_node=nproc_per_node, output=output, **options))


def job_of(
    script: str | os.PathLike,
    *args: str,
    nnodes: int = 1,
    nproc_per_node: int = 1,
    output: str | os.PathLike | None = None,
    **options: object,
) -> Job:
    """The Job `launch` runs: the options become the command line's flags, and the Job is
    built from them by the command line's own `job_from_args` (PET_* variables aside)."""
    argv = [f"--nnodes={nnodes}", f"--nproc-per-node={nproc_per_node}", *options_to_argv(options)]
    return job_from_args(parse([*argv, "--", str(script), *map(str, args)], environ={}), output=output)


def run_argv(argv: list[str], output: str | os.PathLike | None = None) -> RunResult:
    """`launch` for a `neuronabox torchrun` command line (flags, then the script)."""
    return run_job(job_from_args(parse(argv, environ={}), output=output))


def run_job(job: Job) -> RunResult:
    """Run a Job in this process and return its result; everything it started is stopped
    on the way out, and on success only the trace is left of the run's folder. This
    process is a subreaper for the run (its ranks' orphans come here, to be stopped with
    it) and is again what it was before once the run is cleaned up."""
    with subreaper():
        return _run(job)


def _run(job: Job) -> RunResult:
    if not job.runs_controller:
        raise UsageError("node_rank: the API runs the head (node 0's host); another host runs its node with "
                         "`neuronabox torchrun --node-rank K`")  # fmt: skip
    run = Run(job)
    ok = False
    try:
        result = run.execute()
        ok = True
        return result
    finally:
        in_main = threading.current_thread() is threading.main_thread()
        if in_main:
            run.cleanup()
        else:  # signal handlers can be set from the main thread only
            run.cleanup(handle_signals=False)
        if ok:
            _keep_only(run.dir, Path(result.trace_path))


def _keep_only(folder: Path, keep: Path) -> None:
    """Remove a finished run's folder except the trace it holds."""
    for p in folder.iterdir():
        if p == keep:
            continue
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    if not any(folder.iterdir()):
        folder.rmdir()


__all__: Sequence[str] = ["KindStats", "RunResult", "launch"]
