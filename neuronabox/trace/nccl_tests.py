"""The nccl-tests table of a trace: size, count, type, redop, root, time, algbw, busbw per
kind and size, the time the real ranks' mean, with nccl-tests' bus-bandwidth factors;
`#wrong` is `-` (nothing is checked here)."""

from __future__ import annotations

from neuronabox.trace.busbw import bandwidths

TYPE_NAMES = {"Byte": "uint8", "Char": "int8", "Half": "half", "BFloat16": "bfloat16", "Float": "float",
              "Double": "double", "Int": "int32", "Long": "int64"}  # c10's names -> nccl-tests'
REDOPS = {"allreduce": "sum", "reduce": "sum", "reduce_scatter": "sum"}


def nccl_tests(doc: dict) -> str:
    """The nccl-tests table of a trace, one block per collective kind."""
    world = doc["world_size"]
    rows: dict[str, dict[tuple, list[float]]] = {}
    for rec in doc["instances"]:
        if rec["kind"] in ("send", "recv") or not rec["per_rank"]:
            continue
        times = [(b - a) * 1e-6 for a, b in rec["per_rank"].values()]
        key = (rec["nbytes"], rec["numel"], rec["dtype"], rec["root"], rec["world"])
        rows.setdefault(rec["kind"], {}).setdefault(key, []).append(sum(times) / len(times))
    out = [f"# NeuronaBox: {world} ranks, real {doc['real_ranks']}, {doc.get('delay_model')} on {doc.get('topology')};"
           " time: the real ranks' mean per size, in us"]  # fmt: skip
    for kind in sorted(rows):
        out += [
            "#",
            f"# Collective: {kind}",
            f"# {'size':>10} {'count':>12} {'type':>7} {'redop':>6} {'root':>5} {'time':>10} {'algbw':>7} {'busbw':>7}"
            f" {'#wrong':>6}  {'n':>5}",
            f"# {'(B)':>10} {'(elements)':>12} {'':>7} {'':>6} {'':>5} {'(us)':>10} {'(GB/s)':>7} {'(GB/s)':>7}",
        ]
        for (nbytes, numel, dtype, root, ranks), times in sorted(rows[kind].items(), key=lambda kv: kv[0][0]):
            mean = sum(times) / len(times)
            alg, bus = bandwidths(kind, nbytes, mean, ranks)
            count = str(numel) if numel is not None else "?"
            dtype = TYPE_NAMES.get(dtype, dtype or "?")
            rooted = root if root is not None else -1
            out.append(
                f"  {nbytes:>10} {count:>12} {dtype:>7} {REDOPS.get(kind, 'none'):>6} {rooted:>5}"
                f" {mean * 1e6:>10.2f} {alg:>7.3f} {bus:>7.3f} {'-':>6}  {len(times):>5}"
            )
    return "\n".join(out) + "\n"
