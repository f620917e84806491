"""The complete Gloo dialect, end to end: every collective ProcessGroupGloo runs on
CPU tensors, in the default group and in subgroups, with real ranks anywhere."""

import pytest
from conftest import SCRIPTS

EVERY = str(SCRIPTS / "every_collective.py")


@pytest.mark.parametrize(
    "nnodes,nproc,real",
    [
        (4, 1, "0"),
        (4, 1, "0,1"),
        (7, 1, "0"),
        (7, 1, "0,1"),
        (32, 1, "0"),
        (32, 1, "0,1"),
        # Ranks 1 and 5 of 2-rank nodes (started without torchrun), and of 1-rank nodes.
        (4, 2, "1,5"),
        (7, 1, "1,5"),
        (32, 1, "1,5"),
    ],
)
def test_every_collective_gets_the_zero_policy_values(run, nnodes, nproc, real):
    res = run("torchrun", "--nnodes", str(nnodes), "--nproc-per-node", str(nproc), "--real-ranks", real, EVERY)
    assert res.rc == 0, res.out[-2000:] + res.err[-3000:]
    assert res.out.count("all checks passed") == len(real.split(","))
    for kind in ("reduce", "gather", "scatter", "alltoall", "send", "recv", "allreduce", "broadcast"):
        assert f"\n                  {kind} " in res.out, kind  # the summary counts every kind


@pytest.mark.parametrize(
    "flags,cause",
    [
        (["--real-ranks", "1,9"], "--real-ranks names rank 9, outside the emulated world of 4 ranks"),
        (["--real-ranks", "1", "--real-nodes", "0"], "give --real-ranks or --real-nodes, not both"),
        (["--data", "mirror"], "--data mirror is not available yet"),
    ],
)
def test_bad_rank_and_data_flags_exit_2_with_one_line(run, flags, cause):
    res = run("torchrun", "--nnodes", "4", *flags, EVERY)
    assert res.rc == 2
    assert cause in res.last_error
