"""Soak: a long DDP run, with the controller's memory sampled as it goes.

    python scripts/bench_soak.py [--steps 10000] [--nnodes 8] [--every 500]

Runs the bundled example for --steps optimizer steps and prints the controller's
RSS every --every steps, then its growth after the warm-up (the first tenth of
the run: imports, buckets, allocator pools). The controller keeps no per-collective
state once an instance completes and streams its trace to disk, so the RSS stays flat.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
STEP = re.compile(r"^step (\d+) loss")


def controller_of(pid: int) -> psutil.Process | None:
    for child in psutil.Process(pid).children(recursive=True):
        if "neuronabox.controller.main" in " ".join(child.cmdline()):
            return child
    return None


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10_000)
    p.add_argument("--nnodes", type=int, default=8)
    p.add_argument("--every", type=int, default=500)
    p.add_argument("--delay-model", default="alpha-beta")
    ns = p.parse_args()
    trace = Path(tempfile.mkdtemp(prefix="nbx-soak-")) / "trace.jsonl"
    cmd = [
        sys.executable, "-m", "neuronabox.cli", "torchrun", "--nnodes", str(ns.nnodes), "--delay-model",
        ns.delay_model, "--trace", str(trace), str(ROOT / "examples" / "train_ddp.py"), "--steps", str(ns.steps),
    ]  # fmt: skip
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    samples: list[tuple[int, float, int]] = []  # (step, seconds, RSS bytes)
    ctl = None
    summary: list[str] = []
    for line in proc.stdout:
        m = STEP.match(line)
        if m is None:
            if line.startswith("  ") or line.startswith("NeuronaBox"):
                summary.append(line.rstrip())
            continue
        step = int(m.group(1))
        if step % ns.every == 0 or step == ns.steps - 1:
            ctl = ctl or controller_of(proc.pid)
            if ctl is not None:
                samples.append((step, time.monotonic() - t0, ctl.memory_info().rss))
    rc = proc.wait()
    print(f"soak: {ns.steps} DDP steps of examples/train_ddp.py, --nnodes {ns.nnodes}, {ns.delay_model}; "
          f"{os.cpu_count()} cores; exit {rc}")  # fmt: skip
    print(f"{'step':>7} {'seconds':>8} {'controller RSS (MiB)':>21}")
    for step, secs, rss in samples:
        print(f"{step:>7} {secs:>8.1f} {rss / 2**20:>21.1f}")
    warm = [s for s in samples if s[0] >= ns.steps // 10]
    if len(warm) >= 2:
        base = warm[0][2]
        top = max(r for _, _, r in warm)
        print(f"after warm-up (step {warm[0][0]}): RSS {base / 2**20:.1f} MiB -> max {top / 2**20:.1f} MiB, "
              f"last {warm[-1][2] / 2**20:.1f} MiB: growth {100 * (top - base) / base:+.2f}% (max), "
              f"{100 * (warm[-1][2] - base) / base:+.2f}% (last)")  # fmt: skip
    print(f"trace: {trace.stat().st_size / 2**20:.1f} MiB on disk" if trace.exists() else "no trace")
    print("\n".join(summary))
    return rc


if __name__ == "__main__":
    sys.exit(main())
