"""`neuronabox report`: one self-contained HTML page for a run's trace or a sweep's CSV."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

from neuronabox.args import ArgParser
from neuronabox.limits import output_problem
from neuronabox.trace import records as tracefile
from neuronabox.trace.report import sweep_report, trace_report

NAME = "report"
SUMMARY = "write one HTML page (no network needed) for a run's trace or a what-if sweep's CSV"
CSV_LIMIT = 64 << 20  # a sweep's table is a few rows a point: anything larger is not one


def build_parser() -> ArgParser:
    p = ArgParser(
        prog="neuronabox report",
        description="Write one self-contained HTML page (inline SVG, no network access) for a run's trace (the "
        "run, its iteration time and communication share, the per-kind table against the model, the real ranks' "
        "timeline, busbw against size) or for a what-if sweep's CSV (its curve and its points).",
    )
    p.add_argument("input", help="a trace written by --trace, or a sweep's CSV written by whatif --out")
    p.add_argument("--out", help="the page to write (default: INPUT with .html)")
    return p


def main(argv: list[str]) -> int:
    ns = build_parser().parse_args(argv)
    src = Path(ns.input)
    out = Path(ns.out) if ns.out else src.with_suffix(".html")
    if problem := output_problem(str(out)):
        print(f"neuronabox: error: --out {problem}", file=sys.stderr)
        return 2
    try:
        page = _sweep(src) if src.suffix == ".csv" else trace_report(tracefile.load(src), str(src))
        out.write_text(page)
    except OSError as exc:
        print(f"neuronabox: error: {exc.filename or src}: {exc.strerror}", file=sys.stderr)
        return 2
    except (tracefile.TraceError, ValueError) as exc:
        print(f"neuronabox: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0


def _sweep(path: Path) -> str:
    """A sweep's page from its CSV, whose first two columns are the swept key and its value."""
    if path.stat().st_size > CSV_LIMIT:
        raise ValueError(f"{path} is {path.stat().st_size} bytes: not a sweep's table")
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        header, rows = list(reader.fieldnames or []), list(reader)
    if len(header) < 3 or "iteration_s" not in header:
        raise ValueError(f"{path} is not a whatif sweep's table (its columns: {','.join(header) or 'none'})")
    return sweep_report(header, rows, str(path))
