"""NCCL on the CPU rig, live: the emulated world against every rank real, and the world ladder.

    python scripts/bench_nccl_live.py table1 [--repeat 5] [--coll all_reduce]
    python scripts/bench_nccl_live.py worlds [--worlds 2,8,64,512]
    python scripts/bench_nccl_live.py whatif [--repeat 5]

table1: W = 2, the prototype's Table 1 on the rig: `--all-real` (two rig ranks) against
emulated (one rig rank, the controller playing rank 1 under the zero-delay model), in
repetitions interleaved with the order flipped each time; per size the median time of
each side over the repetitions [min-max], and the median of the per-repetition ratios
[min-max]. What it measures is NCCL's host path and our controller, on the rig's CPU
kernels: not a GPU's numbers.

worlds: one rig rank in emulated worlds of W ranks, every collective the rig runs, 1 KiB
to 16 MiB; per row the real rank's time, the model's (alpha-beta on cpu-25gbe) and
#wrong. whatif: W = 8, rank 0 real, zero-delay model, with and without
`--inject latency=+2ms,per=collective`, interleaved; per size the median of the per-repetition
differences of the real rank's time [min-max]: a what-if of +2 ms must read as +2 ms.
Prints tables; exits 1 if any value is wrong.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from neuronabox.perf.ladder import make_spec  # noqa: E402
from neuronabox.perf.rig import RigJob, run_rig  # noqa: E402

COLLS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")


def once(world: int, real: list[int], colls: list[str], top: str, iters: int, warmup: int, model: str,
         inject: list[str] | None = None, bottom: str = "1K") -> list:  # fmt: skip
    specs = [make_spec(c, world, minbytes=bottom, maxbytes=top, factor=4, iters=iters, warmup=warmup, check=1,
                       root=1 % world) for c in colls]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="nbx-bench-nccl-") as d:
        return run_rig(RigJob(specs, world, real, delay_model=model, inject=inject or [], timeout=600), Path(d))


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):9.1f} [{min(values):.1f}-{max(values):.1f}]"


def table1(args: argparse.Namespace) -> int:
    times: dict[str, dict[int, list[float]]] = {"all-real": {}, "emulated": {}}
    ratios: dict[int, list[float]] = {}
    wrong = 0
    for rep in range(args.repeat):
        order = ["all-real", "emulated"] if rep % 2 == 0 else ["emulated", "all-real"]
        got = {}
        for side in order:
            real = [0, 1] if side == "all-real" else [0]
            [rows] = once(2, real, [args.coll], args.top, args.iters, args.warmup, "zero")
            got[side] = rows
            wrong += sum(r.wrong for r in rows)
            for r in rows:
                times[side].setdefault(r.bytes, []).append(r.time_s * 1e6)
        for a, e in zip(got["all-real"], got["emulated"], strict=True):
            ratios.setdefault(a.bytes, []).append(e.time_s / a.time_s)
        print(f"# repetition {rep + 1}/{args.repeat} done ({' then '.join(order)})", flush=True)
    print(f"\n{args.coll}, W = 2 on the CPU rig, -n {args.iters} -w {args.warmup}, {args.repeat} interleaved "
          "repetitions: median [min-max]")  # fmt: skip
    print("| size (B) | all-real (us) | emulated (us) | emulated / all-real |\n|---:|---:|---:|---:|")
    for size in sorted(ratios):
        r = ratios[size]
        print(f"| {size} | {spread(times['all-real'][size])} | {spread(times['emulated'][size])} | "
              f"{statistics.median(r):.2f} [{min(r):.2f}-{max(r):.2f}] |")  # fmt: skip
    print(f"\n#wrong over every checked value: {wrong}")
    return 1 if wrong else 0


def worlds(args: argparse.Namespace) -> int:
    wrong = 0
    print("| W | collective | size (B) | real rank (us) | model (us) | #wrong |\n|---:|---|---:|---:|---:|---:|")
    for w in [int(x) for x in args.worlds.split(",")]:
        per_spec = once(w, [0], list(COLLS), args.top, args.iters, args.warmup, "alpha-beta")
        for coll, rows in zip(COLLS, per_spec, strict=True):
            for r in rows:
                wrong += r.wrong
                print(f"| {w} | {coll} | {r.bytes} | {r.time_s * 1e6:.1f} | {r.model_s * 1e6:.1f} | {r.wrong} |",
                      flush=True)  # fmt: skip
    print(f"\n#wrong over every checked value: {wrong}")
    return 1 if wrong else 0


def whatif(args: argparse.Namespace) -> int:
    diffs: dict[int, list[float]] = {}
    wrong = 0
    for rep in range(args.repeat):
        got = {}
        for side in (("base", "late") if rep % 2 == 0 else ("late", "base")):
            inject = ["latency=+2ms,per=collective"] if side == "late" else []
            [rows] = once(8, [0], ["all_reduce"], "1M", args.iters, args.warmup, "zero", inject, bottom="4K")
            got[side] = rows
            wrong += sum(r.wrong for r in rows)
        for b, late in zip(got["base"], got["late"], strict=True):
            diffs.setdefault(b.bytes, []).append((late.time_s - b.time_s) * 1e3)
    print(f"all_reduce, W = 8, rank 0 real, zero-delay model, -n {args.iters}: latency=+2ms,per=collective "
          f"against none, {args.repeat} interleaved repetitions")  # fmt: skip
    print("| size (B) | added (ms): median [min-max] |\n|---:|---:|")
    for size, d in sorted(diffs.items()):
        print(f"| {size} | {statistics.median(d):.2f} [{min(d):.2f}-{max(d):.2f}] |")
    print(f"\n#wrong over every checked value: {wrong}")
    return 1 if wrong else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("table1", "worlds", "whatif"))
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--coll", default="all_reduce", choices=COLLS)
    p.add_argument("--worlds", default="2,8,64,512")
    p.add_argument("--top", default="16M", help="the largest size (from 1K, times 4)")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    args = p.parse_args()
    return {"table1": table1, "worlds": worlds, "whatif": whatif}[args.what](args)


if __name__ == "__main__":
    sys.exit(main())
