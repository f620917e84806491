"""What-if resolution: does an injected latency move the real rank's time by that much?

    python scripts/bench_whatif_resolution.py [--runs 5] [--nnodes 16] [--bytes 1048576] [--reps 12]
        [--warmup 10] [--local-work measured,topology]

Per amount (+2 ms and +0.5 ms, `latency=+X,per=collective,op=allreduce`), per
`--local-work` setting and per run: one run without the what-if and one with it,
interleaved (order flipped every run), each timing `--reps` allreduces of `--bytes` on
real rank 0 of `--nnodes` nodes after `--warmup` more (scripts/collective_loop.py; the
measured local work is first charged after 8 ring collectives). The run's figure is the
median allreduce time; the shift is the with-run's median less the without-run's. Prints
a markdown table: each run's shift, and whether it is within 10% of the amount.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOOP = str(ROOT / "scripts" / "collective_loop.py")


def median_ms(nnodes: int, nbytes: int, reps: int, warmup: int, local_work: str, inject: str | None) -> float:
    cmd = [sys.executable, "-m", "neuronabox.cli", "torchrun", "--nnodes", str(nnodes), "--local-work", local_work]
    cmd += ["--inject", inject] if inject else []
    cmd += [LOOP, "--kinds", "allreduce", "--bytes", str(nbytes), "--reps", str(reps), "--warmup", str(warmup)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        sys.exit(f"run failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(line[7:])["allreduce"]["median_s"] * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--nnodes", type=int, default=16)
    p.add_argument("--bytes", type=int, default=1 << 20)
    p.add_argument("--reps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--local-work", default="measured,topology")
    ns = p.parse_args()
    print("| injected | --local-work | run | without (ms) | with (ms) | shift (ms) | within 10% |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | :---: |")
    for amount in (2.0, 0.5):
        spec = f"latency=+{amount:g}ms,per=collective,op=allreduce"
        for run in range(ns.runs):
            for work in ns.local_work.split(","):  # the settings interleaved too
                order = (None, spec) if run % 2 == 0 else (spec, None)
                got = {s: median_ms(ns.nnodes, ns.bytes, ns.reps, ns.warmup, work, s) for s in order}
                shift = got[spec] - got[None]
                ok = abs(shift - amount) <= 0.1 * amount
                cells = f"{got[None]:.3f} | {got[spec]:.3f} | {shift:+.3f} | {'yes' if ok else 'no'}"
                print(f"| +{amount:g} ms | {work} | {run} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
