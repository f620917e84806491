"""The complete Gloo dialect, end to end: every collective ProcessGroupGloo runs on
CPU tensors, in the default group and in subgroups, with real ranks anywhere."""

import os
import re
import subprocess
import sys

import pytest
from conftest import SCRIPTS

EVERY = str(SCRIPTS / "every_collective.py")


@pytest.mark.parametrize(
    "nnodes,nproc,real,data",
    [
        # A larger power of two (4 one-rank nodes is 32's shape, smaller): two neighbours, under
        # both policies (the suite's time keeps one of each shape; rank 0 alone at 64 and 512 is
        # test_live's, and the odd world is the 1,5 case below, whose two real ranks are each
        # alone among emulated neighbours, as a lone real rank is).
        (32, 1, "0,1", "zeros"),
        (32, 1, "0,1", "mirror"),
        # Ranks 1 and 5 of 2-rank nodes (started without torchrun), and of 1-rank nodes (the
        # odd world; at 32 the same two ranks added nothing the shapes above miss): one policy
        # each, the other policy's values checked on the same schedules above.
        (4, 2, "1,5", "mirror"),
        (7, 1, "1,5", "zeros"),
    ],
)
def test_every_collective_gets_the_policy_values(run, nnodes, nproc, real, data):
    res = run(
        "torchrun", "--nnodes", str(nnodes), "--nproc-per-node", str(nproc), "--real-ranks", real,
        "--data", data, EVERY,
    )  # fmt: skip
    assert res.rc == 0, res.out[-2000:] + res.err[-3000:]
    assert res.out.count("all checks passed") == len(real.split(","))
    for kind in ("reduce", "gather", "scatter", "alltoall", "send", "recv", "allreduce", "broadcast"):
        assert re.search(rf"^\s+{kind}\s+\d+\s", res.out, re.M), kind  # the summary counts every kind


@pytest.mark.parametrize(
    "flags,cause",
    [
        (["--real-ranks", "1,9"], "--real-ranks names rank 9, outside the emulated world of 4 ranks"),
        (["--real-ranks", "1", "--real-nodes", "0"], "give --real-ranks or --real-nodes, not both"),
        (["--data", "ones"], "--data is zeros or mirror, got 'ones'"),
        (["--data", "mirror", "--no-observer"], "--data mirror needs the observer"),
    ],
)
def test_bad_rank_and_data_flags_exit_2_with_one_line(run, flags, cause):
    res = run("torchrun", "--nnodes", "4", *flags, EVERY)
    assert res.rc == 2
    assert cause in res.last_error


@pytest.mark.parametrize(
    "data,real,hook,ratio",
    [
        ("zeros", "0", [], 1 / 8),
        ("mirror", "0", ["--own-hook"], 1.0),  # mirror without the hook: rank 3's case below
        # Rank 0 emulated: DDP's construction broadcasts (metadata check, state sync) come
        # back as the real rank's own, so its model survives.
        ("zeros", "1", [], 1 / 8),
        ("mirror", "3", [], 1.0),
    ],
)
def test_ddp_gradients_follow_the_data_policy(run, data, real, hook, ratio):
    """Averaged over 8 ranks, DDP's gradient is the real rank's own under mirror (every
    emulated rank contributed the same) and an eighth of it under zeros; a script's own
    comm hook (fp16 compression) is mirrored through the collectives it calls."""
    res = run("torchrun", "--nnodes", "8", "--real-ranks", real, "--data", data, str(SCRIPTS / "ddp_grads.py"), *hook)
    assert res.rc == 0, res.out[-2000:] + res.err[-3000:]
    assert f"rank {real}: model kept through DDP construction: True" in res.out
    got = float(re.search(rf"rank {real}: grad ratio ([0-9.]+)", res.out).group(1))
    assert got == pytest.approx(ratio, rel=5e-3 if hook else 1e-5)  # the hook sends fp16
    if data == "mirror" and not hook:  # one SGD step on the DDP copy lands where the local copy's does
        gap = float(re.search(r"max \|param - local\| = ([0-9.e+-]+)", res.out).group(1))
        assert gap < 1e-6


def test_ddp_bucket_rebuild_with_rank0_emulated(run):
    """At the second forward DDP's reducer rebuilds its buckets and takes rank 0's (two
    broadcasts from inside C++). With rank 0 emulated the controller answers with the
    buckets the real rank computes itself: the same as an all-real run's."""
    script = str(SCRIPTS / "ddp_rebuild.py")
    ref = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", script],
        capture_output=True, text=True, timeout=240, env=dict(os.environ, GLOO_SOCKET_IFNAME="lo"),
    )  # fmt: skip
    want = re.search(r"rank 0: rebuilt bucket sizes ([0-9, ]+) loss", ref.stdout)
    assert want, ref.stdout[-2000:] + ref.stderr[-2000:]
    res = run("torchrun", "--nnodes", "4", "--real-ranks", "1", script)
    assert res.rc == 0, res.out[-2000:] + res.err[-3000:]
    assert f"rank 1: rebuilt bucket sizes {want.group(1)} loss" in res.out
