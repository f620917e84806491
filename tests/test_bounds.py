"""Bounds on what the tool reads, writes and accepts: a file that is not a trace, an output
that would overwrite an input, and worlds out of range end in one line and exit 2, within
seconds, before anything grows or starts (issue "Reliability under faults and bad input")."""

import json
from pathlib import Path

import pytest
from conftest import EXAMPLE
from test_cli_input import usage_error

from neuronabox.limits import MAX_WORLD
from neuronabox.trace.records import FORMAT, MAX_LINE_BYTES, VERSION


def minimal_trace(path: Path, nnodes: int = 4) -> Path:
    header = {"format": FORMAT, "version": VERSION, "world_size": nnodes, "nnodes": nnodes, "nproc_per_node": 1,
              "real_ranks": [0]}
    path.write_text(json.dumps(header) + "\n")
    return path


@pytest.mark.parametrize("cmd", [("export", "--format", "nccl-tests"), ("simulate",)])
def test_a_device_is_not_read_as_a_trace(run, cmd):
    cause = usage_error(run(cmd[0], "/dev/zero", *cmd[1:], timeout=60))
    assert cause == "/dev/zero: not a regular file, so not a trace"


def test_a_line_past_the_bound_ends_the_read_instead_of_growing_it(run, tmp_path):
    huge = tmp_path / "one-line.jsonl"
    with open(huge, "wb") as f:
        f.truncate(MAX_LINE_BYTES + 4096)  # zeros, no newline: what /dev/full gives back
    cause = usage_error(run("export", str(huge), "--format", "nccl-tests", timeout=60))
    assert cause == f"{huge}: line 1 is longer than {MAX_LINE_BYTES >> 20} MiB: not a trace, or a damaged one"


@pytest.mark.parametrize("target", ["/dev/null", "/proc/version", "/dev/stdout"])
def test_the_trace_is_a_regular_file(run, target):
    cause = usage_error(run("torchrun", "--nnodes", "2", "--trace", target, EXAMPLE, timeout=60))
    assert cause == f"--trace {target}: not a regular file"


def test_the_trace_never_overwrites_the_script(run, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(Path(EXAMPLE).read_text())
    before = script.read_bytes()
    cause = usage_error(run("torchrun", "--nnodes", "2", "--trace", str(script), str(script), timeout=60))
    assert cause == f"--trace {script} is {script}, which the run reads; choose another file"
    assert script.read_bytes() == before


def test_a_simulation_never_overwrites_its_recording(run, tmp_path):
    rec = minimal_trace(tmp_path / "rec.jsonl")
    before = rec.read_bytes()
    cause = usage_error(run("simulate", str(rec), "--trace", str(rec), timeout=60))
    assert cause == f"--trace {rec} is the recording being replayed; choose another file"
    assert rec.read_bytes() == before


@pytest.mark.parametrize(("flags", "cause"), [
    (("--nnodes", "0"), "--nnodes and --nproc-per-node must be at least 1, got 0 and 1"),
    (("--nproc-per-node", "0"), "--nnodes and --nproc-per-node must be at least 1, got 4 and 0"),
    (("--nnodes", "100000000"), f"a world of 100000000 ranks is past the largest the tool runs ({MAX_WORLD})"),
])  # fmt: skip
def test_a_simulated_world_out_of_range_is_refused_before_it_grows(run, tmp_path, flags, cause):
    rec = minimal_trace(tmp_path / "rec.jsonl")
    assert usage_error(run("simulate", str(rec), *flags, timeout=60)) == cause


def test_a_launched_world_out_of_range_is_refused_before_anything_starts(run):
    cause = usage_error(run("torchrun", "--nnodes", str(MAX_WORLD + 1), EXAMPLE, timeout=60))
    assert cause == f"a world of {MAX_WORLD + 1} ranks is past the largest the tool runs ({MAX_WORLD})"


def test_a_link_planted_at_the_registrys_temporary_name_is_not_followed(tmp_path, monkeypatch):
    import os

    from neuronabox.launcher import registry

    runs = tmp_path / "runs"
    runs.mkdir(mode=0o700)
    monkeypatch.setattr(registry, "RUNS_DIR", runs)
    victim = tmp_path / "victim"
    victim.write_text("mine")
    for stem in ("latest", str(os.getpid())):  # the names a local stranger can predict
        (runs / f"{stem}.{os.getpid()}.tmp").symlink_to(victim)
    assert registry.enter({"control": "127.0.0.1:1", "token": "secret", "pid": os.getpid()})
    assert victim.read_text() == "mine"
    latest = runs / "latest.json"
    assert not latest.is_symlink() and json.loads(latest.read_text())["token"] == "secret"
    assert oct(latest.stat().st_mode & 0o777) == oct(0o600)


@pytest.mark.parametrize("how", ["another user's", "open to all"])
def test_a_registry_folder_that_is_not_this_users_own_is_neither_written_nor_trusted(tmp_path, monkeypatch, capsys,
                                                                                     how):  # fmt: skip
    import os

    from neuronabox.cli import status
    from neuronabox.launcher import registry

    runs = tmp_path / "runs"
    runs.mkdir(mode=0o700)
    planted = {"control": "127.0.0.1:9", "token": "stolen?", "pid": os.getpid()}
    (runs / f"{os.getpid()}.json").write_text(json.dumps(planted))
    if how == "another user's":
        if os.getuid() != 0:
            pytest.skip("making a folder another user's needs root")
        os.chown(runs, 65534, 65534)
    else:
        runs.chmod(0o777)
    monkeypatch.setattr(registry, "RUNS_DIR", runs)
    assert status.live_runs() == []
    assert not registry.enter({"control": "127.0.0.1:1", "token": "secret", "pid": os.getpid()})
    assert "the run is not listed for status and inject" in capsys.readouterr().err
    assert not (runs / "latest.json").exists()


@pytest.mark.parametrize(("out", "cause"), [
    ("{tmp}/missing/x.json", "--out {tmp}/missing/x.json: no folder '{tmp}/missing' to write into"),
    ("/dev/full", "--out /dev/full: not a regular file"),
    ("{tmp}", "--out {tmp}: is a folder"),
])  # fmt: skip
def test_an_export_that_cannot_be_written_is_refused_before_any_work(run, tmp_path, out, cause):
    rec = minimal_trace(tmp_path / "rec.jsonl")
    out = out.format(tmp=tmp_path)
    assert usage_error(run("export", str(rec), "--format", "chrome", "--out", out, timeout=60)) == cause.format(
        tmp=tmp_path)


def test_a_negative_sample_is_refused(run, tmp_path):
    rec = minimal_trace(tmp_path / "rec.jsonl")
    cause = usage_error(run("export", str(rec), "--format", "chrome", "--sample-emulated", "-5", timeout=60))
    assert cause == "--sample-emulated is 0 or more, got -5"


def test_a_simulated_trace_that_cannot_be_written_is_refused(run, tmp_path):
    rec = minimal_trace(tmp_path / "rec.jsonl")
    cause = usage_error(run("simulate", str(rec), "--trace", str(tmp_path / "no" / "out.jsonl"), timeout=60))
    assert cause == f"--trace {tmp_path}/no/out.jsonl: no folder '{tmp_path}/no' to write into"


def test_a_sweep_that_cannot_write_its_table_is_refused_before_any_run(run, tmp_path):
    import tempfile

    before = set(Path(tempfile.gettempdir()).glob("neuronabox-sweep-*"))
    prefix = tmp_path / "no" / "sweep"
    cause = usage_error(run("whatif", "--sweep", "latency=0,1ms", "--out", str(prefix), "--nnodes", "2", "--", EXAMPLE,
                            timeout=60))  # fmt: skip
    assert cause == f"--out {prefix}.csv: no folder '{prefix.parent}' to write into"
    assert set(Path(tempfile.gettempdir()).glob("neuronabox-sweep-*")) == before


@pytest.mark.parametrize(("record", "cause"), [
    ({"instance": {"kind": "allreduce"}}, "instance 0 has no str 'group': a damaged trace"),
    ({"instance": {"kind": "allreduce", "group": "0", "seq": 0, "world": 4, "nbytes": 8, "per_rank": {"0": 1}}},
     "instance 0 has a malformed span for rank 0: a damaged trace"),
    ({"group": {"name": "1"}}, "a malformed group record: a damaged trace"),
    (["not", "a", "record"], "line 2 is not a trace record"),
])  # fmt: skip
def test_a_damaged_record_is_one_line_not_a_traceback(run, tmp_path, record, cause):
    rec = minimal_trace(tmp_path / "rec.jsonl")
    with open(rec, "a") as f:
        f.write(json.dumps(record) + "\n")
    for cmd in (("export", str(rec), "--format", "nccl-tests"), ("simulate", str(rec))):
        assert usage_error(run(*cmd, timeout=60)) == f"{rec}: {cause}"


def test_inject_without_an_address_means_the_one_live_run_not_the_latest_entry(tmp_path, monkeypatch, capsys):
    import os

    from neuronabox.cli import status
    from neuronabox.launcher import registry

    runs = tmp_path / "runs"
    runs.mkdir(mode=0o700)
    monkeypatch.setattr(registry, "RUNS_DIR", runs)
    dead = 2**22 + 12345  # past pid_max's default: no process has it
    older = {"control": "127.0.0.1:1001", "pid": os.getpid(), "token": "t1"}
    ended = {"control": "127.0.0.1:1002", "pid": dead, "token": "t2"}
    (runs / f"{os.getpid()}.json").write_text(json.dumps(older))
    (runs / "latest.json").write_text(json.dumps(ended))  # the last started, and gone
    assert status._control_address(None) == "127.0.0.1:1001"
    second = {"control": "127.0.0.1:1003", "pid": os.getppid(), "token": "t3"}
    (runs / f"{os.getppid()}.json").write_text(json.dumps(second))
    assert status._control_address(None) is None
    assert "2 runs are live" in capsys.readouterr().err


@pytest.mark.parametrize(("spec", "why"), [
    ("straggler=rank:0,delay=1ms", "(0..3, not real rank 0)"),
    ("straggler=rank:99999,delay=1ms", "(0..3, not real rank 0)"),
])  # fmt: skip
def test_a_straggler_is_an_emulated_rank_for_the_launcher_and_the_simulation_alike(run, tmp_path, spec, why):
    want = f"--inject '{spec}': a straggler must be an emulated rank of the world {why}"
    assert usage_error(run("torchrun", "--nnodes", "4", "--inject", spec, EXAMPLE, timeout=60)) == want
    rec = minimal_trace(tmp_path / "rec.jsonl")
    assert usage_error(run("simulate", str(rec), "--inject", spec, timeout=60)) == want


def test_the_straggler_check_is_one_rule():
    """One rule for every caller (a live run's Inject call: tests/test_timing_live.py)."""
    from neuronabox.delay_models.whatif import WhatIf, WhatIfError

    with pytest.raises(WhatIfError, match="a straggler must be an emulated rank of the world"):
        WhatIf.from_specs(["straggler=rank:2,delay=1ms"]).check(8, [0, 2])
    WhatIf.from_specs(["straggler=rank:3,delay=1ms"]).check(8, [0, 2])
