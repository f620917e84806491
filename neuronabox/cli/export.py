"""`neuronabox export`: a run's trace as Chrome JSON, Chakra, an nccl-tests table, a PNG, or
NCCL Inspector's JSON lines and Prometheus gauges."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from neuronabox.args import ArgParser
from neuronabox.limits import output_problem
from neuronabox.trace import inspector
from neuronabox.trace import records as tracefile
from neuronabox.trace.chrome import chrome
from neuronabox.trace.nccl_tests import nccl_tests
from neuronabox.trace.png import png

NAME = "export"
SUMMARY = "write a trace as Chrome trace JSON, Chakra, an nccl-tests table, a PNG, or NCCL Inspector's output"


def build_parser() -> ArgParser:
    p = ArgParser(
        prog="neuronabox export",
        description="Write a run's trace as Chrome trace JSON, Chakra execution traces, an nccl-tests table, a PNG, "
        "NCCL Inspector's JSON lines (output format v4.0: one object per collective per rank) or its Prometheus "
        "gauges (the text format a node exporter's textfile collector reads).",
    )
    p.add_argument("trace", help="a trace written by --trace (or a run's trace.jsonl)")
    p.add_argument("--format", required=True, choices=["chrome", "chakra", "png", "nccl-tests", "nccl-inspector",
                                                        "prometheus"],
                   help="chrome: trace-event JSON for Perfetto or chrome://tracing; chakra: Chakra execution traces, "
                   "one per rank; png: a timeline picture; nccl-tests: its table per kind and size; nccl-inspector: "
                   "NCCL Inspector's v4.0 JSON lines; prometheus: its metrics, text exposition format")  # fmt: skip
    p.add_argument("--out", help="output file (default: TRACE with .json, .png, .txt, .inspector.jsonl or .prom); "
                   "chakra: a folder")
    p.add_argument("--sample-emulated", type=int, default=0, help="chrome: add K emulated ranks (the model's times)")
    p.add_argument("--window", help="png: FROM,TO in ms from the first event")
    return p


def main(argv: list[str]) -> int:
    ns = build_parser().parse_args(argv)
    if ns.sample_emulated < 0:
        print(f"neuronabox: error: --sample-emulated is 0 or more, got {ns.sample_emulated}", file=sys.stderr)
        return 2
    if ns.out and ns.format != "chakra" and output_problem(ns.out):
        print(f"neuronabox: error: --out {output_problem(ns.out)}", file=sys.stderr)
        return 2
    try:
        doc = tracefile.load(ns.trace)
    except OSError as exc:
        print(f"neuronabox: error: {ns.trace}: {exc.strerror}", file=sys.stderr)
        return 2
    except tracefile.TraceError as exc:
        print(f"neuronabox: error: {exc}", file=sys.stderr)
        return 2
    rc = _export(ns, doc)
    if rc == 0 and (warning := tracefile.cut_off(doc, ns.trace)):  # after the work: an error stays the last line
        print(f"neuronabox: warning: {warning}", file=sys.stderr)
    return rc


def _export(ns, doc: dict) -> int:
    if ns.format == "chakra":
        return _chakra(doc, Path(ns.out) if ns.out else Path(ns.trace).with_name(Path(ns.trace).stem + "-chakra"))
    suffix = {"chrome": ".json", "png": ".png", "nccl-tests": ".txt", "nccl-inspector": ".inspector.jsonl",
              "prometheus": ".prom"}[ns.format]  # fmt: skip
    if ns.format == "nccl-tests" and ns.out is None:
        sys.stdout.write(nccl_tests(doc))
        return 0
    out = Path(ns.out or Path(ns.trace).with_suffix(suffix))
    try:
        return write(ns, doc, out)
    except OSError as exc:  # the disk filled, the folder went away: one line, not a traceback
        print(f"neuronabox: error: {out}: {exc.strerror}", file=sys.stderr)
        return 1


def write(ns, doc: dict, out: Path) -> int:
    if ns.format == "nccl-tests":
        out.write_text(nccl_tests(doc))
    elif ns.format == "nccl-inspector":
        with out.open("w") as f:
            for obj in inspector.records(doc):
                f.write(json.dumps(obj, separators=(",", ":")) + "\n")
    elif ns.format == "prometheus":
        out.write_text(inspector.prometheus(doc))
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
