"""`neuronabox perf COLL`: nccl-tests' benchmark over an emulated world."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

from neuronabox.args import ArgParser
from neuronabox.errors import NeuronaBoxError
from neuronabox.launcher.interrupts import Interrupted, raised_as_interrupted, signum_of
from neuronabox.limits import check_world, output_problem
from neuronabox.perf.ladder import PerfError, make_spec
from neuronabox.perf.rig import rig_job, run_rig_ladder
from neuronabox.perf.run import run_ladder
from neuronabox.perf.simulated import simulate_ladder, simulate_ladder_on_ray, simulate_nccl_ladder
from neuronabox.perf.table import TYPES, render
from neuronabox.progress import StatusLine
from neuronabox.schedules import Kind
from neuronabox.sim.points import EXECUTORS, RAY_MISSING, ray_available

NAME = "perf"
SUMMARY = "nccl-tests' benchmark (all_reduce_perf, ...) over an emulated world, or every rank real"
GLOO_HAS_NO = {Kind.REDUCE_SCATTER: "reduce_scatter schedule", "avg": "avg reduction"}
RIG_RUNS = (Kind.ALLREDUCE, Kind.ALLGATHER, Kind.REDUCE_SCATTER, Kind.BROADCAST)  # the rig's ring kernels
RIG_ALL_REAL_MAX = 16


def build_parser() -> ArgParser:
    p = ArgParser(
        prog="neuronabox perf",
        usage="neuronabox perf COLL [-b MIN] [-e MAX] [-f F | -i STEP] [-n N] [-w N] [-c N] [-o OP] [-d TYPE] "
        "[-r ROOT] [-J FILE] [--backend gloo|nccl] [--nnodes N] [--nproc-per-node N] [--all-real] [launch flags]",
        description="Time COLL over a ladder of sizes as nccl-tests does, on the real ranks of an emulated world "
        "(or with every rank real, --all-real), and print nccl-tests' table with the delay model's time per row.",
    )
    p.add_argument("coll", metavar="COLL", help="all_reduce, all_gather, reduce_scatter, broadcast, reduce, alltoall "
                   "(nccl-tests' names; all_reduce_perf too)")  # fmt: skip
    p.add_argument("-b", "--minbytes", default="32M", help="smallest size (nccl-tests' -b; default 32M)")
    p.add_argument("-e", "--maxbytes", default="32M", help="largest size (-e; default 32M)")
    p.add_argument("-f", "--stepfactor", type=int, help="multiply the size by this (-f; default 2)")
    p.add_argument("-i", "--stepbytes", help="add this to the size instead (-i)")
    p.add_argument("-n", "--iters", type=int, default=20, help="timed iterations per size (default 20)")
    p.add_argument("-w", "--warmup_iters", type=int, default=5, help="warm-up iterations (default 5)")
    p.add_argument("-c", "--check", type=int, default=1, help="checked iterations per size (default 1)")
    p.add_argument("-o", "--op", default="sum", help="sum, prod, max, min or avg (default sum)")
    p.add_argument("-d", "--datatype", default="float", help="float, half, bfloat16, double, int32, ...")
    p.add_argument("-r", "--root", type=int, default=0, help="the root of broadcast and reduce (default 0)")
    p.add_argument("-J", "--output_file", help="also write the rows as JSON to this file")
    p.add_argument("--backend", default="gloo", help="gloo or nccl (default gloo)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--nccl-channels", type=int, default=1, help="NCCL's channels, pinned (--backend nccl; default 1)")
    p.add_argument("--nnodes", type=int, default=8, help="emulated nodes (default 8)")
    p.add_argument("--nproc-per-node", type=int, default=1, help="ranks per node (default 1)")
    p.add_argument("--real-ranks", help="the ranks that really run (default: node 0's)")
    p.add_argument("--real-nodes", help="the nodes whose ranks really run")
    p.add_argument("--all-real", action="store_true", help="every rank runs for real: the comparison baseline")
    p.add_argument("--simulate", action="store_true", help="the same ladder in virtual time, no process run")
    p.add_argument("--executor", default="local", help="--simulate: local (the sizes one after another, default) or "
                   "ray (each size a Ray task of one CPU)")  # fmt: skip
    p.add_argument("--ray-address", metavar="ADDR", help="the Ray cluster's address (default: a Ray instance of this "
                   "machine's own, on loopback, for the ladder's length)")  # fmt: skip
    p.add_argument("--delay-model", help="the delay model (default alpha-beta)")
    p.add_argument("--topology", help="a preset or topology file (default cpu-25gbe)")
    p.add_argument("--inject", action="append", default=[], help="a what-if modifier (repeatable)")
    p.add_argument("--data", help="zeros or mirror: what the emulated ranks contribute (default zeros)")
    p.add_argument("--local-work", help="measured (default) or topology: what emulated ranks spend per message "
                   "(measured: the real rank's own, unless the topology gives it)")
    p.add_argument("--timeout", help="the watchdog's limit in seconds")
    p.add_argument("--keep", metavar="DIR", help="keep the run's folder (spec, results, trace, ranks' output) here")
    return p


def refusal(ns) -> str | None:
    """Why this request cannot run, before anything starts, or None."""
    if ns.backend not in ("gloo", "nccl"):
        return f"--backend is gloo or nccl, got {ns.backend!r}"
    if ns.device not in ("cpu", "cuda"):
        return f"--device is cpu or cuda, got {ns.device!r}"
    if ns.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            return "--device cuda: this torch sees no CUDA device (use --device cpu)"
    if ns.all_real and (ns.real_ranks or ns.real_nodes):
        return "--all-real runs every rank: drop --real-ranks/--real-nodes"
    if ns.simulate and (ns.all_real or ns.data or ns.real_ranks or ns.real_nodes or ns.local_work):
        return "--simulate replays rank 0 with no process: drop --all-real, --data, --local-work and the real ranks"
    cause = executor_refusal(ns)
    if cause:
        return cause
    if ns.backend == "nccl":
        cause = rig_refusal(ns)
        if cause:
            return cause
    elif ns.nccl_channels != 1:
        return "--nccl-channels needs --backend nccl"
    if ns.output_file and output_problem(ns.output_file):
        return f"-J {output_problem(ns.output_file)}"
    return check_world(ns.nnodes, ns.nproc_per_node)


def executor_refusal(ns) -> str | None:
    if ns.executor not in EXECUTORS:
        return f"--executor is {' or '.join(EXECUTORS)}, got {ns.executor!r}"
    if ns.executor == "ray" and not ns.simulate:
        return "--executor ray spreads a simulated ladder's sizes: it needs --simulate (a live ladder is one job)"
    if ns.executor == "ray" and not ray_available():
        return RAY_MISSING
    if ns.ray_address and ns.executor != "ray":
        return "--ray-address goes with --executor ray"
    return None


def rig_refusal(ns) -> str | None:
    """What the NCCL path cannot run (ranks calling libnccl directly: the rig on cpu, the GPU
    on cuda), before anything starts."""
    if not 1 <= ns.nccl_channels <= 16:
        return f"--nccl-channels is 1 to 16 on the rig, got {ns.nccl_channels}"
    if ns.data == "mirror":
        return ("--data mirror: NCCL's wire does not carry a real rank's input, so the NCCL dialect's emulated ranks "
                "contribute the reduction's identity (--data zeros; an allgather's emulated blocks mirror)")
    if ns.all_real and ns.nnodes * ns.nproc_per_node > RIG_ALL_REAL_MAX:
        return f"--all-real on the rig runs every rank as a process: at most {RIG_ALL_REAL_MAX} ranks"
    return None


def title_of(ns, spec, world: int) -> str:
    if ns.simulate:
        how = "rank 0 simulated, no process run"
    elif ns.all_real:
        how = "every rank real"
    else:
        how = f"real ranks {ns.real_ranks}" if ns.real_ranks else f"real nodes {ns.real_nodes or '0'}"
    model = "" if ns.all_real else f", {ns.delay_model or 'alpha-beta'} on {ns.topology or 'cpu-25gbe'}"
    backend = ns.backend
    if backend == "nccl":
        where = "the CPU rig" if ns.device == "cpu" else "the GPU"
        backend = f"nccl on {where} ({ns.nccl_channels} channel{'s' if ns.nccl_channels > 1 else ''})"
    return (f"NeuronaBox perf: {spec.coll.value} over {world} ranks ({how}), {backend}{model}; "
            f"-n {spec.iters} -w {spec.warmup} -c {spec.check}")  # fmt: skip


def main(argv: list[str]) -> int:
    ns = build_parser().parse_args(argv)
    world = ns.nnodes * ns.nproc_per_node if ns.nnodes > 0 and ns.nproc_per_node > 0 else 0
    cause = refusal(ns)
    if cause is None:
        try:
            spec = make_spec(ns.coll, world, minbytes=ns.minbytes, maxbytes=ns.maxbytes, factor=ns.stepfactor,
                             step=ns.stepbytes, iters=ns.iters, warmup=ns.warmup_iters, check=ns.check, op=ns.op,
                             dtype=ns.datatype, root=ns.root)  # fmt: skip
        except PerfError as exc:
            cause = str(exc)
    if cause is None and ns.backend == "gloo":
        missing = GLOO_HAS_NO.get(spec.coll) or GLOO_HAS_NO.get(spec.op)
        if missing:
            cause = f"the Gloo dialect has no {missing} (use --backend nccl)"
    if cause is None and ns.backend == "nccl" and spec.coll not in RIG_RUNS:
        cause = f"the NCCL dialect plays {', '.join(RIG_RUNS)} (NCCL's ring), not {spec.coll}"
    rig = None
    if cause is None and ns.backend == "nccl" and not ns.simulate:
        try:
            rig = rig_job(ns, spec, world)
        except NeuronaBoxError as exc:
            cause = str(exc)
    if cause is not None:
        print(f"neuronabox: error: {cause}", file=sys.stderr)
        return 2
    options = {"delay_model": ns.delay_model, "topology": ns.topology, "inject": ns.inject or None,
               "data": ns.data, "timeout": ns.timeout, "local_work": ns.local_work}  # fmt: skip
    if ns.all_real:
        options["real_nodes"] = ",".join(map(str, range(ns.nnodes)))
    else:
        options.update(real_ranks=ns.real_ranks, real_nodes=ns.real_nodes)
    try:
        what = f"perf {spec.coll.value}: {len(spec.sizes)} sizes, {world} ranks{', simulated' if ns.simulate else ''}"
        with raised_as_interrupted(), StatusLine(what):
            rows = _rows(ns, spec, options) if rig is None else run_rig_ladder(rig, keep=ns.keep)
    except NeuronaBoxError as exc:  # UsageError, PerfError (a bad simulation request): 2; LaunchError: 1
        print(f"neuronabox: error: {exc}", file=sys.stderr)
        return 1 if type(exc).__name__ in ("LaunchError", "RigRunError", "SizeFailed") else 2
    except (Interrupted, KeyboardInterrupt) as exc:  # the run is stopped already (run_job's cleanup)
        signum = signum_of(exc)
        print(f"neuronabox: interrupted ({signal.Signals(signum).name}); the run is stopped", file=sys.stderr)
        return 128 + signum
    print(render(rows, coll=spec.coll.value, dtype=spec.dtype, op=spec.op, root=spec.root, world=world,
                 title=title_of(ns, spec, world)), end="")  # fmt: skip
    if ns.output_file:
        write_json(ns, spec, world, rows)
    return 1 if any(r.wrong for r in rows if r.wrong is not None) else 0


def _rows(ns, spec, options: dict) -> list:
    if ns.simulate and ns.executor == "ray":
        sim = {"topology": ns.topology, "delay_model": ns.delay_model, "inject": ns.inject}
        if ns.backend == "nccl":
            sim["channels"] = ns.nccl_channels
        return simulate_ladder_on_ray(ns.ray_address, spec, ns.nnodes, ns.nproc_per_node, ns.backend, sim)
    if ns.simulate and ns.backend == "nccl":
        return simulate_nccl_ladder(spec, ns.nnodes, ns.nproc_per_node, topology=ns.topology,
                                    delay_model=ns.delay_model, inject=ns.inject,
                                    channels=ns.nccl_channels)  # fmt: skip
    if ns.simulate:
        return simulate_ladder(spec, ns.nnodes, ns.nproc_per_node, topology=ns.topology,
                               delay_model=ns.delay_model, inject=ns.inject)  # fmt: skip
    return run_ladder(spec, ns.backend, ns.nnodes, ns.nproc_per_node, options, keep=Path(ns.keep) if ns.keep else None)


def write_json(ns, spec, world: int, rows: list) -> None:
    doc = {"collective": spec.coll.value, "world": world, "backend": ns.backend, "all_real": ns.all_real,
           "simulated": ns.simulate, "type": TYPES.get(spec.dtype, spec.dtype), "redop": spec.op,
           "root": spec.root,
           "rows": [{"size": r.bytes, "count": r.count, "time_us": r.time_s * 1e6, "wrong": r.wrong,
                     "model_us": None if r.model_s is None else r.model_s * 1e6} for r in rows]}  # fmt: skip
    Path(ns.output_file).write_text(json.dumps(doc, indent=1) + "\n")
