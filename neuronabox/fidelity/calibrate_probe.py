"""The two ranks `neuronabox calibrate` runs on the testbed's link (one per host).

Rank 0 prints one line, `neuronabox-calibration {json}`, with the raw medians:
- `tcp_oneway_s`: half a raw TCP ping-pong of one byte (the link and the kernel);
- `call_s`: one PyTorch/Gloo call that sends nothing (an allreduce on a one-rank group):
  the per-call cost a real rank pays on top of its messages;
- `gloo_oneway_s`: {bytes: half a Gloo send/recv ping-pong};
- `reduce_s`: {bytes: one float32 `add_` of that many bytes on this rank}, the
  reduction a Gloo rank runs on every received reduce-scatter segment.

Environment: RANK, WORLD_SIZE=2, MASTER_ADDR, MASTER_PORT (as torchrun sets them),
NEURONABOX_PROBE_MAX_BYTES (the largest Gloo message), NEURONABOX_PROBE_SECONDS (the
time budget per size).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist

SMALL_REPS = 400


def timed_reps(fn, budget_s: float, max_reps: int, min_reps: int = 5) -> float:
    """Median seconds of `fn()` over as many repetitions as fit in the budget."""
    fn()  # warm
    times: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(times) < max_reps and (len(times) < min_reps or time.perf_counter() < deadline):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def tcp_oneway(rank: int, store: dist.Store, address: str) -> float:
    """Half the round trip of one byte over a raw TCP connection between the two hosts."""
    if rank == 0:
        srv = socket.create_server((address, 0))
        store.set("probe_tcp", f"{address}:{srv.getsockname()[1]}")
        conn, _ = srv.accept()
        srv.close()
    else:
        host, port = store.get("probe_tcp").decode().rsplit(":", 1)
        conn = socket.create_connection((host, int(port)))
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        if rank == 0:

            def ping() -> None:
                conn.sendall(b"x")
                conn.recv(1)

            rtt = timed_reps(ping, 1.0, 2000, 200)
            conn.sendall(b"q")
            return rtt / 2
        while conn.recv(1) == b"x":
            conn.sendall(b"x")
        return 0.0
    finally:
        conn.close()


def gloo_oneway(rank: int, nbytes: int, budget_s: float) -> float:
    t = torch.zeros(max(1, nbytes // 4), dtype=torch.float32)
    peer = 1 - rank
    reps = SMALL_REPS if nbytes < 1 << 16 else 200

    def ping() -> None:
        if rank == 0:
            dist.send(t, peer)
            dist.recv(t, peer)
        else:
            dist.recv(t, peer)
            dist.send(t, peer)

    # Both ranks run the same number of round trips: the count is agreed first.
    n = torch.tensor([0])
    if rank == 0:
        start = time.perf_counter()
        ping()
        one = time.perf_counter() - start
        n[0] = max(5, min(reps, int(budget_s / max(one, 1e-6))))
    else:
        ping()
    dist.broadcast(n, 0)
    times = []
    for _ in range(int(n[0])):
        t0 = time.perf_counter()
        ping()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) / 2


def call_cost() -> float:
    """A Gloo collective on a group of one: every cost of a call, no message."""
    solo = dist.new_group([dist.get_rank()])
    t = torch.zeros(1)
    return timed_reps(lambda: dist.all_reduce(t, group=solo), 0.5, 2000, 50)


def reduce_cost(nbytes: int) -> float:
    a = torch.ones(nbytes // 4)
    b = torch.ones(nbytes // 4)
    return timed_reps(lambda: a.add_(b), 0.3, 200, 5)


def sizes(max_bytes: int) -> list[int]:
    out, n = [], 4
    while n <= max_bytes:
        out.append(n)
        n *= 4
    return out


def main() -> int:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    store = dist.distributed_c10d._get_default_store()
    address = os.environ.get("NEURONABOX_PROBE_ADDRESS", os.environ.get("MASTER_ADDR", "127.0.0.1"))
    max_bytes = int(os.environ.get("NEURONABOX_PROBE_MAX_BYTES", str(16 << 20)))
    budget = float(os.environ.get("NEURONABOX_PROBE_SECONDS", "0.6"))
    result: dict = {"tcp_oneway_s": tcp_oneway(rank, store, address)}
    dist.barrier()
    result["call_s"] = call_cost()
    dist.barrier()
    result["gloo_oneway_s"] = {n: gloo_oneway(rank, n, budget) for n in sizes(max_bytes)}
    dist.barrier()
    if rank == 0:
        result["reduce_s"] = {n: reduce_cost(n) for n in (1 << 16, 1 << 18, 1 << 20, 4 << 20)}
        print("neuronabox-calibration " + json.dumps(result), flush=True)
    sys.stdout.flush()
    os._exit(0)  # stock torch 2.13 sometimes aborts while tearing Gloo down (see examples/train_ddp.py)


if __name__ == "__main__":
    sys.exit(main())
