"""A torchrun worker that calls the wheel's libnccl on the rig and gets its unique id the
way ProcessGroupNCCL does: rank 0 sets the 128 bytes under key "0" of the default group's
"cuda" store, every other rank gets them there, through torch's own TCPStore and
PrefixStore classes (`broadcastUniqueNCCLID`). torch's CPU build has no ProcessGroupNCCL,
so this worker does its store step itself; everything after it is NCCL's own.

    neuronabox torchrun --backend nccl --device cpu ... nccl_store_allreduce.py [COUNTS...]

Per count: one float32 allreduce (sum) of rank+1 everywhere, checked against the sum over
the real ranks (the emulated ranks add zeros). Prints `ok RANK` at the end.
"""

from __future__ import annotations

import ctypes
import os
import sys
from datetime import timedelta

import numpy as np
import torch.distributed as dist

from neuronabox.launcher.nccl_rig import library
from neuronabox.perf.rig_worker import Rig, UniqueId

NCCL_FLOAT32, NCCL_SUM = 7, 0


def unique_id(rig: Rig, rank: int) -> UniqueId:
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=timedelta(seconds=120))  # fmt: skip
    pg_store = dist.PrefixStore("cuda/", dist.PrefixStore("0/", dist.PrefixStore("default_pg", store)))
    uid = UniqueId()
    if rank == 0:
        rig.check(rig.nccl.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
        pg_store.set("0", ctypes.string_at(ctypes.byref(uid), 128))
    else:
        ctypes.memmove(ctypes.byref(uid), bytes(pg_store.get("0")), 128)
    return uid


def main(counts: list[int]) -> int:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    real = [int(r) for r in os.environ["NEURONABOX_REAL_RANKS"].split(",")]
    rig = Rig(str(library("cpu")))
    uid = unique_id(rig, rank)
    ctx, comm, stream = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    rig.cu(rig.cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0), "cuDevicePrimaryCtxRetain")
    rig.cu(rig.cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    rig.check(rig.nccl.ncclCommInitRank(ctypes.byref(comm), world, uid, rank), "ncclCommInitRank")
    rig.cu(rig.cuda.cuStreamCreate(ctypes.byref(stream), 0), "cuStreamCreate")
    want = float(sum(r + 1 for r in real))
    for count in counts:
        host = np.full(count, rank + 1, dtype=np.float32)
        buf = ctypes.c_uint64()
        size, at = ctypes.c_size_t(host.nbytes), ctypes.c_void_p(host.ctypes.data)
        rig.cu(rig.cuda.cuMemAlloc_v2(ctypes.byref(buf), size), "cuMemAlloc")
        rig.cu(rig.cuda.cuMemcpyHtoD_v2(buf, at, size), "cuMemcpyHtoD")
        rig.check(rig.nccl.ncclAllReduce(ctypes.c_void_p(buf.value), ctypes.c_void_p(buf.value), ctypes.c_size_t(count),
                                         NCCL_FLOAT32, NCCL_SUM, comm, stream), "ncclAllReduce")  # fmt: skip
        rig.cu(rig.cuda.cuStreamSynchronize(stream), "cuStreamSynchronize")
        rig.cu(rig.cuda.cuMemcpyDtoH_v2(at, buf, size), "cuMemcpyDtoH")
        rig.cu(rig.cuda.cuMemFree_v2(buf), "cuMemFree")
        wrong = int(np.count_nonzero(host != want))
        if wrong:
            print(f"rank {rank}: allreduce of {count}: {wrong} wrong (first {host[0]}, want {want})", flush=True)
            return 1
    rig.check(rig.nccl.ncclCommDestroy(comm), "ncclCommDestroy")
    print(f"ok {rank}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main([int(c) for c in sys.argv[1:]] or [256, 1 << 18]))
