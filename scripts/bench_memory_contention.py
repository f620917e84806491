"""What two ranks on one host take from each other besides the cores: memory bandwidth.

    python scripts/bench_memory_contention.py [--repeat K] [--seconds S]
    python scripts/bench_memory_contention.py --workloads cnn,mlp,gpt [--repeat K] [--pages 4k|huge|reserved]

The loopback testbed's all-real baseline runs two ranks at once, one per core; its
emulated run computes on one (the controller mostly waits). Each kernel runs for S
seconds on core 0 alone, then on cores 0 and 1 at once (two processes, one torch
thread each), K times interleaved; the figure is core 0's throughput. A kernel that
slows when the other core runs the same shares something the cores do not own (on a
VM: the host's memory bandwidth and last-level cache), and a workload made of such
work runs faster emulated than all-real here for that reason alone. Prints a markdown
table: each kernel's throughput alone and together, medians [min-max], and their ratio.

`--workloads` does the same with whole training scripts, the kernels a validation really
runs: each example at world 1, pinned to core 0 in the real-time class as `validate
--realtime` runs its ranks (scripts/bench_launch_noise.py), once alone and once while a
second copy trains on core 1, K pairs interleaved; the figure is core 0's median
iteration time, and each pair's ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_launch_noise import PAGES, ROOT, WORKLOADS, launch, paged, pinned_run

from neuronabox.fidelity.huge_pages import problem
from neuronabox.launcher.ports import free_port
from neuronabox.launcher.ranks import SITE_DIR
from neuronabox.launcher.reaping import Family
from neuronabox.observer.steps import STEP_LOG, step_file

KERNELS = {
    "matmul 256x256 (compute)": "matmul",
    "add of 32 MiB tensors (memory)": "add",
    "copy of 32 MiB (memory)": "copy",
}


def kernel(name: str, core: int, seconds: float) -> None:
    """One side (a child process): prints its operations per second as JSON."""
    import torch

    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    if name == "matmul":
        a, b = torch.randn(256, 256), torch.randn(256, 256)
        op = lambda: a @ b  # noqa: E731
    else:
        a, b = torch.randn(8 << 20), torch.randn(8 << 20)
        op = (lambda: a.add_(b)) if name == "add" else (lambda: a.copy_(b))
    for _ in range(5):
        op()
    print("ready", flush=True)
    sys.stdin.readline()  # both sides start together
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        op()
        n += 1
    print(json.dumps({"per_s": n / (time.perf_counter() - t0)}), flush=True)


def run(name: str, cores: list[int], seconds: float) -> float:
    """Core 0's throughput with `cores` each running the kernel at once."""
    me = [sys.executable, __file__, "--side", name]
    procs = [subprocess.Popen([*me, str(c), str(seconds)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for c in cores]  # fmt: skip
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = [json.loads(p.stdout.readline())["per_s"] for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    return outs[0]


def co_runner(script: str, folder: Path, pages: str) -> Family:
    """The same script training on core 1 (world 1, 600 steps: several measured runs long),
    returned once it has taken its first steps (its step log, sitecustomize)."""
    env = paged(dict(os.environ, **{STEP_LOG: str(folder)}, PYTHONPATH=str(SITE_DIR), OMP_NUM_THREADS="1"), pages)
    port = str(free_port("127.0.0.1"))  # the measured run has torchrun's default
    family = Family()  # torchrun starts its worker in a session of its own: the family stops it too
    cmd = pinned_run(script, 600, core=1, torchrun=("--master-port", port))
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    family.add(subprocess.Popen(cmd, cwd=ROOT, env=env, start_new_session=True, **quiet))
    deadline = time.monotonic() + 120
    while not (step_file(folder, 0).exists() and len(step_file(folder, 0).read_text().split()) >= 5):
        if family.children[0].poll() is not None or time.monotonic() > deadline:
            family.stop(grace=3)
            sys.exit(f"{script}: the co-runner on core 1 took no steps")
        time.sleep(0.1)
    return family


def workloads(names: list[str], repeat: int, steps: int, pages: str) -> None:
    """Each script's iteration time on core 0, alone and with a copy training on core 1."""
    got = {n: {"alone": [], "together": []} for n in names}
    for rep in range(repeat):
        for n in names:
            for how in ("alone", "together") if rep % 2 == 0 else ("together", "alone"):
                if how == "alone":
                    got[n][how].append(launch(WORKLOADS[n], steps, pages))
                    continue
                with tempfile.TemporaryDirectory() as d:
                    other = co_runner(WORKLOADS[n], Path(d), pages)
                    try:
                        got[n][how].append(launch(WORKLOADS[n], steps, pages))
                    finally:
                        other.stop(grace=3)
        print(f"  repetition {rep + 1}/{repeat} done", file=sys.stderr, flush=True)
    print(f"| workload, world 1 on core 0 ({pages} pages) | alone, ms | with a copy training on core 1, ms "
          "| together / alone | per pair |")  # fmt: skip
    print("|---|---:|---:|---:|---|")
    for n, xs in got.items():
        alone, together = statistics.median(xs["alone"]), statistics.median(xs["together"])
        pairs = ", ".join(f"{t / a:.2f}" for a, t in zip(xs["alone"], xs["together"], strict=True))
        a_lo, a_hi, t_lo, t_hi = min(xs["alone"]), max(xs["alone"]), min(xs["together"]), max(xs["together"])
        print(f"| {n} | {alone:.2f} [{a_lo:.2f}-{a_hi:.2f}] | {together:.2f} [{t_lo:.2f}-{t_hi:.2f}] "
              f"| {together / alone:.2f} | {pairs} |")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--workloads", help="training scripts instead of kernels: " + ",".join(WORKLOADS))
    ap.add_argument("--steps", type=int, default=40, help="--workloads: steps of each measured run")
    ap.add_argument("--pages", default="4k", choices=tuple(PAGES), help="--workloads: malloc's pages")
    ap.add_argument("--side", nargs=3, metavar=("KERNEL", "CORE", "SECONDS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.side:
        kernel(args.side[0], int(args.side[1]), float(args.side[2]))
        return
    if len(os.sched_getaffinity(0)) < 2:
        sys.exit("needs two cores")
    if args.workloads:
        names = args.workloads.split(",")
        if unknown := [n for n in names if n not in WORKLOADS]:
            sys.exit(f"no workload {unknown[0]!r}: {', '.join(WORKLOADS)}")
        if PAGES[args.pages] is not None and (lacking := problem(PAGES[args.pages])):
            sys.exit(f"--pages {args.pages}: {lacking}")
        logs = tempfile.TemporaryDirectory(prefix="torchelastic-")  # the stock torchruns' logs, removed at exit
        os.environ["PET_LOG_DIR"] = logs.name  # torchrun's default: a /tmp folder per launch, never removed
        workloads(names, args.repeat, args.steps, args.pages)
        return
    got = {k: {"alone": [], "together": []} for k in KERNELS}
    for rep in range(args.repeat):
        for label, name in KERNELS.items():
            order = ("alone", "together") if rep % 2 == 0 else ("together", "alone")
            for how in order:
                got[label][how].append(run(name, [0] if how == "alone" else [0, 1], args.seconds))
        print(f"  repetition {rep + 1}/{args.repeat} done", file=sys.stderr, flush=True)

    def cell(xs: list[float]) -> str:
        return f"{statistics.median(xs):.1f} [{min(xs):.1f}-{max(xs):.1f}]"

    print("| kernel, one torch thread on core 0 | alone (ops/s) | with core 1 running it too | together / alone |")
    print("|---|---:|---:|---:|")
    for label, xs in got.items():
        ratio = statistics.median(xs["together"]) / statistics.median(xs["alone"])
        print(f"| {label} | {cell(xs['alone'])} | {cell(xs['together'])} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
