"""A ring's whole program at once is its step-by-step definition.

A new shape's set-up asks a large ring for every message and every emulated send's
origin at once (`_segs`, `seg_lens`, `upstream`); the live engine and the
simulation both load programs that way. Each bulk form must equal the per-step one
(`_seg`, `seg_len`, `origin`) it stands for, for any geometry and real ranks."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from neuronabox.controller.book import load_program

from neuronabox.schedules.gloo import Msg, RealRanks, RingAllreduce, RingGeometry
from neuronabox.schedules.gloo_reduce import RingReduce, reduce_geometry


@st.composite
def rings(draw):
    world = draw(st.integers(1, 48))
    elem = draw(st.sampled_from([1, 2, 4, 8]))
    total = draw(st.integers(0, 400_000))
    geo = RingGeometry.for_tensor(world, total, elem, max_segment=draw(st.sampled_from([64, 4096, 1 << 20])))
    if draw(st.booleans()):  # the last segment's length read off the wire
        geo = RingGeometry(geo.world, geo.total, geo.num_segments, geo.segment_bytes, last_known=False)
    reduce = draw(st.booleans())
    sched = RingReduce(reduce_geometry(world, max(total, elem), elem)) if reduce else RingAllreduce(geo)
    real = draw(st.sets(st.integers(0, world - 1), min_size=1, max_size=min(world, 4)))
    return sched, RealRanks(sorted(real), world)


@settings(max_examples=150, deadline=None)
@given(rings())
def test_the_bulk_ring_program_is_the_step_by_step_one(case):
    sched, real = case
    geo, w = sched.geo, sched.world
    for rank in {0, w - 1, real.sorted[0]}:
        for recv in (False, True):
            segs = [sched._seg(rank, t, recv) for t in range(sched.ring_steps)]
            assert sched._segs(rank, recv) == segs
            # gloo::allreduce's segment lengths: whole segments, then the rest, then none;
            # the last one -1 when only the wire tells it.
            unknown = -1 if geo.last_known else geo.num_segments - 1
            want_lens = [-1 if s == unknown else max(0, min(geo.segment_bytes, geo.total - s * geo.segment_bytes))
                         for s in segs]  # fmt: skip
            assert geo.seg_lens(segs) == want_lens == [geo.seg_len(s) for s in segs]
            peer = (rank + 1) % w if recv else (rank - 1) % w
            want = [Msg(peer, t, n) for t, n in enumerate(want_lens) if n != 0]
            got = sched._msgs(rank, recv)
            assert list(got) == want


@settings(max_examples=150, deadline=None)
@given(rings())
def test_upstream_is_origin_for_every_emulated_send(case):
    sched, real = case
    if isinstance(sched, RingReduce):
        assert sched.upstream is None  # its gather's origins are not one upstream rank's: origin() alone
        return
    for rank in range(sched.world):
        if rank in real:
            continue
        steps = [m.step for m in sched.sends(rank)]
        x, data, wait = sched.upstream(rank, steps, real)
        for k, step in enumerate(steps):
            deps, content = sched.origin(rank, step, real)
            bulk_content = (x, data[k]) if data[k] >= 0 else None
            bulk_deps = ([bulk_content] if bulk_content else []) + ([(x, wait[k])] if wait[k] >= 0 else [])
            assert (bulk_deps, bulk_content) == (deps, content), (rank, step)


def test_a_bulk_loaded_program_is_the_one_loaded_message_by_message():
    """The same ring into a recorded Program (a pair's messages at once) and into one
    fed a message at a time (a Book's calls, recorded): the same messages, each with
    the same dependencies and content, in the same order per pair."""
    from neuronabox.controller import _native

    sched = RingAllreduce(RingGeometry.for_tensor(64, 4 * 100_000, 4))
    real = RealRanks([3, 40], 64)
    one: list[tuple] = []

    class OneByOne:  # a Book's interface, as load_program calls it for a live book
        n = 0

        def add_pair(self, r, e):
            self.n += 1
            return self.n - 1

        def expect_send(self, i, step, nbytes, limit, post_len):
            one.append(("send", i, step, nbytes, limit, post_len, [], []))

        def expect_recv(self, i, step, nbytes, limit, deps, content):
            one.append(("recv", i, step, nbytes, limit, -1, [tuple(d) for d in deps], [tuple(c) for c in content]))

    load_program(OneByOne(), sched, real, {}, sched.sends, sched.recvs)
    program = _native.Program()
    load_program(program, sched, real, {}, sched.sends, sched.recvs)

    def per_pair(rows):
        out: dict[tuple[str, int], list] = {}
        for row in rows:
            out.setdefault((row[0], row[1]), []).append(row[2:])
        return out

    assert per_pair(program.ops()) == per_pair(one)
    assert program.messages == len(one) > 0


def test_a_program_a_book_reads_takes_no_more():
    """A book reads its program's messages in place: once loaded, the program is complete."""
    from neuronabox.controller import _native

    program = _native.Program()
    i = program.add_pair(0, 1)
    program.expect_send(i, 0, 8, 8, 8)
    book = _native.Book(_native.Core(done=lambda owner: None, emit=lambda conn: None), object(), "t", 1, None)
    book.load(program)
    with pytest.raises(RuntimeError, match="loaded into a book"):
        program.expect_send(i, 1, 8, 8, 8)
    other = _native.Program()
    j = other.add_pair(0, 1)
    with pytest.raises(ValueError, match="only the wire tells"):
        other.expect_sends(j, [Msg(1, 0, -1)])  # a length the wire tells goes message by message
