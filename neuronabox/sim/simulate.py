"""`neuronabox simulate TRACE [--nnodes N --nproc-per-node P --topology T --delay-model M
--inject SPEC ...] [--trace OUT]`: predict a recorded job at any world size, running
no process of it.

The recorded real rank's program is its collectives, on the default group and on
each subgroup it belongs to, in the order it entered them, and the compute
between them (groups scale with the world as `scaled_groups` says). It is replayed through the
virtual-time driver (controller/dialects/gloo/virtual.py): the same engine, pair
machines, schedules, timing model and delay models as a live run, a simulated
real rank that speaks Gloo to the engine, and time owned by the loop. Each
collective keeps its recorded size; its time is what the model gives at the new
world size. A collective the rank entered after the previous one ended waits for
that end plus the recorded gap (the rank computed, or waited on something else);
one it entered while the previous was in flight (DDP's buckets overlap the
backward pass), or whose place in the iteration did so in another iteration
(`mark_free`), starts the recorded interval after the previous one's start.
Optimizer steps keep their offset from the collective before them, and the
iteration time is the median interval between them, as in a live run.

The simulated rank answers the model at once; the live one paid its own software
cost in each collective (Gloo's calls, the last reduction, its frames' write), which
the recorded gaps do not hold, as they start at the collective's recorded end. So
the replay charges each collective the recorded rank's cost for its kind and group:
the median of its recorded span less the span a replay at the recorded world, under
the recorded network, gives it (`software_costs`). `--punctual` drops the charge,
for the network's times alone.

Gather and scatter keep each rank's block, an alltoall each rank's tensor (its
blocks shrink as the world grows). What it does not replay yet: point-to-point
traffic and reduce (whose root a later gather names), which are counted and
reported as skipped, and more than one real rank's program (the lowest real
rank's is used).
"""

from __future__ import annotations

import bisect
import gc
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from neuronabox import delay_models, topology
from neuronabox.controller.skew import Skew, SkewError
from neuronabox.delay_models.whatif import WhatIf, WhatIfError
from neuronabox.errors import NeuronaBoxError
from neuronabox.limits import check_world
from neuronabox.schedules import Kind
from neuronabox.schedules.gloo import (
    BinomialBroadcast,
    DisseminationBarrier,
    RingAllgather,
    RingAllreduce,
    RingGeometry,
    Schedule,
)
from neuronabox.schedules.gloo_pairwise import PairwiseAlltoall, RootedPairwise
from neuronabox.topology import HostWork
from neuronabox.trace import records as tracefile

REPLAYED = (Kind.ALLREDUCE, Kind.ALLGATHER, Kind.BROADCAST, Kind.BARRIER, Kind.GATHER, Kind.SCATTER, Kind.ALLTOALL)


@dataclass
class Op:
    """One collective of the recorded program."""

    kind: Kind
    nbytes: int
    elem: int | None
    root: int | None
    start: float  # the real rank's entry and end, recorded (epoch seconds)
    end: float
    group: str = "0"
    world: int = 0  # its group's size, recorded
    work: HostWork | None = None  # the measured local work its live run charged (its trace line's), if any
    free: bool = False  # entered without waiting for the collective before it (see `mark_free`)
    lag: float = 0.0  # the emulator's lag its trace line recorded (Book.lag), not the real rank's stall


@dataclass
class Program:
    rank: int
    world: int
    ops: list[Op]
    steps: list[float]  # optimizer steps (epoch seconds)
    skipped: dict[str, int] = field(default_factory=dict)
    groups: dict[str, tuple[int, ...]] = field(default_factory=dict)  # subgroups it uses: name -> global ranks
    held: list[tuple[float, float, float]] = field(default_factory=list)  # its observer's own work: window, CPU (s)


def program_of(doc: dict) -> Program:
    """The lowest real rank's program: its default-group collectives and optimizer steps."""
    rank = min(doc["real_ranks"])
    ops, skipped, groups = [], {}, {}
    for rec in doc["instances"]:
        times = rec["per_rank"].get(str(rank))
        if times is None:
            continue
        if rec["kind"] not in REPLAYED:
            skipped[rec["kind"]] = skipped.get(rec["kind"], 0) + 1
            continue
        if rec["group"] != "0":
            groups[rec["group"]] = tuple(doc["groups"][rec["group"]])
        elem = rec["nbytes"] // rec["numel"] if rec.get("numel") else None
        ops.append(Op(Kind(rec["kind"]), rec["nbytes"], elem, rec["root"], times[0] * 1e-6, times[1] * 1e-6,
                      rec["group"], rec["world"], work_of(rec.get("work")),
                      lag=(rec.get("lag_us") or 0.0) * 1e-6))  # fmt: skip
    ops.sort(key=lambda o: o.start)
    steps = sorted(t * 1e-6 for r, t in doc["steps"] if r == rank)
    mark_free(ops, steps)
    held = sorted((a * 1e-6, b * 1e-6, cpu * 1e-6) for r, a, b, cpu in doc.get("held", []) if r == rank)
    return Program(rank, doc["world_size"], ops, steps, skipped, groups, held)


def work_of(line: dict | None) -> HostWork | None:
    """An instance line's charged local work (`work`: message_us, reduce_ns_per_byte)."""
    if not line:
        return None
    try:
        per_byte = float(line["reduce_ns_per_byte"]) * 1e-9
        return HostWork(float(line["message_us"]) * 1e-6, 1.0 / per_byte if per_byte > 0 else math.inf)
    except (KeyError, TypeError, ValueError, ZeroDivisionError, topology.TopologyError) as exc:
        raise SimulateError(f"an instance's local work is damaged: {exc}") from None


def mark_free(ops: list[Op], steps: list[float]) -> None:
    """Mark the collectives the program enters without waiting for the one before.

    The trace says when the rank entered a collective, not whether it had waited for
    the previous one to end first. Where it entered while the previous was in flight,
    it did not wait. A training loop does the same thing each iteration, so a
    collective at the same place in another iteration (its index after the optimizer
    step, kind, group and size) did not wait either, even where it happened to come
    after the previous one's end (a DDP bucket whose predecessor was quick at the
    recorded size). Without steps, each collective stands alone."""
    key = []
    at, last_iter = 0, -1
    for op in ops:
        it = bisect.bisect_right(steps, op.start)
        at = at + 1 if it == last_iter else 0
        last_iter = it
        key.append((at, op.kind, op.group, op.nbytes) if steps else id(op))
    overlapped = {key[i] for i in range(1, len(ops)) if ops[i].start < ops[i - 1].end}
    for op, k in zip(ops, key, strict=True):
        op.free = k in overlapped


def scaled_groups(prog: Program, world: int, rank: int) -> dict[str, tuple[int, ...]]:
    """The program's subgroups at `world` ranks. A group whose ranks are strided across
    the whole recorded world (data parallel across a model-parallel degree d) keeps its
    stride and grows with the world: every d-th rank from the simulated one's. Any other
    group (a tensor-parallel block, a pipeline pair) keeps its ranks, as the model's
    degree of parallelism does not change with the world."""
    out = {}
    for name, ranks in prog.groups.items():
        stride = ranks[1] - ranks[0] if len(ranks) > 1 else 1
        strided = stride > 0 and list(ranks) == list(range(ranks[0], ranks[0] + stride * len(ranks), stride))
        if world != prog.world and strided and stride * len(ranks) == prog.world:
            if world % stride:
                raise SimulateError(
                    f"group {name!r} takes every {stride}th rank of the recorded world; {world} ranks are not"
                    f" a multiple of {stride}"
                )
            out[name] = tuple(range(rank % stride, world, stride))
        elif max(ranks) < world and rank in ranks:
            out[name] = ranks
        else:
            raise SimulateError(f"group {name!r} (ranks {ranks[0]}..{ranks[-1]}) does not fit a world of {world}")
    return out


def follows(prev: Op, op: Op) -> tuple[bool, float]:
    """How the recorded program entered `op` after `prev`: (True, gap) `gap` seconds
    after `prev` ended, or (False, offset) `offset` seconds after `prev` was entered,
    not waiting for its end (DDP's overlapping buckets; `mark_free`). The replay and
    the Chakra export keep this one rule."""
    if op.free or op.start < prev.end:
        return False, op.start - prev.start
    return True, op.start - prev.end


def schedule_for(op: Op, recorded_world: int, world: int) -> tuple[Schedule, tuple[int, int] | None]:
    """The op's schedule over its group's `world` ranks (`recorded_world` when it was
    recorded), and the observer's answer for an allreduce."""
    if op.kind is Kind.ALLREDUCE:
        elem = op.elem or 4
        return RingAllreduce.of(RingGeometry.for_tensor(world, op.nbytes, elem)), (op.nbytes // elem, elem)
    if op.kind is Kind.ALLGATHER:
        return RingAllgather(world, max(1, op.nbytes // recorded_world)), None  # each rank's block, as recorded
    root = op.root if op.root is not None and op.root < world else 0
    if op.kind is Kind.BROADCAST:
        return BinomialBroadcast(world, root, op.nbytes), None
    # A pairwise instance's bytes are one message's times its group's size (controller/shape.py).
    if op.kind in (Kind.GATHER, Kind.SCATTER):  # a rank's block keeps its size
        return RootedPairwise(op.kind, world, root, max(1, op.nbytes // recorded_world)), None
    if op.kind is Kind.ALLTOALL:  # each rank's tensor keeps its size: a block is a W-th of it
        return PairwiseAlltoall(world, max(1, op.nbytes // world)), None
    return DisseminationBarrier(world), None


@dataclass
class Simulated:
    world: int
    ends: list[tuple[float, float]]  # each op's (start, end) in virtual seconds
    steps: list[float]
    iteration_s: float
    records: list
    skipped: dict[str, int]
    wall_s: float
    boundary: int = 0  # boundary messages the engine saw cross, every instance's

    @property
    def comm_share(self) -> float:
        """The share of the time between the first and the last optimizer step (the whole
        program without two steps) the real rank spent in at least one collective."""
        if not self.ends:
            return 0.0
        if len(self.steps) >= 2:
            lo, hi = self.steps[0], self.steps[-1]
        else:
            lo, hi = min(a for a, _ in self.ends), max(b for _, b in self.ends)
        covered, reach = 0.0, lo
        for a, b in sorted(self.ends):
            a, b = max(a, reach), min(b, hi)
            if b > a:
                covered += b - a
                reach = b
        return covered / (hi - lo) if hi > lo else 1.0


class SimulateError(NeuronaBoxError, ValueError):
    """Bad input to a simulation: one line, exit status 2."""


Costs = dict[tuple[Kind, str], float]  # (kind, group) -> seconds the real rank adds to each


def simulate(
    prog: Program, world: int, timing, rank: int | None = None, on_record=None, costs: Costs | None = None
) -> Simulated:
    """Replay `prog` at `world` ranks under `timing` (a ReleaseTiming), each collective
    ending `costs` later for the real rank than the network lets it. `on_record(rec,
    open_entries)` sees each finished instance, with the simulated rank's entry into
    those still in flight (TraceWriter.instance's watermark)."""
    from neuronabox.controller.dialects.gloo.protocol import GLOO
    from neuronabox.controller.dialects.gloo.virtual import VirtualRun

    rank = prog.rank if rank is None else rank
    if rank >= world:
        rank = 0
    t_wall = time.perf_counter()
    records: list = []
    costs = costs or {}
    boundary = 0

    def complete(rec) -> None:
        nonlocal boundary
        boundary += rec.boundary_messages
        cost = costs.get((Kind(rec.kind), rec.group), 0.0)
        me = rec.ranks.index(rank) if rec.ranks and rank in rec.ranks else rank  # per_rank is by group rank
        if cost and me in rec.per_rank:
            a, b = rec.per_rank[me]
            rec.per_rank[me] = (a, b + cost)
            rec.end = max(rec.end, b + cost)
        if on_record is None:
            records.append(rec)
        else:
            on_record(rec, run.engine.open_entries())

    groups = scaled_groups(prog, world, rank)
    # Each instance charges the measured local work its live run charged (its line's `work`),
    # unless the topology gives local work of its own, which wins as it did live.
    replayed_work = not timing.work.any() and any(op.work for op in prog.ops)
    if replayed_work:
        timing.work_source, timing.replayed = "recorded", {}
    run = VirtualRun(world, [rank], timing, on_complete=complete, subgroups=groups)
    ops = prog.ops
    ends: list[tuple[float, float] | None] = [None] * len(ops)
    starts: list[float | None] = [None] * len(ops)

    def launch(i: int, at: float) -> None:
        op = ops[i]
        size = len(groups[op.group]) if op.group in groups else world
        sched, meta = schedule_for(op, op.world or prog.world, size)
        starts[i] = at
        work = (op.work or HostWork()) if replayed_work else timing.work
        sim = run.start(op.kind, sched, at, sched.edge_work(work), meta, lambda sim, i=i: finished(i, sim), op.group,
                        getattr(sched, "nbytes", 0))  # fmt: skip
        if replayed_work:  # the instance charges what its live one charged
            timing.replayed[op.group, GLOO.classify(sim.slot)[1]] = work
        nxt = i + 1
        if nxt < len(ops):
            after_end, offset = follows(op, ops[nxt])
            if not after_end:  # entered while this one was in flight
                launch(nxt, at + offset)

    def finished(i: int, sim) -> None:
        end = sim.done + costs.get((ops[i].kind, ops[i].group), 0.0)
        ends[i] = (starts[i], end)
        nxt = i + 1
        if nxt < len(ops):
            after_end, gap = follows(ops[i], ops[nxt])
            if after_end:
                launch(nxt, end + gap)

    if ops:
        launch(0, 0.0)
        # The run allocates schedules' messages by the hundred thousand and frees them at
        # its end: the collector's passes over them in between would find nothing to free.
        collecting = gc.isenabled()
        gc.disable()
        try:
            run.loop.run()
        finally:
            if collecting:
                gc.enable()
    done = [e for e in ends if e is not None]
    if len(done) != len(ops):
        raise RuntimeError(f"the simulation stalled after {len(done)} of {len(ops)} collectives")
    # Each optimizer step keeps its offset from the collective that ended last before it.
    rec_ends = [o.end for o in ops]
    steps = []
    for t in prog.steps:
        j = bisect.bisect_right(rec_ends, t) - 1
        if not ops:  # no collective to keep an offset from: the steps keep their own spacing
            steps.append(t - prog.steps[0])
            continue
        steps.append(t - ops[0].start if j < 0 else ends[j][1] + (t - ops[j].end))
    gaps = [b - a for a, b in zip(steps, steps[1:], strict=False)]
    iteration = statistics.median(gaps) if gaps else 0.0
    return Simulated(world, done, steps, iteration, records, prog.skipped, time.perf_counter() - t_wall, boundary)


def software_costs(prog: Program, recorded_timing) -> Costs:
    """What the recorded real rank spent in each kind of collective beyond the network:
    per kind and group, the median of its recorded span less the span a replay at the
    recorded world under `recorded_timing` (the recorded network) gives it, never below
    zero. The median keeps one slow call from being charged to every call."""
    sim = simulate(prog, prog.world, recorded_timing)
    excess: dict[tuple[Kind, str], list[float]] = {}
    for op, (a, b) in zip(prog.ops, sim.ends, strict=True):
        excess.setdefault((op.kind, op.group), []).append((op.end - op.start) - (b - a))
    return {key: max(0.0, statistics.median(xs)) for key, xs in excess.items()}


def skew_spec(spec: str | None) -> str:
    """--skew for a replay, not given: none. The recorded run's waits for late emulated
    ranks are in its spans, which the replay charges as the real rank's own cost (their
    median), so at the recorded world `none` gives the live run's iteration back; `auto`
    draws them again, to ask what a larger world's slowest rank adds."""
    return spec if spec is not None else "none"


def skew_of(spec: str, prog: Program) -> Skew:
    """--skew for a replay: none, a file's delays, or auto: the recorded real rank's own
    variation (its entries into each recurring collective, as a live run pools them)."""
    if spec != "auto":
        try:
            return Skew.parse(spec)
        except SkewError as exc:
            raise SimulateError(str(exc)) from None
    return Skew.recorded(skew_entries(prog), prog.steps, held=prog.held)


def skew_entries(prog: Program) -> list[tuple[tuple, float, float, float]]:
    """The program's collectives as `Skew.recorded` takes them: (group, kind, bytes), entry,
    end, the emulator's lag."""
    return [((op.group, str(op.kind), op.nbytes), op.start, op.end, op.lag) for op in prog.ops]


def network_of(doc: dict, nnodes: int, nproc: int, topology_name: str | None, model_name: str | None,
               inject: list[str] | None, skew: Skew | None = None):  # fmt: skip
    """The release timing for `nnodes` x `nproc` ranks, with the trace's topology, model
    and injections where none is given; and the topology, model name and what-ifs."""
    from neuronabox.controller.release import ReleaseTiming

    model_name = model_name or doc.get("delay_model") or "alpha-beta"
    try:
        topo = recorded_topology(doc, topology_name).with_nodes(nnodes, nproc)
        model = delay_models.load(model_name, topo)
        whatif = WhatIf.from_specs(doc.get("inject", []) if inject is None else inject)
    except (topology.TopologyError, WhatIfError, KeyError, ValueError) as exc:
        raise SimulateError(str(exc)) from None
    return ReleaseTiming(model, whatif, skew=skew), topo, model_name, whatif


def run_simulation(
    doc: dict,
    source: str,
    nnodes: int | None = None,
    nproc: int | None = None,
    topology_name: str | None = None,
    model_name: str | None = None,
    inject: list[str] | None = None,
    out: str | None = None,
    punctual: bool = False,
    skew: str | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> tuple[Simulated, tracefile.RunTotals, str]:
    """Simulate a loaded trace (`source`: its path, for the new trace's header); unset
    options come from the trace. `punctual`: charge the real rank no software cost;
    `on_progress(done, total)`: each finished collective instance. Returns the
    simulation, its totals and its report."""
    rec_nodes = doc.get("nnodes") or doc["world_size"]
    rec_nproc = doc.get("nproc_per_node") or 1
    nnodes = rec_nodes if nnodes is None else nnodes
    nproc = rec_nproc if nproc is None else nproc
    refused = check_world(nnodes, nproc)
    if refused:
        raise SimulateError(refused)
    if out and Path(out).exists() and Path(out).resolve() == Path(source).resolve():
        raise SimulateError(f"--trace {out} is the recording being replayed; choose another file")
    world = nnodes * nproc
    prog = program_of(doc)
    skew = skew_spec(skew)
    timing, topo, model_name, whatif = network_of(doc, nnodes, nproc, topology_name, model_name, inject,
                                                  skew_of(skew, prog))  # fmt: skip
    try:
        whatif.check(world, [prog.rank])  # as the launcher checks --inject
    except WhatIfError as exc:
        raise SimulateError(f"--inject {exc}") from None
    costs = {} if punctual else software_costs(prog, network_of(doc, rec_nodes, rec_nproc, None, None, None)[0])
    writer = None
    if out:
        header = {"world_size": world, "nnodes": nnodes, "nproc_per_node": nproc, "real_ranks": [prog.rank],
                  "delay_model": model_name, "topology": topo.name, "boundary": "modeled",
                  "topology_spec": topology.as_spec(topo),
                  "inject": whatif.specs(), "skew": skew, "data": "zeros", "started_us": 0.0,
                  "simulated_from": str(Path(source).resolve())}  # fmt: skip
        writer = tracefile.TraceWriter(out, header)
    totals = tracefile.RunTotals()

    done, total = [0], len(prog.ops)

    def on_record(rec, open_entries: dict[int, float]) -> None:
        totals.add(rec.kind, rec.nbytes, rec.per_rank, rec.boundary_messages, rec.predicted)
        if writer is not None:
            writer.instance(rec, open_entries)
        if on_progress is not None:
            done[0] += 1
            on_progress(done[0], total)

    sim = simulate(prog, world, timing, on_record=on_record, costs=costs)
    for t in sim.steps:
        totals.step(prog.rank, t)
        if writer is not None:
            writer.step(prog.rank, t)
    if writer is not None:
        writer.close({"state": "stopped", "error": "", "inject": whatif.specs(), "release": {"timed_releases": 0}})
    return sim, totals, report(sim, totals, world, prog, model_name, topo.name, whatif, costs)


def recorded_topology(doc: dict, name_or_file: str | None) -> topology.Topology:
    """`--topology` when given; else the cluster the trace ran on, which it carries
    whole (a file's topology replays without the file)."""
    if name_or_file:
        return topology.load(name_or_file)
    if doc.get("topology_spec"):
        return topology.from_dict(doc["topology_spec"], doc.get("topology") or "recorded")
    return topology.load(doc.get("topology") or "cpu-25gbe")


def load_trace(path: str) -> dict:
    """A trace for simulation, or SimulateError with the cause."""
    try:
        return tracefile.load(path)
    except OSError as exc:
        raise SimulateError(f"{path}: {exc.strerror}") from None
    except tracefile.TraceError as exc:
        raise SimulateError(str(exc)) from None


def report(
    sim: Simulated, totals, world: int, prog: Program, model: str, topo: str, whatif: WhatIf, costs: Costs
) -> str:
    from neuronabox.trace.busbw import bandwidths

    charged = ", ".join(f"{k}{'' if g == '0' else f' (group {g})'} {c * 1e3:.3f} ms"
                        for (k, g), c in sorted(costs.items()) if c > 0)  # fmt: skip
    lines = [
        "NeuronaBox simulation",
        f"  world size      {world}   (recorded at {prog.world})",
        f"  real rank       {prog.rank} (simulated, "
        + (f"its recorded cost per collective: {charged})" if charged else "punctual)"),
        f"  network         {model} on {topo}" + "".join(f"  +{s}" for s in whatif.specs()),
        "  collectives     kind         count        bytes   time on real rank (mean)   model (mean)"
        "   algbw    busbw (GB/s)",
    ]
    for kind, k in sorted(totals.kinds.items()):
        mean = k.seconds / k.count if k.count else 0.0
        model_mean = k.predicted / k.count if k.count else 0.0
        alg, bus = bandwidths(kind, k.nbytes / k.count if k.count else 0, mean, world)
        lines.append(f"                  {kind:<10} {k.count:>7} {k.nbytes:>12d}   {mean * 1e3:9.3f} ms"
                     f"               {model_mean * 1e3:9.3f} ms  {alg:7.3f}  {bus:7.3f}")  # fmt: skip
    if sim.skipped:
        lines.append("  not replayed    " + ", ".join(f"{k} x{n}" for k, n in sorted(sim.skipped.items())))
    steps, it = totals.iteration()
    lines.append(
        f"  optimizer steps {steps}   iteration time {it * 1e3:.2f} ms" if steps > 1
        else f"  optimizer steps {steps or 'none'} recorded; iteration time unknown (it needs two)"
    )  # fmt: skip
    lines.append(f"  communication   {100 * sim.comm_share:.1f}% of the iterations' time in collectives")
    rate = f", {sim.boundary / sim.wall_s / 1e6:.2f}M a second" if sim.wall_s > 0 else ""
    lines.append(f"  simulated in    {sim.wall_s:.2f} s of wall time: {sim.boundary} boundary messages{rate}")
    return "\n".join(lines)
