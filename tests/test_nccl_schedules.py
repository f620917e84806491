"""NCCL's ring and tree schedules: every rank's program agrees with its peers', moves
the bytes the algorithm must, keeps each message within what the receiver posts,
and the symmetric timing shortcuts equal a walk of every rank."""

from __future__ import annotations

import itertools
import random

import pytest
from neuronabox.delay_models import load as load_model
from neuronabox.delay_models.collective import CollectiveFormulas
from neuronabox.topology import LinkClass, Topology
from neuronabox.topology import load as load_topology

from neuronabox.schedules import Kind
from neuronabox.schedules.nccl import (
    NcclConfig,
    NcclRing,
    NcclTreeAllreduce,
    channel_parts,
    dtree,
    nccl_schedule,
    pipeline_time,
    ring_walk,
    slice_sizes,
)

RING = (Kind.ALLREDUCE, Kind.ALLGATHER, Kind.REDUCE_SCATTER, Kind.BROADCAST)
CASES = [  # (world, count, elem): small, ragged, a partial loop, several loops
    (2, 1, 4),
    (3, 10, 4),
    (4, 1000, 2),
    (5, (3 << 20) + 7, 1),
    (8, 1 << 20, 4),
    (2, (9 << 20) // 8, 8),
]


def by_peer(msgs, peer):
    return [(m.channel, m.step, m.nbytes) for m in msgs if m.peer == peer]


@pytest.mark.parametrize("kind", RING)
@pytest.mark.parametrize("channels", [1, 3])
def test_ring_neighbours_agree_message_by_message(kind, channels):
    """What rank r sends its successor is, message by message, what the successor
    expects from r; every message fits the receiver's posted buffer."""
    for world, count, elem in CASES:
        s = NcclRing(kind, world, count, elem, root=world - 1, config=NcclConfig(channels=channels))
        for r in range(world):
            nxt = (r + 1) % world
            assert by_peer(s.sends(r), nxt) == by_peer(s.recvs(nxt), r), (kind, world, count, elem, r)
            assert all(0 <= m.nbytes <= s.posted_bytes for m in s.sends(r))


@pytest.mark.parametrize("kind", RING)
def test_ring_moves_the_bytes_of_the_algorithm(kind):
    """Summed over ranks: allreduce moves every chunk over 2(W-1) links, allgather and
    reduce-scatter every block over W-1, broadcast the tensor over W-1."""
    for world, count, elem in CASES:
        s = NcclRing(kind, world, count, elem)
        sent = sum(m.nbytes for r in range(world) for m in s.sends(r))
        total = count * elem
        want = {
            Kind.ALLREDUCE: 2 * (world - 1) * total,
            Kind.ALLGATHER: world * (world - 1) * total,
            Kind.REDUCE_SCATTER: world * (world - 1) * total,
            Kind.BROADCAST: (world - 1) * total,
        }[kind]
        assert sent == want, (kind, world, count, elem)


def test_slices_follow_the_simple_protocol():
    """Two slices per allreduce op, each a multiple of 16 elements unless it is the
    rest; a small op leaves its second slice empty, which is still a message."""
    step = (4 << 20) // 8 // 4  # fp32 elements in one 512 KiB step
    assert slice_sizes(10, 2, 2, step) == (10, 0)
    assert slice_sizes(step * 4, 2, 2, step) == (step * 2, step * 2)
    assert slice_sizes(1000, 2, 2, step) == (1000, 0)  # the floor is stepSize*sliceSteps/32
    big = 100_000
    a, b = slice_sizes(big, 2, 2, step)
    assert a + b == big and a % 16 == 0 and a >= b
    assert slice_sizes(-5, 2, 2, step) == (0, 0)
    s = NcclRing(Kind.ALLREDUCE, 2, 10, 4)
    assert s.posted_bytes == 1 << 20 and NcclRing(Kind.BROADCAST, 2, 10, 1).posted_bytes == 512 << 10


def test_a_small_allreduce_on_two_ranks_exactly():
    """10 floats on 2 ranks: one partial loop, chunks of alignUp(ceil(10/2), 4) = 8
    elements: chunk 0 holds 8, chunk 1 holds 2. Rank 0 sends chunk 1 (reduce-scatter),
    then chunk 0 (its reduced chunk), each as a full slice and an empty one."""
    s = NcclRing(Kind.ALLREDUCE, 2, 10, 4)
    assert [m.nbytes for m in s.sends(0)] == [8, 0, 32, 0]
    assert [m.nbytes for m in s.recvs(0)] == [32, 0, 8, 0]
    ops = [(op.recv, op.send, op.block) for op in s.ops(0, s.parts[0])]
    assert ops == [(False, True, 1), (True, True, 0), (True, False, 1)]


def test_channel_partition_covers_the_tensor():
    rng = random.Random(7)
    for _ in range(300):
        kind = rng.choice(RING)
        world, elem = rng.choice([2, 3, 8, 64]), rng.choice([1, 2, 4, 8])
        count = rng.randrange(0, 1 << rng.randrange(1, 24))
        k = rng.choice([1, 2, 4, 16])
        parts = channel_parts(kind, count, elem, world, NcclConfig(channels=k))
        assert 1 <= len(parts) <= k
        assert parts[0].offset == 0 and [p.channel for p in parts] == list(range(len(parts)))
        for a, b in itertools.pairwise(parts):
            assert a.offset + a.count == b.offset
        moved = count * elem if kind in (Kind.ALLGATHER, Kind.BROADCAST) else count  # NCCL moves these as bytes
        assert parts[-1].offset + parts[-1].count == moved
        assert all(p.count > 0 for p in parts) or count == 0


def test_a_small_collective_stays_on_one_channel():
    """Less than a cell of traffic (16 KiB) per channel: NCCL keeps it on channel 0."""
    parts = channel_parts(Kind.ALLREDUCE, 1024, 4, 8, NcclConfig(channels=4))
    assert [(p.offset, p.count) for p in parts] == [(0, 1024)]
    parts = channel_parts(Kind.ALLREDUCE, 1 << 20, 4, 8, NcclConfig(channels=4))
    assert len(parts) == 4 and len({p.count for p in parts}) == 1


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 7, 8, 12, 33, 64, 100])
def test_double_binary_tree_is_two_spanning_trees(world):
    """Each tree: one root, parent and child links agree, every rank reaches the root.
    Tree 0's root is rank 0 with a single child; with an even world no rank is inside
    both trees (that is what makes the pair double the bandwidth of one)."""
    for which in (0, 1):
        links = [dtree(world, r)[which] for r in range(world)]
        roots = [r for r, t in enumerate(links) if t.up == -1]
        assert len(roots) == 1
        for r, t in enumerate(links):
            for c in t.children:
                assert links[c].up == r, (world, which, r, c)
            if t.up != -1:
                assert r in links[t.up].children
            seen, x = set(), r
            while links[x].up != -1:
                assert x not in seen
                seen.add(x)
                x = links[x].up
            assert x == roots[0]
    assert dtree(world, 0)[0].up == -1 and len(dtree(world, 0)[0].children) == (1 if world > 1 else 0)
    if world % 2 == 0:
        inner = [all(dtree(world, r)[w].children for w in (0, 1)) for r in range(world)]
        assert not any(inner)


def test_tree_allreduce_peers_agree():
    for world, channels in itertools.product([2, 3, 5, 8, 13], [1, 2, 4]):
        s = NcclTreeAllreduce(world, (3 << 20) + 5, 4, NcclConfig(channels=channels))
        for a, b in itertools.permutations(range(world), 2):
            assert by_peer(s.sends(a), b) == by_peer(s.recvs(b), a)
        assert all(0 < m.nbytes <= s.posted_bytes for m in s.sends(0))


# -- timing: the shortcuts against a walk of every rank ---------------------------------
def walk_every_rank(s: NcclRing, hop: LinkClass, work: float) -> float:
    """Every rank's program on its own link, in rounds until nothing moves: a message
    leaves when its link is free and the receive it forwards has arrived."""
    part = s.parts[0]
    progs = [s.ops(r, part) for r in range(s.world)]
    sent = [[] for _ in range(s.world)]  # arrival time of each message on link r -> r+1
    state = [[0, 0, 0, 0.0, 0.0] for _ in range(s.world)]  # op, slice, received, ready, link_free
    end = 0.0
    moved = True
    while moved:
        moved = False
        for r in range(s.world):
            op_i, sl, got_n, ready, free = state[r]
            while op_i < len(progs[r]):
                op = progs[r][op_i]
                if op.recv:
                    inbox = sent[(r - 1) % s.world]
                    if got_n >= len(inbox):
                        break
                    got = inbox[got_n]
                    got_n += 1
                    end = max(end, got)
                    ready = max(ready, got + (work if op.send else 0.0))
                if op.send:
                    leave = max(ready, free)
                    free = leave + op.slices[sl] / hop.bandwidth
                    sent[r].append(free + hop.latency)
                sl += 1
                if sl == len(op.slices):
                    op_i, sl = op_i + 1, 0
                moved = True
            state[r] = [op_i, sl, got_n, ready, free]
    assert all(st[0] == len(p) for st, p in zip(state, progs, strict=True)), "a rank never finished"
    return end


@pytest.mark.parametrize("kind", [Kind.ALLREDUCE, Kind.ALLGATHER, Kind.REDUCE_SCATTER])
def test_ring_walk_equals_walking_every_rank(kind):
    """Exact where every rank's messages have the same sizes; an allreduce whose last
    loop leaves ragged chunks (ranks then differ) stays within 0.1%."""
    hop = LinkClass("h", 1e9, 20e-6)
    for (world, count, elem), work in itertools.product(CASES + [(16, 16 << 20, 4)], [0.0, 5e-6]):
        s = NcclRing(kind, world, count, elem)
        ragged = kind == Kind.ALLREDUCE and len({m.nbytes for r in range(world) for m in s.sends(r)}) > 1
        want = walk_every_rank(s, hop, work)
        assert ring_walk(s.ops(0, s.parts[0]), hop, work) == pytest.approx(want, rel=1e-3 if ragged else 1e-9)


def test_pipeline_time_is_the_tandems_longest_path():
    rng = random.Random(3)
    hop = LinkClass("h", 1e9, 10e-6)
    for _ in range(50):
        sizes = [rng.randrange(1, 1 << 20) for _ in range(rng.randrange(1, 9))]
        hops, work = rng.randrange(1, 9), rng.choice([0.0, 3e-6])
        leave = [0.0] * len(sizes)  # departure of each chunk at the current hop
        free = 0.0
        for c, n in enumerate(sizes):
            leave[c] = free
            free += n / hop.bandwidth
        for _ in range(1, hops):
            free = 0.0
            for c, n in enumerate(sizes):
                arrived = leave[c] + n / hop.bandwidth + hop.latency
                leave[c] = max(arrived + work, free)
                free = leave[c] + n / hop.bandwidth
        want = max(leave[c] + n / hop.bandwidth + hop.latency for c, n in enumerate(sizes))
        assert pipeline_time(sizes, hops, hop, work) == pytest.approx(want)


def test_ring_time_approaches_the_bandwidth_bound():
    """A large allreduce: no faster than its bytes on the wire, 2(W-1)/W n/B, and within
    10% of that plus the ring's latency (the pipeline hides most of it)."""
    hop = LinkClass("h", 1.25e9, 10e-6)
    for world in (2, 8, 64):
        n = 256 << 20
        s = NcclRing(Kind.ALLREDUCE, world, n // 4, 4)
        wire = 2 * (world - 1) / world * n / hop.bandwidth
        assert wire <= s.free_time(hop) <= 1.1 * (wire + 2 * (world - 1) * hop.latency)


def test_barrier_is_an_allreduce_of_one_float_and_tree_is_allreduce_only():
    s = nccl_schedule("barrier", 4, 0, 1)
    assert isinstance(s, NcclRing) and s.kind == Kind.ALLREDUCE and s.count == 1
    assert isinstance(nccl_schedule("allreduce", 4, 10, 4, algo="tree"), NcclTreeAllreduce)
    with pytest.raises(ValueError, match="tree runs allreduce only"):
        nccl_schedule("allgather", 4, 10, 4, algo="tree")
    with pytest.raises(ValueError, match="not spoken"):
        nccl_schedule("allreduce", 4, 10, 4, algo="pat")
    with pytest.raises(ValueError, match="no reduce schedule"):
        NcclRing(Kind.REDUCE, 4, 10, 4)


# -- the collective model's NCCL formulas ----------------------------------------------
def test_nccl_formulas_on_known_numbers():
    t = Topology("t", 64, 1, LinkClass("intra", 1e10, 1e-6), LinkClass("inter", 1e9, 5e-6), 64, 1)
    ring, tree = CollectiveFormulas(t, formulas="nccl-ring"), CollectiveFormulas(t, formulas="nccl-tree")
    a, b, n = 10e-6, 1e9, 64 << 20  # up and down one leaf switch
    assert ring.collective_time("allreduce", n, 8) == pytest.approx(14 * a + 14 / 8 * n / b)
    assert tree.collective_time("allreduce", n, 8) == pytest.approx(2 * 3 * a + 2 * n / b)
    assert ring.collective_time("allgather", n, 8) == pytest.approx(7 * a + 7 / 8 * n / b)
    assert tree.collective_time("reduce_scatter", n, 8) == ring.collective_time("reduce_scatter", n, 8)
    assert ring.collective_time("broadcast", n, 8) == pytest.approx(8 * a + n / b)
    assert ring.collective_time("barrier", 0, 8) == ring.collective_time("allreduce", 4, 8)
    with pytest.raises(ValueError, match="unknown collective formulas"):
        CollectiveFormulas(t, formulas="nccl-pat")


def test_tree_beats_ring_on_latency_and_ring_beats_tree_on_bandwidth():
    """The trade NCCL's tuner makes: a small allreduce at scale is faster on the tree,
    a large one on a small world faster on the ring. Both the formulas and a walk of
    the schedules show it."""
    t = load_topology("ib-100g").with_nodes(1024, 1)
    ring, tree = load_model("nccl-ring", t), load_model("nccl-tree", t)
    assert tree.collective_time("allreduce", 4 << 10, 1024) < ring.collective_time("allreduce", 4 << 10, 1024)
    assert ring.collective_time("allreduce", 256 << 20, 8) < tree.collective_time("allreduce", 256 << 20, 8)
    hop = LinkClass("h", t.inter.bandwidth, 2 * t.inter.latency)
    small_ring, small_tree = NcclRing(Kind.ALLREDUCE, 1024, 1024, 4), NcclTreeAllreduce(1024, 1024, 4)
    assert small_tree.free_time(hop) < small_ring.free_time(hop)
    big_ring, big_tree = NcclRing(Kind.ALLREDUCE, 8, 64 << 20, 4), NcclTreeAllreduce(8, 64 << 20, 4)
    assert big_ring.free_time(hop) < big_tree.free_time(hop)


@pytest.mark.parametrize("model", ["nccl-ring", "nccl-tree"])
def test_nccl_formulas_spread_over_nccls_schedule(model):
    """The collective model's hop, walked along NCCL's schedule, gives the formula's time."""
    t = load_topology("cpu-25gbe").with_nodes(256, 1)
    m = load_model(model, t)
    for kind in RING:
        for w in (2, 7, 64):
            for nbytes in (4 << 10, 3 << 20):
                elem = 4 if kind in (Kind.ALLREDUCE, Kind.REDUCE_SCATTER) else 1
                count = nbytes // elem // (w if kind in (Kind.ALLGATHER, Kind.REDUCE_SCATTER) else 1)
                algo = "tree" if model == "nccl-tree" and kind == Kind.ALLREDUCE else "ring"
                sched = nccl_schedule(kind, w, count, elem, algo=algo)
                want = m.collective_time(kind, nbytes, w, sched)
                assert sched.free_time(m.hop(kind, nbytes, w, sched)) == pytest.approx(want, rel=1e-6)


# -- what the emulated ranks send the one real rank ------------------------------------
def play_real_rank(s: NcclRing, rank: int) -> dict[tuple[int, int, int], float]:
    """The real rank's device loop on values, NCCL's way (the first W ops of an
    allreduce loop reduce, the rest copy; an allgather stores what it receives), fed by
    the echo plan. Every element of a block holds one value: 100 + the block's index.
    Returns (channel, loop, block) -> the block's final value."""
    plan, sends = s.echo_plan(rank), s.sends(rank)
    recvs = s.recvs(rank)
    assert len(plan) == len(recvs)
    sent_values: list[float] = []
    final: dict[tuple[int, int, int], float] = {}
    r = 0
    w = s.world
    per_loop = 2 * w - 1 if s.kind == Kind.ALLREDUCE else w
    for ch, ops in s.program(rank).items():
        for i, op in enumerate(ops):
            loop, pos = divmod(i, per_loop)
            key = (ch, loop, op.block)
            if s.kind == Kind.ALLREDUCE:
                value = final.get(key, 100.0 + op.block)
            else:
                value = final.get(key, 100.0 + op.block if op.block == rank else float("nan"))
            if op.recv:
                got = []
                for _ in op.slices:
                    echo = plan[r]
                    if echo is not None:
                        assert sends[echo].nbytes == recvs[r].nbytes, "an echo must fit the receive"
                    got.append(0.0 if echo is None else sent_values[echo])
                    r += 1
                assert len(set(got)) <= 1, "the slices of one block carry one value"
                if s.kind == Kind.ALLREDUCE and pos < w:
                    value = value + got[0]  # reduce-scatter half: add what arrived
                else:
                    value = got[0]  # the allgather half (and allgather): store what arrived
            final[key] = value
            if op.send:
                sent_values.extend(value for _ in op.slices)
    return final


@pytest.mark.parametrize("kind", [Kind.ALLREDUCE, Kind.ALLGATHER])
@pytest.mark.parametrize("channels", [1, 3])
def test_the_echo_plan_gives_the_real_rank_what_the_policy_predicts(kind, channels):
    """Allreduce with emulated zeros: the real rank ends with its own input. Allgather
    with the mirror: every block ends as the real rank's own."""
    for world, count, elem in CASES:
        s = NcclRing(kind, world, count, elem, config=NcclConfig(channels=channels))
        for rank in {0, world - 1}:
            final = play_real_rank(s, rank)
            for (_ch, _loop, block), value in final.items():
                want = 100.0 + block if kind == Kind.ALLREDUCE else 100.0 + rank
                assert value == want, (kind, world, count, elem, rank, block, value)


def test_reduce_scatter_and_broadcast_get_zeros():
    for kind in (Kind.REDUCE_SCATTER, Kind.BROADCAST):
        s = NcclRing(kind, 4, 1000, 4, root=2)
        assert s.echo_plan(0) == [None] * len(s.recvs(0)) and s.echo_plan(0)


def test_the_tree_echo_plan_leaves_the_real_rank_its_input():
    """Tree allreduce with emulated zeros, played on values: a rank adds what its children
    send (zeros), sends the sum up, and keeps what comes down from its parent (the root:
    its own sum). Each rank of the world, in turn the real one, ends with its input."""
    for world, channels in itertools.product([2, 3, 5, 8], [1, 2]):
        s = NcclTreeAllreduce(world, (1 << 20) + 3, 4, NcclConfig(channels=channels))
        for rank in range(world):
            plan, sends, recvs = s.echo_plan(rank), s.sends(rank), s.recvs(rank)
            assert len(plan) == len(recvs)
            mine = 100.0 + rank
            up_sent = {}  # (channel, chunk) -> the value sent to the parent
            for part in s.parts:
                links = s.links(rank, part.channel)
                for step, _ in enumerate(s.chunks(part)):
                    from_children = [
                        0.0 if plan[i] is None else float("nan")
                        for i, m in enumerate(recvs)
                        if m.channel == part.channel and m.step == step and m.peer in links.children
                    ]
                    total = mine + sum(from_children)
                    if links.up == -1:
                        assert total == mine
                        continue
                    up_sent[(part.channel, step)] = total
                    (down,) = [
                        i for i, m in enumerate(recvs) if (m.channel, m.step, m.peer) == (part.channel, step, links.up)
                    ]
                    echo = plan[down]
                    assert echo is not None and sends[echo].peer == links.up and sends[echo].step == step
                    assert sends[echo].nbytes == recvs[down].nbytes
                    assert up_sent[(sends[echo].channel, sends[echo].step)] == mine


def test_small_collectives_trim_channels_as_nccl_does():
    """Worked by hand from src/enqueue.cc (v2.28.9): a collective keeps one channel fewer
    while its bytes are under channels x 512 threads x 64 bytes, then the plan splits its
    traffic over the channels left, in cells of 16 KiB of traffic."""
    # 64 KiB fp32 allreduce on 2 ranks, 4 channels: 65536 < 3*32768, not < 2*32768, so 2
    # channels; traffic 131072 over 2, cells of 8192 bytes (2048 floats): 4 cells each.
    parts = channel_parts(Kind.ALLREDUCE, 16384, 4, 2, NcclConfig(channels=4))
    assert [(p.offset, p.count) for p in parts] == [(0, 8192), (8192, 8192)]
    # a 4 KiB-per-rank allgather on 8 ranks: 32 KiB in all keeps one channel
    parts = channel_parts(Kind.ALLGATHER, 1024, 4, 8, NcclConfig(channels=4))
    assert [(p.offset, p.count) for p in parts] == [(0, 4096)]
    # 1 MiB per rank: four channels of 128 cells of 2048 bytes
    parts = channel_parts(Kind.ALLGATHER, 1 << 18, 4, 8, NcclConfig(channels=4))
    assert [p.count for p in parts] == [1 << 18] * 4
    # 100 KiB of floats on 2 ranks, 2 channels: 13 cells of 2048 floats, 7 then 6 (the
    # last one short); from 2.29 a cell is 32 KiB of traffic: 7 cells of 4096, 4 then 3
    parts = channel_parts(Kind.ALLREDUCE, 25600, 4, 2, NcclConfig(channels=2))
    assert [p.count for p in parts] == [14336, 11264]
    parts = channel_parts(Kind.ALLREDUCE, 25600, 4, 2, NcclConfig(channels=2, min_traffic_per_channel=32 << 10))
    assert [p.count for p in parts] == [16384, 9216]


@pytest.mark.parametrize("search,want", [(1, [0, 1, 0, 1]), (2, [0, 0, 1, 1]), (4, [0, 0, 0, 0])])
def test_channels_alternate_trees_in_runs_of_the_searched_count(search, want):
    s = NcclTreeAllreduce(8, 1 << 20, 4, NcclConfig(channels=4, search_channels=search))
    assert [s.tree_of(c) for c in range(4)] == want
