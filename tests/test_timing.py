"""The release-time fast path against the full-DAG reference, and the model's shape."""

from __future__ import annotations

import random

import pytest
from neuronabox.controller.release import ReleaseTiming
from neuronabox.delay_models import load as load_model
from neuronabox.delay_models.whatif import WhatIf, WhatIfError, parse
from neuronabox.topology import HostWork, LinkClass, Topology
from neuronabox.topology import load as load_topology

from neuronabox.schedules.gloo import (
    BinomialBroadcast,
    DisseminationBarrier,
    RealRanks,
    RingAllgather,
    RingAllreduce,
    RingGeometry,
)
from neuronabox.schedules.gloo_pairwise import PairwiseAlltoall, RootedPairwise
from neuronabox.schedules.gloo_reduce import RingReduce, reduce_geometry
from neuronabox.schedules.timing import Entry, reference_arrivals, timeline_for

KINDS = ["allreduce", "reduce", "allgather", "broadcast", "barrier"]  # the kinds `reference_arrivals` evaluates


def random_case(rng: random.Random, kind: str):
    """A random instance: (schedule, hop, entry, real ranks, real boundary sends, work per
    edge), the work none in some cases and up to a few hops' worth in others."""
    w = rng.randint(2, 24)
    real = RealRanks(rng.sample(range(w), rng.randint(1, min(3, w - 1))), w)
    nbytes = rng.choice([4, 40, 4000, 3 << 20]) * rng.randint(1, 9)
    if kind == "allreduce":
        sched = RingAllreduce(RingGeometry.for_tensor(w, nbytes, 4))
    elif kind == "reduce":
        sched = RingReduce(reduce_geometry(w, nbytes, 4), root=rng.randrange(w))
    elif kind == "allgather":
        sched = RingAllgather(w, rng.randint(1, 5000))
    elif kind == "broadcast":
        sched = BinomialBroadcast(w, rng.randrange(w), rng.randint(0, 1 << 20))
    else:
        sched = DisseminationBarrier(w)
    emulated = [e for e in range(w) if e not in real]
    skew = {q: rng.uniform(0, 3e-3) for q in rng.sample(emulated, min(len(emulated), rng.randint(0, 2)))}
    hop = LinkClass("hop", rng.uniform(1e8, 1e10), rng.uniform(1e-6, 1e-3))
    # --skew: in some cases every emulated rank draws an entry delay (stragglers too)
    draws = tuple(rng.uniform(0, 2e-3) for _ in range(rng.randint(1, 9))) if rng.random() < 0.5 else ()
    hold = rng.random() < 0.3  # latency=+X,per=collective: no real send counts before t0
    t0 = rng.uniform(0, 1)
    entry = Entry(t0, skew, draws, rng.choice([0.0, rng.uniform(0, 1e-3)]), rng.getrandbits(64), hold)
    # Real ranks' boundary sends: in step order, at random rising times (they may be
    # early or late against the model: the two evaluators must agree on any input).
    sends = []
    for x in real.sorted:
        t = entry.t0 - (rng.uniform(0, 3e-3) if hold else 0.0)  # held: the real rank entered before t0
        for m in sched.sends(x):
            if m.peer not in real:
                t += rng.uniform(0, 2e-3)
                sends.append((x, m.step, t))
    work = rng.choice([0.0, rng.uniform(0, 1e-5), rng.uniform(0, 1e-3)])
    return sched, hop, entry, real, sends, work


def fast_arrivals(sched, hop, entry, real, sends, modeled, work, release=False):
    """The fast path's arrivals (or releases) at the reference's (emu, step) pairs."""
    fast = timeline_for(sched, hop, entry, real, modeled, work)
    for x, step, t in sends:
        fast.real_sent(x, step, t)
    keys = sorted(reference_arrivals(sched, hop, entry, real, sends, modeled, work))
    return {k: (fast.release if release else fast.arrival)(*k) for k in keys}


@pytest.mark.parametrize("kind", KINDS)
def test_fast_path_equals_reference(kind):
    rng = random.Random(kind)
    for i in range(60):
        sched, hop, entry, real, sends, work = random_case(rng, kind)
        modeled = i % 2 == 0 if i < 8 else rng.random() < 0.7  # both boundary modes, with and without work
        ref = reference_arrivals(sched, hop, entry, real, sends, modeled, work)
        fast = fast_arrivals(sched, hop, entry, real, sends, modeled, work)
        for (emu, step), want in sorted(ref.items()):
            where = (kind, sched.world, real.sorted, emu, step, work)
            assert fast[(emu, step)] == pytest.approx(want, abs=1e-12), where


@pytest.mark.parametrize("kind", KINDS)
def test_a_collective_latency_holds_the_real_ranks_first_sends_until_it_starts(kind):
    """`latency=+X,per=collective` starts the collective X later for every rank: the
    emulated ranks enter X later (t0), and what a real rank sent on entering, before any
    emulated message reached it, counts from t0, as if it too had entered X later; its
    sends after t0 (after a receive, which was late already) count as they came. An entry
    delay alone let the real rank's first sends in early, so its software left the path
    and a +0.5 ms what-if read +0.3 ms on the real rank (docs/guide.md, "Timing")."""
    rng, differs = random.Random(f"hold-{kind}"), 0
    for i in range(40):
        sched, hop, entry, real, sends, work = random_case(rng, kind)
        x = rng.uniform(1e-4, 5e-3)
        held = Entry(entry.t0 + x, entry.skew, entry.draws, entry.shift, entry.seed, hold_real=True)
        free = Entry(entry.t0 + x, entry.skew, entry.draws, entry.shift, entry.seed)
        late = [(r, step, max(t, held.t0)) for r, step, t in sends]  # every early send made at the start
        modeled = i % 2 == 0
        got = fast_arrivals(sched, hop, held, real, sends, modeled, work, release=True)
        assert got == fast_arrivals(sched, hop, free, real, late, modeled, work, release=True)
        differs += got != fast_arrivals(sched, hop, free, real, sends, modeled, work, release=True)
    assert differs or kind == "barrier", kind  # the hold matters (a barrier's early sends wait for the entries anyway)


@pytest.mark.parametrize("kind", ["allreduce", "allgather", "broadcast", "barrier"])
def test_a_native_timeline_moved_to_another_entry_is_the_one_made_there(kind):
    """A native start prices its book with the template's timeline moved to its own entry
    (`at(t0)`, controller/starts.py): the releases must be those of a timeline made at that
    entry, whatever the earlier instance's real sends did to the template's own state."""
    rng = random.Random(f"at-{kind}")
    for i in range(40):
        sched, hop, entry, real, sends, work = random_case(rng, kind)
        entry = Entry(entry.t0, entry.skew, hold_real=entry.hold_real)  # a native start has no draws of its own
        modeled = i % 2 == 0
        template = timeline_for(sched, hop, entry, real, modeled, work)
        for x, step, t in sends:  # the template's own instance ran
            template.real_sent(x, step, t)
        later = rng.uniform(1, 5)
        moved_entry = Entry(entry.t0 + later, entry.skew, hold_real=entry.hold_real)
        moved_sends = [(x, step, t + later) for x, step, t in sends]
        want = fast_arrivals(sched, hop, moved_entry, real, moved_sends, modeled, work, release=True)
        moved = template.at(entry.t0 + later)
        for x, step, t in moved_sends:
            moved.real_sent(x, step, t)
        for key, t in want.items():
            assert moved.release(*key) == pytest.approx(t, abs=1e-12), (kind, i, key)


@pytest.mark.parametrize("world", [64, 1000, 4096])
def test_under_drawn_skew_a_barrier_waits_for_every_rank_and_a_broadcast_for_its_path(world):
    """Drawn skew reaches trees and barriers too: the real rank leaves a dissemination
    barrier no earlier than every emulated rank's drawn entry, at any world (its last
    round's window holds half the ring); a broadcast's message waits for its sender's
    entry and its ancestors', no others. The fast path is held to the full-DAG reference
    above (W <= 24); here the worlds are large and the rule is checked directly."""
    hop = LinkClass("hop", 1e10, 2e-6)
    draws = tuple(i * 1e-4 for i in range(1, 33))  # 0.1 .. 3.2 ms
    for seed in range(3):
        real = RealRanks([seed * 7 % world], world)
        entry = Entry(1.0, {}, draws, 0.0, seed)
        emulated = [e for e in range(world) if e not in real]
        latest = max(entry.of(e) for e in emulated)
        barrier = timeline_for(DisseminationBarrier(world), hop, entry, real)
        x = real.sorted[0]
        rounds = (world - 1).bit_length()
        for r in range(rounds):
            barrier.real_sent(x, r, 1.0)
        last = max(barrier.release((x - (1 << r)) % world, r) for r in range(rounds))
        assert latest <= last <= latest + rounds * hop.latency + 1e-12, (world, seed)
        root = (x + 1) % world
        tree = BinomialBroadcast(world, root, 4096)
        bcast = timeline_for(tree, hop, entry, real)
        parent, bit = tree.parent(x)
        path, r = [], parent
        while r is not None:
            path.append(r)
            up = tree.parent(r)
            r = up[0] if up else None
        assert bcast.release(parent, bit) >= max(entry.of(r) for r in path)
        assert bcast.release(parent, bit) < latest or max(entry.of(r) for r in path) == latest


@pytest.mark.parametrize("kind", KINDS)
def test_work_delays_releases(kind):
    """No work is the model as it was (the default); more work never releases a message
    earlier, in either boundary mode."""
    rng = random.Random(f"work-{kind}")
    moved = 0
    for _ in range(30):
        sched, hop, entry, real, sends, _ = random_case(rng, kind)
        for modeled in (True, False):
            base = fast_arrivals(sched, hop, entry, real, sends, modeled, 0.0, release=True)
            default = timeline_for(sched, hop, entry, real, modeled)
            for x, step, t in sends:
                default.real_sent(x, step, t)
            assert base == {k: default.release(*k) for k in base}
            small = fast_arrivals(sched, hop, entry, real, sends, modeled, 1e-5, release=True)
            large = fast_arrivals(sched, hop, entry, real, sends, modeled, 1e-3, release=True)
            for k in base:
                assert base[k] <= small[k] <= large[k], (kind, modeled, k)
            moved += sum(large[k] > base[k] for k in base)
    assert moved > 30  # the work shows


def test_release_keeps_work_at_a_real_boundary():
    """A real boundary takes the link's cost off the release, never the sender's work:
    an emulated rank that forwards a real rank's message still works on it first."""
    w, hop, work = 4, LinkClass("hop", 1e9, 10e-6), 50e-6
    cases = [  # (schedule, real ranks, emulated rank 1's send to a real rank that forwards real rank 0's)
        (RingAllgather(w, 1000), [0, 2], 2),  # step 0 from rank 0, forwarded at step 2
        (BinomialBroadcast(w, 0, 1000), [0, 3], 1),  # the root's bit 0, forwarded at bit 1
        (DisseminationBarrier(w), [0, 3], 1),  # round 1 waits for rank 0's round 0
    ]
    for sched, real, step in cases:
        name = type(sched).__name__
        tl = {}
        for modeled in (True, False):
            tl[modeled] = timeline_for(sched, hop, Entry(0.0), RealRanks(real, w), modeled, work)
            tl[modeled].real_sent(0, 0, 1.0)  # long after every entry: the real rank's message decides
        link = tl[True].boundary_cost(1, step)
        assert tl[False].boundary_cost(1, step) == link  # the link's cost only
        assert tl[False].release(1, step) == pytest.approx(1.0 + work), name  # at rank 1 at 1.0: work, then send
        assert tl[True].release(1, step) == pytest.approx(1.0 + link + work + link), name  # a modeled hop each way
    lag = timeline_for(PairwiseAlltoall(w, 1000), hop, Entry(0.0), RealRanks([0], w), False, work)
    assert lag.release(1, 3) == pytest.approx(work + 3 * 1000 / hop.bandwidth)


def test_edge_work_follows_the_lockstep_rule():
    """A ring's edge spans a pace (two steps in flight): two messages, and the reduction of
    two received segments where the ring reduces (half an allreduce's steps, every
    reduce step, no allgather step); a tree, a barrier or a pairwise message: one message."""
    work = HostWork(message=8e-6, reduce_bandwidth=2e9)
    geo = RingGeometry.for_tensor(8, 64 << 20, 4)
    seg = geo.segment_bytes / 2e9
    assert RingAllreduce(geo).edge_work(work) == pytest.approx(2 * (8e-6 + seg / 2))
    rgeo = reduce_geometry(8, 64 << 20, 4)
    assert RingReduce(rgeo).edge_work(work) == pytest.approx(2 * (8e-6 + rgeo.segment_bytes / 2e9))
    assert RingAllgather(8, 1 << 20).edge_work(work) == pytest.approx(2 * 8e-6)
    assert BinomialBroadcast(8, 0, 1 << 20).edge_work(work) == pytest.approx(8e-6)
    assert DisseminationBarrier(8).edge_work(work) == pytest.approx(8e-6)
    assert PairwiseAlltoall(8, 1 << 20).edge_work(work) == pytest.approx(8e-6)
    assert RootedPairwise("gather", 8, 0, 1 << 20).edge_work(work) == pytest.approx(8e-6)
    assert RingAllreduce(geo).edge_work(HostWork()) == 0.0
    assert RingReduce(RingGeometry(1, 8, 2, 4)).edge_work(work) == pytest.approx(2 * 8e-6)  # no ring steps


def test_release_timing_charges_the_models_local_work():
    """ReleaseTiming prices each instance's edges with the model's `local_work` (the
    topology's); a model that does not say charges none, and zero stays inactive."""
    work = HostWork(8e-6, 3.2e9)
    base = load_topology("ib-100g")
    model = load_model("alpha-beta", Topology(base.name, 8, 1, base.intra, base.inter, work=work))
    sched = RingAllreduce(RingGeometry.for_tensor(8, 4 << 20, 4))
    timing = ReleaseTiming(model)
    tl = timing.timeline("allreduce", 4 << 20, sched, RealRanks([0], 8), 0.0)
    assert tl.work == sched.edge_work(work) > 0
    hop = timing.hop("allreduce", 4 << 20, 8, sched)
    assert timing.predicted("allreduce", 4 << 20, sched, 0) == pytest.approx(
        sched.rank_time(hop, 0, sched.edge_work(work))
    )
    assert timing.predicted("allreduce", 4 << 20, sched, 0) > sched.rank_time(hop, 0)

    class Plugin:  # a third-party model without `local_work`
        name = "plugin"

        def hop(self, kind, nbytes, world, schedule):
            return LinkClass("hop", 1e9, 1e-6)

    assert ReleaseTiming(Plugin()).timeline("allreduce", 4 << 20, sched, RealRanks([0], 8), 0.0).work == 0.0
    zero = ReleaseTiming(load_model("zero", base))
    assert not zero.active and zero.work == HostWork()


def test_release_timing_holds_the_real_ranks_under_a_collective_latency():
    """ReleaseTiming gives an instance under `latency=+X,per=collective` the entry that
    starts X later and holds the real ranks' first sends until then (Entry.hold_real);
    another what-if (per message) holds nothing."""
    sched, real = RingAllreduce(RingGeometry.for_tensor(8, 1 << 20, 4)), RealRanks([0], 8)
    model = load_model("alpha-beta", load_topology("ib-100g").with_nodes(8, 1))
    sends = [(0, step, 0.0) for step in range(len(sched.sends(0)))]  # the real rank sent at once on entering

    for spec, held in (("latency=+1ms,per=collective", True), ("latency=+1ms", False)):
        timing = ReleaseTiming(model, WhatIf.from_specs([spec]))
        tl = timing.timeline("allreduce", 1 << 20, sched, real, 0.0)
        hop = timing.hop("allreduce", 1 << 20, 8, sched)
        later = timing.whatif.entry_delay("allreduce")
        want = fast_arrivals(sched, hop, Entry(later, hold_real=held), real, sends, True, tl.work, release=True)
        free = fast_arrivals(sched, hop, Entry(later), real, sends, True, tl.work, release=True)
        for x, step, at in sends:
            tl.real_sent(x, step, at)
        got = {k: tl.release(*k) for k in want}
        assert got == pytest.approx(want), spec
        assert (got != pytest.approx(free)) == held, spec  # the hold moved releases, and only under the latency


@pytest.mark.parametrize("kind", ["broadcast", "barrier", "gather", "scatter", "alltoall"])
def test_rank_time_is_the_timeline_with_a_punctual_real_rank(kind):
    """`rank_time` and `free_time` with work are the timelines' arrivals at each rank when
    the one real rank is punctual (it sends as soon as an emulated rank would: a
    broadcast's leaf, which sends nothing; a barrier rank that works as emulated ones
    do; a pairwise rank, whose message depends on nothing, priced as emulated)."""
    hop, work = LinkClass("hop", 1e9, 20e-6), 7e-6
    for w in (2, 3, 8, 13):
        x = 0
        if kind == "broadcast":
            sched, x = BinomialBroadcast(w, w // 2, 5000), (w // 2 - 1) % w  # vrank W-1: a leaf
        elif kind == "barrier":
            sched = DisseminationBarrier(w)
        elif kind == "alltoall":
            sched = PairwiseAlltoall(w, 5000)
        else:
            sched = RootedPairwise(kind, w, w - 1, 5000)
        tl = timeline_for(sched, hop, Entry(0.0), RealRanks([x], w), True, work)
        sent_x, ready = {}, 0.0
        for m in sched.sends(x) if kind == "barrier" else ():  # round k waits for round k-1's receive
            sent_x[m.step] = ready + hop.latency
            tl.real_sent(x, m.step, ready)
            ready = max(ready, tl.arrival((x - (1 << m.step)) % w, m.step) + work)
        arrivals: dict[int, float] = {}
        for r in range(w):
            for m in sched.sends(r):
                t = sent_x[m.step] if m.step in sent_x and r == x else tl.arrival(r, m.step)
                arrivals[m.peer] = max(arrivals.get(m.peer, 0.0), t)
        for r in arrivals:
            assert arrivals[r] == pytest.approx(sched.rank_time(hop, r, work), rel=1e-12), (kind, w, r)
        assert max(arrivals.values()) == pytest.approx(sched.free_time(hop, work), rel=1e-12), (kind, w)


@pytest.mark.parametrize("work", [0.0, 30e-6])
@pytest.mark.parametrize("kind", ["allreduce", "allgather"])
def test_ring_rank_time_is_the_timeline_with_a_punctual_real_rank(kind, work):
    """A real rank that runs Gloo's program at once (a step's send leaves when the
    receives up to two steps back are in and worked on, as an emulated rank's would)
    ends when `rank_time` says: its last receive in, or its last send gone, small
    tensors in large worlds included, whose last segments are empty; the last step's
    arrival is `free_time`."""
    rng = random.Random(7)
    hop = LinkClass("hop", 1e9, 20e-6)
    checked = 0
    for w in (2, 5, 16, 33, 100):
        if kind == "allreduce":
            sched = RingAllreduce(RingGeometry.for_tensor(w, rng.choice([8, 400, 4096, 5 << 20]), 4))
        else:
            sched = RingAllgather(w, rng.choice([2, 4096]))
        r = rng.randrange(w)
        tl = timeline_for(sched, hop, Entry(0.0), RealRanks([r], w), work=work)
        sends = {m.step for m in sched.sends(r)}
        recvs = {m.step: m.peer for m in sched.recvs(r)}
        arrived: dict[int, float] = {}
        left = 0.0  # its last send's
        for t in range(max(sends | set(recvs)) + 1):
            if t in sends:
                left = max([0.0] + [a + work for s, a in arrived.items() if s <= t - 2])
                tl.real_sent(r, t, left)
            if t in recvs:
                arrived[t] = tl.arrival(recvs[t], t)
        assert max(*arrived.values(), left) == pytest.approx(sched.rank_time(hop, r, work), rel=1e-9), (w, r)
        final = sched.ring_steps - 1 if kind == "allreduce" else 2 * (w - 1) - 1
        if final in arrived:  # the ring's last step is not empty
            assert arrived[final] == pytest.approx(sched.free_time(hop, work), rel=1e-9), (w, r)
            checked += 1
    assert checked


def test_whatif_specs():
    w = WhatIf.from_specs(
        ["latency=+2ms,per=collective,op=allreduce", "latency=1us", "bandwidth=x0.5", "straggler=rank:5,delay=3ms"]
    )
    assert w.entry_delay("allreduce") == pytest.approx(2e-3) and w.entry_delay("broadcast") == 0
    hop = w.hop("broadcast", LinkClass("l", 1e9, 1e-6))
    assert (hop.bandwidth, hop.latency) == (pytest.approx(5e8), pytest.approx(2e-6))
    assert w.stragglers("barrier") == {5: pytest.approx(3e-3)}
    assert parse("latency=0").value == 0 and parse("bandwidth=0.25").value == 0.25
    for kind in ("reduce", "gather", "scatter", "alltoall", "send", "recv"):  # every kind the engine records
        assert WhatIf.from_specs([f"latency=+1ms,per=collective,op={kind}"]).entry_delay(kind) == pytest.approx(1e-3)
    jitter = WhatIf.from_specs(["jitter=200us,seed=1"])
    draws = [jitter.jitter("allreduce") for _ in range(100)]
    assert all(0 <= d <= 200e-6 for d in draws) and len(set(draws)) > 90
    assert WhatIf.from_specs(["jitter=200us,seed=1"]).jitter("allreduce") == draws[0]  # the seed repeats it
    for bad, why in [
        ("latency=+3", "latency"),
        ("bandwidth=x0", "positive factor"),
        ("latency=1ms,per=step", "per is hop or collective"),
        ("straggler=rank:5", "needs delay"),
        ("loss=1%", "unknown modifier"),
        ("latency=1ms,op=all_to_all", "op must be one of"),
        ("bandwidth=x1e-300", "between x1e-06 and x1e\\+06"),  # the model's times would overflow
        ("bandwidth=x1e7", "between"),
        ("latency=+100000s", "at most 86400 s"),
        ("straggler=rank:1,delay=2d", "delay"),
    ]:
        with pytest.raises(WhatIfError, match=why):
            parse(bad)


def test_a_whatif_that_reaches_the_runs_timeout_is_refused():
    """In a live run a real rank would wait past the watchdog's limit, which would then
    blame it for a stall the emulator made; the simulation (no timeout) takes it."""
    for spec in ("latency=+30s", "latency=+30s,per=collective", "jitter=31s", "straggler=rank:1,delay=40s"):
        with pytest.raises(WhatIfError, match="not less than the run's --timeout \\(30 s\\)"):
            WhatIf.from_specs([spec]).check(4, [0], timeout_s=30)
        WhatIf.from_specs([spec]).check(4, [0])
    WhatIf.from_specs(["latency=+29s", "bandwidth=x1e-6"]).check(4, [0], timeout_s=30)


def test_a_modeled_time_past_the_timeout_is_an_error_not_a_stall():
    """Modifiers each below the timeout can add up past it: the instance is refused when
    it is priced, naming the model and the modifiers, instead of held for good."""
    from neuronabox.controller.release import BeyondTimeout

    topo = load_topology("cpu-25gbe").with_nodes(4, 1)
    timing = ReleaseTiming(load_model("alpha-beta", topo), WhatIf.from_specs(["latency=+1s"] * 2), limit_s=5)
    sched = RingAllreduce(RingGeometry.for_tensor(4, 4 << 20, 4))
    t = timing.predicted("allreduce", 4 << 20, sched, 0)
    assert t > 5
    with pytest.raises(BeyondTimeout, match="not less than --timeout \\(5 s\\).*latency=\\+1s, latency=\\+1s"):
        timing.within_limit("allreduce #0", t)
    assert ReleaseTiming(load_model("alpha-beta", topo)).within_limit("allreduce #0", 1e6) == 1e6


def test_the_native_ring_timeline_refuses_what_is_not_a_ring():
    from neuronabox.schedules._timing import RingTimeline

    for real in ([], [3, 1], [0, 8]):
        with pytest.raises(ValueError, match="real rank"):
            RingTimeline(8, real, True, 0.0, 1e-5, 0.0, True, {})
    tl = RingTimeline(8, [0], True, 1.0, 1e-5, 2e-6, False, {})
    assert (tl.world, tl.t0, tl.pace, tl.work, tl.modeled) == (8, 1.0, 1e-5, 2e-6, False)


def test_the_native_tree_and_barrier_timelines_refuse_bad_input():
    from neuronabox.schedules._timing import BarrierTimeline, TreeTimeline

    for real in ([], [3, 1], [0, 8]):
        with pytest.raises(ValueError, match="real rank"):
            TreeTimeline(8, 0, real, 0.0, 1e-5, 1e-6, 0.0, True, {})
        with pytest.raises(ValueError, match="real rank"):
            BarrierTimeline(8, real, 0.0, 1e-5, 0.0, True, {})
    with pytest.raises(ValueError, match="root 8"):
        TreeTimeline(8, 8, [0], 0.0, 1e-5, 1e-6, 0.0, True, {})
    with pytest.raises(TypeError):
        BarrierTimeline(8, [0], 0.0, 1e-5, 0.0, True, [])  # stragglers: a dict
    tl = BarrierTimeline(8, [0], 0.0, 1e-5, 0.0, True, {})
    with pytest.raises(TypeError):
        tl.arrival(1)
    assert tl.arrival(1, 0) == pytest.approx(1e-5)  # round 0 of a punctual emulated rank: one hop
