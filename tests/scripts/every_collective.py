"""Calls every collective ProcessGroupGloo runs on CPU tensors, in the default group
and in subgroups (one with no real rank), and checks the values the data policy
(NEURONABOX_DATA) predicts. Every rank builds its inputs from its own rank number;
an emulated rank's inputs are those of nobody (zeros: it holds zeros, forwards
what it receives) or of its group's mirror source (mirror), so a SUM is the sum
over the members' stand-ins. Either way an allgather's emulated blocks are the
source's block, and point-to-point messages and an emulated root's scatter list
are zeros. Exit status 0 only if every check passes."""

import os
import sys

import torch
import torch.distributed as dist
from checks import expect

RANK = WORLD = 0
REAL: list[int] = []
MIRROR = os.environ.get("NEURONABOX_DATA") == "mirror"


def source(members) -> int:
    """The group's mirror source: the first real member whose ring successor is emulated."""
    w = len(members)
    real = [g for g, r in enumerate(members) if r in REAL]
    return members[next((g for g in real if (g + 1) % w not in real), real[0])]


def who(r, members):
    """Whose inputs member r holds: its own (real), the source's (mirror), or none (zeros)."""
    return r if r in REAL else (source(members) if MIRROR else None)


def stand_ins(members) -> list[int]:
    return [x for r in members if (x := who(r, members)) is not None]


def policy_sum(fn, members):
    """The sum the policy predicts: over every member's stand-in."""
    return sum(fn(x) for x in stand_ins(members))


def reductions(g, members) -> None:
    """all_reduce with every op, coalesced, reduce_scatter (list and tensor), reduce."""
    gr = dist.get_rank(g)
    data = {r: torch.arange(1, 3001, dtype=torch.float32) * (r + 1) for r in range(WORLD)}  # nonnegative
    t = data[RANK].clone()
    dist.all_reduce(t, group=g)
    expect(torch.equal(t, policy_sum(lambda r: data[r], members)), "all_reduce SUM")
    t = data[RANK].clone()
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=g)
    expect(torch.equal(t, torch.stack([data[r] for r in stand_ins(members)]).amax(0)), "all_reduce MAX")
    t = -data[RANK]
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=g)
    expect(torch.equal(t, -torch.stack([data[r] for r in stand_ins(members)]).amax(0)), "all_reduce MIN")
    t = data[RANK].clone()
    dist.all_reduce(t, op=dist.ReduceOp.AVG, group=g)
    expect(torch.allclose(t, policy_sum(lambda r: data[r], members) / len(members)), "all_reduce AVG")
    bits = {r: torch.tensor([1 << (r % 60), 7], dtype=torch.int64) for r in range(WORLD)}
    for op, fold in ((dist.ReduceOp.BOR, lambda a, b: a | b), (dist.ReduceOp.BXOR, lambda a, b: a ^ b)):
        t = bits[RANK].clone()
        dist.all_reduce(t, op=op, group=g)
        want = torch.zeros(2, dtype=torch.int64)
        for r in stand_ins(members):
            want = fold(want, bits[r])
        expect(torch.equal(t, want), f"all_reduce {op}: {t.tolist()} != {want.tolist()}")
    t = torch.full((5,), 2.0)
    dist.all_reduce(t, op=dist.ReduceOp.PRODUCT, group=g)
    # Zeros: emulated ranks forward partial results, so a segment holds a zero only where
    # an emulated rank started it: defined, not predicted. Mirror: the product of all.
    expect(not MIRROR or torch.equal(t, torch.full((5,), 2.0 ** len(members))), f"all_reduce PRODUCT {t.tolist()}")
    a, b = torch.ones(5) * (RANK + 1), torch.ones(7, dtype=torch.float32) * 2
    with dist._coalescing_manager(group=g):
        dist.all_reduce(a, group=g)
        dist.all_reduce(b, group=g)
    expect(torch.equal(a, torch.ones(5) * policy_sum(lambda r: r + 1, members)), "coalesced all_reduce")
    w = len(members)
    inp = torch.arange(w * 4, dtype=torch.float32) + RANK
    out = torch.empty(4)
    dist.reduce_scatter_tensor(out, inp, group=g)
    want = policy_sum(lambda r: torch.arange(w * 4, dtype=torch.float32) + r, members)[gr * 4 : gr * 4 + 4]
    expect(torch.equal(out, want), "reduce_scatter_tensor")
    lst = [torch.full((3,), float(RANK + i)) for i in range(w)]
    out = torch.empty(3)
    dist.reduce_scatter(out, lst, group=g)
    expect(torch.equal(out, torch.full((3,), float(policy_sum(lambda r: r + gr, members)))), "reduce_scatter list")
    for n in (7, 1000, 70000):
        for root in sorted({members[0], members[-1], REAL[0] if REAL[0] in members else members[0]}):
            t = torch.arange(n, dtype=torch.float32) + RANK
            dist.reduce(t, dst=root, group=g)
            if RANK == root:
                want = policy_sum(lambda r, n=n: torch.arange(n, dtype=torch.float32) + r, members)
                expect(torch.equal(t, want), f"reduce n={n} root={root}")


def gathers(g, members) -> None:
    w = len(members)
    x = torch.tensor([RANK, 2 * RANK + 1], dtype=torch.int64)
    out = [torch.empty_like(x) for _ in range(w)]
    dist.all_gather(out, x, group=g)
    src = source(members)
    for i, r in enumerate(members):
        x_ = r if r in REAL else src
        expect(torch.equal(out[i], torch.tensor([x_, 2 * x_ + 1])), f"all_gather block {r}")
    flat = torch.empty(2 * w, dtype=torch.int64)
    dist.all_gather_into_tensor(flat, x, group=g)
    for i, r in enumerate(members):
        x_ = r if r in REAL else src
        expect(torch.equal(flat[2 * i : 2 * i + 2], torch.tensor([x_, 2 * x_ + 1])), "all_gather_into_tensor")
    outs = [[torch.empty(2), torch.empty(3)] for _ in range(w)]
    dist.all_gather_coalesced(outs, [torch.full((2,), float(RANK)), torch.full((3,), -float(RANK))], group=g)
    for i, r in enumerate(members):
        x_ = r if r in REAL else src
        expect(torch.equal(outs[i][1], torch.full((3,), -float(x_))), "all_gather_coalesced")
    for root in sorted({members[0], members[-1]}):
        got = [torch.empty_like(x) for _ in range(w)] if RANK == root else None
        dist.gather(x, got, dst=root, group=g)
        if RANK == root:
            for i, r in enumerate(members):
                x_ = who(r, members)
                want = torch.tensor([x_, 2 * x_ + 1]) if x_ is not None else torch.zeros(2, dtype=torch.int64)
                expect(torch.equal(got[i], want), f"gather root {root} block {r}")
        lst = [torch.full((3,), float(i + 10)) for i in range(w)] if RANK == root else None
        y = torch.empty(3)
        dist.scatter(y, lst, src=root, group=g)
        want = torch.full((3,), float(dist.get_rank(g) + 10)) if root in REAL else torch.zeros(3)
        expect(torch.equal(y, want), f"scatter root {root}")
        b = torch.arange(100.0) * (RANK + 1)
        dist.broadcast(b, src=root, group=g)
        x_ = who(root, members)
        want = torch.arange(100.0) * (x_ + 1) if x_ is not None else torch.zeros(100)
        expect(torch.equal(b, want), f"broadcast root {root}")


def exchanges(g, members) -> None:
    w, gr = len(members), dist.get_rank(g)
    inp = torch.arange(w * 2, dtype=torch.float32) + 100 * RANK
    out = torch.empty(w * 2)
    dist.all_to_all_single(out, inp, group=g)
    for i, r in enumerate(members):
        x_ = who(r, members)
        want = torch.arange(2 * gr, 2 * gr + 2, dtype=torch.float32) + 100 * x_ if x_ is not None else torch.zeros(2)
        expect(torch.equal(out[2 * i : 2 * i + 2], want), f"all_to_all_single block {r}")
    ins = [(gr + j) % 3 for j in range(w)]  # uneven, some zero-length
    outs = [(j + gr) % 3 for j in range(w)]
    out = torch.empty(sum(outs))
    dist.all_to_all_single(out, torch.full((sum(ins),), float(RANK)), outs, ins, group=g)
    off = 0
    src_gr = members.index(source(members))
    for i, r in enumerate(members):
        x_ = who(r, members)
        if x_ is not None and r not in REAL and (src_gr + gr) % 3 != outs[i]:
            x_ = None  # the source's block for us has another length: the message stays zeros
        want = torch.full((outs[i],), float(x_)) if x_ is not None else torch.zeros(outs[i])
        expect(torch.equal(out[off : off + outs[i]], want), f"alltoallv block {r}")
        off += outs[i]
    got = [torch.empty(2) for _ in range(w)]
    dist.all_to_all(got, [torch.full((2,), float(RANK * 10 + j)) for j in range(w)], group=g)
    for i, r in enumerate(members):
        x_ = who(r, members)
        want = torch.full((2,), float(x_ * 10 + gr)) if x_ is not None else torch.zeros(2)
        expect(torch.equal(got[i], want), "all_to_all")
    nxt, prv = members[(gr + 1) % w], members[(gr - 1) % w]
    s = dist.isend(torch.full((5,), float(RANK)), nxt, group=g, tag=3)
    r_ = torch.empty(5)
    dist.recv(r_, prv, group=g, tag=3)
    s.wait()
    expect(torch.equal(r_, torch.full((5,), float(prv)) if prv in REAL else torch.zeros(5)), "send/recv")
    emulated = [r for r in members if r not in REAL]
    for turn in range(2):  # from any source: the emulated members answer in turn
        r_ = torch.ones(4)
        src = dist.recv(r_, group=g, tag=4)
        want = emulated[turn % len(emulated)]
        expect(src == want and torch.equal(r_, torch.zeros(4)), f"recv from any source: {src}, wanted {want}")
    dist.barrier(group=g)


def named_by_hash(g, members) -> None:
    """A group whose name is a hash of its members: its pairs and records still meet."""
    t = torch.full((4,), float(RANK + 1))
    dist.all_reduce(t, group=g)
    expect(torch.equal(t, torch.full((4,), float(policy_sum(lambda r: r + 1, members)))), "hashed group all_reduce")
    root = next(r for r in members if r not in REAL)
    b = torch.full((3,), float(RANK))
    dist.broadcast(b, src=root, group=g)
    x_ = who(root, members)
    expect(torch.equal(b, torch.full((3,), float(x_)) if x_ is not None else torch.zeros(3)), "hashed group broadcast")


def objects() -> None:
    objs = [None] * WORLD
    dist.all_gather_object(objs, {"rank": RANK})
    expect(all(objs[r] == {"rank": r} for r in REAL), "all_gather_object")
    lst = [f"from {REAL[0]}", 42] if RANK == REAL[0] else [None, None]
    dist.broadcast_object_list(lst, src=REAL[0])
    expect(lst == [f"from {REAL[0]}", 42], "broadcast_object_list")
    emulated = [r for r in range(WORLD) if r not in REAL]
    dist.gather_object({"rank": RANK}, None, dst=emulated[0])  # the emulated root takes it
    got = [None]
    dist.scatter_object_list(got, [{"to": r} for r in range(WORLD)] if RANK == REAL[0] else None, src=REAL[0])
    expect(got[0] == {"to": RANK}, "scatter_object_list")
    dist.monitored_barrier()


def main() -> None:
    global RANK, WORLD, REAL
    dist.init_process_group("gloo")
    RANK, WORLD = dist.get_rank(), dist.get_world_size()
    REAL = [int(r) for r in os.environ["NEURONABOX_REAL_RANKS"].split(",")]
    world = list(range(WORLD))
    evens, odds = world[0::2], world[1::2]
    groups = [(dist.new_group(evens), evens), (dist.new_group(odds), odds)]
    no_real = [r for r in world if r not in REAL][:3]
    dist.new_group(no_real)  # no real member: the controller never hears of it
    # A hashed group name (only members call new_group): every real rank and one emulated.
    hashed = sorted(set(REAL) | {no_real[0]})
    hashed_group = dist.new_group(hashed, use_local_synchronization=True)
    for g, members in [(dist.group.WORLD, world)] + groups:
        if RANK not in members or len(members) < 2:
            continue
        reductions(g, members)
        gathers(g, members)
        exchanges(g, members)
    named_by_hash(hashed_group, hashed)
    objects()
    print(f"rank {RANK}: all checks passed", flush=True)
    sys.stdout.flush()
    os._exit(0)  # see collectives.py: stock Gloo teardown aborts now and then


if __name__ == "__main__":
    main()
