"""What two ranks on one host take from each other besides the cores: memory bandwidth.

    python scripts/bench_memory_contention.py [--repeat K] [--seconds S]

The loopback testbed's all-real baseline runs two ranks at once, one per core; its
emulated run computes on one (the controller mostly waits). Each kernel runs for S
seconds on core 0 alone, then on cores 0 and 1 at once (two processes, one torch
thread each), K times interleaved; the figure is core 0's throughput. A kernel that
slows when the other core runs the same shares something the cores do not own (on a
VM: the host's memory bandwidth and last-level cache), and a workload made of such
work runs faster emulated than all-real here for that reason alone. Prints a markdown
table: each kernel's throughput alone and together, medians [min-max], and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--side", nargs=3, metavar=("KERNEL", "CORE", "SECONDS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.side:
        kernel(args.side[0], int(args.side[1]), float(args.side[2]))
        return
    if len(os.sched_getaffinity(0)) < 2:
        sys.exit("needs two cores")
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
