"""The release-time fast path against the full-DAG reference, and the model's shape."""

from __future__ import annotations

import random

import pytest
from neuronabox.topology import LinkClass

from neuronabox.schedules.gloo import (
    BinomialBroadcast,
    DisseminationBarrier,
    RealRanks,
    RingAllgather,
    RingAllreduce,
    RingGeometry,
)
from neuronabox.schedules.timing import Entry, reference_arrivals, timeline_for
from neuronabox.whatif import WhatIf, WhatIfError, parse


def random_case(rng: random.Random, kind: str):
    w = rng.randint(2, 24)
    real = RealRanks(rng.sample(range(w), rng.randint(1, min(3, w - 1))), w)
    if kind == "allreduce":
        sched = RingAllreduce(RingGeometry.for_tensor(w, rng.choice([4, 40, 4000, 3 << 20]) * rng.randint(1, 9), 4))
    elif kind == "allgather":
        sched = RingAllgather(w, rng.randint(1, 5000))
    elif kind == "broadcast":
        sched = BinomialBroadcast(w, rng.randrange(w), rng.randint(0, 1 << 20))
    else:
        sched = DisseminationBarrier(w)
    emulated = [e for e in range(w) if e not in real]
    skew = {q: rng.uniform(0, 3e-3) for q in rng.sample(emulated, min(len(emulated), rng.randint(0, 2)))}
    hop = LinkClass("hop", rng.uniform(1e8, 1e10), rng.uniform(1e-6, 1e-3))
    entry = Entry(rng.uniform(0, 1), skew)
    # Real ranks' boundary sends: in step order, at random rising times (they may be
    # early or late against the model: the two evaluators must agree on any input).
    sends = []
    for x in real.sorted:
        t = entry.t0
        for m in sched.sends(x):
            if m.peer not in real:
                t += rng.uniform(0, 2e-3)
                sends.append((x, m.step, t))
    return sched, hop, entry, real, sends


@pytest.mark.parametrize("kind", ["allreduce", "allgather", "broadcast", "barrier"])
def test_fast_path_equals_reference(kind):
    rng = random.Random(kind)
    for _ in range(60):
        sched, hop, entry, real, sends = random_case(rng, kind)
        modeled = rng.random() < 0.7
        ref = reference_arrivals(sched, hop, entry, real, sends, modeled)
        fast = timeline_for(sched, hop, entry, real, modeled)
        for x, step, t in sends:
            fast.real_sent(x, step, t)
        for (emu, step), want in sorted(ref.items()):
            where = (kind, sched.world, real.sorted, emu, step)
            assert fast.arrival(emu, step) == pytest.approx(want, abs=1e-12), where


@pytest.mark.parametrize("kind", ["allreduce", "allgather"])
def test_ring_rank_time_is_the_timeline_with_a_punctual_real_rank(kind):
    """A real rank that runs Gloo's program at once (a step's send leaves when the
    receives up to two steps back are in) ends when `rank_time` says, small tensors
    in large worlds included, whose last segments are empty."""
    rng = random.Random(7)
    hop = LinkClass("hop", 1e9, 20e-6)
    for w in (2, 5, 16, 33, 100):
        if kind == "allreduce":
            sched = RingAllreduce(RingGeometry.for_tensor(w, rng.choice([8, 400, 4096, 5 << 20]), 4))
        else:
            sched = RingAllgather(w, rng.choice([2, 4096]))
        r = rng.randrange(w)
        tl = timeline_for(sched, hop, Entry(0.0), RealRanks([r], w))
        sends = {m.step for m in sched.sends(r)}
        recvs = {m.step: m.peer for m in sched.recvs(r)}
        arrived: dict[int, float] = {}
        for t in range(max(sends | set(recvs)) + 1):
            if t in sends:
                tl.real_sent(r, t, max([0.0] + [a for s, a in arrived.items() if s <= t - 2]))
            if t in recvs:
                arrived[t] = tl.arrival(recvs[t], t)
        assert max(arrived.values()) == pytest.approx(sched.rank_time(hop, r), rel=1e-9), (w, r)


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
    ]:
        with pytest.raises(WhatIfError, match=why):
            parse(bad)
