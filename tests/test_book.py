"""The native book: once an instance's shape is known its frames bypass Python, and
what it refuses it names as the engine always has (instance, pair, step).

The bytes it writes and the instants it releases them at are checked where the
engine is: tests/test_engine.py (every byte against the schedule's own origin,
through a real-side `GlooPair` that refuses anything Gloo would kill the pair for)
and tests/test_virtual.py (every release against the closed forms)."""

import pytest
from neuronabox.controller.dialects.gloo.wire import SlotPrefix, make_slot
from neuronabox.controller.engine import ProtocolError
from test_engine import RealSide

from neuronabox.schedules.gloo import (
    BinomialBroadcast,
    DisseminationBarrier,
    RingAllgather,
    RingAllreduce,
    RingGeometry,
)


@pytest.mark.parametrize(
    "sched,prefix,meta",
    [
        (RingAllreduce(RingGeometry.for_tensor(16, 4 * 5000, 4)), SlotPrefix.ALLREDUCE, (5000, 4)),
        (RingAllgather(16, 700), SlotPrefix.ALLGATHER, None),
        (BinomialBroadcast(16, 0, 333), SlotPrefix.BROADCAST, None),
        (DisseminationBarrier(16), SlotPrefix.BARRIER, None),
    ],
)
def test_frames_after_install_never_reach_python(sched, prefix, meta):
    """Only the frames read before the book took its pairs go through the engine."""
    side = RealSide(16, (0, 5), sched, make_slot(prefix, 3), meta)
    seen = []
    on_event = side.engine.on_event
    side.engine.on_event = lambda conn, ev: seen.append(ev) or on_event(conn, ev)
    side.start()
    side.pump()
    assert len(side.completed) == 1 and not side.engine.instances
    boundary = side.completed[0].boundary_messages
    # start() queues every real rank's notices before the shape is known; the data
    # frames, and the notices and data that follow them, go to the book directly.
    assert all(type(ev).__name__ != "Data" for ev in seen), seen
    assert len(seen) <= boundary


def test_a_frame_the_schedule_lacks_names_the_instance_pair_and_step():
    world = 4
    sched = RingAllreduce(RingGeometry.for_tensor(world, 4096, 4))
    side = RealSide(world, (0,), sched, make_slot(SlotPrefix.ALLREDUCE, 4), (1024, 4))
    side.engine.on_meta("0", side.slot, 1024, 4)
    side.mirror[(0, 1)].recv_ready(side.slot, sched.recvs(0)[0].nbytes)
    side.say(0, 1)
    side.mirror[(0, 3)].send_ready(side.slot, 17)  # the schedule sends a segment, not 17 bytes
    with pytest.raises(ProtocolError) as err:
        side.say(0, 3)
    n = sched.sends(0)[0].nbytes
    assert str(err.value) == (
        f"allreduce #4 of group '0' rank pair 0<->3 step 0: real rank sends 17 bytes, schedule expects {n}"
    )


def test_a_notice_the_program_lacks_says_so():
    """The root of a broadcast receives nothing: a receive it posts is refused by name."""
    sched = BinomialBroadcast(4, 0, 64)
    side = RealSide(4, (0,), sched, make_slot(SlotPrefix.BROADCAST, 4))
    side.start()
    side.mirror[(0, 1)].recv_ready(side.slot, 64)
    with pytest.raises(ProtocolError) as err:
        side.say(0, 1)
    assert str(err.value) == (
        "broadcast #4 of group '0' rank pair 0<->1: unexpected NOTIFY_RECV_READY of 64 bytes: "
        "the schedule has no recv here, none at all with this peer"
    )
