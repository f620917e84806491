"""`neuronabox export`: a live run's trace as Chrome trace-event JSON (checked for the
structure Perfetto needs) and as a PNG timeline."""

import json

import pytest
from conftest import EXAMPLE

from neuronabox.trace.records import load

REQUIRED_ARGS = {"Collective name", "In msg nelems", "Out msg nelems", "dtype", "Group size",
                 "Process Group Name", "Process Group Ranks", "Seq"}  # fmt: skip


def in_process(*argv: str) -> int:
    """The CLI's entry point in this process (an interpreter's start is most of a process run)."""
    from neuronabox.cli import main

    return main(list(argv))


@pytest.fixture
def run(capsys):
    """`neuronabox export` in this process (it runs no job); anything else as a process."""
    from conftest import Result, nbx

    def call(*argv: str, **kw) -> Result:
        if not argv or argv[0] != "export":
            return nbx(*argv, **kw)
        capsys.readouterr()
        try:
            rc = in_process(*argv)
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
        out, err = capsys.readouterr()
        return Result(rc, out, err, 0.0)

    return call


@pytest.fixture(scope="module")
def two_rank_trace(tmp_path_factory):
    from conftest import nbx

    trace = tmp_path_factory.mktemp("export") / "run.jsonl"
    res = nbx("torchrun", "--nnodes", "8", "--real-nodes", "0,3", "--trace", str(trace), EXAMPLE, "--steps", "4")
    assert res.rc == 0, res.err[-2000:]
    return trace


def test_chrome_export_is_structurally_sound(run, two_rank_trace, tmp_path):
    out = tmp_path / "run.json"
    res = run("export", str(two_rank_trace), "--format", "chrome", "--out", str(out), "--sample-emulated", "2")
    assert res.rc == 0, res.err
    doc = json.loads(out.read_text())
    events = doc["traceEvents"]
    assert {e["ph"] for e in events} <= {"M", "b", "e", "X", "i"}
    named = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert {0, 3} <= set(named) and "real" in named[0] and len(named) == 4  # two real, two sampled emulated
    opened: dict[tuple, dict] = {}
    for e in sorted((e for e in events if e["ph"] in "be"), key=lambda e: (e["ts"], e["ph"] == "e")):
        key = (e["cat"], e["id"], e["pid"])
        if e["ph"] == "b":
            assert key not in opened
            opened[key] = e
        else:
            begin = opened.pop(key)  # every end closes a begun span of the same id and process
            assert e["name"] == begin["name"] and e["ts"] >= begin["ts"]
    assert not opened  # balanced
    colls = [e for e in events if e["ph"] == "b" and e["cat"] == "collective"]
    trace = load(two_rank_trace)
    assert len(colls) == sum(len(i["per_rank"]) for i in trace["instances"])
    assert {e["pid"] for e in colls} == {0, 3}
    for e in colls:
        assert REQUIRED_ARGS <= set(e["args"])
    ar = [e["args"] for e in colls if e["name"] == "allreduce"]
    assert ar and all(a["Group size"] == 8 and json.loads(a["Process Group Ranks"]) == list(range(8)) for a in ar)
    for a in ar[: len(ar) // 2]:  # dtype and count: the flight recorder's, reported after each step
        assert a["dtype"] == "Float" and a["In msg nelems"] > 0, a
    steps = [e for e in events if e["ph"] == "i"]
    assert len(steps) == 8  # four optimizer steps on each real rank
    first_step = min(e["ts"] for e in steps)
    first_coll = min(e["ts"] for e in colls)
    assert abs(first_step - first_coll) < 60e6  # one clock: both in epoch microseconds, within a minute
    computes = [(e["pid"], e["ts"], e["ts"] + e["dur"]) for e in events if e["ph"] == "X" and e["name"] == "compute"]
    assert computes == [tuple(g) for g in trace["gaps"]] and computes  # the trace's gaps, as written
    info = doc["distributedInfo"]
    assert info["world_size"] == 8 and info["pg_count"] >= 1 and info["pg_config"][0]["ranks"] == list(range(8))


def test_png_export_draws_the_timeline(run, two_rank_trace, tmp_path):
    out = tmp_path / "run.png"
    res = run("export", str(two_rank_trace), "--format", "png", "--out", str(out))
    assert res.rc == 0, res.err
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_chakra_files_parse_back_one_per_rank_with_the_group_file(run, two_rank_trace, tmp_path):
    from neuronabox.sim.simulate import program_of
    from neuronabox.trace import chakra
    from neuronabox.trace.chakra import et_pb2

    out = tmp_path / "et"
    res = run("export", str(two_rank_trace), "--format", "chakra", "--out", str(out))
    assert res.rc == 0, res.err
    assert sorted(p.name for p in out.iterdir()) == sorted([f"trace.{r}.et" for r in range(8)] + ["comm_group.json"])
    assert json.loads((out / "comm_group.json").read_text()) == {"0": list(range(8))}
    prog = program_of(load(two_rank_trace))
    for r in range(8):
        meta, nodes = chakra.read(out / f"trace.{r}.et")
        assert meta.version == chakra.VERSION
        assert [n.id for n in nodes] == list(range(len(nodes)))
        colls = [n for n in nodes if n.type == et_pb2.COMM_COLL_NODE]
        assert len(colls) == len(prog.ops)
        for n, op in zip(colls, prog.ops, strict=True):
            attrs = {a.name: a for a in n.attr}
            assert attrs["comm_type"].WhichOneof("value") == "int64_val"
            assert attrs["comm_type"].int64_val == chakra.COMM_TYPE[op.kind]
            assert attrs["comm_size"].WhichOneof("value") == "int64_val" and attrs["comm_size"].int64_val == op.nbytes
            assert attrs["pg_name"].string_val == "0"
        for n in nodes:  # a DAG in file order: every dependency comes earlier
            assert all(d < n.id for d in n.data_deps)
        comps = [n for n in nodes if n.type == et_pb2.COMP_NODE]
        assert comps and all(n.duration_micros > 0 for n in comps)


def test_export_of_what_is_not_a_trace(run, tmp_path):
    bad = tmp_path / "x.jsonl"
    bad.write_text("hello\n")
    res = run("export", str(bad), "--format", "chrome")
    assert res.rc == 2 and "not a NeuronaBox trace" in res.last_error
    res = run("export", str(tmp_path / "missing.jsonl"), "--format", "png")
    assert res.rc == 2 and "missing.jsonl" in res.last_error


def test_nccl_tests_table(run, two_rank_trace):
    res = run("export", str(two_rank_trace), "--format", "nccl-tests")
    assert res.rc == 0, res.err
    blocks = {}
    kind = None
    for line in res.out.splitlines():
        if line.startswith("# Collective: "):
            kind = line.split(": ")[1]
        elif not line.startswith("#") and line.strip():
            size, count, dtype, redop, root, time_us, alg, bus, wrong, n = line.split()
            blocks.setdefault(kind, []).append((int(size), float(time_us), float(alg), float(bus), redop, int(n)))
    assert {"allreduce", "broadcast"} <= set(blocks)
    for size, time_us, alg, bus, redop, n in blocks["allreduce"]:
        assert redop == "sum" and n >= 1
        assert alg == pytest.approx(size / time_us / 1e3, abs=2e-3)  # bytes per us = MB/s; GB/s is /1e3
        assert bus == pytest.approx(alg * 2 * 7 / 8, abs=2e-3)  # 2(n-1)/n at 8 ranks
    for _, _, alg, bus, _, _ in blocks["broadcast"]:
        assert bus == pytest.approx(alg, abs=1e-3)


def test_bus_factors_are_nccl_tests():
    from neuronabox.trace.busbw import bandwidths, bus_factor

    assert bus_factor("allreduce", 8) == 2 * 7 / 8
    assert bus_factor("allgather", 8) == bus_factor("alltoall", 8) == 7 / 8
    assert bus_factor("broadcast", 8) == bus_factor("reduce", 8) == 1.0
    assert bandwidths("allreduce", 1e9, 0.5, 2) == (2.0, 2.0)


def test_gaps_wait_for_the_collectives_still_open():
    """A rank's collectives complete out of entry order when they overlap (DDP's
    buckets): a gap is written only once no open collective began before its end."""
    from neuronabox.trace.records import GapTracker

    gaps = GapTracker()
    gaps.add(0, 0.0, 1.0)
    assert gaps.settle({}) == []  # nothing before it
    gaps.add(0, 5.0, 6.0)  # completes while the one entered at 3.0 is still open
    assert gaps.settle({0: 3.0}) == []  # [1, 5] would be wrong: the open one fills [3, 5]
    gaps.add(0, 3.0, 10.0)
    assert gaps.settle({}) == [(0, 1.0, 3.0)]
    gaps.add(0, 12.0, 13.0)
    gaps.add(1, 2.0, 4.0)
    assert gaps.settle(None) == [(0, 10.0, 12.0)]  # rank 1's first collective leaves no gap


def test_the_trace_is_schema_2_on_one_clock(two_rank_trace):
    from neuronabox.trace.records import SIZE_OF_DTYPE, events

    lines = list(events(two_rank_trace))
    header = lines[0][1]
    assert header["version"] == 2 and header["clock"] == "epoch_us" and header["topology_spec"]["links"]
    kinds = [what for what, _ in lines]
    assert kinds.index("group") < kinds.index("instance")  # a group is named before its first instance
    doc = load(two_rank_trace)
    assert doc["groups"]["0"] == list(range(8))
    lo, hi = header["started_us"], header["started_us"] + 600e6
    # The observer reports dtypes after each step on its own thread; a run may exit before the last report.
    reported_by = sorted(t for _, t in doc["steps"])[-3]
    for rec in doc["instances"]:
        assert {"kind", "group", "seq", "dtype", "numel", "nbytes", "root", "per_rank", "model_us",
                "boundary_messages", "start_us", "end_us"} <= set(rec)  # fmt: skip
        assert lo <= rec["start_us"] <= rec["end_us"] < hi
        assert set(rec["per_rank"]) <= {"0", "3"}
        # Every dtype is the flight recorder's, reported by the observer after each step (DDP's first
        # broadcast is int64 parameter shapes, where the wire's element size alone would say Double).
        if rec["end_us"] < reported_by:
            assert rec["dtype"] in SIZE_OF_DTYPE and rec["numel"] * SIZE_OF_DTYPE[rec["dtype"]] == rec["nbytes"], rec
            assert rec["dtype"] == "Float" or rec["kind"] != "allreduce"
    assert "dtypes" in kinds  # the observers' reports, joined by `load`
    for rank, t in doc["steps"]:
        assert rank in (0, 3) and lo <= t < hi  # the observer's wall clock: the same epoch clock
    # Each rank's gaps lie between its collectives, never inside one.
    for rank in (0, 3):
        busy = sorted(tuple(r["per_rank"][str(rank)]) for r in doc["instances"] if str(rank) in r["per_rank"])
        gaps = sorted((a, b) for r, a, b in doc["gaps"] if r == rank)
        assert gaps and all(b > a for a, b in gaps)
        for a, b in gaps:
            assert not any(x < b and a < y for x, y in busy)


INSPECTOR_KEYS = {
    "header": {"id", "rank", "n_ranks", "nnodes"},
    "metadata": {"inspector_output_format_version", "git_rev", "rec_mechanism", "dump_timestamp_us", "hostname",
                 "pid"},
    "coll_perf": {"coll", "coll_sn", "coll_msg_size_bytes", "coll_exec_time_us", "coll_timing_source",
                  "coll_algobw_gbs", "coll_busbw_gbs"},
}  # fmt: skip


def test_nccl_inspector_lines_are_v4_with_each_real_ranks_time(two_rank_trace, tmp_path):
    """One v4.0 object per collective per real rank, its time the rank's span in the
    trace, its bandwidths nccl-tests' (busbw = algbw x the collective's bus factor)."""
    out = tmp_path / "inspector.jsonl"
    assert in_process("export", str(two_rank_trace), "--format", "nccl-inspector", "--out", str(out)) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    doc = load(two_rank_trace)
    assert len(rows) == sum(len(i["per_rank"]) for i in doc["instances"])
    spans = [(int(r), b - a) for i in doc["instances"] for r, (a, b) in sorted(i["per_rank"].items(),
                                                                               key=lambda kv: int(kv[0]))]  # fmt: skip
    for row, (rank, span) in zip(rows, spans, strict=True):
        assert {k: set(v) for k, v in row.items()} == INSPECTOR_KEYS
        assert row["metadata"]["inspector_output_format_version"] == "v4.0"
        perf, head = row["coll_perf"], row["header"]
        assert head["rank"] == rank and head["n_ranks"] == 8 and head["nnodes"] == 8 and head["id"].startswith("0x")
        assert perf["coll_exec_time_us"] == pytest.approx(span, abs=1e-3)
        assert perf["coll_timing_source"] == "neuronabox_real_rank"
        if perf["coll"] == "AllReduce" and perf["coll_algobw_gbs"] > 1e-3:
            assert perf["coll_busbw_gbs"] == pytest.approx(perf["coll_algobw_gbs"] * 2 * 7 / 8, rel=1e-3)
    assert {r["coll_perf"]["coll"] for r in rows} >= {"AllReduce", "AllGather", "Broadcast"}
    assert len({r["header"]["id"] for r in rows}) == 1  # one communicator: the default group


def test_prometheus_gauges_parse_with_prometheus_clients_parser(two_rank_trace, tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    out = tmp_path / "nccl.prom"
    assert in_process("export", str(two_rank_trace), "--format", "prometheus", "--out", str(out)) == 0
    families = {f.name: f for f in text_string_to_metric_families(out.read_text())}
    assert set(families) == {"nccl_algorithm_bandwidth_gbs", "nccl_bus_bandwidth_gbs",
                             "nccl_collective_exec_time_microseconds"}  # fmt: skip
    last = {}  # (comm, rank) -> the latest collective's line, as the Inspector's Prometheus mode keeps
    doc = load(two_rank_trace)
    for inst in doc["instances"]:
        for r, (a, b) in inst["per_rank"].items():
            last[int(r)] = (inst, b - a)
    for fam in families.values():
        assert fam.type == "gauge" and len(fam.samples) == 2  # rank 0 and rank 3, one communicator
    for sample in families["nccl_collective_exec_time_microseconds"].samples:
        inst, span = last[int(sample.labels["rank"])]
        assert sample.value == pytest.approx(span, rel=1e-5)
        assert sample.labels["coll_sn"] == str(inst["seq"]) and sample.labels["nranks"] == "8"
        assert sample.labels["coll_timing_source"] == "neuronabox_real_rank"


def test_dtype_reports_thin_out_after_the_first_steps_and_lose_nothing(tmp_path):
    """Each dtype report dumps the flight recorder on the real rank's core (about 4 us an
    entry, which an all-real run does not pay). After the first 8 steps a report comes only
    before the recorder could fill past half at the collectives per step counted so far, and
    every collective up to the last report still has its dtype."""
    from conftest import nbx

    from neuronabox.observer.agent import EAGER_STEPS

    steps = 40
    trace = tmp_path / "run.jsonl"
    res = nbx("torchrun", "--nnodes", "2", "--trace", str(trace), EXAMPLE, "--steps", str(steps))
    assert res.rc == 0, res.err[-2000:]
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    reports = [i for i, rec in enumerate(lines) if "dtypes" in rec]
    # not one a step; the first steps' reports may merge when the reporter thread wakes late under load
    assert 2 <= len(reports) < EAGER_STEPS + (steps - EAGER_STEPS) // 2
    last = max(seq for i in reports for _, seq, _ in lines[i]["dtypes"])
    doc = load(trace)
    covered = [rec for rec in doc["instances"] if rec["seq"] <= last]
    # at least the construction's collectives and some steps' (under the suite's load the reporter
    # thread can lag the run by many steps, and the script leaves by os._exit, without a last report)
    assert len(covered) > EAGER_STEPS
    assert all(rec["dtype"] is not None for rec in covered), [r for r in covered if r["dtype"] is None][:2]
    # every dump held the real rank's core, and the observer said when (--skew auto leaves it
    # out of the rank's gaps): one hold a report at least, on the trace's clock, inside the run
    first = min(rec["per_rank"]["0"][0] for rec in doc["instances"])
    last = max(rec["per_rank"]["0"][1] for rec in doc["instances"])
    assert len(doc["held"]) >= len(reports)
    # a window is not the dump's length: under load the first one waited 1.2 s for the GIL, for 0.2 ms of CPU
    assert all(rank == 0 and first - 60e6 < a < b < last + 60e6 for rank, a, b, _ in doc["held"]), doc["held"][:3]
    # the dump's own CPU, within its window (epoch microseconds carry a quarter microsecond)
    assert all(0 < cpu <= b - a + 1 for _, a, b, cpu in doc["held"]), doc["held"][:3]
    # the footer counts the same holds' CPU (the same figures, rounded to 1 ns in the trace and
    # 1 us in the footer: no timing compared), and the summary tells the user what they cost the rank
    footer = lines[-1]["end"]["observer_held"]
    assert footer["0"]["times"] == len(doc["held"])
    assert footer["0"]["seconds"] == pytest.approx(sum(cpu for *_, cpu in doc["held"]) / 1e6, rel=1e-3, abs=1e-5)
    assert f"observer        held real rank 0's core {len(doc['held'])} times" in res.out, res.out[-1500:]
