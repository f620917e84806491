"""Toy training jobs of the usual parallel shapes, end to end: FSDP2, pipeline
parallel over send/recv with a data-parallel group per stage, and tensor x data
parallel on a 2-D device mesh. Each trains a few steps and checks its own loose
properties (finite losses, parameters that move); every real rank must finish."""

import re

import pytest
from conftest import SCRIPTS


@pytest.mark.parametrize(
    "script,nnodes,nproc,real,args",
    [
        # FSDP2 over the whole world, rank 0 real: every allgather and reduce-scatter crosses the boundary.
        ("fsdp_toy.py", 8, 1, "0", []),
        # 4 stages x 2 replicas, stage-major (stage s holds ranks 2s, 2s+1): one real rank per stage, with
        # real<->real p2p (0->2, 5->7), real<->emulated p2p (2<->4, 3<->5) and one real rank per dp group;
        # 4 ranks a node, so each real rank is started without an agent (partly real nodes).
        ("pipeline_toy.py", 2, 4, "0,2,5,7", []),
        # dp 4 x tp 2 on init_device_mesh: one real rank, then real ranks in two dp replicas (and at
        # 2 ranks a node, partly real nodes).
        ("tp_dp_toy.py", 8, 1, "0", []),
        ("tp_dp_toy.py", 4, 2, "0,3", []),
        # The same groups built by hand with dist.new_group, real ranks sharing a tp group.
        ("tp_dp_toy.py", 8, 1, "0,1", ["--groups", "new_group"]),
    ],
    ids=["fsdp-8x1-r0", "pipeline-2x4-r0,2,5,7", "tp_dp-8x1-r0", "tp_dp-4x2-r0,3", "tp_dp_new_group-8x1-r0,1"],
)
def test_toy_trains_under_the_emulator(run, script, nnodes, nproc, real, args):
    res = run(
        "torchrun", "--nnodes", str(nnodes), "--nproc-per-node", str(nproc), "--real-ranks", real,
        str(SCRIPTS / script), *args,
    )  # fmt: skip
    assert res.rc == 0, res.out[-2000:] + res.err[-3000:]
    for r in real.split(","):
        assert re.search(rf"rank {r}: (stage \d+ )?toy trained", res.out), f"rank {r} did not finish: {res.out[-2000:]}"
    assert "CHECK FAILED" not in res.out
