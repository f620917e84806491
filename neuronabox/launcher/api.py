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
from dataclasses import dataclass, field
from pathlib import Path

from neuronabox.launcher.reaping import become_subreaper
from neuronabox.trace.summary import format_summary


@dataclass(frozen=True)
class KindStats:
    count: int
    nbytes: int  # summed over the instances
    mean_s: float  # mean time on the real ranks
    model_mean_s: float  # mean time the delay model gave
    boundary_messages: int


@dataclass(frozen=True)
class RunResult:
    world_size: int
    real_ranks: list[int]
    steps: int  # optimizer steps the observer saw on the lowest real rank
    iteration_s: float  # their median interval (0 when none were seen)
    kinds: dict[str, KindStats]
    boundary_messages: int
    controller_cpu_s: float
    trace_path: Path
    summary: str = field(repr=False)  # what the command line prints


def result_of(reply, header: dict, footer: dict, trace_path: str) -> RunResult:
    """A finished run's result from the controller's final status and the trace's ends."""
    kinds = {
        k.kind: KindStats(
            k.count,
            k.bytes,
            k.seconds / k.count if k.count else 0.0,
            k.predicted_s / k.count if k.count else 0.0,
            k.boundary_messages,
        )
        for k in reply.kinds
    }
    return RunResult(
        world_size=reply.world_size,
        real_ranks=list(reply.real_ranks),
        steps=reply.steps,
        iteration_s=reply.iteration_s,
        kinds=kinds,
        boundary_messages=reply.boundary_messages,
        controller_cpu_s=reply.cpu_s,
        trace_path=Path(trace_path),
        summary=format_summary(reply, header, footer),
    )


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
    argv = [f"--nnodes={nnodes}", f"--nproc-per-node={nproc_per_node}", *options_to_argv(options)]
    return run_argv([*argv, "--", str(script), *map(str, args)], output)


def run_argv(argv: list[str], output: str | os.PathLike | None = None) -> RunResult:
    """`launch` for a `neuronabox torchrun` command line (flags, then the script)."""
    from neuronabox.launcher.run import Run
    from neuronabox.launcher.torchrun_args import parse

    run = Run(parse(argv, environ={}))
    run.output = Path(output) if output is not None else None
    become_subreaper()
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
