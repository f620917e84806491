"""Chakra execution traces of a recorded program, for ASTRA-sim.

`neuronabox export --format chakra` writes one `.et` file per rank of the recorded
world and the communicator-group JSON beside them. Each rank's file is the program
`neuronabox simulate` replays (the lowest real rank's default-group collectives
and the compute between them): a COMM_COLL_NODE per collective, with its
`comm_type`, `comm_size` (bytes, int64) and `pg_name`, and a COMP_NODE for each
compute gap, wired so that a collective the rank entered while another was in
flight overlaps it, and one entered after another ended waits for it, as
`simulate.follows` says. Every rank runs the same program (SPMD), so the file
is built once and written W times.

The messages come from `et.proto`, our restatement of Chakra's schema with the
same names and field numbers (docs/trace.md, "Chakra").
"""

from __future__ import annotations

import json
from pathlib import Path

from neuronabox.limits import read_bounded
from neuronabox.schedules import Kind
from neuronabox.trace.chakra import et_pb2

MAX_ET_BYTES = 1 << 30  # an execution trace of a large world's program: far below this

VERSION = "0.0.4"  # the Chakra schema version these files follow
COMM_TYPE = {
    Kind.ALLREDUCE: et_pb2.ALL_REDUCE,
    Kind.REDUCE: et_pb2.REDUCE,
    Kind.ALLGATHER: et_pb2.ALL_GATHER,
    Kind.GATHER: et_pb2.GATHER,
    Kind.SCATTER: et_pb2.SCATTER,
    Kind.BROADCAST: et_pb2.BROADCAST,
    Kind.ALLTOALL: et_pb2.ALL_TO_ALL,
    Kind.BARRIER: et_pb2.BARRIER,
}
GROUP = "0"  # the default group: every rank


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _attr(name: str, **value) -> et_pb2.AttributeProto:
    return et_pb2.AttributeProto(name=name, **value)


def nodes_of(prog) -> list[et_pb2.Node]:
    """The program as Chakra nodes (ids from 0, in program order)."""
    from neuronabox.sim.simulate import follows

    nodes: list[et_pb2.Node] = []
    comm_ids: list[int] = []
    entry_deps: list[list[int]] = []  # what each collective's entry waits on

    def add(**fields) -> int:
        node = et_pb2.Node(id=len(nodes), **fields)
        nodes.append(node)
        return node.id

    for i, op in enumerate(prog.ops):
        deps: list[int] = []
        if i:
            after_end, gap = follows(prog.ops[i - 1], op)
            before = [comm_ids[-1]] if after_end else entry_deps[-1]
            if gap > 0:
                comp = add(
                    name=f"compute before {op.kind} {i}",
                    type=et_pb2.COMP_NODE,
                    data_deps=before,
                    duration_micros=round(gap * 1e6),
                    attr=[_attr("is_cpu_op", bool_val=False)],
                )
                deps = [comp]
            else:
                deps = list(before)
        entry_deps.append(deps)
        comm_ids.append(
            add(
                name=f"{op.kind} {i}",
                type=et_pb2.COMM_COLL_NODE,
                data_deps=deps,
                duration_micros=round((op.end - op.start) * 1e6),
                attr=[
                    _attr("is_cpu_op", bool_val=False),
                    _attr("comm_type", int64_val=COMM_TYPE[op.kind]),
                    _attr("comm_size", int64_val=op.nbytes),
                    _attr("pg_name", string_val=GROUP),
                ],
            )
        )
    return nodes


def encode(nodes: list[et_pb2.Node], world: int) -> bytes:
    """One rank's `.et` bytes: the metadata, then each node, each behind its varint length."""
    meta = et_pb2.GlobalMetadata(version=VERSION, attr=[_attr("world_size", int64_val=world)])
    parts = []
    for msg in (meta, *nodes):
        raw = msg.SerializeToString()
        parts += [_varint(len(raw)), raw]
    return b"".join(parts)


def write(prog, out: Path, name: str = "trace") -> list[Path]:
    """`out/NAME.R.et` for every rank R of the recorded world, and `out/comm_group.json`
    (group name -> its ranks). Returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    data = encode(nodes_of(prog), prog.world)
    files = []
    for r in range(prog.world):
        path = out / f"{name}.{r}.et"
        path.write_bytes(data)
        files.append(path)
    groups = out / "comm_group.json"
    groups.write_text(json.dumps({GROUP: list(range(prog.world))}))
    return [*files, groups]


def read(path: Path) -> tuple[et_pb2.GlobalMetadata, list[et_pb2.Node]]:
    """Parse an `.et` file back: its metadata and its nodes."""
    data = read_bounded(path, MAX_ET_BYTES, "Chakra execution trace")
    pos, msgs = 0, []
    while pos < len(data):
        size = shift = 0
        while True:
            if pos >= len(data):
                raise ValueError(f"{path}: truncated length at byte {pos}")
            b = data[pos]
            pos += 1
            size |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        if pos + size > len(data):
            raise ValueError(f"{path}: a message of {size} bytes runs past the end")
        msgs.append(data[pos : pos + size])
        pos += size
    if not msgs:
        raise ValueError(f"{path}: empty")
    meta = et_pb2.GlobalMetadata.FromString(msgs[0])
    return meta, [et_pb2.Node.FromString(m) for m in msgs[1:]]
