"""The NCCL dialect live: the controller plays the emulated ranks of an NCCL communicator
whose real ranks are the wheel's unmodified libnccl on the CPU rig.

What is real: every byte of libnccl.so.2 (bootstrap, topology, transport setup, proxy
thread, Socket net), the controller's process and its sockets. What is emulated: the CUDA
driver and NCCL's kernels (CPU code in the rig, docs/nccl_rig.md). Each checked output is
compared with what the data policy predicts (`neuronabox/perf/expect.py`), on every real rank.
"""

from __future__ import annotations

import json
import math
import random
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from neuronabox.controller.dialects.nccl.errors import NcclWireError
from neuronabox.controller.dialects.nccl.live import ProfileLines, token_owner
from neuronabox.controller.dialects.nccl.relay import CollParams, NcclRelay, UnspokenCollective, identity
from neuronabox.controller.dialects.nccl.virtual import VirtualRanks
from neuronabox.controller.dialects.nccl.wire import SockAddr, UniqueId
from neuronabox.controller.nccl_main import read_uid
from neuronabox.controller.release import ReleaseTiming
from neuronabox.delay_models.whatif import WhatIf

from neuronabox import delay_models, topology
from neuronabox.errors import NeuronaBoxError
from neuronabox.perf.ladder import make_spec
from neuronabox.perf.rig import RigJob, RigRunError, run_rig
from neuronabox.schedules import Kind
from neuronabox.schedules.gloo import RealRanks
from neuronabox.schedules.nccl import NcclConfig, NcclRing
from neuronabox.schedules.nccl_sources import Source, ring_sources, walk_sources
from neuronabox.trace import records

COLLS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
KINDS = (Kind.ALLREDUCE, Kind.ALLGATHER, Kind.REDUCE_SCATTER, Kind.BROADCAST)


def zero_timing(world: int) -> ReleaseTiming:
    return ReleaseTiming(delay_models.load("zero", topology.load("cpu-25gbe").with_nodes(world, 1)))


def params(kind: Kind, count: int, seq: int = 0, channels: int = 1, root: int = 1) -> CollParams:
    return CollParams(seq, kind, count, "float32", 4, root, channels, "RING", "SIMPLE")


# ---------------------------------------------------------------- sans-IO: what each message carries


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("world, count, channels", [(2, 1, 1), (3, 5000, 2), (8, 300_000, 2), (5, 70_000, 1)])
def test_one_real_ranks_sources_are_the_echo_plan(kind, world, count, channels):
    """The relay's tracing, with one real rank, is the closed-form echo plan the replay tests checked."""
    ring = NcclRing(kind, world, count, 4, root=1 % world, config=NcclConfig(channels=channels))
    for r in range(world):
        sources = ring_sources(ring, [r], r).get(r, {})
        per_channel_index, seen = [], {}
        for m in ring.sends(r):
            per_channel_index.append(seen.get(m.channel, 0))
            seen[m.channel] = seen.get(m.channel, 0) + 1
        got_at = {}
        for m, echo in zip(ring.recvs(r), ring.echo_plan(r), strict=True):
            k = got_at.get(m.channel, 0)
            got_at[m.channel] = k + 1
            want = None if echo is None else Source(r, per_channel_index[echo])
            assert sources[m.channel][k] == want, (r, m)


def test_the_closed_form_sources_are_the_walked_ones():
    """Any real ranks, kinds, roots, channel counts and ragged last loops: O(1) a message
    equals following each message back hop by hop."""
    rng = random.Random(7)
    checked = 0
    while checked < 120:
        w = rng.randint(2, 12)
        real = sorted(rng.sample(range(w), rng.randint(1, max(1, w // 2))))
        if any((r + 1) % w in real for r in real):
            continue
        kind = rng.choice(KINDS)
        ring = NcclRing(kind, w, rng.choice([1, 7, 100, 5000, 70_000, 300_000]), 4, root=rng.randrange(w),
                        config=NcclConfig(channels=rng.choice([1, 2, 3])))  # fmt: skip
        mirror = RealRanks(real, w).mirror
        assert ring_sources(ring, real, mirror) == walk_sources(ring, real, mirror), (kind, w, real, ring.count)
        checked += 1


def play(kind: Kind, world: int, real: list[int], count: int, channels: int = 1, instances: int = 2):
    """Real ranks stepping NCCL's ring program against the relay in virtual time, slice by
    slice, with bytes that name their sender and message (`VirtualRanks`: real neighbours
    hand theirs over directly); returns what each real rank received."""
    config = NcclConfig(channels=channels)
    relay = NcclRelay(world, real, config, zero_timing(world))
    ring = NcclRing(kind, world, count, 4, root=1 % world, config=config)
    ranks = VirtualRanks(relay)
    for seq in range(instances):
        ranks.run(params(kind, count, seq, len(ring.parts), 1 % world), ring, 0.0)
    assert len(relay.finished) == instances and not relay.in_flight
    return ranks.received


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("world, real, channels", [(8, [0, 5], 1), (8, [2, 5], 2), (7, [1, 3, 5], 1), (6, [3], 2),
                                                    (8, [0, 1, 4], 1), (8, [6, 7, 0], 2)])
def test_the_relay_carries_every_collective_for_any_real_ranks(kind, world, real, channels):
    """Every real rank's program runs to its end, twice in a row, each message as large as
    it posted; what another real rank sent reaches it, and nothing is left in flight."""
    got = play(kind, world, real, count=40_000, channels=channels)
    senders = {struct.unpack("<H", p[:2])[0] for r in real for p in got[r] if len(p) >= 8 and any(p)}
    if kind != Kind.BROADCAST and len(real) > 1:
        assert senders == set(real)  # every real rank's bytes travel along the emulated ranks


def test_what_if_delays_move_the_release_times():
    """+2 ms per collective and a straggler of 5 ms: the first release moves by 7 ms, and the
    model's time with it; jitter only ever adds."""
    def relay(*specs: str) -> NcclRelay:
        model = delay_models.load("alpha-beta", topology.load("cpu-25gbe").with_nodes(4, 1))
        return NcclRelay(4, [0], NcclConfig(), ReleaseTiming(model, WhatIf.from_specs(list(specs))))

    base = relay()
    late = relay("latency=+2ms,per=collective", "straggler=rank:2,delay=5ms")
    shaky = relay("jitter=1ms")
    for r in (base, late, shaky):
        r.collective(0, params(Kind.ALLREDUCE, 1 << 16), 10.0)
    assert late.next_release() - base.next_release() == pytest.approx(7e-3)
    assert late.in_flight[0].predicted - base.in_flight[0].predicted == pytest.approx(7e-3)
    assert base.next_release() <= shaky.next_release() <= base.next_release() + 1e-3


def test_the_relay_refuses_a_frame_the_schedule_does_not_send():
    relay = NcclRelay(4, [0], NcclConfig(), zero_timing(4))
    relay.collective(0, params(Kind.ALLREDUCE, 1024), 0.0)
    with pytest.raises(NcclWireError, match="sent 12 bytes as message 0 of allreduce seq 0 on channel 0; NCCL's "):
        relay.feed(0, 0, struct.pack("<i", 12) + bytes(12), 0.0)


def test_a_channel_count_out_of_step_with_nccl_is_refused():
    relay = NcclRelay(4, [0], NcclConfig(channels=2), zero_timing(4))
    with pytest.raises(NcclWireError, match="on 2 channel.*the schedule says 1"):
        relay.collective(0, params(Kind.ALLREDUCE, 16, channels=2), 0.0)


def test_collective_parameters_come_from_the_profilers_start_lines():
    lines = ProfileLines(8)
    start = {"nccl": "coll_start", "rank": 5, "nranks": 8, "seq": 3, "func": "AllGather", "count": 64, "root": 0,
             "dtype": "ncclBfloat16", "algo": "RING", "proto": "SIMPLE", "channels": 1}  # fmt: skip
    stop = dict(start, nccl="coll", stop_ns=5)
    raw = (json.dumps(stop) + "\n" + json.dumps(start) + "\n").encode()
    assert lines.feed(raw[:30]) == []
    [(rank, p)] = lines.feed(raw[30:])
    assert (rank, p.kind, p.count, p.dtype, p.elem, p.seq) == (5, Kind.ALLGATHER, 64, "bfloat16", 2, 3)
    for change, cause in [({"algo": "TREE"}, "as TREE/SIMPLE; the live dialect plays RING/SIMPLE"),
                          ({"func": "AllToAll"}, "NCCL AllToAll is not played"),
                          ({"nranks": 4}, "communicator of 4 ranks")]:  # fmt: skip
        with pytest.raises((UnspokenCollective, Exception), match=cause):
            ProfileLines(8).feed((json.dumps(dict(start, **change)) + "\n").encode())
    assert token_owner(0x1234) == (None, 0)


# ---------------------------------------------------------------- live, on the rig


def rig_run(tmp_path: Path, world: int, real: list[int], channels: int, top: str = "16M", **job) -> list:
    specs = [make_spec(c, world, minbytes="1K", maxbytes=top, factor=4, iters=1, warmup=0, check=1, root=1 % world)
             for c in COLLS]  # fmt: skip
    return run_rig(RigJob(specs, world, real, channels=channels, timeout=240, **job), tmp_path)


@pytest.mark.parametrize("world", [2, 8, 64])
@pytest.mark.parametrize("channels", [1, 2])
def test_one_rig_rank_and_the_controller_are_exact_at_every_size(tmp_path, world, channels):
    """Must-hold: 1 KiB to 16 MiB, four collectives, #wrong 0; the trace has every instance."""
    per_spec = rig_run(tmp_path, world, [0], channels)
    assert [len(rows) for rows in per_spec] == [8, 8, 8, 8]
    assert all(r.wrong == 0 for rows in per_spec for r in rows), per_spec
    doc = records.load(tmp_path / "trace.jsonl")
    assert doc["complete"] and len(doc["instances"]) == 4 * 8 * 2
    first = doc["instances"][0]
    assert (first["kind"], first["dtype"], first["numel"], first["world"]) == ("allreduce", "float32", 256, world)
    assert first["geometry"].startswith("nccl RING/SIMPLE")


@pytest.mark.parametrize("channels", [1, 2])
def test_two_rig_ranks_at_0_and_5_of_8_are_exact(tmp_path, channels):
    """Must-hold: two real ranks with emulated ranks between them; each one's bytes reach
    the other through the controller."""
    per_spec = rig_run(tmp_path, 8, [0, 5], channels)
    assert all(r.wrong == 0 for rows in per_spec for r in rows), per_spec


def test_real_ranks_side_by_side_wrapping_the_ring(tmp_path):
    """A block of real ranks (6, 7, 0: a node's GPUs) talks among itself for real; the
    controller plays the ring allgathers and the data across the block's two ends."""
    per_spec = rig_run(tmp_path, 8, [6, 7, 0], 2)
    assert all(r.wrong == 0 for rows in per_spec for r in rows), per_spec


def test_the_controller_is_the_root_when_rank_0_is_emulated(tmp_path):
    per_spec = rig_run(tmp_path, 8, [3], 1, top="1M")
    assert all(r.wrong == 0 for rows in per_spec for r in rows), per_spec


def test_identity_elements_add_nothing():
    assert identity("sum", "float32") == bytes(4) and identity("avg", "bfloat16") == bytes(2)
    assert struct.unpack("<f", identity("prod", "float32")) == (1.0,)
    assert struct.unpack("<e", identity("min", "float16")) == (math.inf,)
    assert struct.unpack("<f", bytes(2) + identity("max", "bfloat16")) == (-math.inf,)
    assert identity("min", "int32") == (2**31 - 1).to_bytes(4, "little") and identity("max", "uint8") == b"\x00"
    assert identity("prod", "int64") == (1).to_bytes(8, "little")


def test_emulated_ranks_add_the_reductions_identity(tmp_path):
    """NCCL's profiler does not say the op: the run names it, and an emulated rank adds its
    identity (zeros would make a min 0; the product's identity is checked above)."""
    specs = [make_spec(c, 8, minbytes="4K", maxbytes="1M", factor=16, iters=1, warmup=0, check=1, op="min",
                       dtype="bfloat16") for c in ("all_reduce", "reduce_scatter")]  # fmt: skip
    per_spec = run_rig(RigJob(specs, 8, [0, 4], timeout=240), tmp_path)
    assert all(r.wrong == 0 for rows in per_spec for r in rows), per_spec


def test_the_modeled_time_holds_the_real_rank_back(tmp_path):
    """A link of 5 ms: no collective of the real rank ends before the model's time (a bound
    load cannot break: load only makes the real rank later)."""
    topo = tmp_path / "slow.yaml"
    topo.write_text(textwrap.dedent("""\
        name: slow
        ranks_per_node: 1
        links:
          intra: {bandwidth: 8Gb/s, latency: 1us}
          inter: {bandwidth: 8Gb/s, latency: 5ms}
        """))
    spec = make_spec("all_reduce", 4, minbytes="4K", maxbytes="64K", factor=16, iters=3, warmup=0, check=1)
    [rows] = run_rig(RigJob([spec], 4, [0], delay_model="alpha-beta", topology=str(topo), timeout=120), tmp_path)
    for row in rows:
        assert row.wrong == 0 and row.model_s > 0.03  # 2(W-1) hops of 5 ms
        assert row.time_s >= 0.95 * row.model_s, (row.time_s, row.model_s)


# ---------------------------------------------------------------- the command line


def test_the_nccl_ladder_simulated_at_512_ranks_runs_no_process_and_is_the_model(run):
    """--simulate --backend nccl: rank 0 plays NCCL's ring punctually against the live relay
    in virtual time; its time is the model's, and it grows with the size. Both columns are
    virtual seconds, computed, not measured: no load of the machine's can move them."""
    res = run("perf", "all_reduce", "--backend", "nccl", "--simulate", "--nnodes", "512", "-b", "4K", "-e", "4M",
              "-f", "32", "-n", "2", "-w", "1", "--nccl-channels", "2", timeout=120)  # fmt: skip
    assert res.rc == 0, res.err
    table = [ln.split() for ln in res.out.splitlines() if ln.strip() and not ln.startswith("#")]
    times, models = [float(r[5]) for r in table], [float(r[9]) for r in table]
    assert len(table) == 3 and times == sorted(times) and times == pytest.approx(models, rel=1e-9)


def test_perf_prints_nccl_tests_table_for_the_rig(run):
    res = run("perf", "all_gather", "--backend", "nccl", "-b", "4K", "-e", "64K", "-f", "16", "-n", "2", "-w", "1",
              "--nnodes", "4", "--nproc-per-node", "2", "--nccl-channels", "2", "--delay-model", "zero",
              timeout=180)  # fmt: skip
    assert res.rc == 0, res.err
    assert "nccl on the CPU rig (2 channels)" in res.out and "real nodes 0" in res.out
    table = [ln.split() for ln in res.out.splitlines() if ln.strip() and not ln.startswith("#")]
    assert [int(r[0]) for r in table] == [4096, 65536] and all(r[8] == "0" for r in table), res.out


@pytest.mark.parametrize(
    "argv, cause",
    [
        (("--real-ranks", "0,1,2,3,4,5,6,7,8"), "--real-ranks"),
        (("--data", "mirror"), "--data mirror: NCCL's wire does not carry"),
        (("--nccl-channels", "0"), "--nccl-channels is 1 to 16"),
        (("--device", "cuda"), "this torch sees no CUDA device"),
        (("--all-real", "--nnodes", "32"), "at most 16 ranks"),
    ],
)
def test_bad_nccl_input_is_one_line_and_exit_2(run, argv, cause):
    res = run("perf", "all_reduce", "--backend", "nccl", *argv, timeout=60)
    assert res.rc == 2 and cause in res.last_error, res.err


def test_an_nccl_release_the_dialect_does_not_speak_is_refused_before_anything_starts(run, tmp_path):
    """A libnccl that reports 2.32.3 (a real shared object answering ncclGetVersion, as
    NCCL's does without a driver): one line naming the spoken range, exit 2, nothing run."""
    src = tmp_path / "fake.c"
    src.write_text("int ncclGetVersion(int *v) { *v = 23203; return 0; }\n")
    lib = tmp_path / "libnccl.so.2"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    res = run("perf", "all_reduce", "--backend", "nccl", env={"NEURONABOX_NCCL_LIBRARY": str(lib)}, timeout=60)
    assert res.rc == 2 and "NCCL 2.32.3 is not spoken" in res.last_error, res.err
    assert "time" not in res.out


def test_a_rank_whose_collectives_are_not_announced_ends_the_run_naming_why(tmp_path):
    """No start lines (the profiler does not announce): the rank's bytes wait, then the
    controller ends the run with the cause, and the runner names it; nothing hangs."""
    spec = make_spec("all_reduce", 4, minbytes="4K", maxbytes="4K", iters=1, warmup=0, check=1)
    with pytest.raises(RigRunError, match="no profiler start line announced it"):
        run_rig(RigJob([spec], 4, [0], announce=False, silence_s=1.0, timeout=120), tmp_path)


def test_rank_0s_unique_id_is_read_or_refused_in_one_line():
    uid = UniqueId(0xABC, SockAddr("127.0.0.1", 4242))
    assert read_uid(f"uid {uid.encode().hex()}\n") == uid
    for bad in ("", "uid", "uid zz", f"id {uid.encode().hex()}", "uid 00"):
        with pytest.raises(NeuronaBoxError, match="expected 'uid HEX'"):
            read_uid(bad)


def test_the_controller_process_names_a_bad_request(tmp_path):
    """Its own bad input: one line, exit 3, no port left open."""
    proc = subprocess.run([sys.executable, "-m", "neuronabox.controller.nccl_main", "--world", "4", "--real", "0,1,2,3",
                           "--profile", str(tmp_path / "p.fifo")], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)  # fmt: skip
    assert proc.returncode == 3 and "every rank is real" in proc.stderr.strip().splitlines()[-1], proc.stderr
