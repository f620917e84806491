"""`neuronabox simulate`: a recorded run's real rank replayed through the engine in
virtual time at any world size, running no process of the job."""

import csv
import re
import sys
import time
from pathlib import Path

import pytest
from conftest import EXAMPLE, Result, nbx

from neuronabox.trace.records import load


@pytest.fixture
def run(capsys):
    """`neuronabox simulate` and `whatif --simulate` through the CLI's entry point in this
    process (no job runs in them, and an interpreter's start was most of each call's
    time); anything else as a process (conftest's nbx)."""
    from neuronabox.cli import main

    def call(*argv: str, **kw) -> Result:
        if not argv or not (argv[0] == "simulate" or (argv[0] == "whatif" and "--simulate" in argv)):
            return nbx(*argv, **kw)
        capsys.readouterr()
        t0 = time.monotonic()
        try:
            rc = main(list(argv))
        except SystemExit as exc:  # argparse: --help, a bad flag
            rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
        out, err = capsys.readouterr()
        return Result(rc, out, err, time.monotonic() - t0)

    return call


def iteration_ms(out: str) -> float:
    return float(re.search(r"iteration time ([0-9.]+) ms", out).group(1))


def test_simulation_scales_and_replays_itself(run, live_trace, tmp_path):
    sims = {}
    for n in (8, 64, 1024):
        out = tmp_path / f"sim{n}.jsonl"
        # --skew none (the default, said here): auto would add drawn waits, not the model's (a test below)
        res = run("simulate", str(live_trace), "--nnodes", str(n), "--trace", str(out), "--skew", "none")
        assert res.rc == 0, res.err
        assert f"world size      {n}" in res.out and "optimizer steps 14" in res.out
        sims[n] = (iteration_ms(res.out), out)
        doc = load(out)
        live = load(live_trace)
        assert doc["complete"] and doc["world_size"] == n
        # Every default-group collective of the real rank is replayed, each at its recorded size.
        want = sorted((i["kind"], i["nbytes"]) for i in live["instances"] if i["kind"] != "allreduce")
        got = sorted((i["kind"], i["nbytes"]) for i in doc["instances"] if i["kind"] != "allreduce")
        assert [k for k, _ in got] == [k for k, _ in want]
        # The simulated rank lives the model's time plus one charge per kind: the recorded rank's own cost.
        assert_charged(doc, {"allreduce", "allgather"})
        if n == 8:  # each instance charges the local work its live one did: the same model, line by line
            rings = lambda d: [(i["kind"], i.get("work") and round(i["work"]["message_us"], 6),  # noqa: E731
                                round(i["model_us"], 3))
                               for i in d["instances"] if i["kind"] in ("allreduce", "allgather")]  # fmt: skip
            assert rings(doc) == rings(live) and any(w for _, w, _ in rings(live)), rings(live)
    assert sims[8][0] < sims[64][0] < sims[1024][0]  # rings grow with the world under alpha-beta
    # The simulated trace is a program too: replayed at its own size, it gives itself back.
    res = run("simulate", str(sims[64][1]), "--nnodes", "64")
    assert res.rc == 0, res.err
    assert iteration_ms(res.out) == pytest.approx(sims[64][0], rel=1e-3)


def assert_charged(doc: dict, kinds: set[str], punctual: bool = False) -> dict[str, float]:
    """Each instance of each of `kinds` on the simulated rank took its model time plus
    the same charge (none when `punctual`); returns the charges."""
    excess: dict[str, list[float]] = {}
    for rec in doc["instances"]:
        if rec["kind"] in kinds:  # (a broadcast root's model time is its sends', not its span)
            ((a, b),) = rec["per_rank"].values()
            excess.setdefault(rec["kind"], []).append(b - a - rec["model_us"])
    assert set(excess) == kinds
    for kind, xs in excess.items():
        assert max(xs) - min(xs) < 0.01, (kind, min(xs), max(xs))
        assert min(xs) > -0.01
        if punctual:
            assert max(xs) < 0.01
    return {k: xs[0] for k, xs in excess.items()}


def test_a_punctual_rank_lives_the_models_time(run, live_trace, tmp_path):
    """The charge is the recorded rank's: positive on a live trace, named in the
    report; `--punctual` drops it and the iteration is shorter by about as much."""
    runs = {}
    for mode in ("charged", "punctual"):
        out = tmp_path / f"{mode}.jsonl"
        res = run("simulate", str(live_trace), "--nnodes", "64", "--trace", str(out), "--skew", "none",
                  *(["--punctual"] if mode == "punctual" else []))  # fmt: skip
        assert res.rc == 0, res.err
        runs[mode] = (res.out, load(out))
    charged, punctual = runs["charged"], runs["punctual"]
    cost = assert_charged(charged[1], {"allreduce"})["allreduce"]
    assert_charged(punctual[1], {"allreduce"}, punctual=True)
    assert cost > 1.0  # microseconds: Gloo's calls and the last reduction are never free
    shown = re.search(r"its recorded cost per collective: .*allreduce ([0-9.]+) ms", charged[0])
    assert shown and float(shown.group(1)) == pytest.approx(cost / 1e3, abs=1e-3)
    assert "(simulated, punctual)" in punctual[0]
    # Every charge is on the rank's path, so the punctual replay reaches its last step
    # earlier by the charges paid before it. (Not the median iteration: a charge can land
    # in the next step's interval, and which one does depends on the recorded gaps, so
    # the medians' difference moved with the load the live trace was recorded under.)
    last = charged[1]["steps"][-1][1]
    before = [r for r in charged[1]["instances"] if max(b for _, b in r["per_rank"].values()) <= last]
    paid = sum(b - a - r["model_us"] for r in before for a, b in r["per_rank"].values())
    saved = last - punctual[1]["steps"][-1][1]
    assert saved == pytest.approx(paid, rel=0.05), (saved, paid)


def test_what_if_reaches_the_simulation(run, live_trace):
    base = run("simulate", str(live_trace), "--nnodes", "64")
    slow = run("simulate", str(live_trace), "--nnodes", "64", "--inject", "latency=+1ms,per=hop")
    assert base.rc == slow.rc == 0, slow.err
    assert iteration_ms(slow.out) > iteration_ms(base.out) + 10  # every hop of every ring pays 1 ms


def test_simulate_refuses_what_is_not_a_trace(run, tmp_path):
    res = run("simulate", str(tmp_path / "none.jsonl"))
    assert res.rc == 2 and "none.jsonl" in res.last_error
    res = run("simulate", __file__)
    assert res.rc == 2 and "not a NeuronaBox trace" in res.last_error


def test_whatif_sweeps_the_world_in_simulation(run, live_trace, tmp_path):
    prefix = tmp_path / "scale"
    res = run("whatif", "--simulate", str(live_trace), "--sweep", "nnodes=16,256,4096", "--out", str(prefix))
    assert res.rc == 0, res.err
    rows = (tmp_path / "scale.csv").read_text().splitlines()
    assert rows[0] == "nnodes,nnodes_value,iteration_s,communication_share,status,cause,trace,log"
    values = [tuple(map(float, r.split(",")[1:4])) for r in rows[1:]]
    assert all(r.split(",")[4] == "ok" for r in rows[1:])
    assert [v[0] for v in values] == [16, 256, 4096]
    assert values[0][1] < values[1][1] < values[2][1]  # iteration time grows with the world
    assert values[0][2] < values[2][2] <= 1.0  # and communication takes a growing share of it
    assert (tmp_path / "scale.png").read_bytes()[:4] == b"\x89PNG"
    for n, label in enumerate(("16", "256", "4096")):  # each value's trace is kept
        assert load(tmp_path / f"scale-{n}-{label}.jsonl")["world_size"] == int(label)


def test_emulated_ranks_are_charged_the_real_ranks_own_work(live_trace):
    """On a preset (no local work) the live run measured the real rank's own work per
    message from its ring collectives and charged it to the emulated ranks: later
    instances' model carries it, the footer and the summary say what it is and whence."""
    doc = load(live_trace)
    work = doc["local_work"]
    assert work["source"] == "measured" and work["samples"] >= 8 and work["message_us"] > 1.0, work
    rings = [i for i in doc["instances"] if i["kind"] == "allreduce"]
    first, last = rings[0], rings[-1]
    assert "work" not in first and last["work"]["message_us"] > 1.0  # before the first fit, and after it
    assert last["model_us"] > first["model_us"] + last["work"]["message_us"]
    out = live_trace.with_suffix(".out").read_text()
    assert re.search(r"local work +[0-9.]+ us per message, .*the real rank's own, measured", out), out


def test_a_failed_point_is_a_row_and_a_second_run_resumes(live_trace, tmp_path, capsys):
    """A point that fails is a row with its cause, not a lost sweep (exit 1); run again, the
    sweep skips the points its table holds done and runs the failed one again."""
    from neuronabox.cli import main

    prefix = tmp_path / "sweep"
    argv = ["whatif", "--simulate", str(live_trace), "--sweep", "nnodes=8,300000", "--out", str(prefix)]
    assert main(argv) == 1
    assert "1 point(s) failed" in capsys.readouterr().out
    rows = list(csv.DictReader((tmp_path / "sweep.csv").open()))
    assert [(r["nnodes"], r["status"]) for r in rows] == [("8", "ok"), ("300000", "failed")]
    assert "past the largest the tool runs" in rows[1]["cause"] and rows[0]["trace"].endswith("sweep-0-8.jsonl")
    kept = Path(rows[0]["trace"]).stat().st_mtime_ns
    assert main(argv) == 1
    assert "resuming: 1 of 2 points" in capsys.readouterr().out
    rows = list(csv.DictReader((tmp_path / "sweep.csv").open()))
    assert [(r["nnodes"], r["status"]) for r in rows] == [("8", "ok"), ("300000", "failed")]
    assert Path(rows[0]["trace"]).stat().st_mtime_ns == kept  # not run again


def test_an_executor_that_cannot_run_is_one_line(live_trace, tmp_path, capsys, monkeypatch):
    from neuronabox.cli import main

    argv = ["whatif", "--simulate", str(live_trace), "--sweep", "nnodes=8", "--out", str(tmp_path / "x")]
    assert main([*argv, "--executor", "dask"]) == 2
    assert "--executor is local or ray" in capsys.readouterr().err
    # Ray not installed (its import fails, as on a machine without the extra): how to get it, exit 2.
    monkeypatch.setitem(sys.modules, "ray", None)
    assert main([*argv, "--executor", "ray"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'neuronabox[ray]'" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "x.csv").exists()


def test_a_world_sweep_needs_the_simulation(run):
    res = run("whatif", "--sweep", "nnodes=16,64", "--", EXAMPLE)
    assert res.rc == 2 and "nnodes with --simulate" in res.last_error


def test_subgroups_replay_and_scale(run, tmp_path):
    """A tensor x data parallel job's subgroups replay: at the recorded size as they
    ran, at a larger world the data-parallel group (strided across the world) grows
    and the tensor-parallel block keeps its two ranks."""
    from conftest import SCRIPTS, nbx

    live_path = tmp_path / "tpdp.jsonl"
    res = nbx("torchrun", "--nnodes", "8", "--trace", str(live_path), str(SCRIPTS / "tp_dp_toy.py"))
    assert res.rc == 0, res.err[-2000:]
    live = load(live_path)
    sub = {n: r for n, r in live["groups"].items() if n != "0"}
    assert sorted(len(r) for r in sub.values()) == [2, 4], live["groups"]  # tp and dp of rank 0

    def per_group(doc) -> dict[int, int]:  # group size -> collectives on it
        out: dict[int, int] = {}
        for rec in doc["instances"]:
            if rec["group"] != "0":
                out[rec["world"]] = out.get(rec["world"], 0) + 1
        return out

    for n, sizes in ((8, {2: 2, 4: 4}), (32, {2: 2, 4: 16})):
        out = tmp_path / f"sim{n}.jsonl"
        res = run("simulate", str(live_path), "--nnodes", str(n), "--trace", str(out))
        assert res.rc == 0, res.err
        doc = load(out)
        assert per_group(doc) == {sizes[w]: k for w, k in per_group(live).items()}
        for ranks in doc["groups"].values():
            assert 0 in ranks and len(ranks) in (2, 16 if n == 32 else 4, n)


def test_simulation_predicts_its_live_run(run, tmp_path):
    """Replayed at its own world size, topology and model (all read from the trace), a
    live run's trace gives the live run's iteration time. docs/guide.md's table holds it
    to 2% at 8 to 512 ranks (scripts/simulate_fidelity.py); on a shared machine the
    test asks for a tenth. The topology is one whose hop this machine keeps up with,
    and it is a file: the trace carries it."""
    from conftest import ROOT, nbx

    live_path = tmp_path / "mlp.jsonl"
    lab = str(ROOT / "scripts" / "lab-1gbe.yaml")
    res = nbx("torchrun", "--nnodes", "8", "--topology", lab, "--trace", str(live_path),
              str(ROOT / "examples" / "mlp.py"), "--steps", "6")  # fmt: skip
    assert res.rc == 0, res.err[-2000:]
    live = iteration_ms(res.out)
    sim = run("simulate", str(live_path))
    assert sim.rc == 0, sim.err
    assert "alpha-beta on lab-1gbe" in sim.out and "world size      8" in sim.out
    assert iteration_ms(sim.out) == pytest.approx(live, rel=0.10)


def test_every_replayed_kind_runs_through_the_engine(run, tmp_path):
    """Rings, trees, barriers and the pairwise kinds (gather, scatter, alltoall), on the
    default group and a subgroup, replay at the recorded size and at a larger world
    without stalling; what is not replayed is named."""
    from conftest import SCRIPTS, nbx

    from neuronabox.sim.simulate import REPLAYED

    live_path = tmp_path / "every.jsonl"
    res = nbx("torchrun", "--nnodes", "8", "--trace", str(live_path), str(SCRIPTS / "every_collective.py"))
    assert res.rc == 0, res.err[-2000:]
    live = load(live_path)
    replayed = {k.value for k in REPLAYED}
    want: dict[str, int] = {}
    for rec in live["instances"]:
        if "0" in rec["per_rank"] and rec["kind"] in replayed:
            want[rec["kind"]] = want.get(rec["kind"], 0) + 1
    assert {"gather", "scatter", "alltoall", "allreduce", "broadcast"} <= set(want)
    for n in (8, 64):
        out = tmp_path / f"every{n}.jsonl"
        res = run("simulate", str(live_path), "--nnodes", str(n), "--trace", str(out))
        assert res.rc == 0, res.err
        got: dict[str, int] = {}
        for rec in load(out)["instances"]:
            got[rec["kind"]] = got.get(rec["kind"], 0) + 1
        assert got == want
        skipped = re.search(r"not replayed\s+(.*)", res.out).group(1)
        assert {s.split(" x")[0] for s in skipped.split(", ")} <= {"reduce", "send", "recv"}


def test_a_collective_that_overlapped_once_never_waits():
    """The trace does not say whether a collective waited for the one before it; one
    that overlapped its predecessor in any iteration did not, and neither does the
    same collective (place after the step, kind, group, size) in the other iterations."""
    from neuronabox.schedules import Kind
    from neuronabox.sim.simulate import Op, follows, mark_free

    ops, steps = [], []
    for it, t in enumerate((0.0, 1.0, 2.0)):  # two buckets per iteration; they overlap in the second only
        second = t + (0.05 if it == 1 else 0.2)
        ops += [
            Op(Kind.ALLREDUCE, 1 << 20, 4, None, t, t + 0.1),
            Op(Kind.ALLREDUCE, 4 << 20, 4, None, second, second + 0.1),
        ]
        steps.append(t + 0.5)
    mark_free(ops, steps)
    assert [op.free for op in ops] == [False, True] * 3
    assert follows(ops[0], ops[1]) == (False, pytest.approx(0.2))  # the offset from its predecessor's entry
    assert follows(ops[1], ops[2]) == (True, pytest.approx(0.7))  # after the step: the gap from its end
    mark_free(ops, [])  # no steps: each collective stands alone
    assert [op.free for op in ops] == [False, False, False, True, False, False]


def test_skew_in_a_replay_never_speeds_it_up(run, live_trace, tmp_path):
    """`--skew auto` draws the recorded real rank's own variation: every emulated rank
    enters late or on time, so the replay is never faster; a file of one delay holds each
    allreduce back by at least that much (none draws nothing: test_timing.py). Not given,
    none: the live run (recorded under auto, the launcher's default) had its waits in its
    spans, which the replay charges (test_simulation_predicts_its_live_run)."""
    base_out = tmp_path / "base.jsonl"
    base = run("simulate", str(live_trace), "--nnodes", "64", "--skew", "none", "--trace", str(base_out))
    assert "--skew" in run("simulate", "--help").out
    assert load(live_trace)["skew"] == "auto"
    auto = run("simulate", str(live_trace), "--nnodes", "64", "--skew", "auto")
    default = run("simulate", str(live_trace), "--nnodes", "64")
    assert default.rc == 0 and iteration_ms(default.out) == iteration_ms(base.out)
    delays = tmp_path / "d.txt"
    delays.write_text("5\n")
    out = tmp_path / "skewed.jsonl"
    fixed = run("simulate", str(live_trace), "--nnodes", "64", "--skew", str(delays), "--trace", str(out))
    for res in (base, auto, fixed):
        assert res.rc == 0, res.err
    assert iteration_ms(auto.out) >= iteration_ms(base.out)
    spans = [b - a for i in load(out)["instances"] if i["kind"] == "allreduce" for a, b in i["per_rank"].values()]
    assert spans and min(spans) >= 5e3
    # One allreduce a step, each now 5 ms at least: a step grows by 5 ms less what its allreduce
    # took without the delay (the real rank's own sends had gone out meanwhile), never by less.
    base_spans = [b - a for i in load(base_out)["instances"] if i["kind"] == "allreduce"
                  for a, b in i["per_rank"].values()]  # fmt: skip
    assert iteration_ms(fixed.out) >= iteration_ms(base.out) + 5 - max(base_spans) / 1e3 - 0.02
    delays.write_text("")
    res = run("simulate", str(live_trace), "--skew", str(delays))
    assert res.rc == 2 and "no delays in it" in res.last_error
