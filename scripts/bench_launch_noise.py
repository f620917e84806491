"""How much a fresh launch of the same compute differs from the last, on this machine.

    python scripts/bench_launch_noise.py [--launches N] [--steps S] [--workloads mlp,cnn,gpt] [--reps 5,15]
                                         [--pages 4k,huge,reserved]

`validate` compares medians of K runs a side, and every run is a new process. Each
workload here runs alone (world 1: no peer, no network, no NeuronaBox), pinned to core
0 and in the real-time class as `validate --realtime` runs its ranks, N times in fresh
processes, the workloads interleaved. The table gives the spread of the launches'
median iteration times, and the error that two sides of K launches each show with no
difference between them at all (`validate`'s resolution: two sets of K drawn from the
launches' medians, 2000 times; the 90th percentile of |median(A) / median(B) - 1|, and
how often it is within `--bar`). An error smaller than that is not resolved at K repetitions,
whatever the emulator does. `--pages 4k,huge,reserved` runs every launch each way,
interleaved: malloc on the system's default pages, on transparent huge pages (`validate
--huge-pages`), and on the reserved hugetlb pool (`validate --huge-pages reserved`, which
needs `vm.nr_hugepages`) (neuronabox/fidelity/huge_pages.py).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from neuronabox.fidelity.huge_pages import problem, with_huge_pages
from neuronabox.fidelity.validate import no_difference_error

ROOT = Path(__file__).resolve().parent.parent
LINE = re.compile(r"neuronabox-iteration .*median_ms=([0-9.]+)")
WORKLOADS = {"mlp": "examples/mlp.py", "cnn": "examples/cnn.py", "gpt": "examples/gpt.py"}


def pinned_run(script: str, steps: int, core: int = 0, torchrun: tuple[str, ...] = ()) -> list[str]:
    """The command that trains `script` at world 1 on `core`, in the real-time class."""
    return ["taskset", "-c", str(core), "chrt", "-r", "1", sys.executable, "-m", "torch.distributed.run", *torchrun,
            "--nproc-per-node", "1", script, "--steps", str(steps)]  # fmt: skip


PAGES = {"4k": None, "huge": "transparent", "reserved": "reserved"}  # --pages -> validate --huge-pages's MODE


def paged(env: dict[str, str], pages: str) -> dict[str, str]:
    """`env` with malloc's pages as `pages` says (4k: the system's; huge and reserved:
    validate --huge-pages transparent and reserved)."""
    mode = PAGES[pages]
    return env if mode is None else with_huge_pages(env, mode)


def launch(script: str, steps: int, pages: str) -> float:
    """One fresh process's median iteration time, ms, on core 0; `pages`: a key of PAGES."""
    env = paged(dict(os.environ), pages)
    out = subprocess.run(pinned_run(script, steps), capture_output=True, text=True, cwd=ROOT, timeout=600, env=env)
    found = LINE.search(out.stdout + out.stderr)
    if out.returncode != 0 or not found:
        sys.exit(f"{script}: exit {out.returncode}: {(out.stderr.strip().splitlines() or ['?'])[-1]}")
    return float(found.group(1))


def cell(errs: list[float], bar: float) -> str:
    if not errs:
        return "-"
    within = sum(e <= bar for e in errs) / len(errs)
    return f"{statistics.quantiles(errs, n=10)[-1] * 100:.1f}%, {within:.0%}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--launches", type=int, default=10)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--reps", default="5", help="the K of `validate --repeat K` to give the floor for")
    p.add_argument("--bar", type=float, default=2.0, help="an error bar, %% (the chance a no-difference pair meets it)")
    p.add_argument("--pages", default="4k", help="4k, huge, reserved or several (4k,reserved): malloc's pages, "
                   "interleaved")  # fmt: skip
    args = p.parse_args()
    logs = tempfile.TemporaryDirectory(prefix="torchelastic-")  # the stock torchruns' logs, removed at exit
    os.environ["PET_LOG_DIR"] = logs.name
    pages = args.pages.split(",")
    if set(pages) - PAGES.keys():
        sys.exit(f"--pages takes {', '.join(PAGES)}, got {args.pages!r}")
    for pg in pages:
        if PAGES[pg] is not None and (lacking := problem(PAGES[pg])):
            sys.exit(f"--pages {pg}: {lacking}")
    names = [f"{w} {pg}" if len(pages) > 1 else w for w in args.workloads.split(",") for pg in pages]
    reps = [int(k) for k in args.reps.split(",")]
    medians: dict[str, list[float]] = {n: [] for n in names}
    for i in range(args.launches):
        for n in names:  # interleaved: a drift of the machine weighs on every workload alike
            w, _, pg = n.partition(" ")
            medians[n].append(launch(WORKLOADS[w], args.steps, pg or pages[0]))
        print(f"launch {i + 1}/{args.launches}: " + ", ".join(f"{n} {medians[n][-1]:.2f}" for n in names), flush=True)
    head = " | ".join(f"no-difference error, K = {k}: p90, P(within {args.bar:g}%)" for k in reps)
    cols = ["launches", "median ms", "min .. max ms", "spread", head]
    print(f"\n| workload (world 1, {args.steps} steps a launch) | " + " | ".join(cols) + " |")
    print("|---|---:|---:|---:|---:|" + "---:|" * len(reps))
    for n in names:
        xs = medians[n]
        mid = statistics.median(xs)
        cells = " | ".join(cell(no_difference_error(xs, k) if len(xs) >= 3 else [], args.bar / 100) for k in reps)
        print(f"| {n} | {len(xs)} | {mid:.2f} | {min(xs):.2f} .. {max(xs):.2f} | "
              f"{(max(xs) - min(xs)) / mid * 100:.1f}% | {cells} |")  # fmt: skip


if __name__ == "__main__":
    main()
