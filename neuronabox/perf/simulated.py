"""`neuronabox perf --simulate`: the same ladder in virtual time, no process run. The
real rank's program is the worker's loop (per size, warm-up then timed calls, back to
back), replayed through the simulation's engine (`neuronabox/sim/simulate.py`: the
live engine, schedules and delay models, a simulated rank that answers at once), so a
row's time is what the network alone gives a punctual rank."""

from __future__ import annotations

import dataclasses
import statistics

from neuronabox.errors import NeuronaBoxError
from neuronabox.perf.ladder import PerfError, PerfSpec, nccl_count
from neuronabox.perf.table import Row
from neuronabox.sim.simulate import REPLAYED, Op, Program, network_of, simulate


def simulate_ladder(spec: PerfSpec, nnodes: int, nproc_per_node: int, *, topology: str | None = None,
                    delay_model: str | None = None, inject: list[str] | None = None) -> list[Row]:  # fmt: skip
    """The ladder's rows at nnodes x nproc_per_node ranks (rank 0 the simulated real one)."""
    if spec.coll not in REPLAYED:
        raise PerfError(f"--simulate does not replay {spec.coll.value} yet (it replays {', '.join(REPLAYED)})")
    world = nnodes * nproc_per_node
    timing, *_ = network_of({}, nnodes, nproc_per_node, topology, delay_model, inject or [])
    per_size = spec.warmup + spec.iters
    # Every call entered as the one before ends: the worker's back-to-back loop.
    ops = [Op(spec.coll, n, spec.elem, spec.root, 0.0, 0.0, "0", world) for n in spec.sizes for _ in range(per_size)]
    sim = simulate(Program(0, world, ops, []), world, timing)
    rows = []
    for i, size in enumerate(spec.sizes):
        timed = range(i * per_size + spec.warmup, (i + 1) * per_size)
        spans = [sim.ends[j][1] - sim.ends[j][0] for j in timed]
        model = [sim.records[j].predicted for j in timed]
        count = size // spec.elem
        rows.append(Row(size, count, statistics.fmean(spans), None, statistics.fmean(model)))  # no values to check
    return rows


def simulate_nccl_ladder(spec: PerfSpec, nnodes: int, nproc_per_node: int, *, topology: str | None = None,
                         delay_model: str | None = None, inject: list[str] | None = None,
                         channels: int = 1) -> list[Row]:  # fmt: skip
    """The NCCL ladder in virtual time: rank 0 plays NCCL's ring program punctually against
    the live relay (`controller/dialects/nccl/virtual.py`), calls back to back; a row's time
    is what the network alone gives it, its model column the relay's prediction."""
    from neuronabox.controller.dialects.nccl.relay import CollParams, NcclRelay
    from neuronabox.controller.dialects.nccl.virtual import VirtualRanks
    from neuronabox.schedules.nccl import NcclConfig, NcclRing

    world = nnodes * nproc_per_node
    timing, *_ = network_of({}, nnodes, nproc_per_node, topology, delay_model, inject or [])
    config = NcclConfig(channels=channels)
    op = spec.op if spec.op not in ("none", "-") else "sum"
    relay = NcclRelay(world, [0], config, timing, redop=op)
    ranks = VirtualRanks(relay)
    rows, now, seq = [], 0.0, 0
    for size in spec.sizes:
        count = nccl_count(spec.coll, size, spec.elem, world)
        ring = NcclRing(spec.coll, world, count, spec.elem, root=spec.root, config=config)
        spans, model = [], []
        for call in range(spec.warmup + spec.iters):
            p = CollParams(seq, spec.coll, count, spec.dtype, spec.elem, spec.root, len(ring.parts), "RING", "SIMPLE")
            start = now
            now = ranks.run(p, ring, start)
            inst = relay.finished.pop()
            seq += 1
            if call >= spec.warmup:
                spans.append(now - start)
                model.append(inst.predicted)
        rows.append(Row(size, size // spec.elem, statistics.fmean(spans), None, statistics.fmean(model)))
    return rows


class SizeFailed(NeuronaBoxError, RuntimeError):
    """One size of a ladder simulated on an executor failed; the message names it."""


def simulate_size(point, spec: PerfSpec, nnodes: int, nproc_per_node: int, backend: str, options: dict) -> Row:
    """The ladder's row for one size (`point.value`), alone: an executor's task (top level,
    so a Ray worker imports it). The sizes of a ladder are independent: each begins with
    its own warm-up calls, back to back after the last size's end, which no state
    outlives, so one size alone gives the same row as in the whole ladder, to float
    rounding (it starts at virtual time 0; the tests check it)."""
    one = dataclasses.replace(spec, sizes=(int(point.value),))
    if backend == "nccl":
        return simulate_nccl_ladder(one, nnodes, nproc_per_node, **options)[0]
    return simulate_ladder(one, nnodes, nproc_per_node, **options)[0]


def simulate_ladder_on_ray(address: str | None, spec: PerfSpec, nnodes: int, nproc_per_node: int, backend: str,
                           options: dict) -> list[Row]:  # fmt: skip
    """The ladder with each size a Ray task of one CPU (`sim.points.run_ray`: the cluster at
    `address`, or one of this machine's own); rows in the ladder's order, or SizeFailed
    naming a size that failed."""
    from neuronabox.sim.points import Point, run_ray
    from neuronabox.sim.points import Row as FailedPoint

    points = [Point(i, str(size), float(size), "", "", "") for i, size in enumerate(spec.sizes)]
    rows: dict[int, Row] = {}
    for result in run_ray(points, simulate_size, (spec, nnodes, nproc_per_node, backend, options), address, 1.0):
        if isinstance(result, FailedPoint):
            raise SizeFailed(f"size {result.point.label} B: {result.cause}")
        rows[result.bytes] = result
    return [rows[size] for size in spec.sizes]
