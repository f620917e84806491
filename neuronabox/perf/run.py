"""Running a perf ladder: the worker on the real ranks of an emulated world (or on every
rank, `--all-real`), through the launcher's own Job and Run, then the rows: each size's
time (the real ranks' mean), its `#wrong`, and the model's time from the run's trace."""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
from pathlib import Path

from neuronabox.launcher.api import job_of, run_job
from neuronabox.limits import read_bounded
from neuronabox.perf.ladder import PerfSpec
from neuronabox.perf.table import Row
from neuronabox.trace import records as tracefile

WORKER = Path(__file__).with_name("worker.py")


def run_ladder(spec: PerfSpec, backend: str, nnodes: int, nproc_per_node: int, options: dict,
               keep: Path | None = None) -> list[Row]:  # fmt: skip
    """Run the ladder in one job of nnodes x nproc_per_node ranks (`options`: the launch
    flags, as for `neuronabox.launch`) and return its rows. A failed run raises the
    launcher's LaunchError; bad options its UsageError, before anything starts."""
    folder = Path(tempfile.mkdtemp(prefix="neuronabox-perf-"))
    try:
        (folder / "spec.json").write_text(json.dumps(spec.to_json()))
        trace = folder / "trace.jsonl"
        job = job_of(WORKER, str(folder / "spec.json"), str(folder), backend, nnodes=nnodes,
                     nproc_per_node=nproc_per_node, trace=str(trace), output=folder / "ranks.log",
                     backend=backend, **options)  # fmt: skip
        run_job(job)
        return rows_of(spec, folder, trace, emulated=len(job.real_ranks) < job.world_size)
    finally:
        if keep is not None:
            shutil.copytree(folder, keep, dirs_exist_ok=True)
        shutil.rmtree(folder, ignore_errors=True)


def rows_of(spec: PerfSpec, folder: Path, trace: Path, emulated: bool) -> list[Row]:
    """Each size's row from the real ranks' results and, when ranks were emulated, the model."""
    results = [json.loads(read_bounded(p, 16 << 20, "perf result")) for p in sorted(folder.glob("rank*.json"))]
    if not results:
        raise RuntimeError(f"no real rank wrote its results (its output: {folder / 'ranks.log'})")
    models = model_times(spec, trace) if emulated else [None] * len(spec.sizes)
    rows = []
    for i, nbytes in enumerate(spec.sizes):
        mine = [r["rows"][i] for r in results]
        rows.append(Row(nbytes, mine[0]["count"], statistics.fmean(m["time_s"] for m in mine),
                        sum(m["wrong"] for m in mine), models[i]))  # fmt: skip
    return rows


def model_times(spec: PerfSpec, trace: Path) -> list[float | None]:
    """The model's mean time of each size's timed iterations. The worker issues, per size,
    `warmup` calls, a barrier, `iters` timed calls and `check` checked ones, so the
    trace's instances of the collective come in blocks of that length, in ladder order."""
    doc = tracefile.load(trace)
    calls = [r for r in doc["instances"] if r["kind"] == spec.coll.value and r["group"] == "0"]
    block = spec.warmup + spec.iters + spec.check
    out: list[float | None] = []
    for i in range(len(spec.sizes)):
        timed = calls[i * block + spec.warmup : i * block + spec.warmup + spec.iters]
        out.append(statistics.fmean(r["model_us"] for r in timed) * 1e-6 if len(timed) == spec.iters else None)
    return out
