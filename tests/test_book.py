"""The native book against the Python engine it replaces on the per-message path.

The Python engine (matching, dependencies, FIFO, release) is the oracle: for every
schedule, world and real set, the native book must put the same bytes on every pair,
in the same order, and end each instance with the same record; in virtual time it
must release every message at the same instant. The real side of each pair is a
`GlooPair`, which refuses anything Gloo would kill the pair for."""

from collections import deque

import pytest
from neuronabox.controller.dialects.gloo.virtual import VirtualRun
from neuronabox.controller.dialects.gloo.wire import SlotPrefix, make_slot
from neuronabox.controller.engine import ProtocolError
from neuronabox.controller.release import ReleaseTiming
from neuronabox.delay_models import load as load_model
from neuronabox.topology import load as load_topology
from test_engine import RealSide
from test_virtual import schedule_of

from neuronabox.schedules import Kind
from neuronabox.schedules.gloo import (
    BinomialBroadcast,
    DisseminationBarrier,
    RingAllgather,
    RingAllreduce,
    RingGeometry,
    RingReduce,
    reduce_geometry,
)
from neuronabox.whatif import WhatIf


def schedules(world):
    """(schedule, slot prefix, meta) of the kinds `RealSide` can play, at `world` (the
    pairwise ones, whose sizes only the wire tells, run live in tests/test_live.py)."""
    geo = RingGeometry.for_tensor(world, 4 * 5000, 4)
    return [
        (RingAllreduce(geo), SlotPrefix.ALLREDUCE, (5000, 4)),
        (RingAllreduce(RingGeometry.for_tensor(world, 12, 4)), SlotPrefix.ALLREDUCE, (3, 4)),  # empty segments
        (RingAllgather(world, 700), SlotPrefix.ALLGATHER, None),
        (BinomialBroadcast(world, 0, 333), SlotPrefix.BROADCAST, None),
        (BinomialBroadcast(world, 1, 333), SlotPrefix.BROADCAST, None),  # an emulated root for some
        (DisseminationBarrier(world), SlotPrefix.BARRIER, None),
        (RingReduce(reduce_geometry(world, 4 * 3000, 4), root=world - 1), SlotPrefix.REDUCE, None),
    ]


class Tape(deque):
    """The controller's writes, kept per pair as `RealSide.pump` consumes them."""

    def __init__(self):
        super().__init__()
        self.wire: dict = {}

    def append(self, item):
        conn, raw = item
        key = (conn.real, conn.emu)
        self.wire[key] = self.wire.get(key, b"") + raw
        super().append(item)


def play(world, real, sched, prefix, meta, native):
    side = RealSide(world, real, sched, make_slot(prefix, 3), meta, native=native)
    side.out = tape = Tape()
    side.start()
    side.pump()
    return side, tape.wire


@pytest.mark.parametrize("world,real", [(2, (0,)), (5, (0,)), (8, (0, 1)), (13, (1, 3)), (16, (0, 5, 6))])
def test_the_book_writes_what_the_python_engine_writes(world, real):
    for sched, prefix, meta in schedules(world):
        py_side, py_wire = play(world, real, sched, prefix, meta, native=False)
        nb_side, nb_wire = play(world, real, sched, prefix, meta, native=True)
        what = (sched.kind, world, real)
        # A reduce's root is on the wire only at its gather: its program is not whole at
        # install, and the Python engine runs it.
        assert nb_side.engine.booked == int(sched.kind != Kind.REDUCE) and py_side.engine.booked == 0, what
        assert len(nb_side.completed) == len(py_side.completed) == 1, what
        assert not nb_side.engine.instances, nb_side.engine.pending()
        assert nb_wire == py_wire, what
        assert nb_side.got == py_side.got, what
        a, b = nb_side.completed[0], py_side.completed[0]
        assert (a.boundary_messages, a.nbytes, a.geometry, sorted(a.per_rank)) == (
            b.boundary_messages,
            b.nbytes,
            b.geometry,
            sorted(b.per_rank),
        ), what


def test_errors_match_between_the_planes():
    msgs = []
    for native in (False, True):
        world, real = 4, (0,)
        sched = RingAllreduce(RingGeometry.for_tensor(world, 4096, 4))
        side = RealSide(world, real, sched, make_slot(SlotPrefix.ALLREDUCE, 4), (1024, 4), native=native)
        side.engine.on_meta("0", side.slot, 1024, 4)
        side.mirror[(0, 1)].recv_ready(side.slot, sched.recvs(0)[0].nbytes)
        side.say(0, 1)
        side.mirror[(0, 3)].send_ready(side.slot, 17)  # the schedule sends a segment, not 17 bytes
        with pytest.raises(ProtocolError) as err:
            side.say(0, 3)
        msgs.append(str(err.value))
    assert msgs[0] == msgs[1]
    assert "rank pair 0<->3 step 0: real rank sends 17 bytes" in msgs[1]


@pytest.mark.parametrize("kind", [Kind.ALLREDUCE, Kind.ALLGATHER, Kind.BROADCAST, Kind.BARRIER])
@pytest.mark.parametrize("world,real", [(2, 0), (9, 4), (33, 7)])
def test_virtual_time_releases_at_the_same_instants(kind, world, real):
    """Timed releases through the native core's timers land where the Python engine's do."""
    ends = []
    for native in (False, True):
        timing = ReleaseTiming(load_model("alpha-beta", load_topology("cpu-25gbe").with_nodes(world, 1)))
        timing.whatif = WhatIf.from_specs(["latency=+30us"])
        sched, _, meta = schedule_of(kind, world, real)
        run = VirtualRun(world, [real], timing, native=native)
        sim = run.start(kind, sched, at=1.0, meta=meta)
        run.loop.run()
        assert run.engine.booked == int(native) and len(run.records) == 1
        ends.append((sim.done, sorted(run.records[0].per_rank.items())))
    assert ends[0] == ends[1]
