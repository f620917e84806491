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


def _overlapping_buckets(timing, world=64):
    """Three allreduces entered 20 us apart (DDP's buckets overlap) and a barrier after
    the last: (end of each on the simulated rank, each record's model time)."""
    run = VirtualRun(world, [5], timing)
    started = []
    for k, numel in enumerate((5000, 70_000, 5000)):
        sched = RingAllreduce(RingGeometry.for_tensor(world, 4 * numel, 4))
        started.append(run.start(Kind.ALLREDUCE, sched, at=1.0 + k * 20e-6, meta=(numel, 4)))
    started.append(run.start(Kind.BARRIER, DisseminationBarrier(world), at=1.01))
    run.loop.run()
    assert run.loop.in_flight == 0 and not run.engine.instances
    return [s.done for s in started], sorted(r.predicted for r in run.records)


def test_the_native_clock_answers_as_the_python_one(monkeypatch):
    """The book asks a native timeline's release times through its C API, with no Python
    call; through the timeline's Python methods they must be the same, to the bit."""
    def timing():
        return ReleaseTiming(load_model("alpha-beta", load_topology("cpu-25gbe").with_nodes(64, 1)))

    native = _overlapping_buckets(timing())

    asked = []

    class Delegate:  # no native timeline: the book calls its methods from C, one by one
        def __init__(self, timeline):
            self.timeline = timeline

        def release(self, emu, step):
            asked.append((emu, step))
            return self.timeline.release(emu, step)

        def real_sent(self, rank, step, t):
            self.timeline.real_sent(rank, step, t)

        def __getattr__(self, name):
            return getattr(self.timeline, name)

    made = ReleaseTiming.timeline
    monkeypatch.setattr(ReleaseTiming, "timeline", lambda self, *a, **k: Delegate(made(self, *a, **k)))
    assert _overlapping_buckets(timing()) == native
    assert len(asked) > 100  # the Python path ran: a release asked per emulated message


def test_a_simulation_is_deterministic_and_collected():
    """The same program twice gives the same times; a finished run leaves nothing alive
    (the wire and the engine refer to each other: the collector frees them)."""
    import gc
    import weakref

    def timing():
        return ReleaseTiming(load_model("alpha-beta", load_topology("cpu-25gbe").with_nodes(64, 1)))

    assert _overlapping_buckets(timing()) == _overlapping_buckets(timing())
    run = VirtualRun(16, [0], timing())
    run.start(Kind.BARRIER, DisseminationBarrier(16), at=0.0)
    run.loop.run()
    gone = weakref.ref(run.engine)  # the wire's frames go to it: a wire kept alive would keep it
    del run
    gc.collect()
    assert gone() is None


def test_what_the_wire_cannot_play_is_refused_in_one_line():
    from neuronabox.controller import _native
    from neuronabox.controller.dialects.gloo.protocol import GlooPair
    from neuronabox.controller.engine import Conn

    with pytest.raises(ValueError, match="bytes"):
        _native.RankProgram([(1, 0, -5)], [], 2)
    with pytest.raises(TypeError, match="peer, step, nbytes"):
        _native.RankProgram([(1, 0)], [], 2)
    run = VirtualRun(16, [0], None)
    g = run.groups["0"]
    program = _native.RankProgram([(15, 0, 8)], [(1, 0, 8)], 1)
    link = run.loop.link(0, 15, Conn(g, 0, 15, GlooPair()))
    with pytest.raises(ValueError, match="2 peers"):
        run.loop.start(program, 0, 1, 0.0, 0.0, [link], None)
    other = run.loop.link(0, 1, Conn(g, 0, 1, GlooPair()))
    with pytest.raises(ValueError, match="not the program's peer"):
        run.loop.start(program, 0, 1, 0.0, 0.0, [link, other], None)  # its peers: 1, then 15
    # The engine's side writes on a slot the simulated rank is in no instance of:
    stray = Conn(g, 0, 7, GlooPair())
    run.loop.link(0, 7, stray)
    stray.pair.recv_ready(0xABC, 8)
    run.loop.emit(stray)
    with pytest.raises(RuntimeError, match="0xabc of group 0, which the simulated rank is not in"):
        run.loop.run()
