"""A trace in the forms NCCL's Inspector writes, for the dashboards that read them.

The Inspector (NVIDIA/nccl ext-profiler/inspector) logs one JSON object per
collective per communicator per rank, in its output format v4.0:

    {"header": {"id", "rank", "n_ranks", "nnodes"},
     "metadata": {"inspector_output_format_version": "v4.0", "git_rev", "rec_mechanism",
                  "dump_timestamp_us", "hostname", "pid"},
     "coll_perf": {"coll", "coll_sn", "coll_msg_size_bytes", "coll_exec_time_us",
                   "coll_timing_source", "coll_algobw_gbs", "coll_busbw_gbs"}}

and, in its Prometheus mode, three gauges per communicator and rank for the latest
collective (`nccl_algorithm_bandwidth_gbs`, `nccl_bus_bandwidth_gbs`,
`nccl_collective_exec_time_microseconds`) labelled with the communicator, the rank
and the collective. The facts are the Inspector's; the writer is ours.

What a time is, `coll_timing_source` says: `neuronabox_real_rank` for a live trace
(a real rank's span in the collective, from its first frame to its last message, as
the controller saw it), `neuronabox_model` for a simulated one (the virtual time a
replay gave the simulated rank). Both Gloo and NCCL traces export: a Gloo-only kind
keeps a name in the Inspector's style (Barrier, Gather, Scatter, AllToAll).
"""

from __future__ import annotations

import hashlib
import socket
import time
from collections.abc import Iterator

from neuronabox.trace.busbw import bandwidths

FORMAT_VERSION = "v4.0"
REC_MECHANISM = "neuronabox_trace"
COLL_NAMES = {  # NCCL's own (ncclFuncToString) where it has the collective
    "allreduce": "AllReduce",
    "allgather": "AllGather",
    "reduce_scatter": "ReduceScatter",
    "broadcast": "Broadcast",
    "reduce": "Reduce",
    "send": "Send",
    "recv": "Recv",
    "barrier": "Barrier",
    "gather": "Gather",
    "scatter": "Scatter",
    "alltoall": "AllToAll",
}
METRICS = (  # (name, help, the coll_perf field it carries)
    ("nccl_algorithm_bandwidth_gbs", "NCCL algorithm bandwidth in GB/s", "coll_algobw_gbs"),
    ("nccl_bus_bandwidth_gbs", "NCCL bus bandwidth in GB/s", "coll_busbw_gbs"),
    ("nccl_collective_exec_time_microseconds", "Execution time in microseconds", "coll_exec_time_us"),
)


def comm_id(doc: dict, group: str) -> str:
    """A communicator id in the Inspector's form (hex), stable for a run and group."""
    seed = f"{doc.get('started_us', 0)}/{group}".encode()
    return "0x" + hashlib.blake2b(seed, digest_size=7).hexdigest()


def _nodes(doc: dict, ranks: list[int]) -> int:
    nproc = doc.get("nproc_per_node") or 1
    return len({r // nproc for r in ranks})


def records(doc: dict, hostname: str | None = None) -> Iterator[dict]:
    """One v4.0 object per collective instance per real rank in it, in completion order."""
    host = hostname or socket.gethostname()
    source = "neuronabox_model" if doc.get("simulated_from") else "neuronabox_real_rank"
    world = doc.get("world_size", 0)
    groups = doc.get("groups", {})
    for rec in doc["instances"]:
        group = rec["group"]
        ranks = groups.get(group) or list(range(rec.get("world") or world))
        n_ranks = rec.get("world") or len(ranks)
        for rank, (a, b) in sorted(rec["per_rank"].items(), key=lambda kv: int(kv[0])):
            g = int(rank)
            exec_us = max(0.0, b - a)
            alg, bus = bandwidths(rec["kind"], rec["nbytes"], exec_us * 1e-6, n_ranks)
            yield {
                "header": {
                    "id": comm_id(doc, group),
                    "rank": ranks.index(g) if g in ranks else g,
                    "n_ranks": n_ranks,
                    "nnodes": _nodes(doc, ranks),
                },
                "metadata": {
                    "inspector_output_format_version": FORMAT_VERSION,
                    "git_rev": "",
                    "rec_mechanism": REC_MECHANISM,
                    "dump_timestamp_us": round(b),
                    "hostname": host,
                    "pid": 0,  # the trace keeps no rank's process id
                },
                "coll_perf": {
                    "coll": COLL_NAMES.get(rec["kind"], rec["kind"]),
                    "coll_sn": rec["seq"],
                    "coll_msg_size_bytes": rec["nbytes"],
                    "coll_exec_time_us": round(exec_us, 3),
                    "coll_timing_source": source,
                    "coll_algobw_gbs": round(alg, 6),
                    "coll_busbw_gbs": round(bus, 6),
                },
            }


def _size(n: int) -> str:
    """The Inspector's message_size label: 512B, 2.00GB."""
    units = ("B", "KB", "MB", "GB", "TB")
    x, i = float(n), 0
    while x >= 1024 and i < len(units) - 1:
        x /= 1024
        i += 1
    return f"{n}B" if i == 0 else f"{x:.2f}{units[i]}"


def _label(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def prometheus(doc: dict, hostname: str | None = None) -> str:
    """The Inspector's gauges in the Prometheus text format: per communicator and rank,
    the latest collective (as its Prometheus mode keeps them), each metric's samples
    together under its HELP and TYPE."""
    latest: dict[tuple[str, int], dict] = {}
    for obj in records(doc, hostname):
        latest[(obj["header"]["id"], obj["header"]["rank"])] = obj
    lines = []
    for name, help_text, field in METRICS:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        for obj in latest.values():
            h, m, c = obj["header"], obj["metadata"], obj["coll_perf"]
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(m["dump_timestamp_us"] / 1e6))
            labels = {
                "comm_id": h["id"], "hostname": m["hostname"], "rank": h["rank"], "slurm_job": "unknown",
                "slurm_job_id": "unknown", "nranks": h["n_ranks"], "n_nodes": h["nnodes"], "collective": c["coll"],
                "coll_sn": c["coll_sn"], "coll_timing_source": c["coll_timing_source"], "timestamp": stamp,
                "message_size": _size(c["coll_msg_size_bytes"]),
            }  # fmt: skip
            text = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
            lines.append(f"{name}{{{text}}} {c[field]:.6g}")
    return "\n".join(lines) + "\n"
