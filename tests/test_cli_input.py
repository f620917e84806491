"""Bad input on the command line ends with exit status 2 and one line
`neuronabox: error: <cause>`, within seconds and before any process of the job
starts; --help works for every subcommand; torchrun's own ways of giving flags
(--rdzv-endpoint, PET_* variables) are honored; two runs do not share a store."""

import json
import os
import re
import shutil
import socket
from pathlib import Path

import pytest
from conftest import EXAMPLE, ROOT, SCRIPTS, Live

from neuronabox import topology
from neuronabox.launcher.torchrun_args import UsageError, parse, without_pet

COLLECTIVES = str(SCRIPTS / "collectives.py")
TINY = (COLLECTIVES, "--sizes", "8", "--dtypes", "float32")


def usage_error(res) -> str:
    """The one cause line of a usage error (and no traceback, quickly)."""
    assert res.rc == 2, res.err[-2000:]
    assert "Traceback" not in res.err, res.err
    lines = res.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("neuronabox: error: "), res.err
    assert res.seconds < 30
    return lines[0].removeprefix("neuronabox: error: ")


# -- the script -----------------------------------------------------------------------
def test_a_missing_script(run, tmp_path):
    missing = tmp_path / "trian.py"
    cause = usage_error(run("torchrun", "--nnodes", "4", str(missing), timeout=60))
    assert cause == f"no script {str(missing)!r} to run"


def test_a_script_with_a_syntax_error(run, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import torch\n\nfor i in range(3)\n    print(i)\n")
    cause = usage_error(run("torchrun", "--nnodes", "4", str(script), timeout=60))
    assert cause.startswith(f"{script}: syntax error at line 3")


def test_a_module_that_is_not_there(run):
    cause = usage_error(run("torchrun", "--nnodes", "4", "-m", "no_such_module_nbx.train", timeout=60))
    assert cause == "-m no_such_module_nbx.train: no module named 'no_such_module_nbx'"


# -- flags and their values -----------------------------------------------------------
@pytest.mark.parametrize("port", ["99999", "0", "-5", "abc"])
def test_a_master_port_that_is_not_a_port(run, port):
    cause = usage_error(run("torchrun", "--nnodes", "2", "--master-port", port, EXAMPLE, timeout=60))
    assert cause == f"--master-port must be a port number (1..65535), got {port!r}"


def test_a_rdzv_endpoint_without_a_port(run):
    cause = usage_error(run("torchrun", "--nnodes", "2", "--rdzv-endpoint", "127.0.0.1", EXAMPLE, timeout=60))
    assert cause == "--rdzv-endpoint takes HOST:PORT for the static rendezvous, got '127.0.0.1'"


@pytest.mark.parametrize("spec", ["bandwidth=xnan", "bandwidth=inf", "bandwidth=x-1", "bandwidth=0", "bandwidth=9e999"])
def test_a_bandwidth_factor_that_is_not_finite_and_positive(run, spec):
    cause = usage_error(run("torchrun", "--nnodes", "2", "--inject", spec, EXAMPLE, timeout=60))
    assert cause.startswith(f"--inject {spec!r}: bandwidth takes a positive factor")


@pytest.mark.parametrize("spec", ["latency=nan", "latency=+infms", "jitter=-1ms", "straggler=rank:1,delay=nan"])
def test_a_time_that_is_not_finite_and_not_negative(run, spec):
    cause = usage_error(run("torchrun", "--nnodes", "2", "--inject", spec, EXAMPLE, timeout=60))
    assert cause.startswith(f"--inject {spec!r}")


HUGE = "1" + "0" * 400  # a float of it is inf
LINKS = [("bandwidth", HUGE + "Gb/s"), ("bandwidth", "nanGb/s"), ("bandwidth", "-1Gb/s"), ("latency", HUGE + "us")]


@pytest.mark.parametrize("field, value", [*LINKS, ("latency", "-2us")])
def test_a_topology_file_with_a_link_that_is_not_finite(tmp_path, field, value):
    link = {"bandwidth": "25Gb/s", "latency": "5us", field: value}
    doc = {"links": {"intra": {"bandwidth": "20GB/s", "latency": "1us"}, "inter": link}}
    path = tmp_path / "cluster.yaml"
    path.write_text(json.dumps(doc))  # JSON is YAML
    with pytest.raises(topology.TopologyError, match=rf"links\.inter\.{field}: expected a"):
        topology.load(str(path))


def test_a_folder_as_the_topology(run, tmp_path):
    cause = usage_error(run("torchrun", "--nnodes", "2", "--topology", str(tmp_path), EXAMPLE, timeout=60))
    assert cause == f"--topology: {tmp_path}: a folder, not a topology file (a preset name or a YAML file)"
    res = run("topology", "show", str(tmp_path), timeout=60)
    assert usage_error(res) == f"{tmp_path}: a folder, not a topology file (a preset name or a YAML file)"


def test_a_trace_into_a_folder_that_is_not_there(run, tmp_path):
    trace = tmp_path / "no" / "trace.json"
    cause = usage_error(run("torchrun", "--nnodes", "2", "--trace", str(trace), EXAMPLE, timeout=60))
    assert cause == f"--trace {trace}: no folder {str(trace.parent)!r} to write into"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_a_trace_into_a_folder_that_takes_no_files(run, tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir(mode=0o555)
    cause = usage_error(run("torchrun", "--nnodes", "2", "--trace", str(folder / "t.json"), EXAMPLE, timeout=60))
    assert cause == f"--trace {folder / 't.json'}: not writable"


def test_a_pet_variable_that_is_not_a_number(run):
    res = run("torchrun", EXAMPLE, env={"PET_NNODES": "many"}, timeout=60)
    assert usage_error(res) == "PET_NNODES must be a fixed whole number, got 'many'"
    res = run("torchrun", EXAMPLE, env={"PET_MASTER_PORT": "70000"}, timeout=60)
    assert usage_error(res) == "PET_MASTER_PORT must be a port number (1..65535), got '70000'"


def test_argparse_errors_are_one_line(run):
    assert usage_error(run("status", "--bogus", timeout=60)) == "unrecognized arguments: --bogus"
    assert usage_error(run("whatif", "--", EXAMPLE, timeout=60)) == "the following arguments are required: --sweep"


# -- help -----------------------------------------------------------------------------
COMMANDS = ["torchrun", "controller", "simulate", "whatif", "perf", "export", "report", "calibrate", "validate",
            "status", "inject", "topology"]


@pytest.mark.parametrize("cmd", COMMANDS)
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_every_subcommand_has_help(capsys, cmd, flag):
    """In this process, through the CLI's own entry point (the top-level help below runs
    it as a process): 20 interpreters starting cost the suite 14 s."""
    from neuronabox.cli import main

    try:
        rc = main([cmd, flag])
    except SystemExit as exc:
        rc = exc.code
    out, err = capsys.readouterr()
    assert rc in (0, None), err
    assert out.startswith(f"usage: neuronabox {cmd}"), out
    assert not err


def test_the_top_level_help_names_every_command_on_a_line_of_its_own(run):
    res = run("--help", timeout=60)
    assert res.rc == 0, res.err
    listed = [line.split()[0] for line in res.out.splitlines() if line.startswith("  ")]
    assert listed == COMMANDS
    assert all(len(line.split()) > 3 for line in res.out.splitlines() if line.startswith("  "))  # a summary each


def test_torchrun_help_names_our_flags_and_torchruns():
    from neuronabox.cli.torchrun import build_parser
    from neuronabox.launcher.torchrun_args import OUR_SWITCHES, OURS, OURS_REPEATED

    parser = build_parser()
    described = {flag for action in parser._actions if action.help for flag in action.option_strings}
    assert OURS | OURS_REPEATED | OUR_SWITCHES <= described  # every flag of ours, with its help
    for flag in ("--master-port", "--rdzv-endpoint", "--nnodes", "--nproc-per-node", "PET_"):
        assert flag in parser.format_help()
    assert parse(["--nnodes", "4", "--help"]).help
    assert not parse([EXAMPLE, "--help"], environ={}).help  # after the script: the script's own


# -- torchrun's flags and variables ---------------------------------------------------
def test_pet_variables_are_defaults_and_the_command_line_wins():
    env = {"PET_NNODES": "4", "PET_NPROC_PER_NODE": "2", "PET_MASTER_PORT": "29511", "PET_MODULE": "1"}
    args = parse(["--nnodes", "8", "mod"], environ=env)
    assert args.get("--nnodes") == "8" and args.get("--nproc-per-node") == "2"
    assert args.get("--master-port") == "29511" and ("--module", None) in args.torchrun
    assert args.origin("--nproc-per-node") == "PET_NPROC_PER_NODE" and args.origin("--nnodes") == "--nnodes"
    assert ("--module", None) not in parse(["-m", "mod"], environ=env).torchrun  # given once, as -m
    assert parse(["x.py"], environ={"PET_MODULE": "0"}).torchrun == []
    with pytest.raises(UsageError, match="PET_STANDALONE=1: --standalone runs a single node"):
        parse(["x.py"], environ={"PET_STANDALONE": "1"})
    kept = without_pet({"PET_NNODES": "4", "PET_NODE_RANK": "3", "PET_RDZV_ENDPOINT": "h:1", "PET_MAX_RESTARTS": "2"})
    assert kept == {"PET_MAX_RESTARTS": "2"}


def test_validate_runs_torchrun_without_the_users_pet_flags(monkeypatch, tmp_path):
    """validate gives each run its own flags; a PET_STANDALONE or PET_NNODES of the user's
    would override them in the all-real torchrun (or be refused by the emulated launcher)."""
    from neuronabox.fidelity.testbed import Host
    from neuronabox.fidelity.validate import Job, Runner

    for var, value in {"PET_STANDALONE": "1", "PET_NNODES": "3", "PET_NODE_RANK": "1", "PET_MAX_RESTARTS": "2"}.items():
        monkeypatch.setenv(var, value)
    env = Runner(Job(2, 1, [0], [], ["x.py"]), tmp_path, 10.0, loopback=True).env(Host("node0", "127.0.0.1"))
    assert not {"PET_STANDALONE", "PET_NNODES", "PET_NODE_RANK"} & set(env)
    assert env["PET_MAX_RESTARTS"] == "2" and env["GLOO_SOCKET_IFNAME"] == "lo"


@pytest.mark.parametrize("how", ["flag", "PET_* variables"])
def test_a_rdzv_endpoint_is_the_store(run, how):
    """torchrun's flags, or the PET_* variables standing for them: the endpoint is the
    store the run keeps, and PET_NNODES sizes the world."""
    from neuronabox.launcher.ports import free_port

    endpoint = f"127.0.0.1:{free_port()}"
    if how == "flag":
        flags, env, world = ["--nnodes", "2", "--rdzv-endpoint", endpoint], {}, 2
    else:
        flags, env, world = [], {"PET_NNODES": "4", "PET_RDZV_ENDPOINT": endpoint}, 4
    res = run("torchrun", *flags, *TINY, env=env, timeout=180)
    assert res.rc == 0, res.err[-2000:]
    assert re.search(rf"world size\s+{world}\n", res.out), res.out


# -- failed runs, concurrent runs -----------------------------------------------------
def test_a_failed_run_says_where_its_logs_are(run, tmp_path):
    script = tmp_path / "fails.py"
    script.write_text("import sys\nsys.exit(3)\n")
    res = run("torchrun", "--nnodes", "2", str(script), timeout=180)
    assert res.rc == 1
    assert "process exited with status" in res.last_error
    last = res.err.strip().splitlines()[-1]
    m = re.fullmatch(r"neuronabox: the run's logs are in (\S+)", last)
    assert m, res.err[-2000:]
    folder = Path(m.group(1))
    try:
        assert (folder / "controller.log").is_file()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_master_port_in_use_is_refused(run):
    from neuronabox.launcher.ports import free_port

    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        cause = usage_error(run("torchrun", "--nnodes", "2", "--master-port", str(port), *TINY, timeout=60))
    assert cause == f"--master-port {port} is in use on 127.0.0.1 (another run?)"


def test_status_skips_and_removes_runs_that_are_gone(tmp_path, monkeypatch):
    from neuronabox.cli import status
    from neuronabox.launcher import registry

    monkeypatch.setattr(registry, "RUNS_DIR", tmp_path)
    dead = os.getpid()
    while True:  # a pid no process has
        dead += 1000
        try:
            os.kill(dead, 0)
        except ProcessLookupError:
            break
        except PermissionError:
            continue
    (tmp_path / f"{dead}.json").write_text(json.dumps({"control": "127.0.0.1:1", "pid": dead}))
    (tmp_path / f"{os.getpid()}.json").write_text(json.dumps({"control": "127.0.0.1:2", "pid": os.getpid()}))
    (tmp_path / "latest.json").write_text(json.dumps({"control": "127.0.0.1:1", "pid": dead}))
    assert [r["control"] for r in status.live_runs()] == ["127.0.0.1:2"]
    assert not (tmp_path / f"{dead}.json").exists() and (tmp_path / "latest.json").exists()


def test_status_lists_every_live_run(run, tmp_path):
    from neuronabox.launcher.registry import RUNS_DIR

    go_on = tmp_path / "done"
    flags = ("--nnodes", "3", COLLECTIVES, "--repeat", "1", "--until-file", str(go_on), "--sizes", "8")
    a, b = Live("torchrun", *flags), Live("torchrun", *flags)
    try:
        a.wait_line(r"iteration 0 done")
        b.wait_line(r"iteration 0 done")
        assert (RUNS_DIR / f"{a.proc.pid}.json").is_file() and (RUNS_DIR / f"{b.proc.pid}.json").is_file()
        res = run("status", timeout=60)
        assert res.rc == 0, res.err
        for live in (a, b):
            assert f"run of launcher {live.proc.pid} " in res.out, res.out
        assert res.out.count("state running  world 3") >= 2, res.out
        go_on.touch()
        assert a.finish(timeout=180) == 0, a.err[-2000:]
        assert b.finish(timeout=180) == 0, b.err[-2000:]
    finally:
        go_on.touch()
        a.stop()
        b.stop()
    assert not (RUNS_DIR / f"{a.proc.pid}.json").exists() and not (RUNS_DIR / f"{b.proc.pid}.json").exists()


@pytest.mark.parametrize("cmd", COMMANDS)
def test_every_flag_and_argument_of_every_command_says_what_it_does(cmd):
    """`--help` is complete: nothing a command takes goes undescribed."""
    import argparse

    from neuronabox.cli import command

    parser = command(cmd).build_parser()
    bare = [a.option_strings or [a.dest] for a in parser._actions if not isinstance(a, argparse._HelpAction)
            and not (a.help or "").strip()]  # fmt: skip
    assert bare == [], f"neuronabox {cmd}: no help for {bare}"


def test_the_reference_page_is_what_the_parsers_print_today():
    """docs/reference.md is generated from the parsers: a flag added without regenerating it fails here."""
    from neuronabox.cli.reference import reference

    assert (ROOT / "docs" / "reference.md").read_text() == reference(), (
        "docs/reference.md is stale: python -m neuronabox.cli.reference > docs/reference.md")
