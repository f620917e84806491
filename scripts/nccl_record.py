"""Record real NCCL runs on one GPU: the transcripts tests/fixtures/nccl/ is made of.

Runs 2 to 4 real ranks as separate processes on GPU 0, each its own node through a
distinct NCCL_HOSTID, on NCCL's Socket net over loopback, with the launcher's pins
(neuronabox/launcher/nccl_pins.py). Each rank runs every collective the dialect speaks at a
few sizes, checks the values, and (with --timing) times them for the all-real column
of the prototype's Table 1. Per world size it leaves under OUT/w<N>/:

  rank<r>.<pid>.tap   every TCP connection of rank r, byte for byte (nccl_patch/wiretap.c)
  profiler.jsonl      one line per collective from our profiler plugin (kind, count, dtype,
                      algorithm, protocol, channels)
  nccl.<host>.<pid>   NCCL's own INFO log (INIT, BOOTSTRAP, NET, GRAPH, TUNING, COLL, ENV)
  result.json         versions, store keys, per collective the check and the timings

    python scripts/nccl_record.py --out $OUT/nccl [--worlds 2,4] [--timing]

Needs a CUDA build of torch and a GPU; elsewhere it exits 2 with one line.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
KINDS = ("allreduce", "allgather", "reduce_scatter", "broadcast", "barrier")
CHECK_SIZES = (4, 1024, 65536, (2 << 20) + 4)  # bytes per rank: one float, 1 KiB, 64 KiB, just over 2 MiB
TABLE1_SIZES = tuple(1 << k for k in range(10, 29, 2))  # 1 KiB to 256 MiB


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def driver(args: argparse.Namespace) -> int:
    from neuronabox.launcher.nccl_pins import NcclPins, NcclSetupError, probe_nccl

    try:
        version = probe_nccl(sys.executable, os.environ)
    except NcclSetupError as exc:
        print(f"nccl_record: {exc}", file=sys.stderr)
        return 2
    subprocess.run(["make", "-s", "-C", str(ROOT / "nccl_patch")], check=True, timeout=300)
    tap = ROOT / "nccl_patch" / "build" / "libnbx-wiretap.so"
    print(f"NCCL {version}", flush=True)
    for world in (int(w) for w in args.worlds.split(",")):
        out = Path(args.out) / f"w{world}"
        out.mkdir(parents=True, exist_ok=True)
        pins = NcclPins(world, algo=args.algo, channels=args.channels, trace=str(out / "profiler.jsonl")).env()
        port = free_port()
        procs = []
        for rank in range(world):
            env = {
                **os.environ,
                **pins,
                "RANK": str(rank),
                "LOCAL_RANK": "0",
                "WORLD_SIZE": str(world),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "NCCL_HOSTID": f"nbx-node-{rank}",  # each rank its own node: NET between them
                "NCCL_DEBUG": "INFO",
                "NCCL_DEBUG_SUBSYS": "INIT,BOOTSTRAP,NET,GRAPH,TUNING,COLL,ENV",
                "NCCL_DEBUG_FILE": str(out / "nccl.%h.%p"),
                "LD_PRELOAD": str(tap),
                "NEURONABOX_WIRETAP": str(out / f"rank{rank}"),
                "PYTHONUNBUFFERED": "1",
            }
            cmd = [sys.executable, __file__, "--worker", "--out", str(out)] + (["--timing"] if args.timing else [])
            procs.append(subprocess.Popen(cmd, env=env))
        deadline = time.monotonic() + args.timeout
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                print(f"nccl_record: world {world} did not finish in {args.timeout:.0f} s", file=sys.stderr)
                return 1
        print(f"world {world}: exit codes {codes}", flush=True)
        if any(codes):
            return 1
    return 0


def worker(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(0)
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"]) == 0)  # fmt: skip
    dist.init_process_group("nccl", store=store, rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]), device_id=torch.device("cuda:0"))  # fmt: skip
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda:0")
    checks, timings = [], {}

    def run(kind: str, nbytes: int, dtype: torch.dtype) -> bool:
        n = max(1, nbytes // torch.tensor([], dtype=dtype).element_size())
        x = torch.full((n,), float(rank + 1), dtype=dtype, device=dev)
        if kind == "allreduce":
            dist.all_reduce(x)
            return bool((x == world * (world + 1) / 2).all())
        if kind == "allgather":
            out = torch.empty(n * world, dtype=dtype, device=dev)
            dist.all_gather_into_tensor(out, x)
            want = torch.arange(1, world + 1, dtype=dtype, device=dev).repeat_interleave(n)
            return bool((out == want).all())
        if kind == "reduce_scatter":
            inp = torch.full((n * world,), float(rank + 1), dtype=dtype, device=dev)
            dist.reduce_scatter_tensor(x, inp)
            return bool((x == world * (world + 1) / 2).all())
        if kind == "broadcast":
            dist.broadcast(x, src=0)
            return bool((x == 1).all())
        dist.barrier()
        return True

    for kind in KINDS:
        for nbytes in CHECK_SIZES if kind != "barrier" else (0,):
            for dtype in (torch.float32, torch.bfloat16) if kind == "allreduce" else (torch.float32,):
                ok = run(kind, nbytes, dtype)
                torch.cuda.synchronize()
                checks.append({"kind": kind, "bytes": nbytes, "dtype": str(dtype), "ok": ok})
    if args.timing:
        for kind in ("allreduce", "allgather", "reduce_scatter", "broadcast"):
            for nbytes in TABLE1_SIZES:
                reps = 20 if nbytes <= 1 << 22 else 5
                times = []
                for _ in range(3 + reps):
                    dist.barrier()
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    run(kind, nbytes, torch.float32)
                    torch.cuda.synchronize()
                    times.append(time.perf_counter() - t0)
                timings.setdefault(kind, {})[nbytes] = sorted(times[3:])[reps // 2]
    if rank == 0:
        result = {
            "torch": torch.__version__,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())),
            "gpu": torch.cuda.get_device_name(0),
            "world": world,
            "algo": os.environ.get("NCCL_ALGO", ""),
            "channels": int(os.environ.get("NCCL_MAX_NCHANNELS", "0") or 0),
            "checks": checks,
            "median_s": timings,
            "store_keys": store.num_keys(),
        }
        (Path(args.out) / "result.json").write_text(json.dumps(result, indent=1))
        print(json.dumps({"world": world, "failed": [c for c in checks if not c["ok"]]}), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0 if all(c["ok"] for c in checks) else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--worlds", default="2,4")
    p.add_argument("--algo", default="ring", choices=("ring", "tree"))
    p.add_argument("--channels", type=int, default=1)
    p.add_argument("--timing", action="store_true", help="also time every kind from 1 KiB to 256 MiB")
    p.add_argument("--timeout", type=float, default=240.0, help="seconds per world size")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    return worker(args) if args.worker else driver(args)


if __name__ == "__main__":
    sys.exit(main())
