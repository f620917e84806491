"""Preset clusters and the YAML topology file format.

    name: my-cluster
    nodes: 64                # the run's --nnodes overrides it
    ranks_per_node: 8
    links:
      intra: {bandwidth: 900GB/s, latency: 2us}
      inter: {bandwidth: 400Gb/s, latency: 3us}
      # optional on either: the link under NCCL's low-latency protocols (LL, LL128), e.g.
      # inter: {bandwidth: 400Gb/s, latency: 3us, small: {bandwidth: 100Gb/s, latency: 1us}}
    switches: {tiers: 2, nodes_per_switch: 32}
    local_work: {message: 8us, reduce: 3.2GB/s}   # optional; both keys optional

`local_work` is what one rank spends on its own, which emulated ranks are charged
so they keep a real rank's pace: `message`, the software cost of one message (its
send and receive together), and `reduce`, the rate at which a rank folds a
received segment into its own (left out: free). Presets have none; calibrate it
from a real rank.

Bandwidths take b/s or B/s with k, M, G, T prefixes ("25Gbps", "100Gb/s",
"900GB/s"); latencies take ns, us, ms or s.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from .model import HostWork, LinkClass, Topology, TopologyError

_BW = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kKMGT]?)(b|B)(?:ps|/s)\s*$")
_LAT = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ns|us|ms|s)\s*$|^\s*(0)\s*$")  # zero needs no unit
_SCALE = {"": 1, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_TIME = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def parse_bandwidth(text: object, field: str) -> float:
    """Bytes per second."""
    m = _BW.match(str(text))
    value = float(m.group(1)) * _SCALE[m.group(2)] if m else 0.0
    if not (math.isfinite(value) and value > 0):  # a run of digits too long for a float is inf
        raise TopologyError(f"{field}: expected a bandwidth such as '100Gb/s' or '25GB/s', got {text!r}")
    return value / 8 if m.group(3) == "b" else value


def parse_latency(text: object, field: str) -> float:
    """Seconds."""
    m = _LAT.match(str(text))
    value = (0.0 if m.group(3) else float(m.group(1)) * _TIME[m.group(2)]) if m else math.nan
    if not math.isfinite(value):
        raise TopologyError(f"{field}: expected a latency such as '2us' or '1.5ms', got {text!r}")
    return value


def _link(spec: object, field: str, nested: bool = False) -> LinkClass:
    if not isinstance(spec, dict):
        raise TopologyError(f"{field}: expected a mapping with bandwidth and latency, got {spec!r}")
    unknown = set(spec) - {"bandwidth", "latency"} - (set() if nested else {"small"})
    if unknown:
        raise TopologyError(f"{field}.{sorted(unknown)[0]}: unknown field")
    for key in ("bandwidth", "latency"):
        if key not in spec:
            raise TopologyError(f"{field}.{key}: missing")
    return LinkClass(
        field.rsplit(".", 1)[-1],
        parse_bandwidth(spec["bandwidth"], f"{field}.bandwidth"),
        parse_latency(spec["latency"], f"{field}.latency"),
        _link(spec["small"], f"{field}.small", nested=True) if "small" in spec else None,
    )


def _work(spec: object) -> HostWork:
    if spec is None:
        return HostWork()
    if not isinstance(spec, dict):
        raise TopologyError(f"local_work: expected a mapping with message and/or reduce, got {spec!r}")
    for key in sorted(set(spec) - {"message", "reduce"}):
        raise TopologyError(f"local_work.{key}: unknown field (message, reduce)")
    return HostWork(
        parse_latency(spec["message"], "local_work.message") if "message" in spec else 0.0,
        parse_bandwidth(spec["reduce"], "local_work.reduce") if "reduce" in spec else math.inf,
    )


def from_dict(doc: object, origin: str = "topology") -> Topology:
    if not isinstance(doc, dict):
        raise TopologyError(f"{origin}: expected a mapping at the top level")
    unknown = set(doc) - {"name", "nodes", "ranks_per_node", "links", "switches", "local_work"}
    if unknown:
        raise TopologyError(f"{sorted(unknown)[0]}: unknown field")
    links = doc.get("links")
    if not isinstance(links, dict):
        raise TopologyError("links: missing (needs intra and inter)")
    for key in set(links) - {"intra", "inter"}:
        raise TopologyError(f"links.{key}: unknown link class (intra, inter)")
    switches = doc.get("switches", {}) or {}
    if not isinstance(switches, dict):
        raise TopologyError(f"switches: expected a mapping, got {switches!r}")
    for key in set(switches) - {"tiers", "nodes_per_switch"}:
        raise TopologyError(f"switches.{key}: unknown field")
    return Topology(
        name=str(doc.get("name", origin)),
        nnodes=doc.get("nodes", 1),
        ranks_per_node=doc.get("ranks_per_node", 1),
        intra=_link(links.get("intra"), "links.intra"),
        inter=_link(links.get("inter"), "links.inter"),
        nodes_per_switch=switches.get("nodes_per_switch", 32),
        switch_tiers=switches.get("tiers", 2),
        work=_work(doc.get("local_work")),
    )


PRESETS: dict[str, dict] = {
    # Commodity CPU servers on 25 GbE behind two switch tiers; kernel TCP latency.
    "cpu-25gbe": {
        "name": "cpu-25gbe",
        "nodes": 16,
        "ranks_per_node": 1,
        "links": {
            "intra": {"bandwidth": "20GB/s", "latency": "1us"},
            "inter": {"bandwidth": "25Gb/s", "latency": "15us"},
        },
        "switches": {"tiers": 2, "nodes_per_switch": 32},
    },
    # HDR-class InfiniBand at 100 Gb/s, one rank per node.
    "ib-100g": {
        "name": "ib-100g",
        "nodes": 64,
        "ranks_per_node": 1,
        "links": {
            "intra": {"bandwidth": "20GB/s", "latency": "1us"},
            "inter": {"bandwidth": "100Gb/s", "latency": "1.5us"},
        },
        "switches": {"tiers": 2, "nodes_per_switch": 40},
    },
    # 8 GPUs per node on NVLink (900 GB/s per GPU), 400 Gb/s per GPU between nodes.
    "nvlink-400g": {
        "name": "nvlink-400g",
        "nodes": 32,
        "ranks_per_node": 8,
        "links": {
            "intra": {"bandwidth": "900GB/s", "latency": "2us"},
            "inter": {"bandwidth": "400Gb/s", "latency": "3us"},
        },
        "switches": {"tiers": 2, "nodes_per_switch": 32},
    },
}


def as_spec(topo: Topology) -> dict:
    """The topology as `from_dict` reads it (bandwidths in B/s, latencies in s, with the
    digits that read back to the same floats), so a trace carries the cluster it ran on,
    preset or file, and replays without the file."""

    def plain(x: float) -> str:  # digits the file format reads, enough to give the same float back
        text = repr(x)
        return text if "e" not in text else format(x, ".40f").rstrip("0")

    def link(lc: LinkClass) -> dict:
        out = {"bandwidth": f"{plain(lc.bandwidth)}B/s", "latency": f"{plain(lc.latency)}s"}
        if lc.small is not None:
            out["small"] = link(lc.small)
        return out

    spec = {
        "name": topo.name,
        "nodes": topo.nnodes,
        "ranks_per_node": topo.ranks_per_node,
        "links": {"intra": link(topo.intra), "inter": link(topo.inter)},
        "switches": {"tiers": topo.switch_tiers, "nodes_per_switch": topo.nodes_per_switch},
    }
    work = {}
    if topo.work.message:
        work["message"] = f"{plain(topo.work.message)}s"
    if topo.work.reduce_per_byte:
        work["reduce"] = f"{plain(topo.work.reduce_bandwidth)}B/s"
    if work:
        spec["local_work"] = work
    return spec


MAX_TOPOLOGY_BYTES = 4 << 20  # a topology file names links and counts: a few KiB


def load(name_or_file: str) -> Topology:
    """A preset by name, or a YAML file by path."""
    if name_or_file in PRESETS:
        return from_dict(PRESETS[name_or_file], name_or_file)
    path = Path(name_or_file)
    if not path.exists():
        raise TopologyError(f"no preset or file named {name_or_file!r} (presets: {', '.join(sorted(PRESETS))})")
    if path.is_dir():
        raise TopologyError(f"{path}: a folder, not a topology file (a preset name or a YAML file)")
    if not path.is_file():
        raise TopologyError(f"{path}: not a regular file (a preset name or a YAML file)")
    import yaml

    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_TOPOLOGY_BYTES + 1)
        if len(raw) > MAX_TOPOLOGY_BYTES:
            raise TopologyError(f"{path}: larger than {MAX_TOPOLOGY_BYTES >> 20} MiB, not a topology file")
        doc = yaml.safe_load(raw.decode())
    except (OSError, UnicodeDecodeError) as exc:
        raise TopologyError(f"{path}: cannot read it ({getattr(exc, 'strerror', None) or exc})") from None
    except yaml.YAMLError as exc:
        raise TopologyError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    try:
        return from_dict(doc, path.stem)
    except TopologyError as exc:
        raise TopologyError(f"{path}: {exc}") from None
