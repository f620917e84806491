"""Controller CPU per boundary message, next to the kernel's floor, interleaved.

Floor: two processes pinned to cores 0 and 1 ping-pong small messages over a
loopback TCP socket from a compiled loop (the native module's `pingpong`); one
side's CPU time per message it sends or receives. Controller: a 4 KiB allreduce
at --nnodes 64 and 512 under the zero-delay model, the real rank pinned to core
0, the launcher and controller to core 1; the controller loop thread's CPU over
the timed repetitions by the boundary messages they carried, and the real rank's
median time per allreduce. Each world runs under both data planes (`native`: the
C++ book runs the collective; `python`: the Python engine). Each repetition runs
the floor and every (world, plane), in rotated order; the table gives medians with
their range, the ratio to the floor of the same repetition, and the python/native
ratio of the same repetition.
Usage: python scripts/bench_controller.py [--repeat K] [--reps N]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_allreduce import emulated, write_pinned_placement

FLOOR_BYTES = 64  # a notice-sized frame
FLOOR_ROUNDS = 20000
WORLDS = [64, 512]
PLANES = ["native", "python"]


def floor_side(port: int, cpu: int, first: bool) -> None:
    """One side of the ping-pong (a child process): prints its CPU seconds per message."""
    from neuronabox.controller import _native

    os.sched_setaffinity(0, {cpu})
    if first:
        s = socket.create_connection(("127.0.0.1", port))
    else:
        with socket.create_server(("127.0.0.1", port)) as srv:
            print("listening", flush=True)
            s, _ = srv.accept()
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    _native.pingpong(s.fileno(), 200, FLOOR_BYTES, first)  # warm-up
    t0 = time.thread_time()
    _native.pingpong(s.fileno(), FLOOR_ROUNDS, FLOOR_BYTES, first)
    print(json.dumps({"cpu_per_msg": (time.thread_time() - t0) / (2 * FLOOR_ROUNDS)}), flush=True)
    s.close()


def floor() -> float:
    """The ping-pong's CPU per message, on the side pinned where the controller runs."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    me = [sys.executable, __file__, "--floor-side", str(port)]
    server = subprocess.Popen([*me, "1", "0"], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "listening"
        client = subprocess.run([*me, "0", "1"], capture_output=True, text=True, timeout=120, check=True)
        out, _ = server.communicate(timeout=120)
    finally:
        server.kill()
        server.wait()
    json.loads(client.stdout)  # both sides finished
    return json.loads(out)["cpu_per_msg"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--floor-side", nargs=3, type=int, metavar=("PORT", "CPU", "FIRST"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.floor_side:
        port, cpu, first = args.floor_side
        floor_side(port, cpu, bool(first))
        return
    runs = [(w, p) for w in WORLDS for p in PLANES]
    with tempfile.TemporaryDirectory() as d:
        placement = Path(d) / "placement.json"
        write_pinned_placement(placement)
        floors: list[float] = []
        per_msg: dict = {k: [] for k in runs}
        ratio: dict = {k: [] for k in runs}
        real_ms: dict = {k: [] for k in runs}
        speedup: dict = {w: [] for w in WORLDS}
        for rep in range(args.repeat):
            steps: list = ["floor", *runs]
            k = rep % len(steps)
            steps = steps[k:] + steps[:k]  # rotate the order
            got: dict = {}
            for step in steps:
                if step == "floor":
                    got[step] = floor()
                else:
                    w, plane = step
                    flags = ("--placement", str(placement), "--data-plane", plane)
                    med, cpu, _ = emulated(w, 4096, args.reps, flags=flags, cpus={1})
                    got[step] = cpu
                    real_ms[step].append(med * 1e3)
            floors.append(got["floor"])
            for key in runs:
                per_msg[key].append(got[key])
                ratio[key].append(got[key] / got["floor"])
            for w in WORLDS:
                speedup[w].append(got[(w, "python")] / got[(w, "native")])
            shown = ", ".join(f"{k if k == 'floor' else '/'.join(map(str, k))}={v * 1e6:.1f}us" for k, v in got.items())
            print(f"  rep {rep + 1}: {shown}", file=sys.stderr)

    def spread(xs: list[float], fmt: str = "{:.2f}") -> str:
        return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"

    print(
        "| 4 KiB allreduce | data plane | CPU per message, median (range) | ratio to the floor | "
        "time on the real rank, ms | python / native CPU |"
    )
    print("|---|---|---:|---:|---:|---:|")
    us = "{:.1f}"
    floor_us = spread([f * 1e6 for f in floors], us)
    print(f"| kernel floor: TCP ping-pong, {FLOOR_BYTES} B | - | {floor_us} us | 1 | - | - |")
    for w, plane in runs:
        key = (w, plane)
        cpu = spread([x * 1e6 for x in per_msg[key]], us)
        ab = spread(speedup[w]) if plane == "native" else ""
        real = spread(real_ms[key])
        print(f"| controller, --nnodes {w} | {plane} | {cpu} us | {spread(ratio[key])} | {real} | {ab} |")


if __name__ == "__main__":
    main()
