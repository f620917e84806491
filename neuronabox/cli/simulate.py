"""`neuronabox simulate`: replay a recorded run's real rank at any world size, in virtual time."""

from __future__ import annotations

import gc
import sys

from neuronabox.args import ArgParser
from neuronabox.limits import output_problem
from neuronabox.progress import StatusLine
from neuronabox.sim.simulate import SimulateError, load_trace, run_simulation
from neuronabox.trace import records as tracefile

NAME = "simulate"
SUMMARY = "replay a recorded run's real rank at any world size, in virtual time, no process run"


def build_parser() -> ArgParser:
    p = ArgParser(prog="neuronabox simulate", description="Replay a recorded run's real rank at any world size.")
    p.add_argument("trace", help="a trace written by --trace")
    p.add_argument("--nnodes", type=int, help="the simulated world's nodes (default: the recorded run's)")
    p.add_argument("--nproc-per-node", type=int, help="ranks per node (default: the recorded run's)")
    p.add_argument("--topology", help="a preset or YAML file (default: the recorded run's)")
    p.add_argument("--delay-model", help="the delay model (default: the recorded run's)")
    p.add_argument("--inject", action="append", default=None, help="a what-if, as for torchrun (repeatable)")
    p.add_argument(
        "--skew",
        help="emulated ranks enter late by seeded draws: auto, from the recorded real rank's own variation; "
        "FILE, its delays in ms; none (default: the recorded spans already hold the live run's waits)",
    )
    p.add_argument("--trace", dest="out", help="write the simulated run's trace here")
    p.add_argument(
        "--punctual",
        action="store_true",
        help="charge the real rank no software cost per collective: the network's times alone",
    )
    return p


def main(argv: list[str]) -> int:
    ns = build_parser().parse_args(argv)
    if ns.out and output_problem(ns.out):
        print(f"neuronabox: error: --trace {output_problem(ns.out)}", file=sys.stderr)
        return 2
    try:
        doc = load_trace(ns.trace)
        world = (ns.nnodes or doc.get("nnodes") or doc["world_size"]) * (ns.nproc_per_node or doc.get("nproc_per_node")
                                                                         or 1)  # fmt: skip
        with StatusLine(f"simulate: {world} ranks, collectives") as status:
            _, _, text = run_simulation(doc, ns.trace, ns.nnodes, ns.nproc_per_node, ns.topology, ns.delay_model,
                                        ns.inject, ns.out, ns.punctual, ns.skew,
                                        on_progress=lambda d, t: status.set(d, t))  # fmt: skip
    except SimulateError as exc:
        print(f"neuronabox: error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"neuronabox: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # writing the simulated trace failed
        print(f"neuronabox: error: {exc.filename or ns.out}: {exc.strerror}", file=sys.stderr)
        return 1
    if warning := tracefile.cut_off(doc, ns.trace):
        print(f"neuronabox: warning: {warning}", file=sys.stderr)
    print(text)
    # What the run built (a large world's schedules hold a message object per step) lives
    # until the process ends: the collector's last pass over it at exit would free nothing.
    gc.freeze()
    return 0
