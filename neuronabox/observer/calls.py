"""What the real rank's collective calls named that Gloo's wire does not carry: the
root of a broadcast, and (under `--data mirror`) the input of each collective.

Every emulated rank contributes what the group's mirror source contributed: a real
rank of the group (the first whose ring successor is emulated: rank 0 when it alone
is real). Wrappers around c10d's functions note, as each call enters, the group's
sequence number (`_get_sequence_number_for_group`, one per operation: cheap) with
the root, and on the source a copy of the input. The controller asks by Gloo's tag;
the flight recorder maps a tag to its operation (`collective_seq_id` = tag + 1,
`op_id` = sequence number + 1), read only when a question comes.

DDP's C++ reducer calls Gloo past every Python function, so under mirror DDP models
get PyTorch's own `allreduce_hook` (the same divide-then-allreduce the reducer does),
registered at the first forward unless the script set a hook. DDP's construction
broadcasts (the parameter metadata check, the state sync) are noted in both
policies: with rank 0 emulated, the real ranks get their own model back.

Object collectives carry pickles, which zeros cannot give, so in both policies the
source notes, for an object broadcast or scatter from an emulated root, the sizes
and pickles that root would send (those of its own objects: off the root usually
placeholders, which the call then leaves it), and under zeros gather_object's
gather input (its own pickle: the emulated ranks' objects are its object).
"""

from __future__ import annotations

import base64
import functools
import inspect
import math
import os
import pickle
import sys
import threading
import time
from collections.abc import Callable

from neuronabox.schedules.gloo import RealRanks

from . import sizes

_lock = threading.Lock()
_inputs: dict[tuple[str, int], dict] = {}  # (group, sequence number) -> the input
_roots: dict[tuple[str, int], int] = {}  # (group, sequence number) -> broadcast root (group rank)
_sources: dict[str, bool] = {}  # group -> whether this rank is its mirror source
REAL = {int(r) for r in os.environ.get("NEURONABOX_REAL_RANKS", "").split(",") if r}
KEEP = 4096  # notes kept per kind; older ones nobody asked for go
STALE = 64  # an input noted this many operations before the one asked for is dropped

# c10d function -> the name of its input argument (tensor or list); broadcast has its own
MIRRORED = {
    "all_reduce": "tensor",
    "reduce": "tensor",
    "gather": "tensor",
    "all_to_all_single": "input",
    "all_to_all": "input_tensor_list",
    "reduce_scatter_tensor": "input",
}


def _c10d():
    return sys.modules["torch.distributed.distributed_c10d"]


def _seq(pg) -> int:
    return pg._get_sequence_number_for_group()


def _name(pg) -> str:
    return _c10d()._get_process_group_name(pg)


def _keep(d: dict, key, value) -> None:
    d[key] = value
    if len(d) > KEEP:
        del d[next(iter(d))]


def flight_records() -> list[dict]:
    """The flight recorder's entries (one dump serves every question of a pass)."""
    import torch._C._distributed_c10d as C

    return pickle.loads(C._dump_fr_trace(True, False, False)).get("entries", [])


def dtypes_since(entries: list[dict], reported: dict[str, int]) -> list[list]:
    """[group, tag, dtype] of each collective issued since the last report (`reported`:
    group -> the last tag reported, updated here). The trace fills the instances'
    dtype and element count with them, off the collectives' path (a DDP bucket's
    shape is fixed by the wire, so nobody asks the observer for it)."""
    found = []
    for e in entries:
        group, tag = e["process_group"][0], e.get("collective_seq_id", 0) - 1
        name = e.get("profiling_name", "")
        if tag < 0 or not e.get("input_dtypes") or not name.startswith("gloo:") or name.endswith(("send", "recv")):
            continue
        if tag > reported.get(group, -1):
            found.append([group, tag, e["input_dtypes"][0]])
    for group, tag, _ in found:
        reported[group] = max(reported.get(group, -1), tag)
    return found


def _entry(entries: list[dict], group: str, tag: int) -> dict | None:
    """The group's collective with this tag (the recorder's ids count from 1, tags from 0)."""
    for e in reversed(entries):
        if e["process_group"][0] == group and e["collective_seq_id"] == tag + 1:
            return e
    return None


def _op_of(entries: list[dict], group: str, tag: int) -> int | None:
    """The sequence number of the group's collective with this tag (None: not issued yet)."""
    e = _entry(entries, group, tag)
    return None if e is None else e["op_id"] - 1


def _is_source_of(pg) -> bool:
    """Whether this rank is the group's mirror source: RealRanks.mirror, as the controller
    picks it (once per group)."""
    name = _name(pg)
    mine = _sources.get(name)
    if mine is None:
        members = _c10d().get_process_group_ranks(pg)
        real = RealRanks([g for g, r in enumerate(members) if r in REAL], len(members))
        mine = _sources[name] = members[real.mirror] == int(os.environ["RANK"])
    return mine


def _note_input(pg, tensors, op, splits: list[int] | None, seq: int | None = None, fixed: bool = False) -> None:
    """Note the input of the group's operation `seq` (this one if None). A `fixed` note (an
    object collective's own bytes for the call it makes) is not replaced by the call's."""
    if not _is_source_of(pg):
        return  # not this group's mirror source
    c10d = _c10d()
    data = b"".join(t.detach().contiguous().view(-1).numpy().tobytes() for t in tensors)
    key = (_name(pg), _seq(pg) if seq is None else seq)
    coalescing = pg in getattr(c10d._world, "pg_coalesce_state", {})
    with _lock:
        old = _inputs.get(key)
        if old is not None and old.get("fixed"):
            return
        old = old if coalescing else None  # a coalesced call flattens its tensors, in order
        _keep(_inputs, key, {
            "data": (old["data"] if old else b"") + data,
            "dtype": str(tensors[0].dtype).removeprefix("torch."),
            "op": getattr(op, "name", "SUM"),
            "splits": splits,
            "fixed": fixed,
        })  # fmt: skip


def _note_root(pg, root: int, seq: int | None = None) -> None:
    with _lock:
        _keep(_roots, (_name(pg), _seq(pg) if seq is None else seq), root)


def _noting(fn, note):
    """Wrap `fn` so that `note(arguments)` runs first; a failing note never breaks the call."""
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def noted(*args, **kwargs):
        try:
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            note(bound.arguments)
        except Exception:
            pass
        return fn(*args, **kwargs)

    return noted


def _group(a: dict):
    return a.get("group") or _c10d()._get_default_group()


def install(c10d, mirror: bool) -> None:
    """Wrap c10d's functions as the module loads (before torch.distributed copies them)."""
    sizes.install(c10d)

    def broadcast_root(a):
        pg = _group(a)
        src = a.get("group_src")
        _note_root(pg, src if src is not None else c10d.get_group_rank(pg, a["src"]))
        if mirror:
            _mirror_input("broadcast", "tensor", a)

    c10d.broadcast = _noting(c10d.broadcast, broadcast_root)
    c10d.broadcast_object_list = _noting(c10d.broadcast_object_list, functools.partial(_object_broadcast, c10d))
    c10d.scatter_object_list = _noting(c10d.scatter_object_list, functools.partial(_object_scatter, c10d))
    if not mirror:  # mirror notes every gather's input; zeros those of gather_object only
        c10d.gather_object = _inside(c10d.gather_object, "gather_object")
        c10d.gather = _noting(c10d.gather, _object_gather)
        return
    for name, arg in MIRRORED.items():
        setattr(c10d, name, _noting(getattr(c10d, name), functools.partial(_mirror_input, name, arg)))

    def reduce_scatter_list(a):  # one allreduce per input tensor, in order
        pg = _group(a)
        first = _seq(pg)
        for i, t in enumerate(a["input_list"]):
            _note_input(pg, [t], a.get("op"), None, seq=first + i)

    c10d.reduce_scatter = _noting(c10d.reduce_scatter, reduce_scatter_list)


def _mirror_input(name: str, arg: str, a: dict) -> None:
    pg, x = _group(a), a[arg]
    splits = None
    if name == "all_to_all":
        tensors, splits = list(x), [t.numel() * t.element_size() for t in x]
    elif name == "all_to_all_single":
        tensors, w = [x], pg.size()
        row = x[0].numel() * x.element_size() if x.dim() and len(x) else 0
        given = a.get("input_split_sizes")
        splits = [s * row for s in given] if given else [x.numel() * x.element_size() // w] * w
    else:
        tensors = [x]
    _note_input(pg, tensors, a.get("op"), splits)


def _emulated_root(c10d, pg, src: int | None, group_src: int | None) -> bool:
    """Whether an object collective's root (global `src`, or `group_src`; rank 0 if neither) is emulated."""
    if group_src is None:
        group_src = c10d.get_group_rank(pg, 0 if src is None else src)
    return c10d.get_global_rank(pg, group_src) not in REAL


def _pickles(c10d, pg, objs) -> list:
    """The byte tensors c10d's object collectives send for `objs` (its own pickler)."""
    import torch

    return [c10d._object_to_tensor(o, torch.device("cpu"), pg)[0] for o in objs]


def _int64(values: list[int]):
    import torch

    return torch.tensor(values, dtype=torch.int64)


def _object_broadcast(c10d, a: dict) -> None:
    """broadcast_object_list from an emulated root is two broadcasts: the pickles' sizes
    (int64 each), then the pickles, concatenated. Zeros cannot unpickle, so in both
    policies the root sends the objects this rank passed in (off the root, usually
    placeholders: the call leaves this rank its own objects)."""
    pg, objs = _group(a), a["object_list"]
    if not objs or not _emulated_root(c10d, pg, a.get("src"), a.get("group_src")) or not _is_source_of(pg):
        return
    seq, pickles = _seq(pg), _pickles(c10d, pg, objs)
    _note_input(pg, [_int64([p.numel() for p in pickles])], None, None, seq, fixed=True)
    _note_input(pg, pickles, None, None, seq + 1, fixed=True)


def _object_scatter(c10d, a: dict) -> None:
    """scatter_object_list from an emulated root is a broadcast of the largest pickle's
    size, then two scatters: the pickles (padded to it) and their sizes. In both policies
    the root sends every real rank one object: the entry for this rank in the input list
    it passed, or (no list: the usual case off the root) its own output placeholder."""
    pg = _group(a)
    if not _emulated_root(c10d, pg, a.get("src"), a.get("group_src")) or not _is_source_of(pg):
        return
    given, me = a.get("scatter_object_input_list"), c10d.get_rank(pg)
    obj = given[me] if given is not None and me < len(given) else a["scatter_object_output_list"][0]
    seq, (pickle_,) = _seq(pg), _pickles(c10d, pg, [obj])
    size = _int64([pickle_.numel()])
    for k, t in enumerate((size, pickle_, size)):
        _note_input(pg, [t], None, None, seq + k, fixed=True)


_within = threading.local()  # the object collective this thread is inside (`call`), if any


def _inside(fn, what: str):
    """Wrap `fn` so that the calls it makes know they are inside `what`."""

    @functools.wraps(fn)
    def inside(*args, **kwargs):
        _within.call = what
        try:
            return fn(*args, **kwargs)
        finally:
            _within.call = None

    return inside


def _object_gather(a: dict) -> None:
    """Under zeros, gather_object's gather to a real root still needs pickles from the
    emulated ranks (their sizes came from the allgather before it, which mirrors a real
    rank's block): its input, this rank's pickle padded to the largest, is noted."""
    if getattr(_within, "call", None) == "gather_object":
        _mirror_input("gather", "tensor", a)


def _buckets(tensors, limit: int) -> list[list]:
    """c10d's take_tensors, which `_broadcast_coalesced` flattens and broadcasts: per
    dtype, tensors gather until a bucket reaches `limit` bytes; the part-filled buckets
    follow in the order their dtypes first came."""
    open_: dict = {}
    out = []
    for t in tensors:
        b = open_.setdefault(t.dtype, [[], 0])
        b[0].append(t)
        b[1] += t.numel() * t.element_size()
        if b[1] >= limit:
            out.append(b[0])
            open_[t.dtype] = [[], 0]
    return out + [b[0] for b in open_.values() if b[0]]


def hook_model_sync(dist) -> None:
    """DDP's construction broadcasts from rank 0 run past c10d's functions: the parameter
    metadata check (sizes and strides of every parameter, after an allgather of their
    count) and the state sync (`_broadcast_coalesced`, one broadcast per bucket)."""
    import torch

    verify, coalesced = dist._verify_params_across_processes, dist._broadcast_coalesced

    def verify_params(process_group, params, *rest):
        try:
            seq = _seq(process_group) + 1
            _note_root(process_group, 0, seq)
            meta = [x for p in params for x in (*p.shape, *p.stride())]
            _note_input(process_group, [torch.tensor(meta, dtype=torch.int64)], None, None, seq)
        except Exception:
            pass
        return verify(process_group, params, *rest)

    def broadcast_coalesced(process_group, tensors, buffer_size, src=0, *rest):
        try:
            first = _seq(process_group)
            for i, bucket in enumerate(_buckets(tensors, buffer_size)):
                _note_root(process_group, src, first + i)
                _note_input(process_group, bucket, None, None, first + i)
        except Exception:
            pass
        return coalesced(process_group, tensors, buffer_size, src, *rest)

    dist._verify_params_across_processes = verify_params
    dist._broadcast_coalesced = broadcast_coalesced


def hook_ddp(ddp_module, mirror: bool) -> None:
    """Under mirror, DDP models reduce through PyTorch's `allreduce_hook`, which calls
    the (wrapped) all_reduce: the same bytes on the wire as the C++ reducer's own
    allreduce. In both policies, the bucket rebuild at the second forward is noted."""
    cls = ddp_module.DistributedDataParallel
    forward, register = cls.forward, cls.register_comm_hook

    def register_comm_hook(self, state, hook):
        self._neuronabox_hooked = True
        return register(self, state, hook)

    def forward_noting(self, *args, **kwargs):
        if mirror and not getattr(self, "_neuronabox_hooked", False):
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

            register_comm_hook(self, self.process_group, allreduce_hook)
        try:
            _watch_rebuild(self)
        except Exception:
            pass
        return forward(self, *args, **kwargs)

    cls.register_comm_hook = register_comm_hook
    cls.forward = forward_noting


def _watch_rebuild(ddp) -> None:
    """DDP's reducer rebuilds its buckets at the second forward, in the order gradients
    became ready in the first backward, and takes rank 0's buckets: two broadcasts
    (the bucket indices with their count, then the bucket sizes) from inside C++. With
    rank 0 emulated the controller answers with this rank's own: the first forward
    starts recording the ready order, the second computes the buckets as the reducer
    does and notes them."""
    import torch
    import torch.distributed as dist

    state = getattr(ddp, "_neuronabox_rebuild", None)
    if state == "noted" or not torch.is_grad_enabled():
        return
    if state is None:
        params, sparse = ddp._build_params_for_reducer()
        limits = ddp._bucket_config.compute_bucket_size_limits(
            static_graph=ddp.static_graph, find_unused_parameters=ddp.find_unused_parameters
        )[0]
        _note_buckets(ddp, params, dist._compute_bucket_assignment_by_size(params, limits, sparse)[0])
        order: list[int] = []
        hooks = [p.register_post_accumulate_grad_hook(lambda _, i=i: order.append(i)) for i, p in enumerate(params)]
        ddp._neuronabox_rebuild = (params, sparse, order, hooks)
        return
    params, sparse, order, hooks = state
    for h in hooks:
        h.remove()
    ddp._neuronabox_rebuild = "noted"
    seen = dict.fromkeys(order)
    ready = list(seen) + [i for i in range(len(params)) if i not in seen]
    cfg = ddp._bucket_config
    limits = list(cfg.per_bucket_bytes_caps) if cfg.has_custom_per_bucket_caps else None
    limits = limits or [cfg.first_bucket_bytes_cap, cfg.bucket_bytes_cap]
    buckets, _ = dist._compute_bucket_assignment_by_size(
        [params[i] for i in ready], limits, [sparse[i] for i in ready], ready
    )
    _note_buckets(ddp, params, buckets)
    pg, seq = ddp.process_group, _seq(ddp.process_group)
    indices = [i for b in buckets for i in b] + [len(buckets)]
    for k, values in enumerate((indices, [len(b) for b in buckets])):
        _note_root(pg, 0, seq + k)
        _note_input(pg, [torch.tensor(values, dtype=torch.int32)], None, None, seq + k)


def meta_of(query: dict, entries: Callable[[], list[dict]]) -> dict:
    """An allreduce's element count and dtype: as its call noted them (observer/sizes.py),
    else from the recorder (a coalesced call flattens its tensors, one dtype, into one buffer)."""
    world, wire = query.get("world", 0), query.get("seg", 0)
    note = sizes.noted(query["pg"], query["tag"], query["kind"], world, wire)
    if note is not None:
        return {"q": query["q"], "numel": note[0], "dtype": note[1]}
    e = _entry(entries(), query["pg"], query["tag"])
    if e is None or not e.get("profiling_name", "").startswith(f"gloo:{query['kind']}"):
        return {"q": query["q"], "numel": None}
    numel = sum(math.prod(size) for size in e["input_sizes"])
    return {"q": query["q"], "numel": numel, "dtype": e["input_dtypes"][0]}


def root_of(query: dict, entries: Callable[[], list[dict]]) -> dict:
    """A broadcast's root (group rank), for the controller's question by tag."""
    seq = _op_of(entries(), query["pg"], query["tag"])
    with _lock:
        root = None if seq is None else _roots.get((query["pg"], seq))
    return {"q": query["q"], "root": root}


def input_of(query: dict, entries: Callable[[], list[dict]], deadline: float) -> dict | None:
    """The input of the collective with this tag; {"data": None} if nothing was noted
    (its emulated messages stay zeros); None to ask again later (not issued yet)."""
    group = query["pg"]
    seq = _op_of(entries(), group, query["tag"])
    if seq is None:
        return None if time.monotonic() < deadline else {"q": query["q"], "data": None}
    with _lock:
        entry = _inputs.pop((group, seq), None)
        for k in [k for k in _inputs if k[0] == group and k[1] < seq - STALE]:
            del _inputs[k]  # nobody asked for these (questions can come out of order: keep the recent)
    if entry is None:
        return {"q": query["q"], "data": None}
    data = base64.b64encode(entry["data"]).decode()
    return {"q": query["q"], "data": data, "dtype": entry["dtype"], "op": entry["op"], "splits": entry["splits"]}


def _note_buckets(ddp, params: list, buckets: list[list[int]]) -> None:
    """The sizes of a DDP model's gradient buckets (observer/sizes.py): the first
    iteration's, then the rebuilt ones; and under `find_unused_parameters` the map of
    used parameters, one Int per parameter of the reducer, which it allreduces every
    step past every Python function as it does the buckets (Reducer::initialize_local_used_map)."""
    rings = [(sum(params[i].numel() for i in b), sizes.c10_dtype(params[b[0]])) for b in buckets if b]
    if getattr(ddp, "find_unused_parameters", False) and params:
        rings.append((len(params), "Int"))
    sizes.note_buckets(_name(ddp.process_group), rings)
