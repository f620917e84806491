"""Bounds on what the tool reads, writes and accepts: a file that is not a trace, an output
that would overwrite an input, and worlds out of range end in one line and exit 2, within
seconds, before anything grows or starts (issue "Reliability under faults and bad input")."""

import json
import time
from pathlib import Path

import pytest
from conftest import EXAMPLE, SCRIPTS, Live
from test_cli_input import usage_error

import neuronabox
from neuronabox.launcher.api import job_of
from neuronabox.launcher.torchrun_args import UsageError
from neuronabox.limits import MAX_REAL_RANKS, MAX_WORLD
from neuronabox.trace.records import FORMAT, MAX_LINE_BYTES, VERSION, TraceBusy, TraceWriter, being_written, load

WAITER = str(SCRIPTS / "allreduce_then_wait.py")  # one allreduce, then waits for the file it is given


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


def real_ranks_refused(count: int) -> str:
    return (f"{count} real ranks is past the most the tool starts ({MAX_REAL_RANKS}, each a process of its own); "
            "give fewer with --nproc-per-node, --real-nodes or --real-ranks")  # fmt: skip


def test_more_real_ranks_than_the_bound_are_refused_before_anything_starts(run):
    cause = usage_error(run("torchrun", "--nnodes", "2", "--nproc-per-node", "100000", EXAMPLE, timeout=60))
    assert cause == real_ranks_refused(100000)


def test_the_real_rank_bound_is_one_rule_for_whole_nodes_and_single_ranks():
    with pytest.raises(UsageError) as nodes:
        job_of(EXAMPLE, nnodes=4, nproc_per_node=512, real_nodes="0,1,2")
    assert str(nodes.value) == real_ranks_refused(1536)
    ranks = ",".join(map(str, range(0, 2 * (MAX_REAL_RANKS + 1), 2)))  # one of each node's two: started directly
    with pytest.raises(UsageError) as direct:
        job_of(EXAMPLE, nnodes=MAX_REAL_RANKS + 1, nproc_per_node=2, real_ranks=ranks)
    assert str(direct.value) == real_ranks_refused(MAX_REAL_RANKS + 1)
    assert len(job_of(EXAMPLE, nnodes=2, nproc_per_node=MAX_REAL_RANKS).real_ranks) == MAX_REAL_RANKS


@pytest.mark.parametrize(("flag", "cause"), [
    ("--bogus-flag", "unknown flag --bogus-flag: neither torchrun's nor neuronabox's"),
    ("--nproc", "unknown flag --nproc: neither torchrun's nor neuronabox's; did you mean --nproc-per-node?"),
    ("--delay_model", "unknown flag --delay_model: neither torchrun's nor neuronabox's; did you mean --delay-model?"),
])  # fmt: skip
def test_an_unknown_flag_is_refused_before_anything_starts(run, flag, cause):
    assert usage_error(run("torchrun", "--nnodes", "2", flag, "1", EXAMPLE, timeout=60)) == cause


def test_the_api_refuses_an_unknown_option_as_a_usage_error():
    with pytest.raises(UsageError, match="^unknown flag --bogus-flag: neither torchrun's nor neuronabox's$"):
        neuronabox.launch(EXAMPLE, nnodes=2, bogus_flag=1)


def test_every_flag_of_this_torchrun_is_known_to_the_launcher():
    """The launcher refuses a flag it does not know without importing torch (seconds):
    its list is held here to the parser of the torch installed."""
    from torch.distributed.run import get_args_parser

    from neuronabox.launcher.torchrun_args import REFUSED, parse

    for action in get_args_parser()._actions:
        for flag in action.option_strings:
            if flag in ("-h", "--help") or flag in REFUSED:  # --standalone: refused with a reason
                continue
            value = [] if action.nargs == 0 else ["1"]
            parse([flag, *value, "x.py"], environ={})  # no UsageError


def test_the_trace_has_one_writer_at_a_time(tmp_path):
    path = tmp_path / "trace.jsonl"
    first = TraceWriter(path, {"world_size": 2})
    assert being_written(path)
    with pytest.raises(TraceBusy):
        TraceWriter(path, {"world_size": 3})
    first.close({"state": "stopped"})
    assert not being_written(path)
    assert path.read_text().count("\n") == 2 and '"world_size":2' in path.read_text()  # the first writer's, whole


def test_a_run_refuses_a_trace_another_run_is_writing(run, tmp_path):
    go, trace = tmp_path / "go", tmp_path / "shared.jsonl"
    first = Live("torchrun", "--nnodes", "2", "--no-observer", "--trace", str(trace), WAITER, str(go))
    try:
        deadline = time.monotonic() + 60
        while not trace.exists() and first.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)  # the first run's controller has opened (and locked) its trace
        second = run("torchrun", "--nnodes", "2", "--trace", str(trace), WAITER, WAITER, timeout=60)
        assert usage_error(second) == f"--trace {trace} is being written by another run"
        go.touch()
        assert first.finish(timeout=60) == 0, first.err[-2000:]
    finally:
        go.touch()
        first.stop()
    doc = load(trace)  # the first run's, whole
    assert doc["complete"] and doc["stopped_because"] == "job finished" and len(doc["instances"]) == 1


def test_a_trace_taken_after_the_launcher_looked_ends_the_run_at_its_start(tmp_path):
    """The launcher's look and the controller's lock are seconds apart: a run that takes
    the trace in between keeps it whole, and this one stops before its script starts (the
    agent, started beside the controller, never gets past the store)."""
    import shutil

    from neuronabox.launcher.run import LaunchError, Run

    trace = tmp_path / "shared.jsonl"
    started = tmp_path / "script-started"
    script = tmp_path / "marks_its_start.py"
    script.write_text("import sys\nopen(sys.argv[1], 'w').close()\n")
    job = job_of(script, str(started), nnodes=2, trace=str(trace))
    other = TraceWriter(trace, {"world_size": 9})  # the other run, between the look and the start
    run = Run(job)
    try:
        with pytest.raises(LaunchError, match=f"^controller exited at start: --trace {trace} is being written by"):
            run.execute()
        run.cleanup()
        assert not started.exists()
    finally:
        run.cleanup()
        shutil.rmtree(run.dir, ignore_errors=True)
        other.close({"state": "stopped"})
    assert load(trace)["world_size"] == 9


def test_the_api_refuses_an_output_in_a_missing_folder_before_anything_starts(tmp_path):
    out = tmp_path / "missing" / "ranks.log"
    with pytest.raises(UsageError) as exc:
        neuronabox.launch(EXAMPLE, nnodes=2, output=out)
    assert str(exc.value) == f"output {out}: no folder '{out.parent}' to write into"


@pytest.mark.parametrize("cmd", [("simulate", "--nnodes", "8"), ("export", "--format", "nccl-tests")])
def test_a_trace_without_its_footer_is_used_with_a_warning(run, tmp_path, cmd):
    """A cut-off run's trace (no footer) is still worth replaying, but not silently as if
    it were whole; and one recorded step gives no iteration time, not '0.00 ms'."""
    rec = minimal_trace(tmp_path / "cut.jsonl")
    with open(rec, "a") as f:
        f.write(json.dumps({"step": [0, 1000.0]}) + "\n")
    res = run(cmd[0], str(rec), *cmd[1:], timeout=60)
    assert res.rc == 0, res.err
    assert f"neuronabox: warning: {rec} has no footer: its run was cut off" in res.err
    assert "(0 instances, 1 optimizer steps)" in res.err
    if cmd[0] == "simulate":
        assert "iteration time unknown (it needs two)" in res.out and "0.00 ms" not in res.out
