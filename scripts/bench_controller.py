"""Controller CPU per boundary message, next to the kernel's floor, interleaved.

Floor: two processes pinned to cores 0 and 1 ping-pong small messages over a
loopback TCP socket from a compiled loop (the native module's `pingpong`); one
side's CPU time per message it sends or receives. Controller: a 4 KiB allreduce
at --nnodes 64 and 512 under the zero-delay model, the real rank pinned to core
0, the launcher and controller to core 1; the controller loop thread's CPU over
the timed repetitions by the boundary messages they carried. Each repetition
runs the floor and both worlds, in rotated order; the table gives medians with
their range and the ratio to the floor of the same repetition.
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
    with tempfile.TemporaryDirectory() as d:
        placement = Path(d) / "placement.json"
        write_pinned_placement(placement)
        floors: list[float] = []
        per_msg: dict[int, list[float]] = {w: [] for w in WORLDS}
        ratio: dict[int, list[float]] = {w: [] for w in WORLDS}
        for rep in range(args.repeat):
            steps = ["floor", *WORLDS]
            steps = steps[rep % 3 :] + steps[: rep % 3]  # rotate the order
            got: dict = {}
            for step in steps:
                if step == "floor":
                    got[step] = floor()
                else:
                    flags = ("--placement", str(placement))
                    got[step] = emulated(step, 4096, args.reps, flags=flags, cpus={1})[1]
            floors.append(got["floor"])
            for w in WORLDS:
                per_msg[w].append(got[w])
                ratio[w].append(got[w] / got["floor"])
            print(f"  rep {rep + 1}: " + ", ".join(f"{k}={v * 1e6:.1f}us" for k, v in got.items()), file=sys.stderr)

    def us(xs: list[float]) -> str:
        return f"{statistics.median(xs) * 1e6:.1f} us ({min(xs) * 1e6:.1f}-{max(xs) * 1e6:.1f})"

    print("| 4 KiB allreduce | CPU per message, median (range) | ratio to the floor, median (range) |")
    print("|---|---:|---:|")
    print(f"| kernel floor: TCP ping-pong, {FLOOR_BYTES} B | {us(floors)} | 1 |")
    for w in WORLDS:
        r = ratio[w]
        spread = f"{statistics.median(r):.2f} ({min(r):.2f}-{max(r):.2f})"
        print(f"| controller, --nnodes {w} | {us(per_msg[w])} | {spread} |")


if __name__ == "__main__":
    main()
