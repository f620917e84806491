"""Receives posted on a guess, on live runs with the stock torchrun, PyTorch and Gloo: once
a starter's instances repeat at a steady tag step, each, as it completes, posts the next
one's first receives in the same write as its last sends, so the real rank's first sends
of the next call go at once from its own thread (controller/native/book_bindings.cc,
"Guesses"; docs/fidelity.md, "Receives posted on a guess"). Right guesses keep every
value; wrong ones (another ring of the same kind on the guessed slot) do too."""

from __future__ import annotations

from collections import Counter

from conftest import SCRIPTS, nbx

from neuronabox.trace.records import load as load_trace

SHAPE = ("kind", "group", "seq", "world", "root", "nbytes", "geometry", "boundary_messages")


def traced(tmp_path, name: str, env: dict[str, str], *argv: str) -> list[dict]:
    trace = tmp_path / f"{name}.jsonl"
    res = nbx("torchrun", "--delay-model", "zero", "--trace", str(trace), *argv, env=env)
    assert res.rc == 0 and "all checks passed" in res.out, (res.out[-2000:], res.err[-3000:])
    return load_trace(trace)["instances"]


def test_a_repeating_ring_is_guessed_with_the_values_and_instances_of_no_guesses(tmp_path):
    """The collectives script repeats its allreduces at a steady step and checks every value;
    with guesses the allreduces after the first few start from receives posted ahead, and the
    trace has the instances of a run with none (NEURONABOX_GUESS_AHEAD=0)."""
    argv = ("--nnodes", "2", str(SCRIPTS / "collectives.py"), "--repeat", "12", "--sizes", "7,8000",
            "--dtypes", "float32")  # fmt: skip
    guessed = traced(tmp_path, "guessed", {}, *argv)
    plain = traced(tmp_path, "plain", {"NEURONABOX_GUESS_AHEAD": "0"}, *argv)
    shape = lambda inst: tuple(inst[k] for k in SHAPE)  # noqa: E731
    assert sorted(map(shape, guessed)) == sorted(map(shape, plain))
    ahead = Counter(i["nbytes"] for i in guessed if i["kind"] == "allreduce" and i.get("posted_ahead"))
    assert ahead[7 * 4] >= 3 and ahead[8000 * 4] >= 3, ahead  # a noted ring and one the wire sizes
    assert not any(i.get("posted_ahead") for i in plain if i["kind"] == "allreduce")
    assert not any(i.get("posted_ahead") for i in guessed if i["kind"] == "allgather" and not i.get("native_start"))


def test_wrong_guesses_of_a_ring_of_another_length_keep_every_value(tmp_path):
    """A's guess lands on B's instance (the same kind, the same slot, another length): B's
    book takes that receive, the real rank's data of B's length goes to it, and every value
    holds. B's own steady step is guessed right. (A noted ring's wrong guess: the next test.)"""
    instances = traced(tmp_path, "irregular", {}, "--nnodes", "2", str(SCRIPTS / "allreduce_irregular.py"), "30",
                       "3000", "3001")  # fmt: skip
    allreduces = [i for i in instances if i["kind"] == "allreduce"]
    sizes = Counter(i["nbytes"] for i in allreduces)
    assert sorted(sizes.values()) == [10, 30], allreduces
    b_bytes = min(sizes, key=sizes.__getitem__)  # B's ring (its padded length: the trace's)
    ahead = Counter(i["nbytes"] for i in allreduces if i.get("posted_ahead"))
    assert ahead[b_bytes] >= 3, ahead  # B every third step: guessed from its fifth instance on (6 of 10)


def test_a_wrong_guess_on_another_kinds_tag_is_forgotten_and_every_value_holds(tmp_path):
    """A's guess lands on a broadcast's tag: no book claims it, and 80 collectives on, past
    the core's age for a guess, the run ends with every value right."""
    instances = traced(tmp_path, "broadcast", {}, "--nnodes", "2", str(SCRIPTS / "allreduce_irregular.py"), "60",
                       "7", "1000", "broadcast")  # fmt: skip
    assert Counter(i["kind"] for i in instances if i["kind"] != "barrier") == {"allreduce": 60, "broadcast": 20}
