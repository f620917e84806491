"""A ring's size, told as the call enters, where Gloo's wire does not carry it.

An allreduce or reduce whose segments are full (from 2/3 MiB) or tiny has a size the
controller cannot read off the real ranks' frames (neuronabox/schedules/gloo_reduce.py,
`size_on_wire`). Asking for it after the first frame cost a round trip and a dump of
PyTorch's flight recorder on the real rank's core (about 4 us an entry, 0.3 ms for 64)
for every such instance. Instead the c10d function, as it is called, notes the tensor's
element count and dtype under the instance's Gloo tag and sends them to the controller
at once (`note_out`: the agent's note link, which the controller's core reads itself),
before the call puts its first frame on the wire; a question that comes anyway is
answered from the note. DDP's buckets, which its C++ reducer allreduces past every
Python function, are sized by the controller from the model's bucket sizes
(`note_buckets`). Both ends use a note only if it fits the segments the real rank's
frames carry (`fits_wire`): a note under the wrong tag is another collective's.

The tag is the group's sequence number less the point-to-point operations it counted:
ProcessGroupGloo numbers every operation, but gives a tag to collectives only. The
point-to-point calls are counted at ProcessGroup's own methods, which every path to
them takes, once each has taken its number: a note never names a tag before its call's,
and one past it (a call past those methods) the controller's check of the frames
refuses. Whenever the flight recorder is read anyway (the dtype reports), the notes it
still holds are checked against it; a group whose notes disagree is answered from the
recorder from then on.
"""

from __future__ import annotations

import functools
import math
import os
import sys
import threading
from collections.abc import Callable

from neuronabox.schedules.gloo_reduce import fits_wire, ring_geometry, size_on_wire

KEEP = 4096  # notes kept; older ones were asked for long ago, or never will be
P2P_METHODS = ("send", "recv", "recv_anysource")
RING_CALLS = {"all_reduce": (2, False), "reduce": (3, True)}  # c10d function -> (its group's position, a reduce)

_lock = threading.Lock()
_p2p: dict[object, int] = {}  # process group -> the point-to-point operations it issued
_notes: dict[tuple[str, int], tuple[str, int, int, str]] = {}  # (group, tag) -> (op, element count and size, dtype)
_untrusted: set[str] = set()  # groups whose notes disagreed with the flight recorder
push: Callable[[dict], None] | None = None  # the agent's line to the controller (a DDP model's buckets)
note_out: Callable[[str, int, str, int, str], None] | None = None  # the note link: group, tag, op, numel, dtype


def _c10d():
    return sys.modules["torch.distributed.distributed_c10d"]


def install(c10d) -> None:
    """Count point-to-point operations per group, and wrap the ring collectives' functions
    (NEURONABOX_SIZE_NOTES=0: not, every such size from the recorder, a benchmark's reference)."""
    if os.environ.get("NEURONABOX_SIZE_NOTES", "1") == "0":
        return
    pg_class = c10d.ProcessGroup
    for name in P2P_METHODS:
        if hasattr(pg_class, name):
            setattr(pg_class, name, _counting(getattr(pg_class, name)))
    for name, (group_at, reduce) in RING_CALLS.items():
        setattr(c10d, name, _sizing(getattr(c10d, name), name, group_at, reduce))


def _counting(method):
    @functools.wraps(method)
    def counted(self, *args, **kwargs):
        work = method(self, *args, **kwargs)  # counted once it is in: one that raised took no number
        with _lock:
            _p2p[self] = _p2p.get(self, 0) + 1
        return work

    return counted


def _sizing(fn, op: str, group_at: int, reduce: bool):
    @functools.wraps(fn)
    def sized(*args, **kwargs):
        try:
            tensor = args[0] if args else kwargs.get("tensor")
            group = args[group_at] if len(args) > group_at else kwargs.get("group")
            _note(op, reduce, tensor, group)
        except Exception:  # a note never breaks the call: the controller asks instead
            pass
        return fn(*args, **kwargs)

    return sized


def _note(op: str, reduce: bool, tensor, group) -> None:
    c10d = _c10d()
    pg = group if group is not None else c10d._get_default_group()
    world = pg.size()
    numel, elem = tensor.numel(), tensor.element_size()
    if world < 2 or tensor.is_sparse:
        return
    if size_on_wire(world, ring_geometry(world, numel * elem, elem, reduce).segment_bytes, reduce):
        return  # the controller reads it off the wire
    if pg in getattr(c10d._world, "pg_coalesce_state", {}):
        return  # a coalesced call flattens several tensors under one tag: the recorder says
    name = c10d._get_process_group_name(pg)
    if name in _untrusted:
        return
    dtype = c10_dtype(tensor)
    with _lock:
        tag = pg._get_sequence_number_for_group() - _p2p.get(pg, 0)
        _notes[(name, tag)] = (op, numel, elem, dtype)
        if len(_notes) > KEEP:
            del _notes[next(iter(_notes))]
    if note_out is not None:
        note_out(name, tag, op, numel, dtype)


def c10_dtype(tensor) -> str:
    """The tensor's dtype as c10 and the flight recorder name it: Float, BFloat16, ..."""
    return tensor.type().rsplit(".", 1)[-1].removesuffix("Tensor")


def note_buckets(group: str, buckets: list[tuple[int, str]]) -> None:
    """A DDP model's gradient buckets on `group`, (element count, dtype) each: its C++
    reducer allreduces them past every Python function, so no call tells their sizes. The
    controller sizes such an allreduce at its first frame by the one bucket whose ring fits
    the segments it carries (controller/observer_link.py)."""
    if push is not None:
        push({"buckets": group, "sizes": [list(b) for b in sorted(set(buckets))]})


def noted(group: str, tag: int, op: str, world: int = 0, wire: int = 0) -> tuple[int, str] | None:
    """(element count, dtype) of the group's `op` with this tag, as its call noted them, if
    they fit the segments the controller saw on the wire (`wire`, in a group of `world`)."""
    with _lock:
        note = None if group in _untrusted else _notes.get((group, tag))
    if note is None or note[0] != op:
        return None
    _, numel, elem, dtype = note
    if world and not fits_wire(world, numel * elem, elem, op == "reduce", wire):
        return None  # another collective's note: the recorder answers
    return numel, dtype


def check(entries: list[dict]) -> list[str]:
    """Check the notes the recorder's `entries` still cover; the groups found wrong (from
    now on answered from the recorder)."""
    wrong = []
    with _lock:
        for e in entries:
            group, tag = e["process_group"][0], e.get("collective_seq_id", 0) - 1
            note = _notes.get((group, tag))
            if note is None or group in _untrusted:
                continue
            numel = sum(math.prod(size) for size in e.get("input_sizes", []))
            if not e.get("profiling_name", "").startswith(f"gloo:{note[0]}") or numel != note[1]:
                _untrusted.add(group)
                wrong.append(group)
        for key in [k for k in _notes if k[0] in _untrusted]:
            del _notes[key]
    return wrong
