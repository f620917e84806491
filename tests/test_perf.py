"""`neuronabox perf`: nccl-tests' loop over an emulated world. The ladder and the
policy's predictions are pure and checked here; live runs check that every checked
value is what the policy predicts (`#wrong` 0) and that the table has the model's time."""

from __future__ import annotations

import json
import re

import pytest

from neuronabox.perf.expect import expected, mirror_source
from neuronabox.perf.ladder import PerfError, coll_of, ladder, make_spec, parse_size, whole_elements
from neuronabox.schedules import Kind

# size, count, type, redop, root, time, algbw, busbw, #wrong, model
ROW = re.compile(r"^\s+(\d+)\s+(\d+)\s+(\S+)\s+(\S+)\s+(-?\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+|-)\s+(\S+)$",
                 re.M)


def rows(out: str) -> list[tuple]:
    return ROW.findall(out)


def test_the_ladder_walks_as_nccl_tests_does():
    assert ladder(8, 128, None, None) == [8, 16, 32, 64, 128]
    assert ladder(1024, 4096, 4, None) == [1024, 4096]
    assert ladder(100, 400, None, 100) == [100, 200, 300, 400]
    assert parse_size("128M", "-e") == 128 << 20 and parse_size("1g", "-e") == 1 << 30 and parse_size("8", "-b") == 8
    for bad, cause in [(lambda: ladder(2048, 1024, None, None), "the size range is empty"),
                       (lambda: ladder(1, 1 << 30, 2, 5), "not both"),
                       (lambda: ladder(1, 1 << 30, None, 1), "more than 64 sizes"),
                       (lambda: parse_size("12Q", "-b"), "-b takes a size"),
                       (lambda: parse_size("0", "-b"), "1 byte to")]:  # fmt: skip
        with pytest.raises(PerfError, match=cause):
            bad()


def test_sizes_are_whole_elements_per_rank_and_names_are_nccl_tests():
    assert whole_elements(Kind.ALLGATHER, 1000, 4, 8) == 992 and whole_elements(Kind.ALLREDUCE, 1001, 4, 8) == 1000
    assert coll_of("all_reduce_perf") == coll_of("all_reduce") == coll_of("allreduce") == Kind.ALLREDUCE
    assert coll_of("alltoall_perf") == Kind.ALLTOALL
    spec = make_spec("all_gather", 8, minbytes="8", maxbytes="1K", dtype="half")
    assert spec.sizes[0] == 16 and spec.elem == 2 and spec.dtype == "float16" and spec.op == "none"
    with pytest.raises(PerfError, match="unknown collective 'allreduce_bench'"):
        coll_of("allreduce_bench")


def test_the_policy_predicts_each_block():
    real = [0, 5]
    assert mirror_source(8, real) == 0 and mirror_source(8, [6, 7]) == 7 and mirror_source(4, [1]) == 1
    # zeros: emulated ranks add nothing; mirror: each adds the source's value (rank 0's, 1)
    assert expected(Kind.ALLREDUCE, "sum", 0, 8, real, "zeros", 0) == [1 + 2]
    assert expected(Kind.ALLREDUCE, "sum", 0, 8, real, "mirror", 0) == [1 + 2 + 6 * 1]
    assert expected(Kind.ALLREDUCE, "max", 5, 8, real, "mirror", 0) == [2]
    assert expected(Kind.ALLGATHER, "none", 0, 4, [0, 2], "zeros", 0) == [1, 1, 3, 1]
    assert expected(Kind.BROADCAST, "none", 0, 8, real, "zeros", 3) == [0.0]
    assert expected(Kind.BROADCAST, "none", 0, 8, real, "mirror", 3) == [1]
    assert expected(Kind.BROADCAST, "none", 0, 8, real, "zeros", 5) == [2]
    assert expected(Kind.REDUCE, "sum", 5, 8, real, "zeros", 0) is None  # not the root: nothing defined
    assert expected(Kind.ALLTOALL, "none", 5, 4, [1, 3], "zeros", 0) == [0.0, 2, 0.0, 4]
    every = list(range(4))
    assert expected(Kind.ALLREDUCE, "sum", 2, 4, every, "zeros", 0) == [1 + 2 + 3 + 4]


@pytest.mark.parametrize(
    "argv",
    [
        ("all_reduce", "--nnodes", "8", "--real-ranks", "0,5", "--local-work", "topology"),
        ("all_gather", "--nnodes", "8", "--real-ranks", "0,5", "--data", "mirror"),
        ("broadcast", "--nnodes", "8", "--real-ranks", "0,5", "-r", "3", "--data", "mirror"),
    ],
    ids=["allreduce-zeros", "allgather-mirror", "broadcast-emulated-root"],
)
def test_every_checked_value_is_what_the_policy_predicts(run, tmp_path, argv):
    out = tmp_path / "rows.json"
    res = run("perf", *argv, "-b", "1K", "-e", "64K", "-f", "8", "-n", "3", "-w", "1", "-J", str(out), timeout=180)
    assert res.rc == 0, res.out + res.err[-3000:]
    table = rows(res.out)
    assert [int(r[0]) for r in table] == [1024, 8192, 65536]
    assert all(r[8] == "0" for r in table) and "# Out of bounds values : 0 OK" in res.out
    assert all(float(r[9]) > 0 for r in table)  # the model's time, from the run's trace
    doc = json.loads(out.read_text())
    assert doc["world"] == 8 and [r["size"] for r in doc["rows"]] == [1024, 8192, 65536]
    if argv[0] == "all_reduce":  # the live run's model column is the simulation's, to the rounding
        # (on the topology's local work: a measured one is the real rank's, which a simulation has not)
        sim = run("perf", "all_reduce", "--nnodes", "8", "--simulate", "-b", "1K", "-e", "64K", "-f", "8", "-n", "3",
                  "-w", "1", timeout=120)  # fmt: skip
        assert sim.rc == 0, sim.err
        assert [r[9] for r in rows(sim.out)] == [r[9] for r in table]


def test_the_ladder_simulated_at_512_ranks_runs_no_process(run):
    res = run("perf", "all_gather", "--nnodes", "512", "--simulate", "-b", "64K", "-e", "16M", "-f", "16",
              timeout=120)  # fmt: skip
    assert res.rc == 0, res.err
    table = rows(res.out)
    assert [int(r[0]) for r in table] == [65536, 1048576, 16777216]
    assert all(r[8] == "-" and r[5] == r[9] for r in table)  # nothing checked; a punctual rank lives the model
    times = [float(r[5]) for r in table]
    assert times == sorted(times) and "rank 0 simulated, no process run" in res.out


def test_all_real_is_the_baseline_with_no_model(run):
    res = run("perf", "all_reduce", "--nnodes", "2", "--all-real", "-b", "4K", "-e", "4K", "-n", "3", "-w", "1",
              "-d", "bfloat16", timeout=180)  # fmt: skip
    assert res.rc == 0, res.err[-3000:]
    ((size, count, dtype, redop, root, *_, wrong, model),) = rows(res.out)
    assert (size, count, dtype, redop, root, wrong, model) == ("4096", "2048", "bfloat16", "sum", "-1", "0", "-")
    assert "every rank real" in res.out


@pytest.mark.parametrize(
    "argv, cause",
    [
        (("all_reducex",), "unknown collective 'all_reducex'"),
        (("all_reduce", "-b", "1M", "-e", "1K"), "the size range is empty"),
        (("all_reduce", "--device", "cuda"), "--device cuda: this torch sees no CUDA device"),
        (("reduce_scatter",), "the Gloo dialect has no reduce_scatter schedule"),
        (("all_reduce", "-r", "9"), "-r names rank 9, outside the world of 8 ranks"),
        (("all_reduce", "--all-real", "--real-ranks", "1"), "--all-real runs every rank"),
        (("reduce", "--simulate"), "--simulate does not replay reduce yet"),
        (("all_reduce", "--executor", "ray"), "--executor ray spreads a simulated ladder's sizes: it needs --simulate"),
        (("all_reduce", "--simulate", "--executor", "dask"), "--executor is local or ray, got 'dask'"),
        (("all_reduce", "--simulate", "--ray-address", "h:1"), "--ray-address goes with --executor ray"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(run, argv, cause):
    res = run("perf", *argv, timeout=60)
    assert res.rc == 2 and cause in res.last_error, res.err
