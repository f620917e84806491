"""`neuronabox torchrun`: run a script as torchrun would, the real nodes on stock torchrun
and every other rank of the world emulated; print the run's summary.

The command line is split by `launcher.torchrun_args` (torchrun's flags pass through,
which argparse cannot do); `build_parser` describes every flag for the help. Exit status:
0 the job finished, 1 the job or the emulation failed, 2 bad usage, 130 interrupted
(SIGINT), 143 terminated (SIGTERM)."""

from __future__ import annotations

import argparse
import shutil
import signal
import sys

from neuronabox.args import ArgParser
from neuronabox.launcher.interrupts import Interrupted, raised_as_interrupted, signum_of
from neuronabox.launcher.job import job_from_args
from neuronabox.launcher.member import MemberRun
from neuronabox.launcher.reaping import become_subreaper
from neuronabox.launcher.run import LaunchError, Run
from neuronabox.launcher.torchrun_args import UsageError, parse

NAME = "torchrun"
SUMMARY = "run a script in an emulated world, as torchrun would, with a few real ranks"

USAGE = """neuronabox torchrun [torchrun flags] [neuronabox flags] script.py [script args]
       neuronabox torchrun [flags] -m module [args]  |  --no-python program [args]"""


def build_parser() -> ArgParser:
    """Every flag of the command, for its help. (The command line itself is read by
    `torchrun_args.parse`: torchrun's flags not named here pass through to torchrun.)"""
    p = ArgParser(
        prog="neuronabox torchrun",
        usage=USAGE,
        description="Runs script.py on stock torchrun for the real nodes and emulates every other rank of\n"
        "the world (--nnodes x --nproc-per-node).",
        epilog="Other torchrun flags (--max-restarts, --log-dir, ...) are passed to torchrun; see\n"
        "`python -m torch.distributed.run --help`. torchrun's flags are also read from PET_* variables.\n"
        "Without --node-rank the launcher runs every real node here; with it, each real node's host runs\n"
        "the same command with its own --node-rank (docs/guide.md, \"Real nodes on several hosts\"). --standalone and\n"
        "other rendezvous backends are refused.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("script", metavar="script.py", help="the script (-m: a module, --no-python: a program)")
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="script args", help="the script's own arguments")
    add_world_flags(p)
    return p


def add_world_flags(p: ArgParser) -> None:
    """The flags `neuronabox torchrun` and `neuronabox controller` share: the world, the
    emulation and torchrun's rendezvous."""
    ours = p.add_argument_group("neuronabox flags")
    flag = ours.add_argument
    flag("--real-nodes", metavar="N[,N..]", help="the nodes that really run (default 0)")
    flag("--real-ranks", metavar="R[,R..]", help="the ranks that really run, instead of --real-nodes")
    flag("--topology", metavar="NAME|FILE", help="the emulated cluster (default cpu-25gbe; `neuronabox topology show`)")
    flag("--delay-model", metavar="NAME", help="how the network is timed (default alpha-beta)")
    flag(
        "--boundary",
        metavar="modeled|real",
        help="modeled: the controller adds the boundary hop's cost; real: the link to the real rank is "
        "itself a cluster link (a testbed)",
    )
    flag("--inject", metavar="SPEC", help="a what-if modifier, e.g. latency=+2ms or bandwidth=x0.5 (repeatable)")
    flag("--gloo-mode", metavar="auto|full|lazy", help="Gloo's connection mode (auto: lazy above 64 ranks)")
    flag("--data", metavar="zeros|mirror", help="what the emulated ranks send (mirror needs the observer)")
    flag("--no-observer", action="store_true", help="run without the observer in the real ranks")
    flag(
        "--realtime",
        action="store_true",
        help="run the real ranks in the real-time class (SCHED_RR 1), never the controller: on a kernel that "
        "leaves wake-ups for the next tick, their collectives then take no tick stalls (root or CAP_SYS_NICE)",
    )
    flag("--trace", metavar="FILE", help="write the run's trace to FILE (JSON lines, streamed as the run goes)")
    flag(
        "--timeout",
        metavar="SECONDS",
        help="a real rank without progress this long ends the run, naming where it is stuck "
        "(default 1800, the process group's default)",
    )
    flag(
        "--skew",
        metavar="none|auto|FILE",
        help="emulated ranks enter each collective late by a seeded draw: auto (default), from "
        "the real rank's own variation between its optimizer steps, measured during the run; FILE, from its delays "
        "in ms; none: on time (NCCL runs: none, the only one yet)",
    )
    flag(
        "--local-work",
        metavar="measured|topology",
        help="what emulated ranks spend per message and reduced byte: measured (default), the real rank's own, "
        "fitted from the run's ring collectives, unless the topology gives it; topology: only what it gives "
        "(presets: nothing)",
    )
    flag(
        "--placement",
        metavar="FILE|off",
        help="where real nodes and the controller run: a testbed's hosts (validate writes it); default: a core "
        "of its own for each real rank and the controller when this machine has them; off: where the OS puts them",
    )
    flag("--gloo-host", metavar="ADDR", help="the address the emulated ranks listen on (default 127.0.0.2)")
    flag(
        "--backend",
        metavar="gloo|nccl",
        help="the collective library the script's process group uses (default gloo)",
    )
    flag(
        "--device",
        metavar="cuda|cpu",
        help="backend nccl: the machine's GPUs (default), or the CPU rig (the wheel's libnccl on the rig's driver, "
        "for a script that calls NCCL itself: torch's CPU build has no ProcessGroupNCCL)",
    )
    flag("--nccl-algo", metavar="ring", help="NCCL's algorithm, pinned in the real ranks (the controller plays ring)")
    flag("--nccl-channels", metavar="K", help="NCCL's channel count, pinned (default 1)")
    flag("--nccl-route", metavar="socket", help="NCCL's transport to the controller: its Socket net (the one played)")
    flag(
        "--join-timeout",
        metavar="SECONDS",
        help="several hosts: how long the head waits for every other real node's launcher, and they for it "
        "(default 300)",
    )
    torchrun = p.add_argument_group("torchrun flags (torchrun's own; also read from PET_* variables)")
    flag = torchrun.add_argument
    flag("--nnodes", metavar="N", help="the emulated world's nodes (default 1)")
    flag("--nproc-per-node", metavar="P", help="ranks per node (default 1)")
    flag("--master-addr", metavar="ADDR", help="the store's address (default 127.0.0.1)")
    flag("--master-port", metavar="PORT", help="the store's port (default: a free one)")
    flag("--rdzv-endpoint", metavar="HOST:PORT", help="the store, for the static rendezvous (over --master-*)")
    flag("--rdzv-backend", metavar="static", help="only the static rendezvous can be emulated")
    flag(
        "--node-rank",
        metavar="K",
        help="several hosts: this host runs real node K only (the same command on each real node's host); "
        "node 0's host runs the controller, or `neuronabox controller` does when node 0 is emulated",
    )
    flag("--rdzv-id", metavar="ID", help="the run's id (default nbx<launcher pid>; several hosts: nbx-<port>)")
    flag("-m", "--module", action="store_true", help="run the script as a module (python -m)")
    flag("--no-python", action="store_true", help="run the script as a program, not with python")


def main(argv: list[str]) -> int:
    try:
        args = parse(argv)
        if args.help:
            build_parser().print_help()
            return 0
        job = job_from_args(args)
    except UsageError as exc:
        print(f"neuronabox: error: {exc}", file=sys.stderr)
        return 2
    run = Run(job) if job.runs_controller else MemberRun(job)
    become_subreaper()  # a worker whose agent dies is reparented here, and stopped with the run
    with raised_as_interrupted():
        return run_to_end(run)


def run_to_end(run: Run) -> int:
    last: list[str] = []  # said once the run is stopped, after torchrun's own last words
    try:
        if isinstance(run, MemberRun):  # one real node's host: the head sends the run's summary
            print(run.join_and_run(), flush=True)
        else:
            print(run.execute().summary, flush=True)
        shutil.rmtree(run.dir, ignore_errors=True)  # kept on failure: controller.log is there
        return 0
    except UsageError as exc:
        print(f"neuronabox: error: {exc}", file=sys.stderr)
        return 2
    except LaunchError as exc:
        last = [f"neuronabox: error: {exc}", f"neuronabox: the run's logs are in {run.dir}"]
        return 1
    except (Interrupted, KeyboardInterrupt) as exc:
        signum = signum_of(exc)
        kept = f" (its logs: {run.dir})" if run.dir.is_dir() else ""
        last = [f"neuronabox: interrupted ({signal.Signals(signum).name}); the run is stopped{kept}"]
        return 128 + signum
    finally:
        run.cleanup()
        _say(last)


def _say(lines: list[str]) -> None:
    """The launcher's last lines, on stderr; a closed terminal (SIGHUP) takes them silently."""
    try:
        for line in lines:
            print(line, file=sys.stderr, flush=True)
    except OSError:
        pass
