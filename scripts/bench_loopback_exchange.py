"""Two processes swap 1 MiB over loopback TCP, round after round: is a peer shaped like the
controller (one thread, non-blocking, polling: its whole send, then its read) slower to
trade with than one shaped like Gloo (a blocking writer thread and a reader thread)?

    python scripts/bench_loopback_exchange.py [--rounds N] [--repeat K]

Each round both ends send 1 MiB and receive 1 MiB, as a W = 2 ring step does. End A (core
0, SCHED_RR 1, as `--realtime` runs a real rank) is always Gloo-shaped; end B (core 1) is
Gloo-shaped in the reference and controller-shaped in the other, in the normal class as
the controller runs. No NeuronaBox, no PyTorch. The table gives, per pairing, the median
round and A's median write (the send call's time), over K interleaved runs. Asked because
each 1 MiB write on the emulated pair takes 250-280 us against 145-210 us between two
real ranks (docs/benchmarks.md); the answer here bounds what the peer's shape alone does.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import threading
import time

SIZE = 1 << 20
SKIP = 200  # rounds before timing: the sockets' buffers grow as they carry data


def gloo_shaped(s: socket.socket, rounds: int) -> list[tuple[float, float]]:
    """A writer (this thread, blocking) and a reader thread per round."""
    buf, data, out = bytearray(SIZE), bytes(SIZE), []
    for _ in range(rounds):
        t0 = time.perf_counter()

        def read() -> None:
            view, got = memoryview(buf), 0
            while got < SIZE:
                got += s.recv_into(view[got:], SIZE - got)

        reader = threading.Thread(target=read)
        reader.start()
        s.sendall(data)
        wrote = time.perf_counter() - t0
        reader.join()
        out.append((time.perf_counter() - t0, wrote))
    return out


def controller_shaped(s: socket.socket, rounds: int) -> list[tuple[float, float]]:
    """One thread, non-blocking, polling: sends what the socket takes, reads what came."""
    s.setblocking(False)
    view, data, out = memoryview(bytearray(SIZE)), memoryview(bytes(SIZE)), []
    for _ in range(rounds):
        t0, sent, got, wrote = time.perf_counter(), 0, 0, 0.0
        while sent < SIZE or got < SIZE:
            if sent < SIZE:
                try:
                    sent += s.send(data[sent:], socket.MSG_DONTWAIT)
                except BlockingIOError:
                    pass
                if sent == SIZE:  # the whole send went out just now
                    wrote = time.perf_counter() - t0
            if got < SIZE:
                try:
                    got += s.recv_into(view[got:], SIZE - got)
                except BlockingIOError:
                    pass
        out.append((time.perf_counter() - t0, wrote))
    return out


SHAPES = {"gloo": gloo_shaped, "controller": controller_shaped}


def exchange(shape_b: str, rounds: int) -> tuple[float, float]:
    """(median round, A's median write), in us."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    pid = os.fork()
    if pid == 0:  # end B
        try:
            os.sched_setaffinity(0, {1})
            s = socket.create_connection(listener.getsockname())
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            SHAPES[shape_b](s, rounds)
        finally:
            os._exit(0)
    os.sched_setaffinity(0, {0})
    os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))
    try:
        s, _ = listener.accept()
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        times = gloo_shaped(s, rounds)[SKIP:]
    finally:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        os.waitpid(pid, 0)
        listener.close()
    return statistics.median(t for t, _ in times) * 1e6, statistics.median(w for _, w in times) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3)
    ns = ap.parse_args()
    if len(os.sched_getaffinity(0)) < 2 or not {0, 1} <= os.sched_getaffinity(0):
        sys.exit("bench_loopback_exchange: needs cores 0 and 1")
    got: dict[str, list[tuple[float, float]]] = {shape: [] for shape in SHAPES}
    for rep in range(ns.repeat):
        order = list(SHAPES) if rep % 2 == 0 else list(reversed(SHAPES))
        for shape in order:
            got[shape].append(exchange(shape, ns.rounds + SKIP))
    print("| end B | round, median of runs (range) us | A's 1 MiB write, median (range) us |")
    print("|---|---:|---:|")
    for shape, runs in got.items():
        rounds, writes = [r for r, _ in runs], [w for _, w in runs]
        print(f"| {shape}-shaped | {statistics.median(rounds):.0f} ({min(rounds):.0f}-{max(rounds):.0f}) "
              f"| {statistics.median(writes):.0f} ({min(writes):.0f}-{max(writes):.0f}) |")  # fmt: skip


if __name__ == "__main__":
    main()
