"""`neuronabox perf` as a benchmark: the NeuronaBox paper's Table 1 for Gloo (W = 2,
every rank real against rank 0 real and rank 1 emulated under the zero-delay model,
interleaved, the order flipped every repetition), and the emulated ladder over world sizes.

    python scripts/bench_perf.py table1 [--repeat 5] [--colls all_reduce,all_gather] [-b 1K -e 16M -f 4]
    python scripts/bench_perf.py worlds [--worlds 2,8,64,512] [--coll all_reduce] [-b 1K -e 1M -f 8]

Prints markdown tables: per size the median of the runs' times, their range, and
the emulated run's overhead; per world the real rank's time and the model's.
Whole-process figures of one machine: on a 2-core VM every rank, the launcher and
the controller share the cores.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def perf(coll: str, world: int, all_real: bool, ladder: list[str], iters: int, warmup: int,
         extra: tuple[str, ...] = ()) -> dict[int, dict]:  # fmt: skip
    """One `neuronabox perf` run: its rows by size."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.json"
        argv = [sys.executable, "-m", "neuronabox.cli", "perf", coll, "--nnodes", str(world), *ladder,
                "-n", str(iters), "-w", str(warmup), "-J", str(out), *extra]  # fmt: skip
        argv += ["--all-real"] if all_real else []
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            sys.exit(f"perf failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
        return {r["size"]: r for r in json.loads(out.read_text())["rows"]}


def table1(ns) -> None:
    ladder = ["-b", ns.minbytes, "-e", ns.maxbytes, "-f", str(ns.factor)]
    for coll in ns.colls.split(","):
        runs: dict[str, list[dict[int, dict]]] = {"real": [], "emulated": []}
        for i in range(ns.repeat):
            order = ("real", "emulated") if i % 2 == 0 else ("emulated", "real")
            for mode in order:
                # The emulator's own cost: the zero-delay model, as the paper's Table 1 measures it.
                extra = () if mode == "real" else ("--delay-model", "zero")
                runs[mode].append(perf(coll, 2, mode == "real", ladder, ns.iters, ns.warmup, extra))
        print(f"\n{coll}, W = 2, {ns.repeat} interleaved runs each (-n {ns.iters} -w {ns.warmup}); "
              "time in us: median of the runs [min-max]\n")  # fmt: skip
        print("| size | all-real | emulated (zero-delay model) | overhead |")
        print("| ---: | ---: | ---: | ---: |")
        for size in sorted(runs["real"][0]):
            real = [r[size]["time_us"] for r in runs["real"]]
            emu = [r[size]["time_us"] for r in runs["emulated"]]
            over = statistics.median(emu) / statistics.median(real) - 1
            spread = lambda xs: f"{statistics.median(xs):.1f} [{min(xs):.1f}-{max(xs):.1f}]"  # noqa: E731
            print(f"| {size} | {spread(real)} | {spread(emu)} | {over:+.0%} |")


def worlds(ns) -> None:
    ladder = ["-b", ns.minbytes, "-e", ns.maxbytes, "-f", str(ns.factor)]
    results = {w: perf(ns.coll, w, False, ladder, ns.iters, ns.warmup) for w in map(int, ns.worlds.split(","))}
    sizes = sorted(next(iter(results.values())))
    print(f"\n{ns.coll}, rank 0 real, the rest emulated (alpha-beta on cpu-25gbe; -n {ns.iters} -w {ns.warmup}); "
          "time / model in us, #wrong\n")  # fmt: skip
    print("| size | " + " | ".join(f"W = {w}" for w in results) + " |")
    print("| ---: |" + " ---: |" * len(results))
    for size in sizes:
        cells = [f"{r[size]['time_us']:.0f} / {r[size]['model_us']:.0f}, {r[size]['wrong']}" for r in results.values()]
        print(f"| {size} | " + " | ".join(cells) + " |")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    t = sub.add_parser("table1")
    t.add_argument("--repeat", type=int, default=5)
    t.add_argument("--colls", default="all_reduce,all_gather")
    w = sub.add_parser("worlds")
    w.add_argument("--worlds", default="2,8,64,512")
    w.add_argument("--coll", default="all_reduce")
    for q, lo, hi, f in ((t, "1K", "16M", 4), (w, "1K", "1M", 8)):
        q.add_argument("-b", dest="minbytes", default=lo)
        q.add_argument("-e", dest="maxbytes", default=hi)
        q.add_argument("-f", dest="factor", type=int, default=f)
        q.add_argument("-n", dest="iters", type=int, default=20)
        q.add_argument("-w", dest="warmup", type=int, default=5)
    ns = p.parse_args()
    table1(ns) if ns.what == "table1" else worlds(ns)
    return 0


if __name__ == "__main__":
    sys.exit(main())
