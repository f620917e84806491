"""Scale: one real rank in a very large world under alpha-beta.

Reports, per allreduce size: the time the real rank measures against the model's
instance time (the tracking error), the boundary messages per allreduce, and the
controller's loop CPU per boundary message over the timed repetitions.

Usage: python scripts/bench_scale.py [--nnodes 16384] [--sizes 4096,1048576] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from neuronabox.trace.records import load as load_trace

HERE = Path(__file__).resolve().parent
WORKER = str(HERE / "collective_loop.py")


def run(nnodes: int, nbytes: int, reps: int, model: str, topology: str) -> dict:
    with tempfile.TemporaryDirectory() as d:
        trace = Path(d) / "trace.json"
        cmd = [
            sys.executable, "-m", "neuronabox.cli", "torchrun", "--nnodes", str(nnodes),
            "--delay-model", model, "--topology", topology, "--trace", str(trace),
            WORKER, "--kinds", "allreduce", "--bytes", str(nbytes), "--reps", str(reps), "--warmup", "1",
        ]  # fmt: skip
        t0 = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        wall = time.monotonic() - t0
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-3000:])
        line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
        measured = json.loads(line[7:])["allreduce"]["median_s"]
        doc = load_trace(trace)
    insts = doc["instances"]
    timed = [i for i in insts if i["kind"] == "allreduce" and i["nbytes"] >= nbytes][-reps:]
    first = insts.index(timed[0])
    window = insts[first - 1 : insts.index(timed[-1]) + 1]  # the barriers between them too
    msgs = sum(i["boundary_messages"] for i in window[1:])
    cpu = window[-1]["loop_cpu_s"] - window[0]["loop_cpu_s"]
    return {
        "measured": measured,
        "predicted": statistics.median(i["model_us"] for i in timed) * 1e-6,
        "msgs": timed[-1]["boundary_messages"],
        "cpu_per_msg": cpu / msgs,
        "wall": wall,
        "release": doc.get("release", {}),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nnodes", type=int, default=16384)
    ap.add_argument("--sizes", default="4096,1048576")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--model", default="alpha-beta")
    ap.add_argument("--topology", default="cpu-25gbe")
    args = ap.parse_args()
    print(f"--nnodes {args.nnodes}, one real rank, {args.model} on {args.topology}\n")
    print("| allreduce | real rank (median) | model | error | boundary msgs / op | controller CPU / msg |"
          " release late (median) | run wall time |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for nbytes in map(int, args.sizes.split(",")):
        r = run(args.nnodes, nbytes, args.reps, args.model, args.topology)
        err = (r["measured"] - r["predicted"]) / r["predicted"] * 100
        late = r["release"].get("median_us", float("nan"))
        print(
            f"| {nbytes >> 10} KiB | {r['measured'] * 1e3:.1f} ms | {r['predicted'] * 1e3:.1f} ms | {err:+.1f}% "
            f"| {r['msgs']} | {r['cpu_per_msg'] * 1e6:.1f} us | {late:.0f} us | {r['wall']:.0f} s |",
            flush=True,
        )


if __name__ == "__main__":
    main()
