"""`neuronabox export TRACE --format chrome|png [--out PATH]`: a run's trace in the
forms users load.

- chrome: Chrome trace-event JSON (opens in Perfetto and chrome://tracing). One
  process per real rank, as measured: each collective an async span (overlapping
  DDP buckets survive), with the PyTorch profiler's argument names; the compute
  between a rank's collectives as complete events on a second track; optimizer
  steps as instants. `--sample-emulated K` adds K emulated ranks whose spans are
  the model's time for each instance. A `distributedInfo` block names the world
  and the groups, as the profiler's does.
- png: the same events drawn as a timeline, one row per rank.
- nccl-tests: the nccl-tests table (size, count, type, redop, root, time,
  algbw, busbw) per kind and size, the time the real ranks' mean, with
  nccl-tests' bus-bandwidth factors; `#wrong` is `-` (nothing is checked here).

Times are epoch microseconds, the trace's own clock (docs/trace.md).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from neuronabox.trace import records as tracefile
from neuronabox.trace.busbw import bandwidths

GAP_TRACK, COLL_TRACK = 1, 0


@dataclass
class Span:
    """One real rank's part of one collective, in epoch microseconds."""

    rank: int  # global
    start: float
    end: float
    record: dict


def spans(doc: dict) -> list[Span]:
    """Every real rank's span of every collective, in start order."""
    out = [Span(int(r), a, b, rec) for rec in doc["instances"] for r, (a, b) in rec["per_rank"].items()]
    return sorted(out, key=lambda s: (s.start, s.rank))


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
        "backend": "gloo",
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


TYPE_NAMES = {"Byte": "uint8", "Char": "int8", "Half": "half", "BFloat16": "bfloat16", "Float": "float",
              "Double": "double", "Int": "int32", "Long": "int64"}  # c10's names -> nccl-tests'
REDOPS = {"allreduce": "sum", "reduce": "sum", "reduce_scatter": "sum"}


def nccl_tests(doc: dict) -> str:
    """The nccl-tests table of a trace, one block per collective kind."""
    world = doc["world_size"]
    rows: dict[str, dict[tuple, list[float]]] = {}
    for rec in doc["instances"]:
        if rec["kind"] in ("send", "recv") or not rec["per_rank"]:
            continue
        times = [(b - a) * 1e-6 for a, b in rec["per_rank"].values()]
        key = (rec["nbytes"], rec["numel"], rec["dtype"], rec["root"], rec["world"])
        rows.setdefault(rec["kind"], {}).setdefault(key, []).append(sum(times) / len(times))
    out = [f"# NeuronaBox: {world} ranks, real {doc['real_ranks']}, {doc.get('delay_model')} on {doc.get('topology')};"
           " time: the real ranks' mean per size, in us"]  # fmt: skip
    for kind in sorted(rows):
        out += [
            "#",
            f"# Collective: {kind}",
            f"# {'size':>10} {'count':>12} {'type':>7} {'redop':>6} {'root':>5} {'time':>10} {'algbw':>7} {'busbw':>7}"
            f" {'#wrong':>6}  {'n':>5}",
            f"# {'(B)':>10} {'(elements)':>12} {'':>7} {'':>6} {'':>5} {'(us)':>10} {'(GB/s)':>7} {'(GB/s)':>7}",
        ]
        for (nbytes, numel, dtype, root, ranks), times in sorted(rows[kind].items(), key=lambda kv: kv[0][0]):
            mean = sum(times) / len(times)
            alg, bus = bandwidths(kind, nbytes, mean, ranks)
            count = str(numel) if numel is not None else "?"
            dtype = TYPE_NAMES.get(dtype, dtype or "?")
            rooted = root if root is not None else -1
            out.append(
                f"  {nbytes:>10} {count:>12} {dtype:>7} {REDOPS.get(kind, 'none'):>6} {rooted:>5}"
                f" {mean * 1e6:>10.2f} {alg:>7.3f} {bus:>7.3f} {'-':>6}  {len(times):>5}"
            )
    return "\n".join(out) + "\n"


KIND_COLORS = {
    "allreduce": "tab:blue", "allgather": "tab:green", "broadcast": "tab:orange", "barrier": "tab:red",
    "reduce": "tab:purple", "gather": "tab:brown", "scatter": "tab:pink", "alltoall": "tab:olive",
    "send": "tab:cyan", "recv": "tab:cyan",
}  # fmt: skip


def png(doc: dict, path: Path, window: tuple[float, float] | None = None) -> None:
    """A timeline: one row per real rank, each collective a bar in its kind's colour,
    compute gaps grey, optimizer steps as ticks. `window`: (from, to) in ms from the
    first event, to zoom in."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ss = spans(doc)
    if not ss:
        raise ValueError("the trace has no collective instances to draw")
    t0 = ss[0].start
    real = sorted({s.rank for s in ss})
    row = {r: i for i, r in enumerate(real)}
    fig, ax = plt.subplots(figsize=(11, 1.2 + 0.6 * len(real)))
    kinds = set()
    for rank, a, b in doc["gaps"]:
        if rank in row:
            ax.broken_barh([((a - t0) / 1e3, (b - a) / 1e3)], (row[rank] - 0.15, 0.3), color="lightgrey")
    for s in ss:
        a, b = (s.start - t0) / 1e3, (s.end - t0) / 1e3
        color = KIND_COLORS.get(s.record["kind"], "black")
        ax.broken_barh([(a, max(b - a, 1e-3))], (row[s.rank] - 0.35, 0.7), color=color)
        kinds.add(s.record["kind"])
    for rank, t in doc["steps"]:
        if rank in row:
            ax.plot([(t - t0) / 1e3] * 2, [row[rank] - 0.45, row[rank] + 0.45], color="black", linewidth=0.8)
    ax.set_yticks(range(len(real)), [f"rank {r}" for r in real])
    ax.set_xlabel("time (ms)")
    if window:
        ax.set_xlim(*window)
    ax.set_title(f"NeuronaBox run: world {doc['world_size']}, {doc.get('delay_model')} on {doc.get('topology')}")
    handles = [Patch(color=KIND_COLORS.get(k, "black"), label=k) for k in sorted(kinds)]
    handles.append(Patch(color="lightgrey", label="compute"))
    ax.legend(handles=handles, loc="upper right", fontsize=8, ncol=len(handles))
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def export_main(argv: list[str]) -> int:
    from neuronabox.cli import ArgParser

    p = ArgParser(
        prog="neuronabox export",
        description="Write a run's trace as Chrome trace JSON, Chakra execution traces, an nccl-tests table or a PNG.",
    )
    p.add_argument("trace", help="a trace written by --trace (or a run's trace.jsonl)")
    p.add_argument("--format", required=True, choices=["chrome", "chakra", "png", "nccl-tests"])
    p.add_argument("--out", help="output file (default: TRACE with .json, .png or .txt); chakra: a folder")
    p.add_argument("--sample-emulated", type=int, default=0, help="chrome: add K emulated ranks (the model's times)")
    p.add_argument("--window", help="png: FROM,TO in ms from the first event")
    ns = p.parse_args(argv)
    try:
        doc = tracefile.load(ns.trace)
    except OSError as exc:
        print(f"neuronabox: error: {ns.trace}: {exc.strerror}", file=sys.stderr)
        return 2
    except tracefile.TraceError as exc:
        print(f"neuronabox: error: {exc}", file=sys.stderr)
        return 2
    if ns.format == "chakra":
        return _chakra(doc, Path(ns.out) if ns.out else Path(ns.trace).with_name(Path(ns.trace).stem + "-chakra"))
    suffix = {"chrome": ".json", "png": ".png", "nccl-tests": ".txt"}[ns.format]
    if ns.format == "nccl-tests" and ns.out is None:
        sys.stdout.write(nccl_tests(doc))
        return 0
    out = Path(ns.out or Path(ns.trace).with_suffix(suffix))
    if ns.format == "nccl-tests":
        out.write_text(nccl_tests(doc))
    elif ns.format == "chrome":
        out.write_text(json.dumps(chrome(doc, ns.sample_emulated)))
    else:
        window = None
        if ns.window:
            try:
                lo, hi = (float(x) for x in ns.window.split(","))
            except ValueError:
                print(f"neuronabox: error: --window takes FROM,TO in ms, got {ns.window!r}", file=sys.stderr)
                return 2
            window = (lo, hi)
        try:
            png(doc, out, window)
        except ValueError as exc:
            print(f"neuronabox: error: {exc}", file=sys.stderr)
            return 1
    print(f"wrote {out}")
    return 0


def _chakra(doc: dict, out: Path) -> int:
    from neuronabox.sim.simulate import program_of
    from neuronabox.trace import chakra

    if out.exists() and not out.is_dir():
        print(f"neuronabox: error: --out {out} is a file; chakra writes a folder", file=sys.stderr)
        return 2
    prog = program_of(doc)
    for op in prog.ops:  # one SPMD program on the default group: a subgroup differs from rank to rank
        if op.group != "0":
            prog.skipped[f"{op.kind} (group {op.group})"] = prog.skipped.get(f"{op.kind} (group {op.group})", 0) + 1
    prog.ops = [op for op in prog.ops if op.group == "0"]
    if not prog.ops:
        print("neuronabox: error: the trace has no default-group collective of its lowest real rank", file=sys.stderr)
        return 1
    try:
        files = chakra.write(prog, out)
    except OSError as exc:
        print(f"neuronabox: error: {out}: {exc.strerror}", file=sys.stderr)
        return 2
    skipped = ", ".join(f"{n} {k}" for k, n in sorted(prog.skipped.items()))
    print(f"wrote {len(files) - 1} .et files ({len(prog.ops)} collectives each) and {files[-1]}")
    if skipped:
        print(f"not in the program (subgroups and kinds the replay skips): {skipped}")
    print(f"ASTRA-sim: --workload-configuration={out / 'trace'} --comm-group-configuration={files[-1]}")
    return 0


if __name__ == "__main__":
    sys.exit(export_main(sys.argv[1:]))
