"""Long runs: the controller's memory stays flat and the trace streams to disk.

A run used to fail after about 15,000 collectives ("the controller exited with
status 0"): the final reply carried the whole trace and passed gRPC's 4 MiB
limit. Its records also piled up in memory, about 3 KB per collective.
"""

import psutil
from conftest import ROOT, Live

from neuronabox.trace.records import events, load

LOOP = str(ROOT / "scripts" / "collective_loop.py")
WARMUP, REPS = 1000, 9000  # each repetition is two barriers: 20,000 collectives in all


def controller_of(live: Live) -> psutil.Process:
    for child in psutil.Process(live.proc.pid).children(recursive=True):
        if "neuronabox.controller.main" in " ".join(child.cmdline()):
            return child
    raise AssertionError("no controller process")


def test_twenty_thousand_collectives_in_flat_memory(tmp_path):
    trace = tmp_path / "run.jsonl"
    live = Live(
        "torchrun", "--nnodes", "2", "--delay-model", "zero", "--trace", str(trace),
        LOOP, "--kinds", "barrier", "--warmup", str(WARMUP), "--reps", str(REPS), "--announce",
    )  # fmt: skip
    try:
        live.wait_line(r"^REP barrier", timeout=180)  # the first timed repetition: 2,000 collectives done
        ctl = controller_of(live)
        before = ctl.memory_info().rss
        for _ in range(REPS - 100):
            live.wait_line(r"^REP barrier", timeout=60)
        grown = ctl.memory_info().rss - before
        assert live.finish(timeout=120) == 0, live.err[-2000:]
    finally:
        live.stop()
    collectives = 2 * (REPS - 101)
    assert grown / collectives < 200, f"the controller grew {grown} bytes over {collectives} collectives"
    out = "".join(live.out)
    assert "barrier      20001" in out  # the summary came (the init barrier is one more)
    doc = load(trace)
    assert doc["complete"] and doc["state"] == "stopped"
    assert len(doc["instances"]) == 20001 and doc["world_size"] == 2
    tags = [i["seq"] for i in doc["instances"]]
    assert tags == sorted(tags) and len(set(tags)) == len(tags)


def test_a_cut_off_trace_keeps_what_it_wrote(tmp_path):
    """A run killed mid-write leaves a trace whose last line is torn: what came before
    it reads back, without a footer."""
    path = tmp_path / "cut.jsonl"
    from neuronabox.controller.outcomes import InstanceRecord

    from neuronabox.trace.records import TraceWriter

    w = TraceWriter(path, {"world_size": 4})
    for tag in range(3):
        w.instance(InstanceRecord("0", tag, "allreduce", 64, 6, tag, tag + 0.5, {0: (tag, tag + 0.5)}, "", 0.0, 0.4, 4))
    w.close({"state": "stopped"})
    text = path.read_text()
    torn = text[: text.rindex('{"end"')] + '{"instance": {"seq": 3, "ki'
    path.write_text(torn)
    doc = load(path)
    assert [i["seq"] for i in doc["instances"]] == [0, 1, 2] and not doc["complete"]
    assert doc["gaps"] == [[0, 0.5e6, 1e6], [0, 1.5e6, 2e6]]  # a gap is final once a later entry closes it
    header = {"format": "neuronabox-trace", "version": 2, "clock": "epoch_us", "world_size": 4}
    assert next(events(path)) == ("header", header)
