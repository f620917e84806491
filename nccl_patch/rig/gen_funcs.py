#!/usr/bin/env python3
"""Print the C header `rig_funcs.h`: what each NCCL 2.28.9 device function id means.

A work batch that NCCL's host code hands to a device kernel names the function to run by an
index (`funcId`) into the device function table. NCCL builds that table at compile time with
src/device/generate.py; the index is not stored anywhere we can read at run time, so this
script recomputes it. What follows restates the rules of generate.py at tag v2.28.9-1 (read
from NCCL's sources, BSD-licensed; the code here is ours):

* The candidate rows are: SendRecv; AllGather x {RING, COLLNET_DIRECT, NVLS, PAT} x protos;
  Broadcast x {RING} x protos; then AllReduce, Reduce, ReduceScatter x redops x types x their
  algorithms x protos (AllReduce: TREE RING COLLNET_DIRECT COLLNET_CHAIN NVLS NVLS_TREE;
  Reduce: RING; ReduceScatter: RING COLLNET_DIRECT NVLS PAT).
* A row is dropped when the combination can never be built: a non-SIMPLE protocol with an
  algorithm other than RING/TREE; SumPostDiv on a floating type; NVLS variants of reductions
  outside (i32,u32,i64,u64: Sum/MinMax), (f32,f64: Sum), (f16,bf16: Sum/MinMax). Rows that
  need a newer CUDA or arch (bf16, fp8, NVLS) stay in the table (their slot may hold a null
  pointer on the device, but the numbering is unaffected).
* Each kept row is mapped to its "primary": a signed integer type becomes the unsigned one for
  Sum/Prod/PreMulSum/SumPostDiv, and for MinMax unless the algorithm is an NVLS one.
* The function ids are the positions of the distinct primaries after sorting them as Python
  tuples (coll, redop, type, algo, proto) of strings. Entries without a redop/type (None) are
  only AllGather/Broadcast/SendRecv; tuples are compared element by element and a None is
  only ever compared with another None (the coll names differ before that), so the sort is
  well defined and is plain lexicographic string order.

The result was checked against the real libnccl.so.2 of nvidia-nccl-cu12 2.28.9: the row->id
table this logic implies occurs byte for byte in the library's read-only data.

Usage: python3 gen_funcs.py > build/rig/rig_funcs.h
"""

import sys

COLLS = ["Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce", "SendRecv"]
REDOPS = ["Sum", "Prod", "MinMax", "PreMulSum", "SumPostDiv"]
TYPES = ["i8", "u8", "i32", "u32", "i64", "u64", "f16", "f32", "f64", "bf16", "f8e4m3", "f8e5m2"]
PROTOS = ["LL", "LL128", "SIMPLE"]
ALGOS = ["TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT"]

# Numeric values NCCL uses for these names (ncclFunc_t, ncclDevRedOp_t, ncclDataType_t,
# NCCL_ALGO_*, NCCL_PROTO_*): the position in the lists above.
COLL_ID = {name: i for i, name in enumerate(COLLS)}
REDOP_ID = {name: i for i, name in enumerate(REDOPS)}
TYPE_ID = {name: i for i, name in enumerate(TYPES)}
PROTO_ID = {name: i for i, name in enumerate(PROTOS)}
ALGO_ID = {name: i for i, name in enumerate(ALGOS)}

ALGOS_FOR = {
    "AllGather": ["RING", "COLLNET_DIRECT", "NVLS", "PAT"],
    "Broadcast": ["RING"],
    "AllReduce": ["TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE"],
    "Reduce": ["RING"],
    "ReduceScatter": ["RING", "COLLNET_DIRECT", "NVLS", "PAT"],
}


def candidate_rows():
    """All (coll, redop, type, algo, proto) rows in the order NCCL numbers them."""
    yield ("SendRecv", None, None, None, None)
    for coll in ("AllGather", "Broadcast"):
        for algo in ALGOS_FOR[coll]:
            for proto in PROTOS:
                yield (coll, None, None, algo, proto)
    for coll in ("AllReduce", "Reduce", "ReduceScatter"):
        for redop in REDOPS:
            for ty in TYPES:
                for algo in ALGOS_FOR[coll]:
                    for proto in PROTOS:
                        yield (coll, redop, ty, algo, proto)


def buildable(coll, redop, ty, algo, proto):
    """False for combinations NCCL never compiles (they get no function id)."""
    if coll == "SendRecv":
        return True
    if proto != "SIMPLE" and algo not in ("RING", "TREE"):
        return False
    reduces = coll in ("AllReduce", "Reduce", "ReduceScatter")
    if reduces and redop == "SumPostDiv" and not ty.startswith(("i", "u")):
        return False
    if reduces and "NVLS" in algo:
        if ty in ("i32", "u32", "i64", "u64", "f16", "bf16"):
            return redop in ("Sum", "MinMax")
        if ty in ("f32", "f64"):
            return redop == "Sum"
        return False
    return True


def primary(coll, redop, ty, algo, proto):
    """The representative function a row is served by (signed ints share unsigned code)."""
    if coll in ("AllReduce", "Reduce", "ReduceScatter") and ty.startswith("i"):
        unsigned = "u" + ty[1:]
        if redop in ("Sum", "Prod", "PreMulSum", "SumPostDiv"):
            return (coll, redop, unsigned, algo, proto)
        if redop == "MinMax" and "NVLS" not in algo:
            return (coll, redop, unsigned, algo, proto)
    return (coll, redop, ty, algo, proto)


def function_table():
    primaries = {primary(*row) for row in candidate_rows() if buildable(*row)}
    return sorted(primaries)


def c_value(table, key):
    return "-1" if key is None else str(table[key])


def main():
    funcs = function_table()
    out = sys.stdout.write
    out("/* Generated by nccl_patch/rig/gen_funcs.py: NCCL 2.28.9 device function ids. Do not edit. */\n")
    out("#ifndef NBX_RIG_FUNCS_H\n#define NBX_RIG_FUNCS_H\n\n")
    out("/* Values: coll = ncclFunc_t (Broadcast 0, Reduce 1, AllGather 2, ReduceScatter 3,\n"
        " * AllReduce 4, SendRecv 5); redop = ncclDevRedOp_t (Sum 0, Prod 1, MinMax 2, PreMulSum 3,\n"
        " * SumPostDiv 4); type = ncclDataType_t (i8 0, u8 1, i32 2, u32 3, i64 4, u64 5, f16 6,\n"
        " * f32 7, f64 8, bf16 9, f8e4m3 10, f8e5m2 11); algo = NCCL_ALGO_* (TREE 0, RING 1,\n"
        " * COLLNET_DIRECT 2, COLLNET_CHAIN 3, NVLS 4, NVLS_TREE 5, PAT 6); proto = NCCL_PROTO_*\n"
        " * (LL 0, LL128 1, SIMPLE 2); -1 where the function has no such attribute. */\n")
    out("struct nbxRigFuncDesc {\n  signed char coll, redop, type, algo, proto;\n  const char *name;\n};\n\n")
    out(f"#define NBX_RIG_FUNC_COUNT {len(funcs)}\n\n")
    out("static const struct nbxRigFuncDesc nbxRigFuncs[NBX_RIG_FUNC_COUNT] = {\n")
    for fid, (coll, redop, ty, algo, proto) in enumerate(funcs):
        name = " ".join(x for x in (coll, redop, ty, algo, proto) if x is not None)
        fields = (COLL_ID[coll], c_value(REDOP_ID, redop), c_value(TYPE_ID, ty), c_value(ALGO_ID, algo),
                  c_value(PROTO_ID, proto))
        out(f"  /* {fid:4d} */ {{ {', '.join(str(f) for f in fields)}, \"{name}\" }},\n")
    out("};\n\n#endif\n")


if __name__ == "__main__":
    main()
