"""`neuronabox validate`: the same script all-real and emulated, interleaved, compared."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from neuronabox.args import ArgParser
from neuronabox.cli.calibrate import add_testbed_flags
from neuronabox.fidelity.calibrate import calibrate, testbed_rate, write_topology
from neuronabox.fidelity.huge_pages import MODES
from neuronabox.fidelity.testbed import Loopback, Netns, TestbedError, TestbedUnavailable, check_netns_possible
from neuronabox.fidelity.validate import (
    AGAIN,
    CPU_HEADROOM,
    MAX_REPEAT,
    RUN_TIMEOUT_S,
    Comparison,
    Job,
    Runner,
    job_of,
    report,
    resolution_of,
    write_csv,
)
from neuronabox.launcher.torchrun_args import UsageError
from neuronabox.progress import StatusLine

NAME = "validate"
SUMMARY = "run a script all-real and emulated, interleaved, and report the iteration-time error"


def build_parser() -> ArgParser:
    p = ArgParser(
        prog="neuronabox validate",
        description="Run a script all-real and emulated, interleaved, and report the iteration-time error.",
    )
    add_testbed_flags(p)
    p.add_argument("--repeat", type=int, default=3, help="interleaved repetitions of each run (default 3)")
    p.add_argument("--resolve", metavar="PCT",
                   help="after --repeat, go on in pairs of repetitions until the all-real runs resolve this error "
                   "(their resolution at or under it, e.g. 2%%) or --max-repeat are done")  # fmt: skip
    p.add_argument("--max-repeat", type=int, help=f"--resolve's cap on the repetitions (default {MAX_REPEAT})")
    p.add_argument("--real-ranks", help="ranks that stay real in the emulated run (whole nodes; default node 0)")
    p.add_argument("--real-nodes", help="nodes that stay real in the emulated run (default 0)")
    p.add_argument("--topology", help="the emulated run's topology (default: calibrate this testbed first)")
    p.add_argument("--delay-model", help="the emulated run's delay model (default alpha-beta)")
    p.add_argument("--skew", help="the emulated run's --skew: auto (default, as torchrun's), none or FILE")
    p.add_argument("--realtime", action="store_true",
                   help="every real rank of both runs in the real-time class, as torchrun --realtime: for a host "
                   "whose kernel leaves wake-ups for the next tick (root or CAP_SYS_NICE)")  # fmt: skip
    p.add_argument("--huge-pages", nargs="?", const="transparent", choices=sorted(MODES), metavar="MODE",
                   help="every process of both runs with malloc on 2 MiB pages: transparent (the default; "
                   "glibc.malloc.hugetlb=1, as a host with THP always runs a job) or reserved (=2, from the hugetlb "
                   "pool, vm.nr_hugepages: each launch runs on much the same memory, so launches differ less). It "
                   "changes the job's own speed (docs/fidelity.md, \"Reserved huge pages\")")  # fmt: skip
    p.add_argument("--cpu-share", type=float, help="netns: cores per node (default: 0.8 x the machine's cores / nodes)")
    p.add_argument("--iteration", default="steps",
                   help="steps: time iterations between the optimizer's steps (any script; default); "
                   "line: the script's own `neuronabox-iteration ... median_ms=` line")  # fmt: skip
    p.add_argument("--warmup-steps", type=int, default=3, help="step intervals left out at the start (default 3)")
    p.add_argument("--noise-floor", action="store_true",
                   help="run all-real against all-real: the testbed's own error at this repetition count")  # fmt: skip
    p.add_argument("--csv", default="validate.csv", help="where the per-run results go (default validate.csv)")
    p.add_argument("--timeout", type=float, default=RUN_TIMEOUT_S, help="seconds one run may take")
    return p


def parse(argv: list[str]) -> tuple[argparse.Namespace, Job]:
    """Our flags, then the torchrun flags and the script after --."""
    if "--" not in argv:
        raise UsageError("validate needs the script after --")
    i = argv.index("--")
    ours, script = argv[:i], argv[i + 1 :]
    if not script:
        raise UsageError("no training script given after --")
    ns, rest = build_parser().parse_known_args(ours)
    return ns, job_of(ns, rest, script)


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help") and "--" not in argv:
        argv = [*argv, "--", "x"]  # argparse prints the help and exits before the script matters
    try:
        ns, job = parse(argv)
        rate = testbed_rate(ns)
        if ns.testbed == "netns":
            check_netns_possible()
    except (UsageError, TestbedError) as exc:
        print(f"neuronabox: error: {exc}", file=sys.stderr)
        return 2
    if not Path(ns.csv).resolve().parent.is_dir():
        print(f"neuronabox: error: --csv: no folder {str(Path(ns.csv).parent)!r} to write into", file=sys.stderr)
        return 2
    folder = Path(tempfile.mkdtemp(prefix="neuronabox-validate-"))
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C cleans up, even if our parent ignored it
    old = signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    runner = Runner(job, folder, ns.timeout, loopback=ns.testbed == "loopback")
    testbed = None
    try:
        if ns.testbed == "loopback":
            testbed = Loopback(job.nnodes, job.nproc, job.real_nodes)
        topology = ns.topology
        if topology is None and not ns.noise_floor:  # the noise floor runs nothing emulated
            print(f"calibrating the {ns.testbed} testbed (give --topology to skip)", flush=True)
            with StatusLine(f"validate: calibrating the {ns.testbed} testbed"):
                cal = calibrate(ns.testbed, rate)
            print(cal.report(), flush=True)
            topology = str(folder / "calibrated.yaml")
            write_topology(cal, Path(topology))
        if topology is not None and Path(topology).is_file():
            topology = str(Path(topology).resolve())
        if ns.testbed == "netns":
            share = ns.cpu_share or CPU_HEADROOM * len(os.sched_getaffinity(0)) / job.nnodes
            testbed = Netns(job.nnodes, rate, share)
        second = AGAIN if ns.noise_floor else "emulated"  # the noise floor: all-real twice
        placement = None if ns.noise_floor else testbed.emulated(job.real_nodes)
        plan = job.plan
        with StatusLine("validate: runs", 2 * ns.repeat) as status:
            rep = 0
            while plan.more([r.median_ms for r in job.results if r.mode == "all-real"]):
                if rep >= ns.repeat:  # --resolve: the testbed has not resolved its target yet
                    status.total = 2 * (rep + 2 - rep % 2)
                # Interleaved, the order flipped every repetition, so a drift of the machine
                # weighs on both sides alike.
                order = ("all-real", second) if rep % 2 == 0 else (second, "all-real")
                for mode in order:
                    status.set(detail=f"rep {rep} {mode}")
                    if mode == "emulated":
                        res = runner.emulated(placement, topology, ns.delay_model or "alpha-beta", rep, ns.skew)
                    else:
                        res = runner.all_real(testbed.all_real(), rep, mode)
                    job.results.append(res)
                    status.set(done=status.done + 1)
                    status.say(f"  rep {rep} {mode:<9} {res.median_ms:9.2f} ms   ({res.seconds:.0f} s)")
                rep += 1
                if plan.target is not None and rep >= max(ns.repeat, 3) and rep % 2 == 0:
                    reached = resolution_of([r.median_ms for r in job.results if r.mode == "all-real"])
                    status.say(f"  resolution after {rep} repetitions: {reached * 100:.1f}%")
        cmp = Comparison(
            [r.median_ms for r in job.results if r.mode == "all-real"],
            [r.median_ms for r in job.results if r.mode == second],
        )
        print(report(job, ns, cmp, job.results, runner.pool))
        write_csv(Path(ns.csv), job, ns, cmp, job.results)
        print(f"wrote {ns.csv}")
        shutil.rmtree(folder, ignore_errors=True)
        return 0
    except TestbedUnavailable as exc:
        print(f"neuronabox: error: {exc}", file=sys.stderr)
        return 2
    except TestbedError as exc:
        print(f"neuronabox: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"neuronabox: interrupted (logs in {folder})", file=sys.stderr)
        return 130
    finally:
        try:
            runner.stop()
        finally:  # the testbed goes even if stopping the runs failed, and a second signal waits for it
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
            try:
                if testbed is not None:
                    testbed.close()
            finally:
                signal.signal(signal.SIGTERM, old)
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
