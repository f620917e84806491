"""Chrome trace-event JSON (opens in Perfetto and chrome://tracing). One process per real
rank, as measured: each collective an async span (overlapping DDP buckets survive), with the
PyTorch profiler's argument names; the compute between a rank's collectives as complete
events on a second track; optimizer steps as instants. `sample_emulated` adds K emulated
ranks whose spans are the model's time for each instance. A `distributedInfo` block names
the world and the groups, as the profiler's does. Times are epoch microseconds, the trace's
own clock (docs/trace.md)."""

from __future__ import annotations

import json

from neuronabox.trace.spans import COLL_TRACK, GAP_TRACK, spans


def _group_ranks(doc: dict, rec: dict) -> list[int]:
    return doc["groups"].get(rec["group"]) or list(range(rec["world"]))


def _args(doc: dict, rec: dict) -> dict:
    """The PyTorch profiler's argument names for a collective."""
    numel = rec["numel"]
    ranks = _group_ranks(doc, rec)
    args = {
        "Collective name": rec["kind"],
        "In msg nelems": numel if numel is not None else -1,
        "Out msg nelems": numel if numel is not None else -1,
        "dtype": rec["dtype"] or "unknown",
        "Group size": len(ranks),
        "Process Group Name": rec["group"],
        "Process Group Ranks": json.dumps(ranks),
        "Seq": rec["seq"],
        "bytes": rec["nbytes"],
        "boundary messages": rec["boundary_messages"],
        "model time (us)": rec["model_us"],
        "schedule": rec["geometry"],
    }
    if rec.get("root") is not None:
        args["Root"] = rec["root"]
    return args


def chrome(doc: dict, sample_emulated: int = 0) -> dict:
    """The Chrome trace-event document of a loaded trace (`trace.load`)."""
    world = doc["world_size"]
    real = sorted(doc["real_ranks"])
    events: list[dict] = []
    emulated = [e for e in range(world) if e not in set(real)]
    step = max(1, len(emulated) // sample_emulated) if sample_emulated else 0
    sampled = emulated[::step][:sample_emulated] if sample_emulated else []
    for r in real + sampled:
        kind = "real, measured" if r in real else "emulated, the model's time"
        events.append({"name": "process_name", "ph": "M", "pid": r, "args": {"name": f"rank {r} ({kind})"}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": r, "args": {"sort_index": r}})
        events.append({"name": "thread_name", "ph": "M", "pid": r, "tid": COLL_TRACK, "args": {"name": "collectives"}})
        if r in real:
            events.append({"name": "thread_name", "ph": "M", "pid": r, "tid": GAP_TRACK, "args": {"name": "compute"}})
    ident = 0
    for s in spans(doc):
        ident += 1
        name = s.record["kind"]
        events.append({"name": name, "cat": "collective", "ph": "b", "id": ident, "pid": s.rank, "tid": COLL_TRACK,
                       "ts": s.start, "args": _args(doc, s.record)})  # fmt: skip
        events.append({"name": name, "cat": "collective", "ph": "e", "id": ident, "pid": s.rank, "tid": COLL_TRACK,
                       "ts": max(s.end, s.start)})  # fmt: skip
    for rank, a, b in doc["gaps"]:
        events.append({"name": "compute", "cat": "compute", "ph": "X", "pid": rank, "tid": GAP_TRACK,
                       "ts": a, "dur": b - a})  # fmt: skip
    for rec in doc["instances"]:
        members = _group_ranks(doc, rec)
        for e in sampled:
            if e not in members:
                continue
            ident += 1
            base = {"name": rec["kind"], "cat": "collective (model)", "id": ident, "pid": e, "tid": COLL_TRACK}
            events.append({**base, "ph": "b", "ts": rec["start_us"], "args": _args(doc, rec)})
            events.append({**base, "ph": "e", "ts": rec["start_us"] + rec["model_us"]})
    for rank, t in doc["steps"]:
        if rank in set(real):
            events.append({"name": "optimizer step", "cat": "step", "ph": "i", "s": "p", "pid": rank,
                           "tid": GAP_TRACK, "ts": t})  # fmt: skip
    groups = doc["groups"]
    info = {
        "backend": doc.get("backend", "gloo"),
        "rank": real[0] if real else 0,
        "world_size": world,
        "pg_count": len(groups),
        "pg_config": [
            {"pg_name": n, "pg_desc": "default_pg" if n == "0" else n, "pg_size": len(r), "ranks": r}
            for n, r in sorted(groups.items())
        ],
        "emulated_by": "neuronabox",
        "real_ranks": real,
        "delay_model": doc.get("delay_model"),
        "topology": doc.get("topology"),
    }
    return {"traceEvents": events, "displayTimeUnit": "ms", "distributedInfo": info}
