"""Replay of real NCCL bytes: the rig's recordings (tests/fixtures/nccl/rig*/) and an H100's
(tests/fixtures/nccl/h100/: torch's ProcessGroupNCCL on the real driver) through every wire
fact scripts/nccl_verify.py checks.

The recordings are the wiretap's transcripts of the wheel's unmodified libnccl 2.28.9 run by
scripts/nccl_rig.py (2 and 4 ranks on one channel, 4 ranks on two), so what they hold is
NCCL's own bootstrap, allgathers, transport setup and Socket-net frames. The verifier feeds
them to the dialect's sans-IO layers (codecs, layouts, SetupResponder) and to NcclRing's
message sizes. The only fact the rig's cannot show is the c10d store key of the unique id: the
rig hands the id over a pipe, not a store; the H100's show it.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "nccl"
RECORDINGS = [FIXTURES / "rig", FIXTURES / "rig-2ch", FIXTURES / "h100"]


def verifier():
    spec = importlib.util.spec_from_file_location("nccl_verify", ROOT / "scripts" / "nccl_verify.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("nccl_verify", module)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("recording", RECORDINGS, ids=lambda p: p.name)
def test_every_wire_fact_passes_on_real_nccl_bytes_or_is_unseen_with_its_reason(recording: Path) -> None:
    v = verifier()
    tables, status = v.verify(recording, None)
    assert status == 0
    worlds = {head.split(":")[0].strip("= ") for head, _ in tables}
    assert worlds == {p.name for p in recording.iterdir() if p.is_dir()}
    for head, facts in tables:
        by_status = {f.name: f.status for f in facts}
        assert v.Status.FAIL not in by_status.values(), head
        unseen = [f for f in facts if f.status is v.Status.UNSEEN]
        if recording.name == "h100":  # torch's ProcessGroupNCCL put the id in the store
            assert unseen == [] and by_status["uid.store"] is v.Status.PASS, head
            assert "NVIDIA H100" in head and "torch 2.11.0+cu130" in head
        else:
            assert [f.name for f in unseen] == ["uid.store"], head
            assert "the unique id went through a pipe" in unseen[0].line()
        assert len(facts) == 21
        for name in ("setup.reply", "setup.entries", "net.sends", "net.recvs", "allgather.sizes", "rootreply.ring"):
            assert by_status[name] is v.Status.PASS, (head, name)


def test_the_recordings_hold_the_program_the_rig_ran_and_name_what_ran_it() -> None:
    result = json.loads((FIXTURES / "rig-2ch" / "w4" / "result.json").read_text())
    assert result["nccl"] == "2.28.9" and result["world"] == 4 and result["channels"] == 2
    kinds = {c["kind"] for c in result["checks"]}
    assert kinds == {"allreduce", "allgather", "reduce_scatter", "broadcast"}
    loaded = result["loaded"][0]
    assert loaded["libnccl.so.2"].endswith("nvidia/nccl/lib/libnccl.so.2")
    assert loaded["libcuda.so.1"].endswith("nccl_patch/build/rig/libcuda.so.1")


def test_a_program_that_differs_from_what_ran_fails_the_frame_sizes(tmp_path: Path) -> None:
    """The replay can fail: claim the 1 MiB float32 allreduce was 4 bytes larger."""
    copy = tmp_path / "rig"
    shutil.copytree(FIXTURES / "rig", copy)
    result_path = copy / "w4" / "result.json"
    result = json.loads(result_path.read_text())
    target = next(c for c in result["checks"] if c["kind"] == "allreduce" and c["bytes"] == 1 << 20)
    target["bytes"] += 4
    result_path.write_text(json.dumps(result))
    v = verifier()
    tables, status = v.verify(copy, None)
    assert status == 1
    failed = {f.name for head, facts in tables if head.startswith("== w4") for f in facts if f.status is v.Status.FAIL}
    assert failed == {"net.sends", "net.recvs"}
