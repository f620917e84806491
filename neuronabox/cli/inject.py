"""`neuronabox inject`: change a live run's what-if modifiers."""

from __future__ import annotations

import sys

from neuronabox.args import ArgParser
from neuronabox.cli.status import _control_address, token_for, unreachable
from neuronabox.delay_models.whatif import WhatIfError, parse

NAME = "inject"
SUMMARY = "change a live run's what-if modifiers (collectives that start later see them)"


def build_parser() -> ArgParser:
    p = ArgParser(prog="neuronabox inject", description="Change the what-if modifiers of a live run.")
    p.add_argument("--address", help="the controller's control address (default: the latest run)")
    p.add_argument("--clear", action="store_true", help="drop the active modifiers first")
    p.add_argument("specs", nargs="*", help="as for --inject, e.g. latency=+2ms,per=collective")
    return p


def main(argv: list[str]) -> int:
    """Change the what-if modifiers of a live run; collectives that start later see them."""
    from neuronabox.controller import control_pb2
    from neuronabox.controller.service import connect

    ns = build_parser().parse_args(argv)
    if not ns.specs and not ns.clear:
        print("neuronabox: error: inject needs a spec or --clear", file=sys.stderr)
        return 2
    try:
        for spec in ns.specs:
            parse(spec)
    except WhatIfError as exc:
        print(f"neuronabox: error: {exc}", file=sys.stderr)
        return 2
    address = _control_address(ns.address)
    if address is None:
        return 2
    try:
        stub = connect(address, timeout=3, token=token_for(address))
        reply = stub.Inject(control_pb2.InjectRequest(specs=ns.specs, clear=ns.clear), timeout=5)
    except Exception as exc:  # noqa: BLE001
        print(f"neuronabox: error: {unreachable(address, exc)}", file=sys.stderr)
        return 1
    if reply.error:
        print(f"neuronabox: error: {reply.error}", file=sys.stderr)
        return 2
    print("what-if now: " + (", ".join(reply.active) or "none"))
    return 0
