"""The engine in virtual time (controller/dialects/gloo/virtual.py): the same engine,
native pairs, release timing and delay model as a live run, with a simulated real
rank and time owned by the loop. A punctual simulated rank must end each collective
exactly when the schedule's closed form (`rank_time`, what the summary calls the
model's time) says, and every frame must pass the real side's pair machine."""

import pytest
from neuronabox.controller.dialects.gloo.virtual import VirtualRun
from neuronabox.controller.release import ReleaseTiming
from neuronabox.delay_models import load as load_model
from neuronabox.topology import HostWork
from neuronabox.topology import load as load_topology

from neuronabox.schedules import Kind
from neuronabox.schedules.gloo import (
    BinomialBroadcast,
    DisseminationBarrier,
    RingAllgather,
    RingAllreduce,
    RingGeometry,
)


def schedule_of(kind: Kind, world: int, real: int):
    """(schedule, bytes, the observer's meta) for one instance of `kind`."""
    if kind is Kind.ALLREDUCE:
        numel = 3000 + world
        return RingAllreduce(RingGeometry.for_tensor(world, 4 * numel, 4)), 4 * numel, (numel, 4)
    if kind is Kind.ALLGATHER:
        return RingAllgather(world, 4096), 4096 * world, None
    if kind is Kind.BROADCAST:
        return BinomialBroadcast(world, (real + 1) % world, 20_000), 20_000, None
    return DisseminationBarrier(world), 0, None


@pytest.mark.parametrize("work", [0.0, 15e-6])
@pytest.mark.parametrize("kind", [Kind.ALLREDUCE, Kind.ALLGATHER, Kind.BROADCAST, Kind.BARRIER])
@pytest.mark.parametrize("world,real", [(2, 0), (5, 3), (16, 0), (33, 7)])
def test_a_punctual_rank_ends_when_the_closed_form_says(kind, world, real, work):
    timing = ReleaseTiming(load_model("alpha-beta", load_topology("cpu-25gbe").with_nodes(world, 1)))
    timing.work = HostWork(message=work)
    sched, nbytes, meta = schedule_of(kind, world, real)
    run = VirtualRun(world, [real], timing)
    sim = run.start(kind, sched, at=2.5, work=sched.edge_work(timing.work), meta=meta)
    run.loop.run()
    assert len(run.records) == 1 and not run.engine.instances, run.engine.pending()
    rec = run.records[0]
    assert rec.kind == kind
    # The engine's own model time for the instance, from the shape it inferred (an
    # allreduce's may come from the wire, padded to whole segments, before the meta):
    assert sim.done - 2.5 == pytest.approx(rec.predicted, rel=1e-9, abs=1e-12), (kind, world, real)
    if rec.nbytes == nbytes:
        assert rec.predicted == pytest.approx(timing.predicted(kind, nbytes, sched, real), rel=1e-12)


def test_what_if_latency_moves_the_virtual_end():
    """A what-if modifier reaches the virtual run as it reaches a live one."""
    from neuronabox.delay_models.whatif import WhatIf

    world, real = 16, 0
    ends = []
    for spec in ([], ["latency=+1ms"]):
        timing = ReleaseTiming(load_model("alpha-beta", load_topology("cpu-25gbe").with_nodes(world, 1)),
                               WhatIf.from_specs(spec))  # fmt: skip
        sched, _, meta = schedule_of(Kind.ALLREDUCE, world, real)
        run = VirtualRun(world, [real], timing)
        sim = run.start(Kind.ALLREDUCE, sched, at=0.0, meta=meta)
        run.loop.run()
        ends.append(sim.done)
    hops = 2 * (world - 1)  # every step of the ring pays the added latency once
    assert ends[1] - ends[0] == pytest.approx(hops * 1e-3, rel=0.05)


def test_a_large_world_runs_in_virtual_time():
    """1024 ranks, a 1 MiB allreduce: 8184 boundary messages through the engine, its end
    exactly the model's (a live run measures the controller's speed there too)."""
    world, numel = 1024, 1 << 18
    timing = ReleaseTiming(load_model("alpha-beta", load_topology("cpu-25gbe").with_nodes(world, 1)))
    sched = RingAllreduce(RingGeometry.for_tensor(world, 4 * numel, 4))
    run = VirtualRun(world, [0], timing)
    sim = run.start(Kind.ALLREDUCE, sched, at=0.0, meta=(numel, 4))
    run.loop.run()
    assert run.records[0].boundary_messages == len(sched.sends(0)) + len(sched.recvs(0))  # both neighbours emulated
    assert sim.done == pytest.approx(run.records[0].predicted, rel=1e-12)
