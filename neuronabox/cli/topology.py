"""`neuronabox topology show`: a topology preset or file, described."""

from __future__ import annotations

import sys

from neuronabox.args import ArgParser

NAME = "topology"
SUMMARY = "describe a topology preset or file (neuronabox topology show NAME|FILE)"


def build_parser() -> ArgParser:
    from neuronabox.topology import PRESETS

    p = ArgParser(prog="neuronabox topology", description="Describe a topology: its nodes, links and paths.")
    sub = p.add_subparsers(dest="action", required=True, metavar="show", help="show: describe NAME|FILE")
    show = sub.add_parser("show", help="describe a preset or a YAML file")
    show.add_argument("name", metavar="NAME|FILE", help=f"a preset ({', '.join(sorted(PRESETS))}) or a YAML file")
    return p


def main(argv: list[str]) -> int:
    from neuronabox.topology import TopologyError, load

    ns = build_parser().parse_args(argv)
    try:
        print(load(ns.name).describe())
    except TopologyError as exc:
        print(f"neuronabox: error: {exc}", file=sys.stderr)
        return 2
    return 0
