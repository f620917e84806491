"""Timing end to end: release times, what-if injection (at launch and live) and the sweep."""

from __future__ import annotations

import csv
import json
import statistics

import pytest
from conftest import EXAMPLE, ROOT, Live, control_address, nbx

from neuronabox.trace.records import load as load_trace

LOOP = str(ROOT / "scripts" / "collective_loop.py")
SLOW_LAB = """name: slow-lab
nodes: 8
ranks_per_node: 1
links:
  intra: {bandwidth: 10GB/s, latency: 1us}
  inter: {bandwidth: 1Gb/s, latency: 500us}
"""


def timed(*launch: str, kinds: str, nbytes: int = 4096, reps: int = 8, root: int = 0, trace=None) -> dict:
    """Per kind, the real rank's statistics over the repetitions: median_s, min_s, mean_s."""
    extra = ("--trace", str(trace)) if trace else ()
    args = ("--kinds", kinds, "--bytes", str(nbytes), "--reps", str(reps), "--root", str(root))
    res = nbx("torchrun", *launch, *extra, LOOP, *args)
    assert res.rc == 0, res.err[-3000:]
    line = next(ln for ln in res.out.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[7:])


def predicted_of(trace) -> dict:
    """The model's time per kind, from a run's trace (the same for every instance of a kind)."""
    return {r["kind"]: r["model_us"] * 1e-6 for r in load_trace(trace)["instances"]}


def test_latency_per_collective_lands_on_its_kind_only(tmp_path):
    base_trace, more_trace = tmp_path / "base.json", tmp_path / "more.json"
    kinds = "allreduce,broadcast"
    # The model's arithmetic alone: no measured local work, which differs run to run.
    timed("--nnodes", "4", "--local-work", "topology", kinds=kinds, trace=base_trace)
    inject = ("--inject", "latency=+2ms,per=collective,op=allreduce")
    more = timed("--nnodes", "4", "--local-work", "topology", *inject, kinds=kinds, trace=more_trace)
    assert load_trace(more_trace)["local_work"] == {"source": "none", "message_us": 0.0, "reduce_gbps": None}
    base_model, more_model = predicted_of(base_trace), predicted_of(more_trace)
    # The model: 2 ms more on allreduce, nothing on broadcast.
    assert more_model["allreduce"] - base_model["allreduce"] == pytest.approx(2e-3, rel=1e-6)
    assert more_model["broadcast"] == pytest.approx(base_model["broadcast"], rel=1e-9)
    # The real rank: no allreduce can end before the emulated ranks enter, 2 ms late, while
    # its broadcasts in the same run are not held: a held broadcast would take 2 ms every
    # time, so one that took less was not. (Their median, against half the allreduce's,
    # failed under the suite's load: 2.2 ms, its best 0.2 ms.)
    assert more["allreduce"]["min_s"] >= 2e-3, more
    assert more["broadcast"]["min_s"] < 2e-3, more


def test_real_rank_tracks_the_model(tmp_path):
    """Where the modeled network is slower than the emulator's own costs, the real rank
    measures the model's instance time (the benchmark table has the full grid)."""
    topo = tmp_path / "slow.yaml"
    topo.write_text(SLOW_LAB)
    trace = tmp_path / "trace.json"
    # root 1 makes real rank 0 the last vrank of the broadcast tree: it waits longest.
    # 20 repetitions: the best of 5 was once a tick-stalled 10.6 ms barrier (the model's 3.2
    # ms) under the other test worker's load, every repetition held up.
    got = timed(
        "--nnodes", "8", "--topology", str(topo), kinds="allreduce,allgather,broadcast,barrier",
        nbytes=1 << 20, reps=20, root=1, trace=trace,
    )  # fmt: skip
    doc = load_trace(trace)
    big = [r for r in doc["instances"] if r["nbytes"] >= 1 << 17 or r["kind"] == "barrier"]
    predicted = {r["kind"]: r["model_us"] * 1e-6 for r in big}
    # The rank may also see the releases' own lateness, as the same run measured it.
    late = doc["release"]["p99_us"] * 1e-6
    for kind, stats in got.items():
        best, median, want = stats["min_s"], stats["median_s"], predicted[kind]
        # It keeps the model's pace (its best repetition), is never released early (its
        # median), and does not time the emulator: the controller's own lag past the modeled
        # releases stays small. Not the real rank's median against an upper bound: a wake-up
        # on this VM can wait a scheduler tick (4 ms), all-real runs alike (docs/fidelity.md,
        # "Tick stalls"), and under the other test worker's load a clean clone once saw a
        # 3.2 ms barrier's median at 12.7 ms (3.75 ms another time).
        assert abs(best - want) <= 0.15 * want + late, (kind, best, want, late)
        assert 0.85 * want <= median, (kind, median, want, late)
        lags = [r["lag_us"] * 1e-6 for r in big if r["kind"] == kind and r.get("lag_us") is not None]
        assert lags and statistics.median(lags) <= 0.15 * want + late, (kind, sorted(lags), want, late)
    assert predicted["broadcast"] > predicted["allgather"] > predicted["barrier"]
    # Releases are late by a small part of the model's own times (the same run's barrier).
    assert doc["release"]["timed_releases"] > 0 and doc["release"]["median_us"] * 1e-6 < predicted["barrier"]


def next_reps(live: Live, n: int) -> list[float]:
    """The next `n` allreduce repetitions the real rank reports, in seconds."""
    return [float(live.wait_line(r"REP allreduce ([0-9.]+)").group(1)) for _ in range(n)]


def best_after_change(live: Live, n: int) -> float:
    """The fastest of `n` repetitions that all started after a change: the lines queued
    before it are dropped, and so is the repetition in flight when it landed. The best,
    not the median: the other test worker's load held a whole window's median at 7.5 ms
    once and its tenth percentile at 3.7 ms another time (against 0.6 ms alone: the CPU
    shared in 4 ms slices), while no repetition under +4 ms can end in less than 4 ms."""
    live.drain()
    next_reps(live, 2)
    return min(next_reps(live, n))


def test_inject_changes_a_live_run():
    live = Live(
        "torchrun", "--nnodes", "4", "--delay-model", "zero",
        LOOP, "--kinds", "allreduce", "--reps", "400000", "--warmup", "0", "--announce",
    )  # fmt: skip
    try:
        inject = lambda *a: nbx("inject", "--address", control_address(live.proc.pid), *a, check_clean=False)  # noqa: E731
        bad = inject("latency=+3")
        assert bad.rc == 2 and "latency" in bad.last_error
        real = inject("straggler=rank:0,delay=1ms")  # the launcher refuses it too
        assert real.rc == 2 and "a straggler must be an emulated rank of the world" in real.last_error, real.err
        # Measured after the refused injections, each window of 100 repetitions (0.1-0.5 s)
        # right before its change: CI once saw the first 50 repetitions of the run (the
        # start's own load) at 2.9 ms against 1.15 ms later, and a window of 30 right after
        # an `inject` process exits measured its teardown once (3.37 ms).
        before = best_after_change(live, 100)
        ok = inject("latency=+4ms,per=collective,op=allreduce")
        assert ok.rc == 0 and "latency=+4ms" in ok.out, ok.err
        during = best_after_change(live, 100)
        assert inject("--clear").out.strip() == "what-if now: none"
        after = best_after_change(live, 100)
        # The emulated ranks enter 4 ms late: no repetition ends sooner while it holds.
        assert during >= 3.9e-3 and during > before + 2e-3 and during > after + 2e-3, (before, during, after)
    finally:
        live.stop()


def test_whatif_sweep_on_the_example(tmp_path):
    # 40 ms per hop (each allreduce crosses 6 hops at 4 nodes: 240 ms) stands far above
    # what the suite's own load adds to an iteration (up to ~80 ms seen), so the order of
    # the two points is the model's, not the machine's.
    out = tmp_path / "sweep"
    res = nbx(
        "whatif", "--sweep", "latency=0,40ms", "--out", str(out), "--nnodes", "4",
        "--", EXAMPLE, "--steps", "3",
    )  # fmt: skip
    assert res.rc == 0, res.err[-3000:]
    rows = list(csv.DictReader((tmp_path / "sweep.csv").open()))
    assert [r["latency"] for r in rows] == ["0", "40ms"]
    assert all(r["status"] == "ok" and r["log"].endswith(".log") for r in rows)
    its = [float(r["iteration_s"]) for r in rows]
    assert its[0] < its[1], its
    import matplotlib.image

    img = matplotlib.image.imread(str(tmp_path / "sweep.png"))
    assert img.shape[0] > 100 and img.shape[1] > 100
    from neuronabox.sim.sweep import plot

    xlabel, ylabel = plot([(r["latency"], float(r["latency_s"]), it) for r, it in zip(rows, its, strict=True)],
                          "latency", "", tmp_path / "again.png")  # fmt: skip
    assert "latency" in xlabel and "(ms)" in xlabel and ylabel == "iteration time (ms)"


def test_single_message_instance_released_at_once(tmp_path):
    """A broadcast from an emulated root to the one real rank is a single boundary
    message; when its release time has passed by the time the instance is set up, it
    leaves at once and the instance completes once."""
    trace = tmp_path / "trace.json"
    timed("--nnodes", "2", kinds="broadcast", root=1, reps=3, trace=trace)
    bcasts = [r for r in load_trace(trace)["instances"] if r["kind"] == "broadcast"]
    assert len(bcasts) == 3 + 3  # warm-ups and repetitions, each completed once
    assert all(r["boundary_messages"] == 1 for r in bcasts)


def test_a_modeled_delay_past_the_timeout_ends_the_run_at_once():
    """Two modifiers, each below --timeout, add up past it on a two-hop ring: the first
    allreduce is refused when priced, not held until the watchdog blames the real rank."""
    res = nbx("torchrun", "--nnodes", "2", "--timeout", "5", "--inject", "latency=+2s", "--inject", "latency=+2s",
              str(ROOT / "tests" / "scripts" / "collectives.py"), "--sizes", "1024", timeout=120)  # fmt: skip
    assert res.rc == 1, res.err[-2000:]
    assert "the delay model gives allreduce #0 of group '0'" in res.last_error
    assert "not less than --timeout (5 s)" in res.last_error and "made no progress" not in res.err


def test_drawn_skew_holds_every_ring_collective_back_by_its_delay(tmp_path):
    """`--skew FILE` of one delay (6 ms): every emulated rank enters every allreduce that
    late, so none completes on the real rank sooner; the trace says which skew ran. A file
    that is not one is refused in one line before anything starts."""
    delays = tmp_path / "delays.txt"
    delays.write_text("6\n")
    trace = tmp_path / "trace.jsonl"
    stats = timed("--nnodes", "8", "--skew", str(delays), kinds="allreduce", reps=6, trace=trace)
    assert stats["allreduce"]["min_s"] >= 6e-3, stats
    doc = load_trace(trace)
    assert doc["skew"] == str(delays.resolve())
    spans = [b - a for i in doc["instances"] if i["kind"] == "allreduce" for a, b in i["per_rank"].values()]
    assert spans and min(spans) >= 6e3, spans  # microseconds
    delays.write_text("six\n")
    res = nbx("torchrun", "--nnodes", "8", "--skew", str(delays), LOOP)
    assert res.rc == 2 and "'six' is not a delay in ms" in res.last_error, res.err
