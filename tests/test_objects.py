"""Object collectives (pickles in a size broadcast or exchange, then the bytes) with
the source emulated or real, under both data policies. Zeros cannot unpickle, so an
emulated source sends what the real rank passed in: the real rank gets its own
objects back (tests/scripts/objects.py checks each call and prints what it got)."""

import pytest
from conftest import SCRIPTS

OBJECTS = str(SCRIPTS / "objects.py")


@pytest.mark.parametrize(
    "data,real",
    [
        # Each side once, each policy once: an object collective's emulated contributions are
        # the real rank's own under either policy, so the outputs checked are the same.
        ("zeros", "1"),  # rank 0 emulated: it broadcasts and scatters the real rank's own objects
        ("mirror", "0"),  # rank 0 real: its objects go out; gather_object's emulated blocks are its pickle
    ],
)
def test_object_collectives_from_either_side(run, data, real):
    res = run("torchrun", "--nnodes", "2", "--real-nodes", real, "--data", data, OBJECTS)
    assert res.rc == 0, res.out[-2000:] + res.err[-3000:]
    r = int(real)
    assert f"rank {r}: broadcast_object_list got [{{'rank': {r}, 'items': {list(range(r + 3))}}}, 'text " in res.out
    assert "and 76800 bytes" in res.out
    assert f"rank {r}: broadcast_object_list got [None]" in res.out
    if r == 1:  # the emulated root sent the real rank's own output placeholder; nothing gathered here
        assert "rank 1: scatter_object_list got [{'placeholder': 1}]" in res.out
        assert "rank 1: gather_object got None" in res.out
    else:  # the emulated rank's object is the real rank's (its size came from the allgather)
        assert "rank 0: scatter_object_list got [{'to': 0}]" in res.out
        assert "rank 0: gather_object got [{'rank': 0}, {'rank': 0}]" in res.out
    assert f"rank {r}: objects done" in res.out
