"""End to end: the stock torchrun, PyTorch and Gloo against the real controller."""

import pytest
from conftest import EXAMPLE, ROOT, SCRIPTS

from neuronabox.trace.records import load as load_trace

COLLECTIVES = str(SCRIPTS / "collectives.py")


@pytest.mark.parametrize("nnodes", [2, 3, 64, 512])  # 8 ranks: every toy of test_toys.py
def test_ddp_example_one_real_rank(run, nnodes, tmp_path):
    trace = tmp_path / "trace.json"
    res = run(
        "torchrun",
        "--nnodes",
        str(nnodes),
        "--nproc-per-node",
        "1",
        "--trace",
        str(trace),
        EXAMPLE,
        "--steps",
        "3",
        "--check-grads",
    )
    assert res.rc == 0, res.err[-3000:]
    assert res.out.count("grad check ok") == 3
    assert f"world size      {nnodes}" in res.out
    assert "optimizer steps 3" in res.out
    data = load_trace(trace)
    kinds = {i["kind"] for i in data["instances"]}
    assert {"allreduce", "allgather", "broadcast"} <= kinds
    assert all(i["boundary_messages"] > 0 for i in data["instances"])


@pytest.mark.parametrize("nnodes,data", [(32, "zeros"), (4, "mirror")])  # two ranks of 4, zeros: test_multihost
def test_ddp_example_two_real_ranks(run, nnodes, data):
    """The example checks every step's averaged gradient against its policy's prediction."""
    res = run(
        "torchrun", "--nnodes", str(nnodes), "--nproc-per-node", "2", "--data", data,
        EXAMPLE, "--steps", "3", "--check-grads",
    )  # fmt: skip
    assert res.rc == 0, res.err[-3000:]
    assert res.out.count("grad check ok") == 6
    assert "real ranks      0, 1" in res.out


@pytest.mark.parametrize(
    "nnodes,nproc,mode,real_nodes",
    [
        (2, 1, "auto", "0"),
        (5, 1, "full", "0"),
        (3, 2, "lazy", "0"),
        (13, 1, "lazy", "0"),
        (4, 1, "auto", "1"),
        (4, 1, "full", "0,2"),
    ],
)
def test_collective_values_follow_the_zero_policy(run, nnodes, nproc, mode, real_nodes):
    """Every byte a real rank sends lands where the schedule says: the allreduce result
    is the real ranks' own sum (offsets), and the engine checks every length. Real
    nodes anywhere: node 0 emulated (the controller hosts the store), two torchruns."""
    res = run(
        "torchrun",
        "--nnodes",
        str(nnodes),
        "--nproc-per-node",
        str(nproc),
        "--gloo-mode",
        mode,
        "--real-nodes",
        real_nodes,
        COLLECTIVES,
    )
    assert res.rc == 0, res.out[-2000:] + res.err[-3000:]
    assert res.out.count("all checks passed") == nproc * len(real_nodes.split(","))
    assert "Error waiting on exit barrier" not in res.err


def test_geometry_from_the_wire_alone(run):
    """Without the observer, allreduces whose segmentation the wire pins down still run exactly."""
    res = run("torchrun", "--nnodes", "4", "--no-observer", COLLECTIVES, "--sizes", "4096,65536", "--dtypes", "float32")
    assert res.rc == 0, res.out[-2000:] + res.err[-3000:]
    assert "all checks passed" in res.out
    assert "optimizer steps not observed (no observer)" in res.out


def test_a_script_without_an_optimizer_is_said_to_have_taken_no_step_not_to_lack_the_observer(run):
    res = run("torchrun", "--nnodes", "2", COLLECTIVES, "--sizes", "64", "--dtypes", "float32")
    assert res.rc == 0, res.out[-2000:] + res.err[-3000:]
    assert "optimizer steps not observed (the observer saw no optimizer.step())" in res.out


@pytest.mark.parametrize(
    "nnodes,real_nodes,elements",
    [(2, "0", "2359296,1310720,1400001"), (4, "0,2", "2359296,1400001"), (16, "3", "100,2359296")],
)
def test_a_ring_the_wire_leaves_open_is_sized_as_its_call_enters(run, tmp_path, nnodes, real_nodes, elements):
    """Full 1 MiB segments (and tiny ones at 16 ranks) do not say how many there are: the
    call's own note tells the controller, past point-to-point calls that move the group's
    sequence number but not Gloo's tag. With PyTorch's flight recorder off, the notes are
    the only source: the sizes the wire would guess are wrong (9 MiB in 10 segments, not 6),
    and the engine would reject the real rank's frames."""
    trace = tmp_path / "trace.json"
    res = run(
        "torchrun", "--nnodes", str(nnodes), "--real-nodes", real_nodes, "--trace", str(trace),
        str(SCRIPTS / "ring_sizes.py"), "--elements", elements,
        env={"TORCH_FR_BUFFER_SIZE": "0"},
    )  # fmt: skip
    assert res.rc == 0, res.out[-2000:] + res.err[-3000:]
    assert res.out.count("all checks passed") == len(real_nodes.split(","))
    rings = [i for i in load_trace(trace)["instances"] if i["kind"] in ("allreduce", "reduce")]
    assert len(rings) == 2 * 2 * len(elements.split(","))  # two iterations
    told = [i for i in rings if "(wire)" not in i["geometry"]]  # sizes only the call could tell
    assert len(told) >= 2 and all("(observer)" in i["geometry"] for i in told), [i["geometry"] for i in rings]
    assert {i["numel"] for i in told} <= set(map(int, elements.split(",")))


def test_a_call_with_a_buckets_first_segment_is_sized_by_its_own_note(run, tmp_path):
    """A DDP bucket's size is a standing answer, so a bucket seen before starts natively from
    its first frame; but a plain allreduce whose first segment is the bucket's (another
    last segment, or fewer segments) would start as the bucket. Its call's note, which
    comes before its frames, keeps it in Python: the note wins there, and every value is
    right (without that guard the run breaks at the first such call)."""
    trace = tmp_path / "trace.json"
    res = run("torchrun", "--nnodes", "2", "--trace", str(trace), str(SCRIPTS / "ddp_collide.py"), "4")
    assert res.rc == 0, res.out[-2000:] + res.err[-3000:]
    assert "all checks passed" in res.out
    rings = [i for i in load_trace(trace)["instances"] if i["kind"] == "allreduce" and i["nbytes"] > 1 << 20]
    assert [i["numel"] for i in rings] == [1_574_912, 1_574_911, 1_181_184] * 4
    calls = [i for i in rings if i["numel"] != 1_574_912]
    assert not any(i.get("native_start") for i in calls)


def test_a_told_size_that_does_not_fit_the_wire_is_asked_of_the_recorder(run, tmp_path):
    """A point-to-point call past ProcessGroup's Python methods (as a C++ caller's would be)
    moves the group's sequence number without the observer counting it: every size it tells
    afterwards carries the tag of the collective after it. Allreduces of different sizes one
    after another then each find the note of the one before: it does not fit their frames'
    segments, so the controller asks, the observer finds its own note does not fit either,
    and the flight recorder answers. The run completes with every value right, and no note
    starts a ring: its tag is not the one after the latest the real rank's frames carried."""
    trace = tmp_path / "trace.json"
    res = run(
        "torchrun", "--nnodes", "2", "--trace", str(trace), str(SCRIPTS / "ring_sizes.py"),
        "--elements", "2359296,1310720,2359296", "--no-reduce", "--past-p2p", "--repeat", "3",
    )  # fmt: skip
    assert res.rc == 0, res.out[-2000:] + res.err[-3000:]
    assert "all checks passed" in res.out
    rings = [i for i in load_trace(trace)["instances"] if i["kind"] == "allreduce"]
    assert len(rings) == 9 and all("(observer)" in i["geometry"] for i in rings), [i["geometry"] for i in rings]
    assert [i["numel"] for i in rings] == [2359296, 1310720, 2359296] * 3
    # Every note's tag is past its call's, and the frames show it: no ring starts on a note.
    assert not any(i.get("started_on_note") for i in rings), [i["numel"] for i in rings if i.get("started_on_note")]


@pytest.mark.parametrize("nnodes,real_nodes", [(2, "0"), (4, "0,2")])
def test_ddp_buckets_the_wire_leaves_open_are_sized_from_the_models_buckets(run, tmp_path, nnodes, real_nodes):
    """The MLP's DDP buckets (10.5 MB at the first step, then 4.2 and 6.3 MB) have segments
    the wire cannot count, and DDP's C++ reducer allreduces them past every Python function,
    so no call tells their sizes. The observer sends the model's buckets (the first
    iteration's and the rebuilt ones) and the controller takes the one whose ring has the
    segments the first frame carried. With the flight recorder off that is the only source; without it the
    wire's guess for the 6.3 MB bucket (6 segments, not 8) breaks the run. That answer stands
    for every instance with the same first frame, so a bucket seen before starts natively,
    as DDP's buckets must every step (with one real rank a third at least: a refit of the
    measured local work drops the starters now and then)."""
    trace = tmp_path / "trace.json"
    res = run(
        "torchrun", "--nnodes", str(nnodes), "--real-nodes", real_nodes, "--trace", str(trace),
        str(ROOT / "examples" / "mlp.py"), "--steps", "6",
        env={"TORCH_FR_BUFFER_SIZE": "0"},
    )  # fmt: skip
    assert res.rc == 0, res.out[-2000:] + res.err[-3000:]
    buckets = [i for i in load_trace(trace)["instances"] if i["kind"] == "allreduce" and i["nbytes"] > 1 << 20]
    told = [i for i in buckets if "(observer)" in i["geometry"]]  # the rest the wire pins down (4.2 MB at W = 4)
    assert len(told) >= 6 and all(i in told or "(wire)" in i["geometry"] for i in buckets), [
        (i["nbytes"], i["geometry"]) for i in buckets
    ]
    assert "skew            auto: the emulated ranks entered late by draws from the real rank's own" in res.out
    native = [i for i in told if i.get("native_start")]
    if real_nodes == "0":  # one real rank: its first frame is every instance's (with two, either may come first)
        assert 3 * len(native) >= len(told), [(i["nbytes"], i.get("native_start", False)) for i in told]
