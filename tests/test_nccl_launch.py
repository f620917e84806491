"""`neuronabox torchrun --backend nccl`: what it pins in the real ranks' NCCL, and the
setups it refuses in one line before anything starts."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from neuronabox.launcher.nccl_pins import NET_PLUGIN, PROFILER_PLUGIN, NcclPins, NcclSetupError, check_user_env

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train_ddp.py"


def test_the_pins_fix_every_choice_the_schedule_depends_on():
    env = NcclPins(world=512, algo="tree").env()
    assert env["NCCL_ALGO"] == "Tree" and env["NCCL_PROTO"] == "Simple"
    assert NcclPins(world=512, channels=2).env()["NCCL_MAX_NCHANNELS"] == "2"
    assert env["NCCL_MIN_NCHANNELS"] == env["NCCL_MAX_NCHANNELS"] == "1"
    assert env["NCCL_NET"] == "Socket" and env["NCCL_NET_PLUGIN"] == "none"
    assert env["NCCL_SOCKET_IFNAME"] == "lo" and env["NCCL_SOCKET_NTHREADS"] == "0"
    for off in ("NCCL_NVLS_ENABLE", "NCCL_COLLNET_ENABLE", "NCCL_PAT_ENABLE", "NCCL_RAS_ENABLE", "NCCL_OOB_NET_ENABLE"):
        assert env[off] == "0", off
    assert int(env["TORCH_NCCL_RANKS_PER_ROOT"]) >= 512  # one bootstrap root, whatever the world
    assert env["NCCL_PROFILER_PLUGIN"] == "none" and "NEURONABOX_NCCL_TRACE" not in env
    plugin = NcclPins(world=8, route="plugin", trace="/tmp/t.jsonl").env()
    assert plugin["NCCL_NET"] == "NeuronaBox" and plugin["NCCL_NET_PLUGIN"] == str(NET_PLUGIN)
    assert plugin["NCCL_PROFILER_PLUGIN"] == str(PROFILER_PLUGIN) and plugin["NEURONABOX_NCCL_TRACE"] == "/tmp/t.jsonl"
    assert "Ring/Simple, 1 channel(s)" in NcclPins(world=8).summary()


@pytest.mark.parametrize(
    "bad",
    [{"algo": "pat"}, {"channels": 0}, {"channels": 65}, {"route": "ib"}, {"algo": "tree", "channels": 2}],
)
def test_pins_outside_what_the_dialect_speaks_are_refused(bad):
    with pytest.raises(NcclSetupError):
        NcclPins(world=8, **bad)


@pytest.mark.parametrize(
    "var,value,cause",
    [("NCCL_ALGO", "CollNetDirect", "is not spoken by the NCCL dialect (spoken: Ring, Tree)"),
     ("NCCL_ALGO", "PAT", "is not spoken"), ("NCCL_PROTO", "LL128", "is not spoken"),
     ("NCCL_ALGO", "Tree", "contradicts the launcher's pin NCCL_ALGO=Ring; use --nccl-algo instead"),
     ("NCCL_NET", "IB", "contradicts the launcher's pin NCCL_NET=Socket; use --nccl-route instead"),
     ("NCCL_NVLS_ENABLE", "1", "contradicts the launcher's pin NCCL_NVLS_ENABLE=0; unset it"),
     ("NCCL_COMM_ID", "10.0.0.1:5000", "is not spoken by the NCCL dialect (it moves the bootstrap root"),
     ("TORCH_NCCL_RANKS_PER_ROOT", "4", "contradicts the launcher's pin TORCH_NCCL_RANKS_PER_ROOT=128")],
)  # fmt: skip
def test_a_choice_the_user_forced_is_refused_naming_it(var, value, cause):
    pins = NcclPins(world=8)
    with pytest.raises(NcclSetupError, match=re.escape(f"{var}={value} {cause}")):
        check_user_env({var: value}, pins)
    # what agrees with the pins, or is the user's own business, passes
    check_user_env({"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple", "NCCL_DEBUG": "INFO", "NCCL_NET": "Socket"}, pins)
    check_user_env({"TORCH_NCCL_RANKS_PER_ROOT": "100000"}, pins)
    check_user_env({"NCCL_ALGO": "Tree"}, NcclPins(world=8, algo="tree"))


def run_launcher(*flags: str, env_extra: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, **(env_extra or {})}
    cmd = [sys.executable, "-m", "neuronabox.cli", "torchrun", "--nnodes", "8", *flags, str(EXAMPLE), "--steps", "1"]
    start = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120, cwd=ROOT)
    return out, time.monotonic() - start


def test_the_launcher_refuses_an_nccl_setup_in_one_line_before_starting_anything():
    """On this machine's torch (CPU) there is no NCCL: one line, exit 2, nothing started.
    (On a CUDA torch the same command runs; `--device cpu` runs it on the rig, in
    tests/test_nccl_torchrun.py.)"""
    out, took = run_launcher("--backend", "nccl")
    if out.returncode == 0:
        pytest.skip("this torch has NCCL and a GPU: the run went ahead")
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("neuronabox: error: "), out.stderr
    assert any(s in lines[0] for s in ("has no NCCL", "is not spoken"))
    assert "controller" not in out.stdout
    assert took < 110


@pytest.mark.parametrize(
    "flags,env,cause",
    [
        (["--backend", "nccl"], {"NCCL_ALGO": "CollNetChain"}, "NCCL_ALGO=CollNetChain is not spoken"),
        (["--backend", "nccl", "--nccl-algo", "pat"], {}, "--nccl-algo is ring or tree"),
        (["--backend", "mpi"], {}, "--backend is gloo or nccl"),
        (["--nccl-channels", "2"], {}, "--nccl-channels needs --backend nccl"),
        (["--backend", "nccl", "--nccl-channels", "two"], {}, "--nccl-channels takes a whole number"),
        (["--device", "cpu"], {}, "--device picks where NCCL runs; it needs --backend nccl"),
        (["--backend", "nccl", "--device", "tpu"], {}, "--device is cuda or cpu (the rig), got 'tpu'"),
        (["--backend", "nccl", "--nccl-algo", "tree"], {}, "--nccl-algo tree: the live controller plays NCCL's Ring"),
        (["--backend", "nccl", "--nccl-route", "plugin"], {}, "--nccl-route plugin: the live controller plays NCCL's"),
        (["--backend", "nccl", "--data", "mirror"], {}, "--data mirror is Gloo's"),
        (["--backend", "nccl", "--skew", "auto"], {}, "--skew is drawn by the Gloo dialect's timelines"),
    ],
)
def test_bad_nccl_flags_are_one_line_usage_errors(flags, env, cause):
    out, _ = run_launcher(*flags, env_extra=env)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"neuronabox: error: {cause}"), out.stderr


def test_the_recorder_refuses_a_machine_without_nccl_in_one_line(tmp_path):
    """scripts/nccl_record.py makes the GPU session's transcripts; on a CPU torch it
    stops at once, naming why, and records nothing."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "nccl_record.py"), "--out", str(tmp_path / "rec")],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    if "has no NCCL" not in out.stderr:
        pytest.skip("this torch has NCCL: the recorder runs for real here")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "rec").exists()
