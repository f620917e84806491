"""`neuronabox calibrate`: measure this machine's testbed and write a topology file."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from neuronabox.args import ArgParser
from neuronabox.fidelity.calibrate import calibrate, testbed_rate, write_topology
from neuronabox.fidelity.testbed import TestbedError, TestbedUnavailable, check_netns_possible
from neuronabox.progress import StatusLine

NAME = "calibrate"
SUMMARY = "measure the loopback or netns testbed, or fit nccl-tests logs, and write a topology file for --topology"


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
        description="Measure the link, Gloo's per-message cost and the reduction cost between two real ranks "
        "(or, with --from-nccl-tests, fit a real cluster's nccl-tests logs under NCCL's formulas), "
        "fit them, and write a topology file for --topology.",
    )
    add_testbed_flags(p)
    p.add_argument("--out", required=True, help="the topology file to write (YAML)")
    p.add_argument("--max-bytes", type=int, help="the largest Gloo message measured")
    nt = p.add_argument_group("from nccl-tests logs (instead of measuring this machine)")
    nt.add_argument("--from-nccl-tests", nargs="+", metavar="LOG",
                    help="fit the topology to nccl-tests output (text, with or without mpirun's prefixes, or -J "
                    "JSON), one world per file, any number of worlds")  # fmt: skip
    nt.add_argument("--model", default="nccl-ring", help="the delay model fitted: nccl-ring (default) or nccl-tree")
    nt.add_argument("--from-size", default="1M", help="the smallest size fitted (default 1M; smaller ones are "
                    "printed with their residuals)")  # fmt: skip
    nt.add_argument("--coll", help="the collective, for logs that do not say (all_reduce, all_gather, ...)")
    nt.add_argument("--ranks-per-node", type=int, help="ranks per node (default: the most ranks on one host)")
    nt.add_argument("--check", nargs="+", metavar="LOG", help="held-out logs: their busbw against the fit, and "
                    "the median error from --from-size")  # fmt: skip
    return p


def main(argv: list[str]) -> int:
    ns = build_parser().parse_args(argv)
    if ns.from_nccl_tests:
        return from_nccl_tests(ns)
    if ns.check:
        print("neuronabox: error: --check goes with --from-nccl-tests", file=sys.stderr)
        return 2
    out = Path(ns.out)
    try:
        rate = testbed_rate(ns)
        if ns.testbed == "netns":
            check_netns_possible()
        if not out.parent.is_dir():
            raise TestbedUnavailable(f"--out: no folder {str(out.parent)!r} to write into")
        with StatusLine(f"calibrate: measuring the {ns.testbed} testbed"):
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


def from_nccl_tests(ns) -> int:
    """A topology fitted to nccl-tests logs; held-out logs checked against it."""
    import yaml

    from neuronabox.fidelity import nccl_tests_fit as ntf
    from neuronabox.limits import output_problem
    from neuronabox.perf.ladder import parse_size

    out = Path(ns.out)
    problem = output_problem(str(out))
    try:
        if problem:
            raise ntf.NcclTestsError(f"--out {problem}")
        from_size = parse_size(ns.from_size, "--from-size")
        fitted = ntf.fit([ntf.read(p, ns.coll) for p in ns.from_nccl_tests], ns.model, from_size, ns.ranks_per_node)
        held = [ntf.read(p, ns.coll) for p in ns.check or []]
    except (ntf.NcclTestsError, ValueError) as exc:
        print(f"neuronabox: error: {exc}", file=sys.stderr)
        return 2
    print(ntf.report(fitted))
    for lg in held:
        print("\n".join(ntf.log_lines(fitted, lg, "held out: ")))
        print(f"  held out {lg.path}: median busbw error from {from_size} B: "
              f"{ntf.median_error(fitted, lg, from_size) * 100:.1f}%")  # fmt: skip
    spec = fitted.topology(out.stem)
    head = (f"# neuronabox calibrate --from-nccl-tests {' '.join(ns.from_nccl_tests)}: {fitted.model}, "
            f"sizes from {from_size} B\n")  # fmt: skip
    out.write_text(head + yaml.safe_dump(spec, sort_keys=False, default_flow_style=None))
    print(f"wrote {out} (use it with --topology {out} --delay-model {fitted.model})")
    return 0
