"""`neuronabox controller`: the controller alone, for a run whose real nodes all run on
other hosts and whose node 0 is emulated. It takes the world flags every host's
`neuronabox torchrun --node-rank K` takes (no script), hosts the run's store on
--master-addr, waits for those hosts' launchers, and prints the run's summary. Exit
status as `neuronabox torchrun`'s."""

from __future__ import annotations

import argparse
import sys

from neuronabox.args import ArgParser
from neuronabox.cli.torchrun import add_world_flags, run_to_end
from neuronabox.launcher.interrupts import raised_as_interrupted
from neuronabox.launcher.job import job_from_args
from neuronabox.launcher.reaping import become_subreaper
from neuronabox.launcher.run import Run
from neuronabox.launcher.torchrun_args import UsageError, parse

NAME = "controller"
SUMMARY = "run the controller alone, for real nodes on other hosts (node 0 emulated)"


def build_parser() -> ArgParser:
    p = ArgParser(
        prog="neuronabox controller",
        usage="neuronabox controller --master-addr ADDR --master-port PORT [world flags]",
        description="Runs the controller of a run whose real nodes run on other hosts, each under\n"
        "`neuronabox torchrun ... --node-rank K` with the same flags. The store, the emulated ranks\n"
        "and the observer listen on --master-addr; the control service on loopback.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_world_flags(p)
    return p


def main(argv: list[str]) -> int:
    try:
        args = parse(argv, script=False)
        if args.help:
            build_parser().print_help()
            return 0
        job = job_from_args(args, controller_only=True)
    except UsageError as exc:
        print(f"neuronabox: error: {exc}", file=sys.stderr)
        return 2
    run = Run(job)
    become_subreaper()
    with raised_as_interrupted():
        return run_to_end(run)
