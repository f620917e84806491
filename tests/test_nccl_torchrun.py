"""`neuronabox torchrun --backend nccl` end to end on the rig: the stock torchrun, its
agents and store, the wheel's unmodified libnccl in the real ranks (on the rig's driver:
what is emulated here is the CUDA driver and NCCL's kernels, as CPU code), and the
controller playing the emulated ranks of the default group's communicator.

torch's CPU build has no ProcessGroupNCCL, so the ranks' script does ProcessGroupNCCL's
store step itself (tests/scripts/nccl_store_allreduce.py: key "0" of the default group's
"cuda" store, through torch's own store classes); the controller finds the id there, or
puts its own there when rank 0 is emulated, exactly as under a CUDA torch.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from neuronabox.trace import inspector, records

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "nccl_store_allreduce.py"


def torchrun(tmp_path: Path, *flags: str, counts=(300, 100_000)) -> tuple[subprocess.CompletedProcess, dict]:
    trace = tmp_path / "trace.jsonl"
    cmd = [sys.executable, "-m", "neuronabox.cli", "torchrun", "--backend", "nccl", "--device", "cpu",
           "--trace", str(trace), *flags, str(SCRIPT), *map(str, counts)]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return out, records.load(trace)


@pytest.mark.parametrize(
    "flags,real",
    [
        # rank 0 emulated: the controller is NCCL's root and puts its unique id in torch's store;
        # two real ranks far apart, two channels
        (["--nnodes", "8", "--real-nodes", "2,5", "--nccl-channels", "2"], [2, 5]),
        # rank 0 real: its id read from the store; a real node of two ranks (a block of the
        # ring), each its own NCCL node though torchrun gives them one environment
        (["--nnodes", "4", "--nproc-per-node", "2", "--real-nodes", "0"], [0, 1]),
    ],
    ids=["root-emulated", "root-real"],
)
def test_torchrun_plays_the_emulated_ranks_of_an_nccl_communicator(tmp_path, flags, real):
    out, doc = torchrun(tmp_path, *flags)
    for r in real:  # each real rank checked every element against the real ranks' sum
        assert f"ok {r}" in out.stdout, out.stdout[-2000:]
    world = doc["world_size"]
    assert doc["backend"] == "nccl" and doc["nccl"] and doc["real_ranks"] == real
    insts = doc["instances"]
    assert [i["kind"] for i in insts] == ["allreduce", "allreduce"]
    assert [i["numel"] for i in insts] == [300, 100_000]
    # NCCL trims a small collective to fewer channels (16 KiB per channel at least)
    channels = [1, 2] if "--nccl-channels" in flags else [1, 1]
    assert [i["geometry"] for i in insts] == [f"nccl RING/SIMPLE {k}ch" for k in channels]
    for inst in insts:  # every real rank took part, and the model priced the collective
        assert sorted(map(int, inst["per_rank"])) == real and inst["model_us"] > 0
        assert inst["world"] == world
    assert doc["complete"] and doc["state"] == "stopped" and doc["stopped_because"] == "job finished"
    assert "allreduce" in out.stdout  # the summary's per-kind table
    # An NCCL trace in the Inspector's form: NCCL's own collective names, a row per real rank.
    rows = list(inspector.records(doc))
    assert [r["coll_perf"]["coll"] for r in rows] == ["AllReduce"] * 2 * len(real)
    assert {r["header"]["rank"] for r in rows} == set(real) and rows[-1]["coll_perf"]["coll_msg_size_bytes"] == 400_000


def test_a_script_that_makes_a_gloo_group_under_backend_nccl_ends_the_run_naming_it():
    """Its ranks would wait for emulated Gloo peers that nobody plays: the controller sees
    the Gloo record in the store and ends the run at once, with the cause in one line."""
    cmd = [sys.executable, "-m", "neuronabox.cli", "torchrun", "--nnodes", "4", "--backend", "nccl", "--device", "cpu",
           str(ROOT / "examples" / "train_ddp.py"), "--steps", "1"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode != 0
    errors = [line for line in out.stderr.splitlines() if line.startswith("neuronabox: error: ")]
    assert len(errors) == 1 and "real rank 0 made its default process group with Gloo" in errors[0], out.stderr


def test_every_rank_real_is_the_baseline_the_controller_only_keeps_the_store_for(tmp_path):
    """The all-real run of the same script (what emulation is measured against): NCCL's ranks
    reach one another, the controller plays no communicator and sees no collective."""
    out, doc = torchrun(tmp_path, "--nnodes", "2", "--real-nodes", "0,1", counts=(300,))
    assert "ok 0" in out.stdout and "ok 1" in out.stdout, out.stdout[-2000:]
    assert doc["real_ranks"] == [0, 1] and doc["instances"] == []
    assert doc["complete"] and doc["stopped_because"] == "job finished"
