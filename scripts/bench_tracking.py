"""Model tracking: the time the real rank measures against the model's instance time.

For each delay model, world size and message size, one emulated run times
allreduce, allgather, broadcast and barrier on real rank 0 (median of the timed
repetitions; the broadcast root makes rank 0 the last rank of the tree) and reads
the model's predicted instance time from the run's trace. Prints a markdown table
with the error of each cell.

Usage: python scripts/bench_tracking.py [--topology NAME|FILE] [--models alpha-beta,collective]
                                        [--nnodes 2,16,128,1024] [--sizes 4096,1048576,67108864] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from neuronabox.trace.records import load as load_trace

HERE = Path(__file__).resolve().parent
WORKER = str(HERE / "collective_loop.py")
KINDS = ("allreduce", "allgather", "broadcast", "barrier")


def deepest_root(world: int) -> int:
    """The root that makes rank 0 the broadcast tree's costliest vrank (the most set bits)."""
    top = world - 1
    cands = [top] + [(top & ~((2 << i) - 1)) | ((1 << i) - 1) for i in range(top.bit_length()) if top >> i & 1]
    v = max(cands, key=lambda c: (c.bit_length(), bin(c).count("1")))
    return (-v) % world


def one_run(model: str, topology: str, nnodes: int, nbytes: int, reps: int) -> dict[str, tuple[float, float]]:
    with tempfile.TemporaryDirectory() as d:
        trace = Path(d) / "trace.json"
        cmd = [
            sys.executable, "-m", "neuronabox.cli", "torchrun", "--nnodes", str(nnodes),
            "--delay-model", model, "--topology", topology, "--trace", str(trace),
            WORKER, "--kinds", ",".join(KINDS), "--bytes", str(nbytes), "--reps", str(reps),
            "--warmup", "1", "--root", str(deepest_root(nnodes)),
        ]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-3000:])
        line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
        measured = json.loads(line[7:])
        instances = load_trace(trace)["instances"]
    out = {}
    for kind in KINDS:
        sizes = [i for i in instances if i["kind"] == kind]
        biggest = max(i["nbytes"] for i in sizes)  # the timed op, not the set-up collectives
        predicted = statistics.median(i["model_us"] for i in sizes if i["nbytes"] == biggest) * 1e-6
        out[kind] = (measured[kind]["median_s"], predicted)
    return out


def human(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--topology", default="cpu-25gbe")
    ap.add_argument("--models", default="alpha-beta,collective")
    ap.add_argument("--nnodes", default="2,16,128,1024")
    ap.add_argument("--sizes", default="4096,1048576,67108864")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    print(f"topology {args.topology}; real rank 0; median of {args.reps} repetitions\n")
    print("| model | --nnodes | size | " + " | ".join(f"{k} measured / model (error)" for k in KINDS) + " |")
    print("|---|---:|---:|" + "---:|" * len(KINDS))
    for model in args.models.split(","):
        for nnodes in map(int, args.nnodes.split(",")):
            for nbytes in map(int, args.sizes.split(",")):
                try:
                    res = one_run(model, args.topology, nnodes, nbytes, args.reps)
                except RuntimeError as exc:
                    print(f"| {model} | {nnodes} | {human(nbytes)} | failed: {str(exc).splitlines()[-1:]} |")
                    continue
                cells = []
                for kind in KINDS:
                    got, want = res[kind]
                    err = (got - want) / want * 100 if want else float("nan")
                    cells.append(f"{got * 1e3:.3f} / {want * 1e3:.3f} ms ({err:+.0f}%)")
                print(f"| {model} | {nnodes} | {human(nbytes)} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
