"""A trace drawn as a timeline PNG, one row per real rank."""

from __future__ import annotations

from pathlib import Path

from neuronabox.trace.spans import spans

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
