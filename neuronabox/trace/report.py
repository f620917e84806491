"""One self-contained HTML page for a run's trace or a sweep's table (`neuronabox report`).

Inline CSS and SVG, one short inline script, no fonts, images or scripts fetched: the page
opens offline, attached to a ticket or served from anywhere. What it shows is computed
here from the trace alone (what the run wrote), so a page made later reads the same.
"""

from __future__ import annotations

import html
import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from neuronabox.trace.busbw import bandwidths
from neuronabox.trace.spans import Span, spans
from neuronabox.trace.summary import fmt_bytes

# tab10, as the PNG export's matplotlib colours: the same kind reads the same in both
KIND_COLORS = {
    "allreduce": "#1f77b4", "allgather": "#2ca02c", "broadcast": "#ff7f0e", "barrier": "#d62728",
    "reduce": "#9467bd", "gather": "#8c564b", "scatter": "#e377c2", "alltoall": "#bcbd22",
    "reduce_scatter": "#17becf", "send": "#7f7f7f", "recv": "#7f7f7f",
}  # fmt: skip
TIMELINE_SPANS = 4000  # bars drawn at most (the page stays small whatever the run's length)
STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1100px;color:#222;padding:0 16px}
h1{font-size:22px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse}td,th{padding:3px 10px;text-align:right;border-bottom:1px solid #eee}
th{background:#f6f6f6}td:first-child,th:first-child{text-align:left}
.kv td{text-align:left}.note{color:#666}svg{background:#fff;border:1px solid #eee}
.big{font-size:20px;font-weight:600}
"""
# Marks the page as rendered, and any script error on it (what a headless check reads back).
SCRIPT = """
window.addEventListener("error", function (e) { document.body.dataset.errors = (e.message || "error"); });
document.body.dataset.rendered = "ok";
"""


@dataclass(frozen=True)
class KindRow:
    """One collective kind's line of the per-kind table."""

    kind: str
    count: int
    mean_bytes: float
    real_us: float  # the real ranks' mean span
    model_us: float | None  # the model's mean, where the trace has it
    algbw: float
    busbw: float


@dataclass(frozen=True)
class Iterations:
    """The real ranks' optimizer steps: each iteration's length, and the share of it the
    rank spent inside collectives (None without steps)."""

    seconds: list[float]
    communication_share: float | None


def kind_rows(doc: dict) -> list[KindRow]:
    """Per kind: count, mean size, the real ranks' mean time, the model's, and the bandwidths."""
    by_kind: dict[str, list[dict]] = {}
    for rec in doc["instances"]:
        if rec["per_rank"]:
            by_kind.setdefault(rec["kind"], []).append(rec)
    rows = []
    for kind, recs in sorted(by_kind.items()):
        times = [statistics.fmean(b - a for a, b in rec["per_rank"].values()) for rec in recs]
        models = [rec["model_us"] for rec in recs if rec.get("model_us") is not None]
        mean_bytes, mean_us = statistics.fmean(r["nbytes"] for r in recs), statistics.fmean(times)
        alg, bus = bandwidths(kind, mean_bytes, mean_us * 1e-6, recs[0].get("world") or doc["world_size"])
        rows.append(KindRow(kind, len(recs), mean_bytes, mean_us, statistics.fmean(models) if models else None,
                            alg, bus))  # fmt: skip
    return rows


def iterations(doc: dict) -> Iterations:
    """Iterations between consecutive optimizer steps of each real rank, and the share of
    each spent inside that rank's collectives (their union: overlapping spans count once)."""
    steps: dict[int, list[float]] = {}
    for rank, t in doc["steps"]:
        steps.setdefault(int(rank), []).append(t)
    by_rank: dict[int, list[Span]] = {}
    for s in spans(doc):
        by_rank.setdefault(s.rank, []).append(s)
    lengths, shares = [], []
    for rank, ts in steps.items():
        ts.sort()
        for a, b in itertools.pairwise(ts):
            if b <= a:
                continue
            lengths.append((b - a) * 1e-6)
            shares.append(_covered(by_rank.get(rank, []), a, b) / (b - a))
    return Iterations(lengths, statistics.fmean(shares) if shares else None)


def _covered(ss: list[Span], a: float, b: float) -> float:
    """How much of [a, b] the spans cover (start-sorted spans; overlaps count once)."""
    total, reach = 0.0, a
    for s in ss:
        lo, hi = max(s.start, reach), min(s.end, b)
        if hi > lo:
            total += hi - lo
            reach = hi
        if s.start >= b:
            break
    return total


def busbw_by_size(doc: dict) -> dict[str, list[tuple[float, float]]]:
    """Per kind, (bytes, median busbw in GB/s) per size: the page's bandwidth curve."""
    per: dict[str, dict[int, list[float]]] = {}
    for rec in doc["instances"]:
        if not rec["per_rank"] or rec["kind"] in ("barrier", "send", "recv") or rec["nbytes"] <= 0:
            continue
        mean_s = statistics.fmean(b - a for a, b in rec["per_rank"].values()) * 1e-6
        _, bus = bandwidths(rec["kind"], rec["nbytes"], mean_s, rec.get("world") or doc["world_size"])
        per.setdefault(rec["kind"], {}).setdefault(rec["nbytes"], []).append(bus)
    return {k: [(n, statistics.median(v)) for n, v in sorted(sizes.items())] for k, sizes in sorted(per.items())}


# -- drawing -----------------------------------------------------------------------------
def _e(x: object) -> str:
    return html.escape(str(x), quote=True)


def _us(x: float) -> str:
    return f"{x / 1e3:.3f} ms" if x >= 1e3 else f"{x:.1f} us"


def line_chart(series: dict[str, list[tuple[float, float]]], xlabel: str, ylabel: str, xlog: bool,
               width: int = 900, height: int = 320) -> str:  # fmt: skip
    """An SVG chart: one polyline with dots per series, axes with a few labelled ticks."""
    pts = [p for ps in series.values() for p in ps]
    if not pts:
        return '<p class="note">nothing to draw</p>'
    fx = (lambda v: math.log2(max(v, 1e-12))) if xlog else (lambda v: v)
    xs, ys = [fx(x) for x, _ in pts], [y for _, y in pts]
    x0, x1 = min(xs), max(xs)
    y0, y1 = 0.0, max(ys) * 1.08 or 1.0
    x1 = x1 if x1 > x0 else x0 + 1
    left, right, top, bottom = 70, 150, 14, 44
    w, h = width - left - right, height - top - bottom

    def px(x: float) -> float:
        return left + (fx(x) - x0) / (x1 - x0) * w

    def py(y: float) -> float:
        return top + h - (y - y0) / (y1 - y0) * h

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">']
    for i in range(5):
        y = y0 + (y1 - y0) * i / 4
        out.append(f'<line x1="{left}" x2="{left + w}" y1="{py(y):.1f}" y2="{py(y):.1f}" stroke="#eee"/>'
                   f'<text x="{left - 6}" y="{py(y) + 4:.1f}" font-size="11" text-anchor="end">{y:.3g}</text>')
    last = -math.inf
    for x in sorted({x for x, _ in pts}):
        if px(x) - last < 60:  # labels no closer than 60 px: none overlaps
            continue
        last = px(x)
        label = fmt_bytes(x) if xlog else f"{x:.3g}"
        out.append(f'<text x="{px(x):.1f}" y="{top + h + 16}" font-size="11" text-anchor="middle">{_e(label)}</text>')
    out.append(f'<text x="{left + w / 2}" y="{height - 6}" font-size="12" text-anchor="middle">{_e(xlabel)}</text>'
               f'<text x="14" y="{top + h / 2}" font-size="12" text-anchor="middle" '
               f'transform="rotate(-90 14 {top + h / 2})">{_e(ylabel)}</text>')  # fmt: skip
    for n, (name, ps) in enumerate(series.items()):
        color = KIND_COLORS.get(name, ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"][n % 4])
        coords = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in ps)
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{coords}"/>')
        for x, y in ps:
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{color}">'
                       f"<title>{_e(name)}: {_e(f'{x:.4g}')} -> {y:.4g}</title></circle>")  # fmt: skip
        ly = top + 14 + 18 * n
        out.append(f'<rect x="{left + w + 16}" y="{ly - 9}" width="12" height="12" fill="{color}"/>'
                   f'<text x="{left + w + 34}" y="{ly + 1}" font-size="12">{_e(name)}</text>')
    out.append("</svg>")
    return "".join(out)


def timeline(doc: dict, width: int = 1060) -> tuple[str, str]:
    """An SVG timeline of the real ranks (collectives in their kind's colour, compute gaps
    grey, optimizer steps as ticks) over the last three iterations, or the run's start when
    it has no steps; and a line saying what window it shows."""
    ss = spans(doc)
    if not ss:
        return '<p class="note">the trace has no collective instances</p>', ""
    steps = sorted(t for _, t in doc["steps"])
    if len(steps) >= 2:
        a, b = steps[max(0, len(steps) - 4)], steps[-1]
        what = f"the last {min(3, len(steps) - 1)} iteration(s), between optimizer steps"
    else:
        a, b = ss[0].start, ss[min(len(ss), TIMELINE_SPANS) - 1].end
        what = "the run from its first collective" + (f" (its first {TIMELINE_SPANS} spans)"
                                                      if len(ss) > TIMELINE_SPANS else "")  # fmt: skip
    shown = [s for s in ss if s.end >= a and s.start <= b][:TIMELINE_SPANS]
    ranks = sorted({s.rank for s in ss})
    row = {r: i for i, r in enumerate(ranks)}
    left, top, lane = 70, 10, 26
    w, height = width - left - 10, top + lane * len(ranks) + 30
    span_us = max(b - a, 1e-3)

    def px(t: float) -> float:
        return left + (min(max(t, a), b) - a) / span_us * w

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">']
    for r, i in row.items():
        out.append(f'<text x="{left - 8}" y="{top + lane * i + 17}" font-size="12" text-anchor="end">rank {r}</text>')
    for rank, g0, g1 in doc["gaps"]:
        if int(rank) in row and g1 >= a and g0 <= b:
            y = top + lane * row[int(rank)] + 9
            out.append(f'<rect x="{px(g0):.1f}" y="{y}" width="{max(px(g1) - px(g0), 0.5):.1f}" height="6" '
                       'fill="#ccc"><title>compute</title></rect>')  # fmt: skip
    for s in shown:
        y = top + lane * row[s.rank] + 3
        kind = s.record["kind"]
        out.append(f'<rect x="{px(s.start):.1f}" y="{y}" width="{max(px(s.end) - px(s.start), 0.8):.1f}" height="18" '
                   f'fill="{KIND_COLORS.get(kind, "#333")}"><title>{_e(kind)} {_e(fmt_bytes(s.record["nbytes"]))}: '
                   f"{_e(_us(s.end - s.start))}</title></rect>")  # fmt: skip
    for rank, t in doc["steps"]:
        if int(rank) in row and a <= t <= b:
            y = top + lane * row[int(rank)]
            out.append(f'<line x1="{px(t):.1f}" x2="{px(t):.1f}" y1="{y}" y2="{y + 24}" stroke="#000" '
                       'stroke-width="2"><title>optimizer step</title></line>')  # fmt: skip
    y = top + lane * len(ranks) + 18
    out.append(f'<text x="{left}" y="{y}" font-size="11">0</text>'
               f'<text x="{left + w}" y="{y}" font-size="11" text-anchor="end">{_e(_us(b - a))}</text></svg>')
    return "".join(out), what


def _page(title: str, body: list[str]) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_e(title)}</title><style>{STYLE}</style></head><body>\n"
            + "\n".join(body) + f"\n<script>{SCRIPT}</script>\n</body></html>\n")  # fmt: skip


def _kv(pairs: Sequence[tuple[str, object]]) -> str:
    return '<table class="kv">' + "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in pairs) + "</table>"


def trace_report(doc: dict, source: str) -> str:
    """The page of one run's trace."""
    world, real = doc["world_size"], doc["real_ranks"]
    inject = ", ".join(doc.get("inject") or []) or "none"
    state = doc.get("state", "?") if doc["complete"] else "no footer: the run did not finish"
    run = [("trace", source), ("world", f"{world} ranks ({doc.get('nnodes')} nodes x {doc.get('nproc_per_node')})"),
           ("real ranks", ", ".join(map(str, real))), ("backend", doc.get("backend", "gloo")),
           ("topology", doc.get("topology")), ("delay model", doc.get("delay_model")), ("injections", inject),
           ("data", doc.get("data")), ("state", f"{state}; {doc.get('stopped_because') or doc.get('error') or ''}")]
    it = iterations(doc)
    if it.seconds:
        med = statistics.median(it.seconds)
        share = f"{it.communication_share:.0%}" if it.communication_share is not None else "?"
        iteration = (f'<p><span class="big">{med * 1e3:.2f} ms</span> per iteration (median of {len(it.seconds)}, '
                     f"{min(it.seconds) * 1e3:.2f} to {max(it.seconds) * 1e3:.2f} ms); "
                     f'<span class="big">{share}</span> of it inside collectives on the real ranks.</p>')
    else:
        iteration = ('<p class="note">No optimizer steps in the trace (the observer was off, or the script '
                     "steps no optimizer): the iteration time is unknown.</p>")  # fmt: skip
    rows = kind_rows(doc)
    table = ["<table><tr><th>kind</th><th>count</th><th>mean size</th><th>real rank (mean)</th><th>model (mean)</th>"
             "<th>algbw GB/s</th><th>busbw GB/s</th></tr>"]  # fmt: skip
    for r in rows:
        model = _us(r.model_us) if r.model_us is not None else "-"
        table.append(f"<tr><td>{_e(r.kind)}</td><td>{r.count}</td><td>{fmt_bytes(r.mean_bytes)}</td>"
                     f"<td>{_us(r.real_us)}</td><td>{model}</td><td>{r.algbw:.3f}</td><td>{r.busbw:.3f}</td></tr>")
    table.append("</table>")
    svg, window = timeline(doc)
    body = [f"<h1>NeuronaBox run: {world} ranks, {len(real)} real</h1>", "<h2>The run</h2>", _kv(run),
            "<h2>Iteration</h2>", iteration,
            "<h2>Collectives</h2>", "".join(table) if rows else '<p class="note">no collectives</p>',
            f'<h2>Timeline of the real ranks</h2><p class="note">{_e(window)}</p>', svg,
            "<h2>Bus bandwidth against size</h2>",
            line_chart(busbw_by_size(doc), "size", "busbw (GB/s, nccl-tests' definition)", xlog=True)]  # fmt: skip
    return _page(f"NeuronaBox: {source}", body)


def sweep_report(header: list[str], rows: list[dict], source: str) -> str:
    """The page of a what-if sweep's CSV: its curve and its rows, failures with their cause."""
    key, value = header[0], header[1]
    ok = [r for r in rows if r.get("status", "ok") == "ok" and r.get("iteration_s")]
    series = {"iteration": sorted((float(r[value]), float(r["iteration_s"]) * 1e3) for r in ok)}
    cols = [h for h in header if h not in ("trace", "log")]
    table = ["<table><tr>" + "".join(f"<th>{_e(h)}</th>" for h in cols) + "</tr>"]
    for r in rows:
        table.append("<tr>" + "".join(f"<td>{_e(r.get(h, ''))}</td>" for h in cols) + "</tr>")
    table.append("</table>")
    failed = len(rows) - len(ok)
    body = [f"<h1>NeuronaBox sweep: {_e(key)}</h1>",
            _kv([("table", source), ("points", f"{len(rows)} ({failed} failed)" if failed else len(rows))]),
            "<h2>Iteration time against the swept value</h2>",
            line_chart(series, value, "ms per iteration", xlog=False),
            "<h2>Points</h2>", "".join(table)]  # fmt: skip
    return _page(f"NeuronaBox sweep: {source}", body)
