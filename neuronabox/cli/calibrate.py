"""`neuronabox calibrate`: measure this machine's testbed and write a topology file."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from neuronabox.args import ArgParser
from neuronabox.fidelity.calibrate import calibrate, testbed_rate, write_topology
from neuronabox.fidelity.testbed import TestbedError, TestbedUnavailable, check_netns_possible

NAME = "calibrate"
SUMMARY = "measure the loopback or netns testbed and write a topology file for --topology"


def add_testbed_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--testbed",
        choices=("loopback", "netns"),
        default="loopback",
        help="loopback: each rank on a core of its own; netns: namespaces with shaped links (root)",
    )
    p.add_argument("--rate", help="netns: the link rate of each node, e.g. 100mbit, 1gbit (default 1gbit)")


def build_parser() -> ArgParser:
    p = ArgParser(
        prog="neuronabox calibrate",
        description="Measure the link, Gloo's per-message cost and the reduction cost between two real ranks, "
        "fit them, and write a topology file for --topology.",
    )
    add_testbed_flags(p)
    p.add_argument("--out", required=True, help="the topology file to write (YAML)")
    p.add_argument("--max-bytes", type=int, help="the largest Gloo message measured")
    return p


def main(argv: list[str]) -> int:
    ns = build_parser().parse_args(argv)
    out = Path(ns.out)
    try:
        rate = testbed_rate(ns)
        if ns.testbed == "netns":
            check_netns_possible()
        if not out.parent.is_dir():
            raise TestbedUnavailable(f"--out: no folder {str(out.parent)!r} to write into")
        cal = calibrate(ns.testbed, rate, ns.max_bytes)
    except TestbedError as exc:
        print(f"neuronabox: error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, TestbedUnavailable) else 1
    except KeyboardInterrupt:
        print("neuronabox: interrupted", file=sys.stderr)
        return 130
    print(cal.report())
    write_topology(cal, out)
    print(f"wrote {out} (use it with --topology {out})")
    return 0
