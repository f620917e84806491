"""Run the wheel's unmodified libnccl on this machine's CPU: N ranks, every collective the rig
runs, checked exactly.

Each rank is its own process and its own node (NCCL_HOSTID), on NCCL's Socket net over
loopback with the launcher's pins, with the rig's CUDA driver first on the library path
(neuronabox/launcher/nccl_rig.py, docs/nccl_rig.md). Rank 0 makes the unique id and hands it to the
others through this driver. Every rank then calls the real libnccl directly through ctypes:
ncclCommInitRank, then each collective at each dtype, op and size, and checks its output
byte for byte against the values its inputs predict (small integers, exact in fp16 and
bf16 whatever the order of the sums).

    python scripts/nccl_rig.py --ranks 4 [--sizes 1K-16M] [--channels 2] [--record DIR]

Prints the version NCCL reports, one line per case and `N cases, K wrong`; exits 1 on any
wrong value, 3 when a rank is stuck (naming it and its collective), 2 on bad input.
"""

from __future__ import annotations

import argparse
import ctypes
import gzip
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

COLLECTIVES = ("allreduce", "allgather", "reduce_scatter", "broadcast")
DTYPES = {"float32": (7, 4), "float16": (6, 2), "bfloat16": (9, 2)}  # ncclDataType_t, bytes
OPS = {"sum": 0, "max": 2, "min": 3}  # ncclRedOp_t
OPS_OF = {"float32": ("sum", "max", "min"), "float16": ("sum",), "bfloat16": ("sum",)}
UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
STUCK_GRACE_S = 3.0  # after one rank failed, how long its peers get to say they are stuck too (watchdogs wake each 1 s)


def parse_size(text: str) -> int:
    text = text.strip().upper().removesuffix("B")
    scale = UNITS.get(text[-1:], 1)
    number = text[:-1] if text[-1:] in UNITS else text
    if not number.isdigit() or int(number) <= 0:
        raise ValueError(f"not a size: {text!r}")
    return int(number) * scale


def parse_sizes(text: str) -> list[int]:
    """'1K-16M' (every power of 4 between), or a comma list."""
    if "-" in text:
        low, high = (parse_size(t) for t in text.split("-", 1))
        sizes = []
        while low <= high:
            sizes.append(low)
            low *= 4
        return sizes
    return [parse_size(t) for t in text.split(",")]


def cases(world: int, sizes: list[int], colls: list[str], dtypes: list[str]) -> list[dict]:
    out = []
    for coll in colls:
        for dtype in dtypes:
            for op in OPS_OF[dtype] if coll in ("allreduce", "reduce_scatter") else ("-",):
                for size in sizes:
                    out.append({"coll": coll, "dtype": dtype, "op": op, "bytes": size})
    return out


# ---------------------------------------------------------------- the driver


def driver(args: argparse.Namespace) -> int:
    from neuronabox.launcher.nccl_pins import NcclPins
    from neuronabox.launcher.nccl_rig import RigError, check_built, rank_env, verify_unmodified, wheel_library

    try:
        check_built()
        lib = wheel_library()
        verify_unmodified(lib)
    except RigError as exc:
        print(f"nccl_rig: {exc}", file=sys.stderr)
        return 2
    print(f"libnccl: {lib.path} (sha256 {lib.sha256}, as the wheel's RECORD says)", flush=True)
    pins = NcclPins(args.ranks, algo=args.algo, channels=args.channels)
    plan = cases(args.ranks, args.sizes, args.colls, args.dtypes)
    work = Path(tempfile.mkdtemp(prefix="nbx-rig-"))
    (work / "plan.json").write_text(json.dumps(plan))
    record = Path(args.record) / f"w{args.ranks}" if args.record else None
    if record:
        record.mkdir(parents=True, exist_ok=True)
        for old in record.glob("rank*.tap*"):
            old.unlink()
    procs: list[subprocess.Popen] = []
    id_read, id_write = os.pipe()
    try:
        for rank in range(args.ranks):
            env = {**os.environ, **rank_env(rank, pins), "PYTHONUNBUFFERED": "1"}
            inherited = os.environ.get("LD_LIBRARY_PATH")
            env["LD_LIBRARY_PATH"] = ":".join(p for p in (env["LD_LIBRARY_PATH"], inherited) if p)
            if args.debug:
                env.update({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET,COLL"})
            if record:
                env["LD_PRELOAD"] = str(ROOT / "nccl_patch" / "build" / "libnbx-wiretap.so")
                env["NEURONABOX_WIRETAP"] = str(record / f"rank{rank}")
            cmd = [sys.executable, __file__, "--worker", "--rank", str(rank), "--ranks", str(args.ranks),
                   "--work", str(work), "--case-timeout", str(args.case_timeout), "--nccl", str(lib.path),
                   "--stall-rank", str(args.stall_rank), "--stall-at", str(args.stall_at)]  # fmt: skip
            if rank == 0:
                env["NBX_RIG_ID_FD"] = str(id_write)
                procs.append(subprocess.Popen(cmd, env=env, pass_fds=(id_write,), start_new_session=True))
                os.close(id_write)
                id_write = -1
                unique_id = read_unique_id(id_read, procs[0], args.timeout)
                if unique_id is None:
                    print("nccl_rig: rank 0 gave no unique id (see its lines above)", file=sys.stderr)
                    return 3
            else:
                env["NBX_RIG_UNIQUE_ID"] = unique_id
                procs.append(subprocess.Popen(cmd, env=env, start_new_session=True))
        status = collect(procs, work, plan, args)
        if record:
            write_result(record, plan, args, work)
            compress_taps(record)
        return status
    finally:
        for fd in (id_read, id_write):
            if fd >= 0:
                os.close(fd)
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for f in work.iterdir():
            f.unlink()
        work.rmdir()


def read_unique_id(fd: int, rank0: subprocess.Popen, timeout: float) -> str | None:
    deadline = time.monotonic() + timeout
    data = b""
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 4096)
        if not chunk:  # rank 0 ended first
            return None
        data += chunk
    return data.decode().strip()


def collect(procs: list[subprocess.Popen], work: Path, plan: list[dict], args: argparse.Namespace) -> int:
    deadline = time.monotonic() + args.timeout
    codes: list[int | None] = [None] * len(procs)
    while None in codes and time.monotonic() < deadline:
        for i, p in enumerate(procs):
            if codes[i] is None:
                try:
                    codes[i] = p.wait(timeout=0.2)
                except subprocess.TimeoutExpired:
                    pass
        if any(c not in (None, 0) for c in codes):
            # One rank failed: the others would wait for it until their own timeouts. A peer
            # stuck in the same collective says so within its watchdog's period: wait that.
            deadline = min(deadline, time.monotonic() + STUCK_GRACE_S)
    results = [load_results(work / f"rank{r}.jsonl") for r in range(len(procs))]
    version = next((r["version"] for rs in results for r in rs if "version" in r), None)
    if version is not None:
        print(f"NCCL {version} (as ncclGetVersion reports), {len(procs)} ranks", flush=True)
    for r, rs in enumerate(results):
        for libs in (x["loaded"] for x in rs if "loaded" in x):
            print(f"rank {r} loaded " + ", ".join(f"{k} from {v}" for k, v in sorted(libs.items())), flush=True)
    done = {r: {(c["case"]): c for c in rs if "case" in c} for r, rs in enumerate(results)}
    wrong_cases = 0
    ran = 0
    for index, case in enumerate(plan):
        per_rank = [done[r].get(index) for r in range(len(procs))]
        if any(c is None for c in per_rank):
            continue
        ran += 1
        wrong = sum(c["wrong"] for c in per_rank)
        ms = max(c["ms"] for c in per_rank)
        wrong_cases += wrong > 0
        verdict = "ok" if wrong == 0 else f"{wrong} wrong values"
        print(f"{case['coll']:<14} {case['dtype']:<8} {case['op']:<3} {case['bytes']:>9} B  {ms:8.2f} ms  {verdict}")
    stuck = [r for rs in results for r in rs if "stuck" in r or "error" in r]
    for s in stuck:
        print(f"nccl_rig: {s.get('stuck') or s.get('error')}", file=sys.stderr)
    if None in codes and not stuck:
        waiting = [r for r, c in enumerate(codes) if c is None]
        for r in waiting:
            nxt = max(done[r]) + 1 if done[r] else None  # None: no case finished, so still in init
            if nxt is None:
                what = "ncclCommInitRank"
            elif nxt < len(plan):
                at = plan[nxt]
                what = f"{at['coll']} {at['dtype']} {at['op']} {at['bytes']} B"
            else:
                what = "ncclCommDestroy"
            print(f"nccl_rig: rank {r} is stuck in {what} after {args.timeout:.0f} s", file=sys.stderr)
    print(f"{ran} cases, {wrong_cases} wrong")
    crashed = any(c not in (None, 0) for c in codes) and not wrong_cases  # a rank with wrong values exits 0
    if None in codes or stuck or crashed:
        if ran < len(plan):
            print(f"nccl_rig: {len(plan) - ran} of {len(plan)} cases did not run; exit codes {codes}", file=sys.stderr)
        return 3
    return 1 if wrong_cases else 0


def write_result(record: Path, plan: list[dict], args: argparse.Namespace, work: Path) -> None:
    """result.json in scripts/nccl_verify.py's terms: the program each rank ran, in order, with
    NCCL's own counts (per rank for allgather and reduce-scatter) and the broadcast root."""
    rank0 = load_results(work / "rank0.jsonl")
    version = next((r["version"] for r in rank0 if "version" in r), "")
    checks = []
    for case in plan:
        count = case_counts(case, args.ranks)[0]
        elem = DTYPES[case["dtype"]][1]
        root = root_of(args.ranks) if case["coll"] == "broadcast" else 0
        checks.append({"kind": case["coll"], "bytes": count * elem, "dtype": f"torch.{case['dtype']}",
                       "op": case["op"], "root": root})  # fmt: skip
    result = {"nccl": version, "torch": "none (the rig calls libnccl directly)", "gpu": "NeuronaBox CPU rig",
              "world": args.ranks, "algo": args.algo.capitalize(), "channels": args.channels, "checks": checks,
              "closing_barrier": False, "unique_id_via": "through a pipe from rank 0 (scripts/nccl_rig.py)",
              "loaded": [r["loaded"] for r in rank0 if "loaded" in r]}  # fmt: skip
    (record / "result.json").write_text(json.dumps(result, indent=1) + "\n")


def compress_taps(record: Path) -> None:
    """gzip each rank's transcript (payloads are patterned: a committed fixture stays small);
    scripts/nccl_verify.py reads both forms."""
    for tap in record.glob("rank*.tap"):
        tap.with_name(tap.name + ".gz").write_bytes(gzip.compress(tap.read_bytes(), 9, mtime=0))
        tap.unlink()


def case_counts(case: dict, world: int) -> tuple[int, int, int]:
    """(NCCL's count, send elements, receive elements) of a case: its bytes are the largest buffer's."""
    elem = DTYPES[case["dtype"]][1]
    full = max(case["bytes"] // elem, world)
    count = full // world if case["coll"] in ("allgather", "reduce_scatter") else full
    send_n = count * world if case["coll"] == "reduce_scatter" else count
    recv_n = count * world if case["coll"] == "allgather" else count
    return count, send_n, recv_n


def load_results(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ---------------------------------------------------------------- a rank


def check(rc: int, what: str, nccl: ctypes.CDLL) -> None:
    if rc != 0:
        nccl.ncclGetErrorString.restype = ctypes.c_char_p
        raise RuntimeError(f"{what} failed: {nccl.ncclGetErrorString(rc).decode()} ({rc})")


def inputs(rank: int, n: int):
    """Rank r's element i: small integers, so every partial sum of up to 8 ranks is exact in bf16."""
    import numpy as np

    return (rank + 1 + (np.arange(n) % 13)).astype(np.float32)


def expected(case: dict, rank: int, world: int, count: int):
    """What the output buffer must hold, from the inputs alone."""
    import numpy as np

    coll, op = case["coll"], case["op"]
    reduce = {"sum": np.sum, "max": np.max, "min": np.min}.get(op)
    if coll == "allreduce":
        return reduce(np.stack([inputs(r, count) for r in range(world)]), axis=0)
    if coll == "allgather":
        return np.concatenate([inputs(r, count) for r in range(world)])
    if coll == "reduce_scatter":
        full = reduce(np.stack([inputs(r, count * world) for r in range(world)]), axis=0)
        return full[rank * count:(rank + 1) * count]
    return inputs(root_of(world), count)


def root_of(world: int) -> int:
    return 1 % world  # not rank 0, so the root is not also the bootstrap root


def loaded_libraries() -> dict[str, str]:
    """The files this process mapped for NCCL, the CUDA driver and NVML: what really ran."""
    found: dict[str, str] = {}
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split(None, 5)[-1] if line.count(" ") >= 5 else ""
        name = Path(path).name
        if name in ("libnccl.so.2", "libcuda.so.1", "libnvidia-ml.so.1"):
            found[name] = path
    return found


def worker(args: argparse.Namespace) -> int:
    out = open(Path(args.work) / f"rank{args.rank}.jsonl", "a", buffering=1)
    current = {"what": "ncclCommInitRank"}

    def watchdog() -> None:
        while True:
            started = current.get("since", time.monotonic())
            time.sleep(1.0)
            if time.monotonic() - started > args.case_timeout:
                out.write(json.dumps({"stuck": f"rank {args.rank} is stuck in {current['what']} "
                                               f"after {args.case_timeout:.0f} s"}) + "\n")  # fmt: skip
                out.flush()
                os._exit(3)

    current["since"] = time.monotonic()
    threading.Thread(target=watchdog, daemon=True).start()
    try:
        status = run_rank(args, out, current)
    except Exception as exc:  # one line naming the rank, for the driver to print
        out.write(json.dumps({"error": f"rank {args.rank}: {exc}"}) + "\n")
        status = 1
    out.close()
    os._exit(status)  # NCCL's threads and atexit hooks have nothing left to do


def run_rank(args: argparse.Namespace, out, current: dict) -> int:
    import numpy as np

    from neuronabox.perf.rig_worker import Rig, encode

    rig = Rig(args.nccl)  # the rig's driver: first on LD_LIBRARY_PATH
    cuda, nccl = rig.cuda, rig.nccl
    version = ctypes.c_int()
    check(nccl.ncclGetVersion(ctypes.byref(version)), "ncclGetVersion", nccl)
    v = version.value
    out.write(json.dumps({"version": f"{v // 10000}.{v // 100 % 100}.{v % 100}"}) + "\n")
    out.write(json.dumps({"loaded": loaded_libraries()}) + "\n")
    comm, stream = rig.communicator(args.ranks, args.rank)  # rank 0 makes the id (NBX_RIG_ID_FD)
    plan = json.loads((Path(args.work) / "plan.json").read_text())
    world = args.ranks
    for index, case in enumerate(plan):
        current.update(what=f"{case['coll']} {case['dtype']} {case['op']} {case['bytes']} B", since=time.monotonic())
        elem = DTYPES[case["dtype"]][1]
        count, send_n, recv_n = case_counts(case, world)
        if index == args.stall_at and args.rank == args.stall_rank:
            time.sleep(3600)  # a fault for the tests: this rank never joins the collective
        host_in = encode(inputs(args.rank, send_n), case["dtype"])
        want = encode(expected(case, args.rank, world, count), case["dtype"])
        send, recv = ctypes.c_uint64(), ctypes.c_uint64()
        check(cuda.cuMemAlloc_v2(ctypes.byref(send), ctypes.c_size_t(send_n * elem)), "cuMemAlloc", nccl)
        check(cuda.cuMemAlloc_v2(ctypes.byref(recv), ctypes.c_size_t(recv_n * elem)), "cuMemAlloc", nccl)
        check(cuda.cuMemcpyHtoD_v2(send, host_in, ctypes.c_size_t(len(host_in))), "cuMemcpyHtoD", nccl)
        dtype = DTYPES[case["dtype"]][0]
        op = OPS.get(case["op"], 0)
        started = time.perf_counter()
        sp, rp, n = ctypes.c_void_p(send.value), ctypes.c_void_p(recv.value), ctypes.c_size_t(count)
        if case["coll"] == "allreduce":
            rc = nccl.ncclAllReduce(sp, rp, n, dtype, op, comm, stream)
        elif case["coll"] == "allgather":
            rc = nccl.ncclAllGather(sp, rp, n, dtype, comm, stream)
        elif case["coll"] == "reduce_scatter":
            rc = nccl.ncclReduceScatter(sp, rp, n, dtype, op, comm, stream)
        else:
            rc = nccl.ncclBroadcast(sp, rp, n, dtype, root_of(world), comm, stream)
        check(rc, f"nccl {case['coll']}", nccl)
        rc = cuda.cuStreamSynchronize(stream)
        if rc != 0:
            raise RuntimeError(f"{current['what']}: the stream failed (CUDA error {rc}; see the nbx-rig line)")
        ms = (time.perf_counter() - started) * 1e3
        got = ctypes.create_string_buffer(recv_n * elem)
        check(cuda.cuMemcpyDtoH_v2(got, recv, ctypes.c_size_t(recv_n * elem)), "cuMemcpyDtoH", nccl)
        a = np.frombuffer(got.raw, dtype=np.uint8).reshape(-1, elem)
        b = np.frombuffer(want, dtype=np.uint8).reshape(-1, elem)
        wrong = int((a != b).any(axis=1).sum())
        cuda.cuMemFree_v2(send)
        cuda.cuMemFree_v2(recv)
        out.write(json.dumps({"case": index, "wrong": wrong, "ms": ms}) + "\n")
    current.update(what="ncclCommDestroy", since=time.monotonic())
    check(nccl.ncclCommDestroy(comm), "ncclCommDestroy", nccl)
    return 0


# ---------------------------------------------------------------- command line


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2, help="processes, 2 to 8")
    p.add_argument("--sizes", default="1K-16M", help="bytes per case: LOW-HIGH in powers of 4, or a list")
    p.add_argument("--colls", default=",".join(COLLECTIVES))
    p.add_argument("--dtypes", default=",".join(DTYPES))
    p.add_argument("--channels", type=int, default=1)
    p.add_argument("--algo", choices=("ring", "tree"), default="ring",
                   help="NCCL's algorithm, pinned; the rig's kernels run the ring (tree: refused, naming it)")
    p.add_argument("--record", default="", help="record every rank's TCP bytes here (the wiretap)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds for the whole run")
    p.add_argument("--case-timeout", type=float, default=60.0, help="seconds one collective may take on a rank")
    p.add_argument("--debug", action="store_true", help="NCCL's INFO log on stderr")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--work", default="", help=argparse.SUPPRESS)
    p.add_argument("--nccl", default="", help=argparse.SUPPRESS)
    p.add_argument("--stall-rank", type=int, default=-1, help=argparse.SUPPRESS)  # tests: a rank that never joins
    p.add_argument("--stall-at", type=int, default=-1, help=argparse.SUPPRESS)  # ... case number STALL_AT
    args = p.parse_args()
    if args.worker:
        return worker(args)
    try:
        args.sizes = parse_sizes(args.sizes)
    except ValueError as exc:
        p.exit(2, f"nccl_rig: --sizes: {exc}\n")
    args.colls = [c for c in args.colls.split(",") if c]
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    bad = [c for c in args.colls if c not in COLLECTIVES] + [d for d in args.dtypes if d not in DTYPES]
    if bad:
        p.exit(2, f"nccl_rig: not run by the rig: {', '.join(bad)} (collectives: {', '.join(COLLECTIVES)}; "
                  f"dtypes: {', '.join(DTYPES)})\n")  # fmt: skip
    if not 2 <= args.ranks <= 8:
        p.exit(2, f"nccl_rig: --ranks is 2 to 8, got {args.ranks}\n")
    if not 1 <= args.channels <= 16:
        p.exit(2, f"nccl_rig: --channels is 1 to 16, got {args.channels}\n")
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
