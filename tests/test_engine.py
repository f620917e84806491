"""The engine, sans-IO: real ranks are played from the schedules' own programs and
every byte the controller writes goes through a real-side `GlooPair`, which
refuses anything Gloo would kill the pair for."""

import itertools
import socket
import time
from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from neuronabox.controller.dialects.gloo.protocol import GLOO, Data, GlooPair, RecvReady
from neuronabox.controller.dialects.gloo.wire import SlotPrefix, make_slot
from neuronabox.controller.engine import Conn, Engine, Group, ProtocolError
from neuronabox.controller.shape import Told

from neuronabox.schedules.gloo import (
    BinomialBroadcast,
    DisseminationBarrier,
    RealRanks,
    RingAllgather,
    RingAllreduce,
    RingGeometry,
)


class RealSide:
    """What the stock Gloo of real ranks puts on the boundary, for one instance."""

    def __init__(self, world, real, sched, slot, meta=None):
        self.group = Group("0", world, RealRanks(real, world))
        self.sched, self.slot = sched, slot
        self.out = deque()  # (conn, bytes) the controller wrote
        self.engine = Engine(
            emit=lambda c: self.out.append((c, c.pair.take())),
            dialect=GLOO,
            request_meta=(lambda g, slot, r, kind, world, wire: True) if meta else None,
            conn_of=lambda g, r, e: self.conns.get((r, e)),
        )
        self.meta = meta
        self.conns, self.mirror = {}, {}
        self.sends, self.got, self.credits = {}, {}, {}
        for r in real:
            for m in sched.sends(r) + sched.recvs(r):
                if m.peer not in self.group.real and (r, m.peer) not in self.conns:
                    self.conns[(r, m.peer)] = Conn(self.group, r, m.peer, GlooPair())
                    self.mirror[(r, m.peer)] = GlooPair()  # the real side's view of the pair
        self.completed = []
        self.engine.on_complete = self.completed.append

    def payload(self, r, step, n):
        head = bytes([r % 251, step % 251, (step >> 8) % 251])  # distinct per (rank, step)
        return (head * (n // 3 + 1))[:n]

    def feed(self, r, peer, raw):
        conn = self.conns[(r, peer)]
        for ev in conn.pair.receive(raw):
            self.engine.on_event(conn, ev)

    def say(self, r, peer):
        """Real rank r's frames to `peer`, queued on its side of the pair, reach the engine."""
        self.feed(r, peer, self.mirror[(r, peer)].take())

    def start(self):
        """Post every receive and announce every send, in program order."""
        for r in self.group.real.sorted:
            for m in self.sched.recvs(r):
                if m.peer not in self.group.real:
                    self.mirror[(r, m.peer)].recv_ready(self.slot, m.nbytes)
                    self.say(r, m.peer)
            for m in self.sched.sends(r):
                if m.peer not in self.group.real:
                    self.announce(r, m)
        if self.meta:
            self.engine.on_meta("0", self.slot, *self.meta)

    def announce(self, r, m):
        """Real rank r calls send(): NOTIFY_SEND_READY now, data once a receive is posted."""
        key = (r, m.peer)
        self.sends.setdefault(key, deque()).append(m)
        self.mirror[key].send_ready(self.slot, m.nbytes)
        self.say(r, m.peer)
        self.serve(key)

    def serve(self, key):
        while self.credits.get(key) and self.sends.get(key):
            self.credits[key] -= 1
            m = self.sends[key].popleft()
            data = self.payload(key[0], m.step, m.nbytes)
            self.mirror[key].data(self.slot, data)
            self.say(*key)

    def pump(self):
        while self.out:
            conn, raw = self.out.popleft()
            key = (conn.real, conn.emu)
            for ev in self.mirror[key].receive(raw):  # raises on any wire-rule violation
                if isinstance(ev, RecvReady):
                    self.credits[key] = self.credits.get(key, 0) + 1
                    self.serve(key)
                elif isinstance(ev, Data):
                    self.got.setdefault(key, []).append(ev.payload)


def run(world, real, sched, prefix, meta=None):
    side = RealSide(world, real, sched, make_slot(prefix, 3), meta)
    side.start()
    side.pump()
    return side


CASES = list(itertools.product([2, 3, 5, 8, 13], [(0,), (0, 1), (1, 3)]))


@pytest.mark.parametrize("world,real", [c for c in CASES if max(c[1]) < c[0] and len(c[1]) < c[0]])
@pytest.mark.parametrize("total,elem", [(4, 4), (28, 4), (4096, 4), (10_000, 8), (3 << 20, 4)])
def test_allreduce_completes_and_obeys_the_wire(world, real, total, elem):
    sched = RingAllreduce(RingGeometry.for_tensor(world, total, elem))
    side = run(world, real, sched, SlotPrefix.ALLREDUCE, meta=(total // elem, elem))
    assert len(side.completed) == 1 and not side.engine.instances
    rec = side.completed[0]
    assert rec.boundary_messages == sum(1 for r in real for m in sched.sends(r) + sched.recvs(r) if m.peer not in real)
    if len(real) == 1:  # the allgather phase hands the real rank back its own segments
        r = real[0]
        p = sched.geo.phase_steps
        got = side.got[(r, (r + 1) % world)]
        recvs = sched.recvs(r)
        own = {m.step: side.payload(r, m.step, m.nbytes) for m in sched.sends(r)}
        assert len(got) == len(recvs)
        for m, data in zip(recvs, got, strict=True):
            assert data == (own[m.step - p] if m.step >= p else bytes(m.nbytes))


@pytest.mark.parametrize("world,real", [(2, (0,)), (5, (0,)), (8, (0, 1)), (13, (1, 3))])
def test_allgather_mirrors_a_real_block_into_emulated_blocks(world, real):
    sched = RingAllgather(world, 10)
    side = run(world, real, sched, SlotPrefix.ALLGATHER)
    assert len(side.completed) == 1
    for r in real:
        e = (r - 1) % world
        if e in real:
            continue
        got = side.got[(r, e)]
        assert len(got) == 2 * (world - 1)
        for i, data in enumerate(got):  # the bytes of the real send the schedule names, in order
            x, s = sched.origin(e, i, side.group.real)[1]
            assert data == side.payload(x, s, sched.chunks[i & 1])
            if len(real) == 1:  # one real rank: every emulated block mirrors its own block
                assert (x, s) == (r, i & 1)


@pytest.mark.parametrize("world,real,root", [(2, (0,), 0), (7, (0,), 0), (16, (0, 1), 0), (9, (3,), 0)])
def test_broadcast_forwards_the_roots_bytes(world, real, root):
    sched = BinomialBroadcast(world, root, 64)
    side = run(world, real, sched, SlotPrefix.BROADCAST)
    assert len(side.completed) == 1
    for (r, _), got in side.got.items():
        assert got == [side.payload(root, sched.parent(r)[1], 64)] if root in real else [bytes(64)]


def test_broadcast_root_is_settled_while_a_real_rank_waits_on_a_real_parent():
    """Real ranks 1 and 5 of 32, root 31 (emulated): rank 1's receive notice allows
    roots 31 and 30, and rank 5 says nothing, for its parent is rank 1. The engine must
    answer rank 1 without waiting for rank 5 (which would wait forever)."""
    sched = BinomialBroadcast(32, 31, 64)
    side = RealSide(32, (1, 5), sched, make_slot(SlotPrefix.BROADCAST, 3))
    side.mirror[(1, 31)].recv_ready(side.slot, 64)
    side.say(1, 31)
    side.pump()
    assert side.got[(1, 31)] == [bytes(64)]


def test_ambiguous_broadcast_root_comes_from_the_observer():
    """Real ranks 0 and 1 of 8, root 6: rank 0's receive notice allows roots 5 and 6,
    which give the real ranks different programs, and rank 1 (which speaks under either)
    is late. The engine asks the observer of the rank that spoke and takes the root its
    call named, instead of guessing 5."""
    sched = BinomialBroadcast(8, 6, 64)
    side = RealSide(8, (0, 1), sched, make_slot(SlotPrefix.BROADCAST, 3), meta=True)
    asked = []
    side.engine.request_meta = lambda g, slot, r, kind, world, wire: asked.append((r, kind)) or True
    side.mirror[(0, 6)].recv_ready(side.slot, 64)
    side.say(0, 6)
    assert asked == [(0, "broadcast")] and not side.out  # nothing guessed yet
    side.engine.on_root("0", side.slot, 6)
    side.mirror[(1, 7)].recv_ready(side.slot, 64)
    side.say(1, 7)
    for r in (0, 1):
        for m in sched.sends(r):
            side.announce(r, m)
    side.pump()
    assert side.got[(0, 6)] == [bytes(64)] and side.got[(1, 7)] == [bytes(64)]
    assert len(side.completed) == 1 and side.completed[0].geometry.startswith("root=6")


@pytest.mark.parametrize("world,real", [(2, (0,)), (3, (0,)), (6, (0, 3)), (32, (0, 1, 7))])
def test_barrier_completes(world, real):
    side = run(world, real, DisseminationBarrier(world), SlotPrefix.BARRIER)
    assert len(side.completed) == 1


def test_barrier_holds_an_emulated_release_until_the_other_real_rank_arrives():
    world, real = 8, (0, 5)
    sched = DisseminationBarrier(world)
    side = RealSide(world, real, sched, make_slot(SlotPrefix.BARRIER, 0))
    for m in sched.recvs(0):  # only rank 0 enters the barrier
        if m.peer not in real:
            side.mirror[(0, m.peer)].recv_ready(side.slot, 0)
            side.say(0, m.peer)
    side.pump()
    assert (0, 7) in side.got and (0, 6) not in side.got  # round 1 from rank 6 waits for rank 5
    side.announce(5, sched.sends(5)[0])  # rank 5 enters: its round-0 send to rank 6
    side.pump()
    assert (0, 6) in side.got


def test_a_wrong_length_names_the_collective_the_pair_and_the_step():
    world = 4
    sched = RingAllreduce(RingGeometry.for_tensor(world, 4096, 4))
    side = RealSide(world, (0,), sched, make_slot(SlotPrefix.ALLREDUCE, 9), meta=(1024, 4))
    m = sched.recvs(0)[0]
    side.mirror[(0, m.peer)].recv_ready(side.slot, m.nbytes)
    side.say(0, m.peer)
    side.engine.on_meta("0", side.slot, 1024, 4)
    with pytest.raises(ProtocolError, match=r"allreduce #9 of group '0' rank pair 0<->1 step 1: .*schedule expects"):
        side.mirror[(0, m.peer)].recv_ready(side.slot, m.nbytes + 4)
        side.say(0, m.peer)


def test_an_observer_answer_that_contradicts_the_wire_names_both_sizes():
    """9 MiB at W = 2 runs in ten 1 MiB-ish segments, which the wire cannot count: the
    observer tells the size. An answer of 5 MiB (segments of 873816 bytes) against the
    real rank's 943720-byte segments would send the wrong frames: it ends the run, saying so."""
    world, total = 2, 9437184
    sched = RingAllreduce(RingGeometry.for_tensor(world, total, 4))
    side = RealSide(world, (0,), sched, make_slot(SlotPrefix.ALLREDUCE, 5), meta=True)
    asked = []
    side.engine.request_meta = lambda g, slot, r, kind, world, wire: asked.append((kind, wire)) or True
    m = sched.recvs(0)[0]
    side.mirror[(0, m.peer)].recv_ready(side.slot, m.nbytes)
    side.say(0, m.peer)
    assert asked == [("all_reduce", 943720)] and m.nbytes == 943720
    said = r"allreduce #5 .*observer says 1310720 elements .*segments of 873816 bytes.*segments of 943720"
    with pytest.raises(ProtocolError, match=said):
        side.engine.on_meta("0", side.slot, 1310720, 4)


def test_a_size_told_before_the_first_frame_installs_the_ring_at_that_frame():
    """9 MiB at W = 2: the wire cannot count its segments, but the call told its size (the
    engine's `request_meta` returns it, with the segment the frame carried): the schedule
    is installed at the first frame, no question goes out, and the record has the dtype."""
    world, total = 2, 9437184
    sched = RingAllreduce(RingGeometry.for_tensor(world, total, 4))
    side = RealSide(world, (0,), sched, make_slot(SlotPrefix.ALLREDUCE, 6))
    asked = []
    side.engine.request_meta = lambda g, slot, r, kind, world, wire: asked.append(wire) or (total // 4, 4, "Float")
    side.start()
    assert asked == [943720]
    side.pump()
    assert len(side.completed) == 1
    rec = side.completed[0]
    assert (rec.numel, rec.dtype) == (total // 4, "Float") and rec.geometry.endswith("(observer)")


@pytest.mark.parametrize("standing", [True, False])
def test_a_ring_sized_by_a_standing_answer_starts_natively_the_next_time(standing):
    """A DDP bucket's size is the controller's standing answer for its first frame (the one
    bucket whose ring fits it), so the next instance with that first frame gets the same
    answer: it starts in the core, as DDP's buckets must every step. A size one call's note
    told belongs to that call alone: the next instance asks again, in Python."""
    world, total = 2, 6299648  # the MLP example's second bucket: 8 segments the wire cannot count
    sched = RingAllreduce(RingGeometry.for_tensor(world, total, 4))
    side = RealSide(world, (0,), sched, make_slot(SlotPrefix.ALLREDUCE, 3))
    side.engine.native_start = True
    asked = []
    side.engine.request_meta = lambda g, slot, r, kind, world, wire: (
        asked.append(slot) or Told(total // 4, 4, "Float", standing)
    )
    side.start()
    side.pump()
    first = dict(side.got)
    for tag in (4, 5):
        again(side, tag)
    assert [r.native for r in side.completed] == [False, standing, standing]
    assert len(asked) == (1 if standing else 3)
    assert {(r.nbytes, r.numel, r.dtype, r.geometry) for r in side.completed} == {
        (total, total // 4, "Float", side.completed[0].geometry)
    }
    assert side.got == first and not side.engine.instances


def test_an_allreduce_ring_posts_its_receives_two_ahead_as_gloo_does():
    """gloo::allreduce's ring posts each receive two steps ahead. An emulated peer that posted
    them all at once made the real rank find every send's notice waiting and write it in place
    under its pair's lock, while its I/O loop spun on the peer's pending data (docs/
    benchmarks.md). The book keeps two posted per pair, the next as data fills one, and the
    ring still completes."""
    world, total = 2, 5 << 20  # six segments: the real rank sends six to the emulated peer
    sched = RingAllreduce(RingGeometry.for_tensor(world, total, 4))
    side = RealSide(world, (0,), sched, make_slot(SlotPrefix.ALLREDUCE, 4), meta=(total // 4, 4))
    side.start()
    first = [ev for conn, raw in side.out for ev in side.mirror[(conn.real, conn.emu)].receive(raw)]
    side.out.clear()
    assert sum(isinstance(ev, RecvReady) for ev in first) == 2 < len(sched.sends(0))
    for ev in first:  # the real side takes the two credits as pump would
        if isinstance(ev, RecvReady):
            side.credits[(0, 1)] = side.credits.get((0, 1), 0) + 1
    side.serve((0, 1))
    side.pump()
    assert len(side.completed) == 1


def test_an_unknown_collective_names_its_slot_prefix_and_group():
    unknown = max(SlotPrefix) + 1
    side = RealSide(4, (0,), DisseminationBarrier(4), make_slot(unknown, 2))
    with pytest.raises(ProtocolError, match=rf"slot prefix {unknown} \(unknown\) #2 on group '0'"):
        side.mirror[(0, 1)].recv_ready(side.slot, 8)
        side.say(0, 1)


def test_a_finished_instance_is_freed_at_once():
    """An instance holds the payloads it forwarded (a 64 MiB ring segment, say): it must go
    when it completes, by reference counting, not whenever the cyclic collector runs."""
    import gc
    import weakref

    world, total, elem = 8, 1 << 16, 4
    sched = RingAllreduce(RingGeometry.for_tensor(world, total, elem))
    side = RealSide(world, (0, 3), sched, make_slot(SlotPrefix.ALLREDUCE, 3), meta=(total // elem, elem))
    finished = []
    complete = side.engine.completed
    side.engine.completed = lambda inst: (finished.append(weakref.ref(inst)), complete(inst))
    gc.disable()
    try:
        side.start()
        side.pump()
        assert len(finished) == 1 and finished[0]() is None
    finally:
        gc.enable()


def again(side, tag, prefix=SlotPrefix.ALLREDUCE):
    """The same real side plays the next instance of its schedule, on a new slot (the
    driver's turn then adopts what the core started natively)."""
    side.slot = make_slot(prefix, tag)
    side.sends, side.got, side.credits = {}, {}, {}
    side.start()
    side.pump()
    side.engine.adopt_started()


@pytest.mark.parametrize("world,real", [(2, (0,)), (8, (0, 3)), (13, (1, 3))])
def test_a_shape_seen_before_loads_its_recorded_program(world, real):
    """DDP repeats its buckets: the second instance of a shape takes the program recorded
    for the first (one miss, then hits), and crosses the same messages with the same bytes."""
    total, elem = 10_000, 4
    sched = RingAllreduce(RingGeometry.for_tensor(world, total, elem))
    side = run(world, real, sched, SlotPrefix.ALLREDUCE, meta=(total // elem, elem))
    first = dict(side.got)
    again(side, 4)
    again(side, 5)
    programs = side.engine.programs
    assert (programs.misses, programs.hits) == (1, 2)
    assert [r.boundary_messages for r in side.completed] == [side.completed[0].boundary_messages] * 3
    assert side.got == first and not side.engine.instances
    other = RingAllreduce(RingGeometry.for_tensor(world, 2 * total, elem))  # another shape: recorded anew
    side.sched = other
    side.meta = (2 * total // elem, elem)
    again(side, 6)
    assert (programs.misses, programs.hits) == (2, 2) and len(side.completed) == 4


@pytest.mark.parametrize(
    "world,real,make,prefix",
    [
        (2, (0,), lambda w: RingAllreduce(RingGeometry.for_tensor(w, 1024, 4)), SlotPrefix.ALLREDUCE),
        (8, (0, 3), lambda w: RingAllreduce(RingGeometry.for_tensor(w, 10_000, 4)), SlotPrefix.ALLREDUCE),
        (13, (1, 3), lambda w: DisseminationBarrier(w), SlotPrefix.BARRIER),
        (8, (0, 5), lambda w: BinomialBroadcast(w, 0, 4096), SlotPrefix.BROADCAST),
        (2, (0,), lambda w: RingAllgather(w, 10), SlotPrefix.ALLGATHER),  # two notices settle it: one pair
    ],
)  # fmt: skip
def test_a_first_frame_seen_before_starts_its_book_natively(world, real, make, prefix):
    """An instance whose first frame alone settled its schedule leaves a starter: the next
    one with that first frame on that pair starts in the core, before any Python, and
    crosses the same messages with the same bytes; its instance, made at the driver's
    next turn, records it. Another first frame (another shape) starts in Python."""
    sched = make(world)
    side = RealSide(world, real, sched, make_slot(prefix, 3))
    side.engine.native_start = True
    side.start()
    side.pump()
    first = dict(side.got)
    assert [r.native for r in side.completed] == [False] and len(side.engine.starters) == 1
    for tag in (4, 5):
        again(side, tag, prefix)
    assert [r.native for r in side.completed] == [False, True, True]
    assert [r.tag for r in side.completed] == [3, 4, 5]
    assert {(r.boundary_messages, r.nbytes, r.geometry) for r in side.completed} == {
        (side.completed[0].boundary_messages, side.completed[0].nbytes, side.completed[0].geometry)
    }
    assert side.got == first and not side.engine.instances
    for rec in side.completed[1:]:  # its times are the book's: entered at its first frame, ended when done
        assert rec.start <= min(a for a, _ in rec.per_rank.values()) and rec.end >= rec.start
    side.engine.clear_starters()  # a pair closed, a what-if came: Python starts the next one
    again(side, 6, prefix)
    assert side.completed[-1].native is False and side.got == first


def test_held_first_frames_that_no_starter_completes_go_to_python_in_order():
    """An allgather's block takes two notices: the core holds the first while it may begin
    a starter's frames. When the second is another length (another block), both go to
    Python, in order, and the instance starts there and completes."""
    world = 2
    side = RealSide(world, (0,), RingAllgather(world, 10), make_slot(SlotPrefix.ALLGATHER, 3))
    side.engine.native_start = True
    side.start()
    side.pump()
    again(side, 4, SlotPrefix.ALLGATHER)
    assert [r.native for r in side.completed] == [False, True]
    side.sched = RingAllgather(world, 11)  # halves of 5 and 6: the same first notice, another second
    again(side, 5, SlotPrefix.ALLGATHER)
    assert [r.native for r in side.completed] == [False, True, False]
    assert side.completed[-1].nbytes == 22 and side.completed[-1].geometry == "block=11"
    assert not side.engine.instances and not side.engine.core.take_started()


def test_a_slot_python_has_a_frame_of_never_starts_natively():
    """The loop serves every ready pair before Python's turn: a broadcast root's notice on
    a pair with no starter goes to Python, and its notice on the starter's pair, read in the
    same batch, must not start a second book for that slot in the core (its routes would
    take the first pair's data, whose notice Python has). Python starts the instance, and
    it completes with the root's bytes."""
    world = 8
    sched = BinomialBroadcast(world, 0, 4096)
    side = RealSide(world, (0,), sched, make_slot(SlotPrefix.BROADCAST, 3))
    side.engine.native_start = True
    side.start()
    side.pump()
    first = dict(side.got)
    assert len(side.engine.starters) == 1  # on the pair of the root's first send
    side.slot = make_slot(SlotPrefix.BROADCAST, 4)
    side.sends, side.got, side.credits = {}, {}, {}
    starter, *others = sched.sends(0)
    batch = []
    for m in (*others, starter):  # the starter's pair read last in the batch
        key = (0, m.peer)
        side.sends.setdefault(key, deque()).append(m)
        side.mirror[key].send_ready(side.slot, m.nbytes)
        conn = side.conns[key]
        batch += [(conn, ev) for ev in conn.pair.receive(side.mirror[key].take())]
    assert len(batch) == len(sched.sends(0))  # every notice went to Python, the starter's too
    for conn, ev in batch:
        side.engine.on_event(conn, ev)
    side.pump()
    side.engine.adopt_started()
    assert [r.native for r in side.completed] == [False, False]
    assert side.got == first and not side.engine.instances
    again(side, 5, SlotPrefix.BROADCAST)  # the starter still starts the next one
    assert [r.native for r in side.completed] == [False, False, True] and side.got == first


def ring_played_once(world):
    """A 1 KiB ring allreduce (#3) played once by real rank 0, native starts on: its
    starter is in the core."""
    sched = RingAllreduce(RingGeometry.for_tensor(world, 1024, 4))
    side = RealSide(world, (0,), sched, make_slot(SlotPrefix.ALLREDUCE, 3))
    side.engine.native_start = True
    side.start()
    side.pump()
    return sched, side


def test_a_native_start_refuses_a_later_frame_its_shape_lacks():
    """A starter matches the first frame only; a frame the shape does not have later ends
    the run as the Python start's book would, naming the instance."""
    sched, side = ring_played_once(2)
    side.slot = make_slot(SlotPrefix.ALLREDUCE, 4)
    m = sched.sends(0)[0]
    side.mirror[(0, 1)].send_ready(side.slot, m.nbytes)  # the same first frame: started natively
    side.say(0, 1)
    side.mirror[(0, 1)].send_ready(side.slot, m.nbytes + 8)  # a second notice the ring does not send
    with pytest.raises(ProtocolError, match=r"allreduce #4 of group '0'"):
        side.say(0, 1)


def test_the_program_cache_keeps_the_most_recently_used_shapes():
    from neuronabox.controller.book import ProgramCache

    cache, recorded = ProgramCache(limit=2), []
    record = lambda key: lambda prog, idx: recorded.append(key)  # noqa: E731
    for key in ("a", "b", "a", "c", "b", "a"):
        cache.program(key, record(key))
    # a (miss) b (miss) a (hit) c (miss, evicts b) b (miss, evicts a) a (miss)
    assert recorded == ["a", "b", "c", "b", "a"] and (cache.hits, cache.misses) == (1, 5)


def test_a_deferred_record_waits_for_the_idle_turn_and_holds_the_gaps_open():
    """Under `defer_records` the record leaves the path of the next collective's frames: it
    is published on the driver's idle turn, and until then its real ranks' entries still
    hold back the trace's gaps (open_entries) as an instance in flight does."""
    from neuronabox.controller.engine import DEFERRED_RECORDS_MAX

    world, total, elem = 5, 4096, 4
    sched = RingAllreduce(RingGeometry.for_tensor(world, total, elem))
    side = RealSide(world, (0, 2), sched, make_slot(SlotPrefix.ALLREDUCE, 3), meta=(total // elem, elem))
    side.engine.defer_records = True
    side.start()
    side.pump()
    assert side.completed == [] and not side.engine.instances and len(side.engine.finished) == 1
    assert set(side.engine.open_entries()) == {0, 2}
    assert side.engine.publish_next() is False
    assert len(side.completed) == 1 and side.engine.open_entries() == {}
    for tag in range(4, 5 + DEFERRED_RECORDS_MAX):  # no idle turn ever came: they go out at once
        again(side, tag)
    assert len(side.completed) + len(side.engine.finished) == 2 + DEFERRED_RECORDS_MAX
    assert len(side.engine.finished) <= DEFERRED_RECORDS_MAX


def test_a_finished_book_lets_go_of_the_bytes_that_crossed():
    """A finished instance's record may wait for the loop's idle turn, and a book started
    natively for Python's adoption, up to 64 of each: a book lets go of the real sends'
    bytes as it completes, so what waits holds its times only (64 waiting 4 MiB
    allreduces once held 256 MiB, and every new instance faulted in fresh pages)."""
    world, total, elem = 2, 1 << 20, 4
    sched = RingAllreduce(RingGeometry.for_tensor(world, total, elem))
    side = RealSide(world, (0,), sched, make_slot(SlotPrefix.ALLREDUCE, 3), meta=(total // elem, elem))
    side.engine.defer_records = True
    held, finished = [], []
    say, completed = side.say, side.engine.completed
    side.say = lambda r, peer: (say(r, peer), held.extend(i.book.held for i in side.engine.instances.values()))
    side.engine.completed = lambda inst: (finished.append(inst), completed(inst))
    side.start()
    side.pump()
    assert len(finished) == 1 and len(side.engine.finished) == 1  # done, its record waiting
    assert max(held) > 0  # in flight, it held what the emulated rank sends back
    assert finished[0].book.held == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.dictionaries(st.integers(0, 3), st.floats(0, 100), max_size=4)), max_size=60))
def test_the_waiting_records_earliest_entries_are_the_minimum_over_the_queue(ops):
    """WaitingRecords answers each rank's earliest entry from its sliding-window minimum:
    the same as the minimum over every record still waiting (None in `ops`: a pop)."""
    from neuronabox.controller.waiting import WaitingRecords

    queue: WaitingRecords[int] = WaitingRecords()
    held: deque[tuple[int, dict[int, float]]] = deque()
    for i, op in enumerate(ops):
        if op is None and held:
            first, _ = held.popleft()
            assert queue.pop() == (first, float(first))
        elif op is not None:
            queue.push(i, float(i), op)
            held.append((i, op))
        expect: dict[int, float] = {}
        for _, entries in held:
            for r, x in entries.items():
                expect[r] = min(expect.get(r, x), x)
        assert queue.earliest() == expect and len(queue) == len(held)


def test_the_frames_of_one_poll_carry_its_time():
    """The loop stamps every frame of one epoll answer with the time it came back: all of
    them were in by then. Here the real rank's first frame of allreduce #5 (on the pair
    to its predecessor) is ready before its last data frame of #4 (on the pair to its
    successor), and #5 starts natively when served first. Stamped as served, #4 would end
    after #5 began, an overlap the rank never had, which `simulate` reads as a collective
    entered without waiting. Real sockets, the native core and pairs."""
    sched, side = ring_played_once(3)
    assert len(side.engine.starters) == 1
    last, held = sched.sends(0)[-1], {}
    side.slot = make_slot(SlotPrefix.ALLREDUCE, 4)
    side.sends, side.got, side.credits = {}, {}, {}
    side.serve = lambda key: serve_holding(side, key, last, held)
    side.start()
    side.pump()
    side.engine.adopt_started()
    assert len(held) == 1 and len(side.completed) == 1  # #4 waits for its last frame
    first = sched.recvs(0)[0]
    assert first.peer != last.peer
    pairs = {}
    for key in ((0, first.peer), (0, last.peer)):
        mine, theirs = socket.socketpair()
        side.engine.core.watch(mine.fileno(), side.conns[key], f"rank 0 <-> emulated {key[1]}")
        pairs[key] = (mine, theirs)
    try:
        side.mirror[(0, first.peer)].recv_ready(make_slot(SlotPrefix.ALLREDUCE, 5), first.nbytes)
        pairs[(0, first.peer)][1].sendall(side.mirror[(0, first.peer)].take())  # ready first
        pairs[(0, last.peer)][1].sendall(held[(0, last.peer)])
        side.engine.core.wait(time.monotonic() + 30, False, 0.0)  # back once #5's book waits to be adopted
        side.engine.adopt_started()
        assert len(side.completed) == 2 and side.completed[-1].native and len(side.engine.instances) == 1
        ended, began = side.completed[-1].per_rank[0][1], side.engine.open_entries()[0]
        assert ended == began  # one poll's answer, one time
    finally:
        for mine, theirs in pairs.values():
            side.engine.core.unwatch(mine.fileno())
            mine.close()
            theirs.close()


def serve_holding(side, key, last, held):
    """RealSide.serve, but the data of `last` is written to the mirror and kept in `held`
    rather than said to the engine."""
    while side.credits.get(key) and side.sends.get(key):
        side.credits[key] -= 1
        m = side.sends[key].popleft()
        side.mirror[key].data(side.slot, side.payload(key[0], m.step, m.nbytes))
        if (key[1], m.step) == (last.peer, last.step):
            held[key] = side.mirror[key].take()
        else:
            side.say(*key)
