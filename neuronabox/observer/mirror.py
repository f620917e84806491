"""The observer's half of `--data mirror`: the real rank's inputs, by collective.

Every emulated rank contributes what the mirror source contributed: a real rank
of the group (the first whose ring successor is emulated: rank 0 when it alone
is real). That rank's observer wraps c10d's collective functions and keeps a copy
of each input as the call enters, keyed by (group, tag); the controller asks for
it when an instance starts. The tag is the one Gloo is about to use: the flight
recorder's last collective sequence id of the group (ids count from 1, tags from
0). DDP's C++ reducer calls Gloo past every Python function, so DDP models get
PyTorch's own `allreduce_hook` (the same divide-then-allreduce the reducer does),
registered at the first forward unless the script set a hook.
"""

from __future__ import annotations

import base64
import functools
import inspect
import os
import pickle
import threading
import time

_lock = threading.Lock()
_inputs: dict[tuple[str, int], dict] = {}  # (group, tag) -> the answer for the controller
_last_tag: dict[str, int] = {}
REAL = {int(r) for r in os.environ.get("NEURONABOX_REAL_RANKS", "").split(",") if r}

# c10d function -> (names of the input tensor argument or list, the alltoall flavour)
WRAPPED = {
    "all_reduce": "tensor",
    "reduce": "tensor",
    "broadcast": "tensor",
    "gather": "tensor",
    "all_to_all_single": "input",
    "all_to_all": "input_tensor_list",
    "reduce_scatter_tensor": "input",
}


def _issued_tags(group: str) -> int:
    """How many collectives the group has issued (its next tag), per the flight recorder."""
    import torch._C._distributed_c10d as C

    dump = pickle.loads(C._dump_fr_trace(True, False, False))
    seen = [e["collective_seq_id"] for e in dump.get("entries", []) if e["process_group"][0] == group]
    return max([*seen, _last_tag.get(group, 0)])


def _source(members: list[int]) -> int:
    """The group's mirror source (global rank), chosen as the controller's RealRanks.mirror
    does: the first real member whose ring successor is emulated."""
    w = len(members)
    real = [g for g, r in enumerate(members) if r in REAL]
    src = next((g for g in real if (g + 1) % w not in real), real[0] if real else -1)
    return members[src] if src >= 0 else -1


def _record(c10d, pg, tensors, op, splits: list[int] | None) -> None:
    group = c10d._get_process_group_name(pg)
    if _source(c10d.get_process_group_ranks(pg)) != int(os.environ["RANK"]):
        return  # not this group's mirror source
    data = b"".join(t.detach().contiguous().view(-1).numpy().tobytes() for t in tensors)
    coalescing = pg in getattr(c10d._world, "pg_coalesce_state", {})
    tag = _issued_tags(group)
    with _lock:
        old = _inputs.get((group, tag)) if coalescing else None  # a coalesced call flattens its tensors
        entry = {
            "data": (old["data"] if old else b"") + data,
            "dtype": str(tensors[0].dtype).removeprefix("torch."),
            "op": getattr(op, "name", "SUM"),
            "splits": splits,
        }
        _inputs[(group, tag)] = entry


def _wrap_one(c10d, name: str, arg: str) -> None:
    fn = getattr(c10d, name)
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def recording(*args, **kwargs):
        try:
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            a = bound.arguments
            pg = a.get("group") or c10d._get_default_group()
            x = a[arg]
            op = a.get("op")
            if name == "all_to_all":
                tensors, splits = list(x), [t.numel() * t.element_size() for t in x]
            elif name == "all_to_all_single":
                tensors, row = [x], x[0].numel() * x.element_size() if x.dim() and len(x) else 0
                given = a.get("input_split_sizes")
                w = pg.size()
                splits = [s * row for s in given] if given else [x.numel() * x.element_size() // w] * w
            else:
                tensors, splits = [x], None
            _record(c10d, pg, tensors, op, splits)
        except Exception:  # never break the script: the controller falls back to zeros
            pass
        return fn(*args, **kwargs)

    setattr(c10d, name, recording)


def _wrap_reduce_scatter(c10d) -> None:
    """The list form runs one allreduce per input tensor, tags in order."""
    fn = c10d.reduce_scatter
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def recording(*args, **kwargs):
        try:
            a = sig.bind(*args, **kwargs).arguments
            pg = a.get("group") or c10d._get_default_group()
            group = c10d._get_process_group_name(pg)
            first = _issued_tags(group)
            for i, t in enumerate(a["input_list"]):
                _last_tag[group] = first + i
                _record(c10d, pg, [t], a.get("op"), None)
        except Exception:
            pass
        return fn(*args, **kwargs)

    c10d.reduce_scatter = recording


def install(c10d) -> None:
    """Wrap c10d's collectives (called as the module loads, before torch.distributed
    copies its names)."""
    for name, arg in WRAPPED.items():
        if hasattr(c10d, name):
            _wrap_one(c10d, name, arg)
    if hasattr(c10d, "reduce_scatter"):
        _wrap_reduce_scatter(c10d)


def hook_ddp(ddp_module) -> None:
    """DDP models reduce through PyTorch's `allreduce_hook`, which calls the (wrapped)
    all_reduce: the same bytes on the wire as the C++ reducer's own allreduce."""
    cls = ddp_module.DistributedDataParallel
    forward, register = cls.forward, cls.register_comm_hook

    def register_comm_hook(self, state, hook):
        self._neuronabox_hooked = True
        return register(self, state, hook)

    def first_forward(self, *args, **kwargs):
        if not getattr(self, "_neuronabox_hooked", False):
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

            register_comm_hook(self, self.process_group, allreduce_hook)
        return forward(self, *args, **kwargs)

    cls.register_comm_hook = register_comm_hook
    cls.forward = first_forward


def answer(query: dict, deadline: float) -> dict | None:
    """The controller's question for (group, tag): the input, or None (nothing recorded:
    the emulated ranks send zeros), or wait (the call has not entered yet)."""
    group, tag = query["pg"], query["tag"]
    with _lock:
        entry = _inputs.pop((group, tag), None)
        for k in [k for k in _inputs if k[0] == group and k[1] < tag]:
            del _inputs[k]  # older calls nobody asked for
    if entry is not None:
        data = base64.b64encode(entry["data"]).decode()
        return {"q": query["q"], "data": data, "dtype": entry["dtype"], "op": entry["op"], "splits": entry["splits"]}
    if _issued_tags(group) > tag or time.monotonic() > deadline:
        return {"q": query["q"], "data": None}
    return None
