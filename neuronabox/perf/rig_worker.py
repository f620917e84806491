"""The perf loop of one NCCL rank on the CPU rig: the wheel's unmodified libnccl, called
through ctypes on the rig's CUDA driver (neuronabox/launcher/nccl_rig.py), as nccl-tests
calls it. `neuronabox perf --backend nccl --device cpu` starts one per real rank.

    python -m neuronabox.perf.rig_worker JOB_JSON RANK

JOB_JSON: {"specs": [PerfSpec...], "world", "real", "policy", "nccl": libnccl's path,
"out": folder}. The unique id comes in NBX_RIG_UNIQUE_ID (hex), or rank 0 makes it and
writes it to the descriptor NBX_RIG_ID_FD. Per spec and size: `warmup` calls, `iters`
timed calls (the row's time is their mean, the stream synchronised once at the end, as
nccl-tests times), then `check` calls on filled buffers compared with what the data policy
predicts (`expect.py`). Writes OUT/spec<i>/rank<R>.json, as the torch worker does.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from neuronabox.limits import read_bounded
from neuronabox.perf.expect import BLOCKED, expected, mirror_source, value
from neuronabox.perf.ladder import PerfSpec, nccl_count
from neuronabox.schedules import Kind

# torch's dtype name -> (ncclDataType_t, numpy dtype of the bytes NCCL moves)
NCCL_TYPES = {"int8": (0, np.int8), "uint8": (1, np.uint8), "int32": (2, np.int32), "int64": (4, np.int64),
              "float16": (6, np.float16), "float32": (7, np.float32), "float64": (8, np.float64),
              "bfloat16": (9, np.uint16)}  # fmt: skip
NCCL_OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}
TOLERANCE = {"float16": 1e-2, "bfloat16": 4e-2, "float32": 1e-5, "float64": 1e-12}


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


class Rig:
    """libnccl and the rig's driver, with calls that raise naming what failed."""

    def __init__(self, nccl_path: str) -> None:
        self.cuda = ctypes.CDLL("libcuda.so.1")  # the rig's: first on LD_LIBRARY_PATH
        self.nccl = ctypes.CDLL(nccl_path)
        self.nccl.ncclGetErrorString.restype = ctypes.c_char_p

    def check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"{what} failed: {self.nccl.ncclGetErrorString(rc).decode()} ({rc})")

    def cu(self, rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"{what} failed: CUDA error {rc} (see the nbx-rig line)")

    def communicator(self, world: int, rank: int) -> tuple[ctypes.c_void_p, ctypes.c_void_p]:
        """(comm, stream): ncclCommInitRank on GPU 0's primary context. The unique id comes in
        NBX_RIG_UNIQUE_ID (hex), or this rank makes it and writes it to NBX_RIG_ID_FD."""
        uid = UniqueId()
        if "NBX_RIG_ID_FD" in os.environ:
            self.check(self.nccl.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
            fd = int(os.environ["NBX_RIG_ID_FD"])
            os.write(fd, ctypes.string_at(ctypes.byref(uid), 128).hex().encode() + b"\n")
            os.close(fd)
        else:
            ctypes.memmove(ctypes.byref(uid), bytes.fromhex(os.environ["NBX_RIG_UNIQUE_ID"]), 128)
        self.cu(self.cuda.cuInit(0), "cuInit")  # the rig's driver needs none; a real one refuses all else first
        ctx = ctypes.c_void_p()
        self.cu(self.cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0), "cuDevicePrimaryCtxRetain")
        self.cu(self.cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        comm = ctypes.c_void_p()
        self.check(self.nccl.ncclCommInitRank(ctypes.byref(comm), world, uid, rank), "ncclCommInitRank")
        stream = ctypes.c_void_p()
        self.cu(self.cuda.cuStreamCreate(ctypes.byref(stream), 0), "cuStreamCreate")
        return comm, stream


def encode(values: np.ndarray, dtype: str) -> bytes:
    if dtype == "bfloat16":
        return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()
    return values.astype(NCCL_TYPES[dtype][1]).tobytes()


def decode(raw: bytes, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return np.frombuffer(raw, NCCL_TYPES[dtype][1]).astype(np.float64)


class Case:
    """One size's device buffers and the call, as perf's torch worker lays them out."""

    def __init__(self, rig: Rig, comm, stream, spec: PerfSpec, nbytes: int, rank: int, world: int) -> None:
        self.rig, self.comm, self.stream, self.spec = rig, comm, stream, spec
        self.rank, self.world = rank, world
        n = nbytes // spec.elem
        kind = spec.coll
        self.count = n
        self.nccl_count = nccl_count(kind, nbytes, spec.elem, world)
        self.in_n = n // world if kind == Kind.ALLGATHER else n
        self.out_n = n // world if kind == Kind.REDUCE_SCATTER else n
        self.send, self.recv = ctypes.c_uint64(), ctypes.c_uint64()
        rig.cu(rig.cuda.cuMemAlloc_v2(ctypes.byref(self.send), ctypes.c_size_t(max(1, self.in_n) * spec.elem)), "alloc")
        rig.cu(rig.cuda.cuMemAlloc_v2(ctypes.byref(self.recv), ctypes.c_size_t(max(1, self.out_n) * spec.elem)),
               "alloc")  # fmt: skip

    def free(self) -> None:
        self.rig.cuda.cuMemFree_v2(self.send)
        self.rig.cuda.cuMemFree_v2(self.recv)

    def run(self) -> None:
        s, nccl = self.spec, self.rig.nccl
        dtype, op = NCCL_TYPES[s.dtype][0], NCCL_OPS.get(s.op, 0)
        sp, rp, n = ctypes.c_void_p(self.send.value), ctypes.c_void_p(self.recv.value), ctypes.c_size_t(self.nccl_count)
        kind = s.coll
        if kind == Kind.ALLREDUCE:
            rc = nccl.ncclAllReduce(sp, rp, n, dtype, op, self.comm, self.stream)
        elif kind == Kind.ALLGATHER:
            rc = nccl.ncclAllGather(sp, rp, n, dtype, self.comm, self.stream)
        elif kind == Kind.REDUCE_SCATTER:
            rc = nccl.ncclReduceScatter(sp, rp, n, dtype, op, self.comm, self.stream)
        elif kind == Kind.BROADCAST:
            rc = nccl.ncclBroadcast(sp, rp, n, dtype, s.root, self.comm, self.stream)
        else:
            raise RuntimeError(f"the rig's kernels run no {kind}")
        self.rig.check(rc, f"nccl {kind}")

    def sync(self) -> None:
        self.rig.cu(self.rig.cuda.cuStreamSynchronize(self.stream), f"{self.spec.coll}: the stream")

    def fill(self, real: list[int]) -> None:
        mine = value(self.rank)
        root = self.spec.root
        if self.spec.coll == Kind.BROADCAST and self.rank != root:
            mine = mine if root not in real and self.rank == mirror_source(self.world, real) else -1.0
        data = encode(np.full(self.in_n, mine), self.spec.dtype)
        self.rig.cu(self.rig.cuda.cuMemcpyHtoD_v2(self.send, data, ctypes.c_size_t(len(data))), "copy in")
        junk = encode(np.full(self.out_n, -1.0), self.spec.dtype)
        self.rig.cu(self.rig.cuda.cuMemcpyHtoD_v2(self.recv, junk, ctypes.c_size_t(len(junk))), "copy in")

    def wrong(self, real: list[int], policy: str) -> int:
        want = expected(self.spec.coll, self.spec.op, self.rank, self.world, real, policy, self.spec.root)
        if want is None:
            return 0
        raw = ctypes.create_string_buffer(self.out_n * self.spec.elem)
        self.rig.cu(self.rig.cuda.cuMemcpyDtoH_v2(raw, self.recv, ctypes.c_size_t(len(raw))), "copy out")
        out = decode(raw.raw, self.spec.dtype)
        blocks = np.array_split(out, self.world) if self.spec.coll in BLOCKED else [out]
        tol = TOLERANCE.get(self.spec.dtype, 0.0)
        return sum(int((np.abs(b - w) > tol * abs(w)).sum()) for b, w in zip(blocks, want, strict=True))


def run_size(rig: Rig, comm, stream, spec: PerfSpec, nbytes: int, rank: int, world: int, real: list[int],
             policy: str) -> dict:  # fmt: skip
    case = Case(rig, comm, stream, spec, nbytes, rank, world)
    try:
        case.fill(real)
        for _ in range(spec.warmup):
            case.run()
        case.sync()
        t0 = time.perf_counter()
        for _ in range(spec.iters):
            case.run()
        case.sync()
        seconds = (time.perf_counter() - t0) / max(1, spec.iters)
        wrong = 0
        for _ in range(spec.check):
            case.fill(real)
            case.run()
            case.sync()
            wrong += case.wrong(real, policy)
    finally:
        case.free()
    return {"bytes": nbytes, "count": case.count, "time_s": seconds, "wrong": wrong}


def main(argv: list[str]) -> int:
    job_path, rank_text = argv
    job = json.loads(read_bounded(job_path, 1 << 20, "the rig job"))
    rank, world, real = int(rank_text), int(job["world"]), [int(r) for r in job["real"]]
    rig = Rig(job["nccl"])
    comm, stream = rig.communicator(world, rank)
    for i, doc in enumerate(job["specs"]):
        spec = PerfSpec.from_json(doc)
        rows = [run_size(rig, comm, stream, spec, n, rank, world, real, job["policy"]) for n in spec.sizes]
        out = Path(job["out"]) / f"spec{i}"
        out.mkdir(exist_ok=True)
        tmp = out / f".rank{rank}.json"
        tmp.write_text(json.dumps({"rank": rank, "world": world, "rows": rows}))
        os.replace(tmp, out / f"rank{rank}.json")
    rig.check(rig.nccl.ncclCommDestroy(comm), "ncclCommDestroy")
    sys.stdout.flush()
    os._exit(0)  # NCCL's threads and atexit hooks have nothing left to do


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Exception as exc:  # one line naming the rank, for the runner
        print(f"rig rank {sys.argv[2] if len(sys.argv) > 2 else '?'}: {exc}", file=sys.stderr, flush=True)
        os._exit(1)
