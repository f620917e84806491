"""Native starts on live runs, with the stock torchrun, PyTorch and Gloo: a collective
whose first frame settled an earlier instance's schedule starts in the controller's
core, with no Python before its messages flow. The real ranks get the same values and
the trace the same instances as when every book starts from Python
(NEURONABOX_NATIVE_START=0, the reference)."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from conftest import ROOT, SCRIPTS, nbx

from neuronabox.trace.records import ends
from neuronabox.trace.records import load as load_trace

COLLECTIVES = str(SCRIPTS / "collectives.py")
LOOP = str(ROOT / "scripts" / "collective_loop.py")
SHAPE = ("kind", "group", "seq", "world", "root", "nbytes", "geometry", "boundary_messages")


def traced(tmp_path, name: str, native: bool, *argv: str) -> tuple[list[dict], dict]:
    trace = tmp_path / f"{name}.jsonl"
    env = {"NEURONABOX_NATIVE_START": "1" if native else "0"}
    res = nbx("torchrun", "--trace", str(trace), *argv, env=env)
    assert res.rc == 0, res.err[-3000:]  # the collectives script checks every value it gets
    _, footer = ends(trace)
    return load_trace(trace)["instances"], footer


def test_native_starts_give_the_values_and_instances_of_python_starts(tmp_path):
    # Untimed releases (the zero model): a timed one needs the instance's own timeline.
    # Eight repetitions: an instance's first frame is either real rank's first notice, a
    # send's or a receive's, so at most four first frames per collective and size, and of
    # five instances one must come on a pair and slot where an earlier one's came (three
    # once gave no native barrier on CI). A told ring's call note and its frames come on two
    # sockets with no order between them: under load the note now and then trails the frames
    # (more often since the loop spins past its busy window, and so reads the frames the moment
    # they come), and that instance starts from Python, as correct but slower. With five, a
    # suite under load once saw every 7-element int64 allreduce start from Python.
    argv = ("--nnodes", "4", "--real-nodes", "0,2", "--delay-model", "zero", COLLECTIVES, "--repeat", "8",
            "--sizes", "7,1024,33000", "--dtypes", "float32,int64")  # fmt: skip
    native, native_end = traced(tmp_path, "native", True, *argv)
    python, python_end = traced(tmp_path, "python", False, *argv)
    shape = lambda inst: tuple(inst[k] for k in SHAPE)  # noqa: E731
    assert sorted(map(shape, native)) == sorted(map(shape, python))
    started = [i for i in native if i.get("native_start")]
    assert not any(i.get("native_start") for i in python)
    assert native_end["starts"] == {"native": len(started), "python": len(native) - len(started)}
    assert python_end["starts"] == {"native": 0, "python": len(python)}
    # A ring allreduce's first notice settles it where its segments are long enough, and the
    # call's note (armed in the core as it comes, ahead of the frames) where they are not (the
    # 7-element ones); the script repeats its sizes: a later repetition starts natively when
    # its first frame comes on a pair where a Python start's first frame came (either real
    # rank's may come first; eight repetitions make one for each size and dtype).
    allreduces = Counter(i["nbytes"] for i in started if i["kind"] == "allreduce")
    assert {7 * 4, 7 * 8} <= set(allreduces) <= {7 * 4, 7 * 8, 1024 * 4, 1024 * 8, 33000 * 4, 33000 * 8}, allreduces
    assert Counter(i["kind"] for i in started)["barrier"] >= 1
    on_note = Counter(i["nbytes"] for i in native if i.get("started_on_note"))  # only rings the wire leaves open
    assert set(on_note) <= {7 * 4, 7 * 8}, on_note
    for inst in started:  # its times are the book's own
        entered = min(a for a, _ in inst["per_rank"].values())
        assert inst["start_us"] <= entered <= inst["end_us"], inst


def loop(tmp_path, name: str, *launch: str, reps: int = 20) -> tuple[list[dict], dict, dict]:
    """collective_loop's allreduce and barrier at W = 2: the trace's instances and footer,
    and the real rank's RESULT (per kind: median_s, min_s, mean_s)."""
    trace = tmp_path / f"{name}.jsonl"
    argv = ("--nnodes", "2", *launch, "--trace", str(trace), LOOP, "--kinds", "allreduce,barrier", "--bytes", "4096",
            "--reps", str(reps))  # fmt: skip
    res = nbx("torchrun", *argv)
    assert res.rc == 0, res.err[-3000:]
    line = next(ln for ln in res.out.splitlines() if ln.startswith("RESULT "))
    return load_trace(trace)["instances"], ends(trace)[1], json.loads(line[7:])


def test_a_timed_native_start_keeps_the_model_and_the_whatif(tmp_path):
    """A timed instance starts natively with the template's native timeline moved to its own
    entry: +2 ms of later entry still holds every allreduce of the real rank, and the trace
    prices natively started instances as Python-started ones (the local work the topology's,
    so that no refit moves the price within the run)."""
    inject = ("--inject", "latency=+2ms,per=collective,op=allreduce")
    instances, footer, got = loop(tmp_path, "timed", "--delay-model", "zero", "--local-work", "topology", *inject)
    started = [i for i in instances if i.get("native_start")]
    assert footer["starts"]["native"] == len(started) >= 30, footer  # 23 of each kind, the first of each in Python
    assert got["allreduce"]["min_s"] >= 2e-3, got  # no repetition ends before the emulated ranks enter
    models = {(i["kind"], bool(i.get("native_start"))): i["model_us"] for i in instances if i["kind"] == "allreduce"}
    assert models[("allreduce", True)] == models[("allreduce", False)] >= 2000, models


def test_a_refit_keeps_the_drawn_starters_and_reprices_their_instances(tmp_path):
    """Under drawn skew (the default) a native start makes its timeline from the timing of
    the moment, so a refit of the measured local work keeps the starters: after the first
    Python start of each kind every instance starts natively, and the natively started
    allreduces are priced under the charge that came since their template was made (the
    measured local work's fit rises over a run's first hundred or so collectives: several
    refits, each of which dropped every starter before)."""
    inject = ("--inject", "latency=+2ms,per=collective,op=allreduce")
    instances, footer, _ = loop(tmp_path, "refit", "--delay-model", "zero", "--local-work", "measured", *inject,
                                reps=150)  # fmt: skip
    allreduces = [i for i in instances if i["kind"] == "allreduce"]
    native = [i["model_us"] for i in allreduces if i.get("native_start")]
    python = [i for i in allreduces if not i.get("native_start")]
    assert len(python) <= 2, [(i["seq"], i["model_us"]) for i in python]  # the first, and at most a straggler
    assert min(native) >= 2000 and max(native) > allreduces[0]["model_us"], allreduces[:3]  # charged since


def test_jitter_keeps_every_start_in_python(tmp_path):
    """Jitter draws each release in Python: no native timeline to move, no native start."""
    instances, footer, _ = loop(tmp_path, "jitter", "--delay-model", "zero", "--inject", "jitter=100us,op=allreduce")
    assert footer["starts"]["native"] == sum(1 for i in instances if i.get("native_start"))
    assert not any(i.get("native_start") for i in instances if i["kind"] == "allreduce")
    assert any(i.get("native_start") for i in instances if i["kind"] == "barrier")  # jitter on allreduce only


def test_an_allgather_that_two_notices_settle_starts_natively_at_w2(tmp_path):
    """At W = 2 an allgather's first two notices come on the one pair: the core holds the
    first until the second matches a starter, then starts the book with both. The real
    rank's values are the collectives script's check; the records are the Python starts'."""
    argv = ("--nnodes", "2", "--delay-model", "zero", COLLECTIVES, "--repeat", "4", "--sizes", "1024",
            "--dtypes", "float32")  # fmt: skip
    native, native_end = traced(tmp_path, "native", True, *argv)
    python, _ = traced(tmp_path, "python", False, *argv)
    shape = lambda inst: tuple(inst[k] for k in SHAPE)  # noqa: E731
    assert sorted(map(shape, native)) == sorted(map(shape, python))
    allgathers = [i for i in native if i["kind"] == "allgather"]
    assert len(allgathers) == 4 and sum(1 for i in allgathers if i.get("native_start")) == 3, allgathers
    assert native_end["starts"]["native"] == sum(1 for i in native if i.get("native_start"))


def test_an_allgather_posts_its_first_receive_ahead_of_the_notices_that_settle_it(tmp_path):
    """At W = 2 the core posts the emulated rank's receive of chunk 0 as the real rank's first
    send notice comes, while the notice of chunk 1 that settles the block is still to come:
    blocks of 2h and 2h + 1 bytes alternate, so that notice is all that tells them apart, and
    a first notice matching one shape's starter may turn out the other's (handed back to
    Python with the data the early receive let come, which that receive then serves). Every
    block each rank gets is the script's check; each shape starts natively after its first
    Python start, each native start after a receive posted ahead."""
    for h in (1, 40_000):
        trace = tmp_path / f"halves-{h}.jsonl"
        res = nbx("torchrun", "--nnodes", "2", "--delay-model", "zero", "--trace", str(trace),
                  str(SCRIPTS / "allgather_halves.py"), "6", str(h))  # fmt: skip
        assert res.rc == 0 and "all checks passed" in res.out, res.err[-3000:]
        allgathers = [i for i in load_trace(trace)["instances"] if i["kind"] == "allgather"]
        assert len(allgathers) == 12, allgathers
        started = [i for i in allgathers if i.get("native_start")]
        assert {i["nbytes"] for i in started} == {4 * h, 4 * h + 2}, allgathers  # both shapes, W = 2
        assert len(started) >= 8 and all(i.get("posted_ahead") for i in started), allgathers
        assert not any(i.get("posted_ahead") for i in allgathers if not i.get("native_start"))


def test_ddps_map_of_used_parameters_starts_natively_like_its_buckets(tmp_path):
    """Under `find_unused_parameters=True` DDP's reducer allreduces a map of used parameters
    (one int32 per parameter) every step from C++, as it does its buckets: no call notes its
    size, and a ring that small does not carry it on the wire. The observer tells it with
    the buckets, so after the first step it starts natively instead of asking the real
    rank's flight recorder every step (a dump on the real rank's core). The script checks
    that the branch it leaves out on odd steps keeps its values."""
    trace = tmp_path / "unused.jsonl"
    res = nbx("torchrun", "--nnodes", "2", "--trace", str(trace), str(SCRIPTS / "ddp_unused.py"), "12")
    assert res.rc == 0 and "all checks passed" in res.out, res.err[-3000:]
    maps = [i for i in load_trace(trace)["instances"] if i["kind"] == "allreduce" and i["dtype"] == "Int"]
    assert len(maps) == 12 and {i["nbytes"] for i in maps} == {8 * 4}, maps  # 8 parameters
    assert sum(1 for i in maps if i.get("native_start")) >= 10, [i.get("native_start", False) for i in maps]


def test_a_start_under_drawn_skew_draws_its_own_entry_natively(tmp_path):
    """Under `--skew` each instance draws its emulated ranks' entries (seeded by its tag):
    the starter's timeline makes each start's own in the core's call, as a Python start
    would at its install, so allreduces start natively and every one still waits for the
    drawn 6 ms (before, drawn skew kept every start in Python)."""
    delays = tmp_path / "delays.txt"
    delays.write_text("6\n")
    instances, footer, got = loop(tmp_path, "drawn", "--skew", str(delays))
    allreduces = [i for i in instances if i["kind"] == "allreduce"]
    started = [i for i in allreduces if i.get("native_start")]
    assert len(started) >= len(allreduces) // 2, [i.get("native_start", False) for i in allreduces]
    assert footer["starts"]["native"] == sum(1 for i in instances if i.get("native_start"))
    assert got["allreduce"]["min_s"] >= 6e-3, got  # no repetition ends before the emulated ranks enter
    spans = [b - a for i in started for a, b in i["per_rank"].values()]
    assert min(spans) >= 6e3, spans  # microseconds


@pytest.mark.parametrize(
    "nnodes,real_nodes,note_start,env",
    [
        (2, "0", True, {}),
        (4, "0,2", True, {}),
        (2, "0", False, {"NEURONABOX_NOTE_START": "0"}),
        (2, "0", True, {"NEURONABOX_NOTE_LINK": "0"}),
    ],
    ids=["on-note", "on-note-two-real-ranks", "at-first-frame", "on-note-read-by-python"],
)
def test_a_told_shape_starts_natively_only_where_the_call_noted_it(tmp_path, nnodes, real_nodes, note_start, env):
    """A ring whose size only the call's note tells starts natively from the note, never from
    its first frame alone: an unnoted allreduce (the process group's own method, as DDP's
    reducer or a functional collective calls it) with the same first frame goes to Python,
    which asks the observer, and every result is right. By default the note starts it as it
    comes, before any of its frames (`started_on_note`; the core reads the note link itself
    once Python has seen the shape noted), and with two real ranks the second rank's note
    finds it started; NEURONABOX_NOTE_START=0 only arms the start at the instance's first
    frame. With NEURONABOX_NOTE_LINK=0 the notes come over the observer link and Python
    starts or arms (the same check of the tag in the core)."""
    trace = tmp_path / "told.jsonl"
    # The local work from the topology: a refit of the measured one drops fixed starters, and
    # under the suite's load refits came at every step (no native start at all, once).
    res = nbx("torchrun", "--nnodes", str(nnodes), "--real-nodes", real_nodes, "--delay-model", "zero",
              "--local-work", "topology", "--trace", str(trace), str(SCRIPTS / "told_and_unnoted.py"), "8",
              env=env)  # fmt: skip
    assert res.rc == 0 and "all checks passed" in res.out, res.err[-3000:]
    allreduces = [i for i in load_trace(trace)["instances"] if i["kind"] == "allreduce"]
    native = Counter(i["nbytes"] for i in allreduces if i.get("native_start"))
    assert Counter(i["nbytes"] for i in allreduces) == {7 * 4: 8, 6 * 4: 8}, allreduces
    # The first noted one, and any after a refit, from Python; with two real ranks also any
    # whose frames from one came before either's note (5 to 7 of 8 native in four runs).
    assert native[7 * 4] >= (6 if nnodes == 2 else 2) and native[6 * 4] == 0, native
    on_note = Counter(i["nbytes"] for i in allreduces if i.get("started_on_note"))
    assert all(i.get("native_start") for i in allreduces if i.get("started_on_note"))
    if note_start:  # under load a note may trail its frames now and then: that one starts from its arm
        assert on_note[7 * 4] >= 1 and on_note[6 * 4] == 0, on_note
    else:
        assert not on_note, on_note
