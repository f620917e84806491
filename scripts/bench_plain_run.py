"""A plain run against all-real, as a user would run them: no flags beyond the world.

    python scripts/bench_plain_run.py [--repeat K] [--steps N] [--workload mlp|cnn|gpt]

All-real: the stock `torchrun --nproc-per-node 2` of the workload (two real ranks here).
Emulated: `neuronabox torchrun --nnodes 2` of the same script (rank 0 real, rank 1 the
controller's), with the launcher's default placement (a core per real rank and one for
the controller, when the machine has them). K interleaved pairs, the order flipped every
pair; each run's figure is rank 0's median iteration time, as the workload prints it.
Prints one markdown row: each side's median [min-max], the error of the medians and the
range of the per-pair errors. `--python-starts` adds a third run to each round, the
emulated run with every collective's book started from Python (NEURONABOX_NATIVE_START=0),
and its column: what native starts take off the iteration; `--skew-none` one emulated with
`--skew none` (the default is auto: the emulated ranks draw the real rank's variation).
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

ROOT = Path(__file__).resolve().parent.parent
LINE = re.compile(r"neuronabox-iteration .*\brank=0\b.*\bmedian_ms=([0-9.]+)")


def run(cmd: list[str], env: dict[str, str] | None = None) -> float:
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600, env=env)
    m = LINE.search(proc.stdout)
    if proc.returncode != 0 or not m:
        sys.exit(f"{' '.join(cmd[:6])} ... failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    placed = [ln for ln in proc.stdout.splitlines() if "placed" in ln]
    if placed:
        print(f"  {placed[0]}", file=sys.stderr)
    return float(m.group(1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--workload", default="mlp", choices=("mlp", "cnn", "gpt"))
    p.add_argument("--python-starts", action="store_true", help="also run with every book started from Python")
    p.add_argument("--skew-none", action="store_true", help="also run emulated with --skew none")
    args = p.parse_args()
    logs = tempfile.TemporaryDirectory(prefix="torchelastic-")  # the stock torchruns' logs, removed at exit
    os.environ["PET_LOG_DIR"] = logs.name
    script = [f"examples/{args.workload}.py", "--steps", str(args.steps)]
    all_real = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", *script]

    def emulated_with(*flags: str) -> list[str]:
        return [sys.executable, "-m", "neuronabox.cli", "torchrun", "--nnodes", "2", *flags, *script]

    emulated = emulated_with()
    runs = {"all-real": (all_real, None), "emulated": (emulated, None)}
    if args.python_starts:
        runs["python starts"] = (emulated, dict(os.environ, NEURONABOX_NATIVE_START="0"))
    if args.skew_none:
        runs["skew none"] = (emulated_with("--skew", "none"), None)
    times: dict[str, list[float]] = {mode: [] for mode in runs}
    for rep in range(args.repeat):
        order = list(runs)[rep % len(runs) :] + list(runs)[: rep % len(runs)]  # rotated every round
        for mode in order:
            t = run(*runs[mode])
            times[mode].append(t)
            print(f"rep {rep} {mode:<13} {t:8.2f} ms", file=sys.stderr, flush=True)
    real, emu = times["all-real"], times["emulated"]
    errs = [e / r - 1 for r, e in zip(real, emu, strict=True)]
    err = statistics.median(emu) / statistics.median(real) - 1

    def ms(xs: list[float]) -> str:
        return f"{statistics.median(xs):.2f} [{min(xs):.2f}-{max(xs):.2f}]"

    extra = [m for m in ("python starts", "skew none") if m in times]
    label = {"python starts": "every book from Python", "skew none": "emulated, --skew none"}
    head = "".join(f" {label[m]} ms | its error |" for m in extra)
    print("| workload | W | all-real ms | plain emulated ms | error (per pair) |" + head)
    print("| --- | ---: | ---: | ---: | ---: |" + " ---: | ---: |" * len(extra))
    tail = "".join(
        f" {ms(times[m])} | {(statistics.median(times[m]) / statistics.median(real) - 1) * 100:+.1f}% |" for m in extra
    )
    print(f"| {args.workload} | 2 | {ms(real)} | {ms(emu)} | {err * 100:+.1f}% "
          f"({min(errs) * 100:+.1f} .. {max(errs) * 100:+.1f}) |" + tail)  # fmt: skip


if __name__ == "__main__":
    main()
