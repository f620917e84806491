"""A topology fitted to nccl-tests' own measurements of a cluster (`calibrate
--from-nccl-tests`), under NCCL's cost formulas (`nccl-ring`, `nccl-tree`).

nccl-tests prints, per size, the time of the collective and its algbw and busbw
(the text table, with or without mpirun's `[r,c]<stdout>:` prefixes, and with or
without the `root` column newer releases print), or writes the same as JSON with
`-J` (`results[].out_of_place.time`, `config.devices[].hostname`). Each log is one
world: its ranks are the `#  Rank N ... on HOST device D` lines, its nodes the
distinct hosts.

The fit: the delay models price a collective of n bytes over W ranks as
`steps(W) * alpha + bytes(W, n) / beta` (delay_models/collective.py), with (alpha,
beta) those of the intra-node link when the world fits in one node and of the path
between nodes otherwise. Both are linear in (alpha, 1/beta), so each link class is a
least-squares fit of the relative time over the worlds and sizes it prices, from
`from_size` up: what NCCL's Simple protocol moves. Below it NCCL's tuner picks its
low-latency protocols (LL, LL128: less latency, less bandwidth), so each link class
gets a second (alpha, beta) fitted on the sizes below `from_size`, its `small` link;
the model prices a collective with whichever of the two is faster, as the tuner does,
and the crossover is where the measured curve changes protocol. Pure: texts in, a fit
out.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from neuronabox.delay_models.collective import nccl_terms
from neuronabox.errors import NeuronaBoxError
from neuronabox.limits import read_bounded
from neuronabox.schedules import Kind

PREFIX = re.compile(r"^\[\d+,\d+\]<std(?:out|err)>:")
RANK_LINE = re.compile(r"#\s+Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device")
COLLS = {  # nccl-tests' program names -> the kinds the formulas price
    "all_reduce": Kind.ALLREDUCE, "all_gather": Kind.ALLGATHER, "reduce_scatter": Kind.REDUCE_SCATTER,
    "broadcast": Kind.BROADCAST, "reduce": Kind.REDUCE,
}  # fmt: skip
MODELS = ("nccl-ring", "nccl-tree")
MAX_LOG_BYTES = 64 << 20


class NcclTestsError(NeuronaBoxError, ValueError):
    """A file that is not an nccl-tests log this reader can use; the message names it."""


@dataclass
class Row:
    size: int
    time_us: float  # out-of-place
    busbw: float  # GB/s, as nccl-tests printed it


@dataclass
class Log:
    path: str
    coll: Kind
    world: int
    nodes: int
    ranks_per_node: int
    rows: list[Row] = field(default_factory=list)


def coll_of(name: str) -> Kind | None:
    base = Path(name).name.lower().replace("allreduce", "all_reduce").replace("allgather", "all_gather")
    for key in sorted(COLLS, key=len, reverse=True):
        if key in base:
            return COLLS[key]
    return None


def read(path: str, coll: str | None = None) -> Log:
    """One nccl-tests log (text or -J JSON); `coll` when the file does not say its collective."""
    try:
        text = read_bounded(path, MAX_LOG_BYTES, "nccl-tests log").decode(errors="replace")
    except (OSError, ValueError) as exc:
        raise NcclTestsError(f"{path}: {getattr(exc, 'strerror', None) or exc}") from None
    given = coll_of(coll) if coll else None
    if coll and given is None:
        raise NcclTestsError(f"--coll {coll!r}: one of {', '.join(COLLS)}")
    return _json(path, text, given) if text.lstrip().startswith("{") else _text(path, text, given)


def _text(path: str, text: str, given: Kind | None) -> Log:
    hosts: dict[str, int] = {}
    ranks: set[int] = set()
    rows: list[Row] = []
    named, time_col = None, 4
    for raw in text.splitlines():
        line = PREFIX.sub("", raw)
        if m := RANK_LINE.match(line.strip()):
            ranks.add(int(m.group(1)))
            hosts[m.group(2)] = hosts.get(m.group(2), 0) + 1
            continue
        if "Collective test starting:" in line:
            named = coll_of(line.split(":", 1)[1].strip())
            continue
        if line.startswith("#") and "redop" in line:
            time_col = 5 if "root" in line else 4
            continue
        f = line.split()
        if len(f) > time_col + 2 and f[0].isdigit() and f[1].isdigit():
            try:
                rows.append(Row(int(f[0]), float(f[time_col]), float(f[time_col + 2])))
            except ValueError:
                raise NcclTestsError(f"{path}: a result line that does not read: {line.strip()[:80]!r}") from None
    return _log(path, given or named or coll_of(path), ranks, hosts, rows)


def _json(path: str, text: str, given: Kind | None) -> Log:
    try:
        doc = json.loads(text)
        devices = (doc.get("config") or {}).get("devices") or []
        ranks = {int(d["rank"]) for d in devices}
        hosts: dict[str, int] = {}
        for d in devices:
            hosts[d["hostname"]] = hosts.get(d["hostname"], 0) + 1
        rows = []
        for r in doc.get("results") or []:
            oop = r.get("out_of_place") or r.get("in_place")
            if oop:
                rows.append(Row(int(r["size"]), float(oop.get("time", oop.get("cpu_time"))), float(oop["bus_bw"])))
        args = doc.get("args") or []
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise NcclTestsError(f"{path}: not nccl-tests' -J JSON ({exc})") from None
    return _log(path, given or (coll_of(args[0]) if args else None) or coll_of(path), ranks, hosts, rows)


def _log(path: str, coll: Kind | None, ranks: set[int], hosts: dict[str, int], rows: list[Row]) -> Log:
    if not rows:
        raise NcclTestsError(f"{path}: no result lines (size, count, type, ..., time, algbw, busbw)")
    if not ranks:
        raise NcclTestsError(f"{path}: no `#  Rank N ... on HOST device D` lines: its world is unknown")
    if coll is None:
        raise NcclTestsError(f"{path}: it does not say its collective: give --coll (all_reduce, all_gather, ...)")
    return Log(path, coll, len(ranks), len(hosts), max(hosts.values()), rows)


# -- the fit -----------------------------------------------------------------------------
@dataclass
class LinkFit:
    alpha: float  # seconds per step
    beta: float  # bytes per second
    worlds: list[int]
    small: LinkFit | None = None  # the low-latency protocols' (sizes below the fit's from_size)

    def simple_time(self, steps: float, moved: float) -> float:
        return steps * self.alpha + moved / self.beta

    def time(self, steps: float, moved: float) -> float:
        """The faster protocol's, as NCCL's tuner picks."""
        t = self.simple_time(steps, moved)
        return t if self.small is None else min(t, self.small.simple_time(steps, moved))


@dataclass
class Fit:
    model: str
    ranks_per_node: int
    intra: LinkFit | None
    inter: LinkFit | None
    from_size: int
    logs: list[Log]

    def link_for(self, world: int) -> LinkFit | None:
        return self.intra if world <= self.ranks_per_node else self.inter

    def time(self, kind: Kind, world: int, nbytes: int) -> float | None:
        link = self.link_for(world)
        if link is None or world <= 1:
            return None
        return link.time(*nccl_terms(self.model, kind, world, nbytes))

    def low_latency(self, kind: Kind, world: int, nbytes: int) -> bool:
        """Whether the fit prices this size with the low-latency protocols (the faster)."""
        link = self.link_for(world)
        if link is None or link.small is None or world <= 1:
            return False
        steps, moved = nccl_terms(self.model, kind, world, nbytes)
        return link.small.simple_time(steps, moved) < link.simple_time(steps, moved)

    def busbw(self, kind: Kind, world: int, nbytes: int) -> float | None:
        """GB/s, nccl-tests' definition."""
        from neuronabox.trace.busbw import bandwidths

        t = self.time(kind, world, nbytes)
        return None if t is None else bandwidths(kind, nbytes, t, world)[1]

    def topology(self, name: str) -> dict:
        """The file --topology takes: the delay model's alpha for a world within a node is
        the intra link's latency; across nodes the path crosses two inter links."""
        def link(lf: LinkFit | None, hops: int) -> dict:
            lf = lf or self.intra or self.inter
            out = {"bandwidth": f"{lf.beta / 1e9:.9g}GB/s", "latency": f"{lf.alpha / hops * 1e6:.9g}us"}
            if lf.small is not None:
                out["small"] = link(lf.small, hops)
            return out

        nodes = max(max(lg.nodes for lg in self.logs), 1)
        return {
            "name": name,
            "nodes": nodes,
            "ranks_per_node": self.ranks_per_node,
            "links": {"intra": link(self.intra, 1), "inter": link(self.inter, 2)},
            "switches": {"tiers": 1, "nodes_per_switch": 1 << 16},  # one hop of inter links up and down
        }


def fit(logs: list[Log], model: str = "nccl-ring", from_size: int = 1 << 20, ranks_per_node: int | None = None) -> Fit:
    if model not in MODELS:
        raise NcclTestsError(f"--model is {' or '.join(MODELS)}, got {model!r}")
    rpn = ranks_per_node or max(lg.ranks_per_node for lg in logs)
    intra = [lg for lg in logs if 1 < lg.world <= rpn]
    inter = [lg for lg in logs if lg.world > rpn]
    if not intra and not inter:
        raise NcclTestsError("no log of 2 ranks or more: nothing to fit (1 rank moves no data)")
    return Fit(model, rpn, _fit_link(intra, model, from_size), _fit_link(inter, model, from_size), from_size, logs)


def _fit_link(logs: list[Log], model: str, from_size: int) -> LinkFit | None:
    """The link's Simple fit from `from_size` up, and its low-latency protocols' below."""
    main = _least_squares(logs, model, from_size, math.inf)
    if main is None:
        return None
    sizes = {r.size for lg in logs for r in lg.rows if 0 < r.size < from_size and r.time_us > 0}
    if len(sizes) >= 3:  # enough sizes below to say what the other protocols cost
        small = _least_squares(logs, model, 1, from_size)
        # kept only as NCCL's low-latency protocols are: less latency, and less bandwidth
        if small is not None and small.alpha < main.alpha and small.beta < main.beta:
            main.small = small
    return main


def _least_squares(logs: list[Log], model: str, low: float, high: float) -> LinkFit | None:
    """Least squares of time/measured - 1 over (alpha, 1/beta), both at least 0, over
    the sizes in [low, high)."""
    if not logs:
        return None
    saa = sab = sbb = sa = sb = 0.0
    for lg in logs:
        for r in lg.rows:
            if not low <= r.size < high or r.time_us <= 0:
                continue
            steps, moved = nccl_terms(model, lg.coll, lg.world, r.size)
            t = r.time_us * 1e-6
            a, b = steps / t, moved / t  # relative: each point weighs the same whatever its size
            saa, sab, sbb, sa, sb = saa + a * a, sab + a * b, sbb + b * b, sa + a, sb + b
    det = saa * sbb - sab * sab
    if det <= 0:
        raise NcclTestsError(f"too few sizes from {low:.0f} B in {', '.join(lg.path for lg in logs)} to fit")
    alpha = (sa * sbb - sb * sab) / det
    inv_beta = (sb * saa - sa * sab) / det
    if alpha < 0:  # all of it is bandwidth
        alpha, inv_beta = 0.0, sb / sbb
    if inv_beta <= 0:  # all of it is latency
        inv_beta, alpha = 1e-30, sa / saa
    return LinkFit(alpha, 1.0 / inv_beta, sorted({lg.world for lg in logs}))


def report(f: Fit) -> str:
    """Every log's sizes: measured and fitted busbw, and the residual."""
    def us(x: float) -> str:
        return f"{x * 1e6:.3f} us"

    lines = [f"nccl-tests fit, {f.model}, {f.ranks_per_node} ranks per node, sizes from {f.from_size} B"]
    for label, lf in (("intra-node", f.intra), ("inter-node", f.inter)):
        if lf:
            lines.append(f"  {label}: alpha {us(lf.alpha)} per step, beta {lf.beta / 1e9:.2f} GB/s "
                         f"(worlds {', '.join(map(str, lf.worlds))})")  # fmt: skip
            if lf.small is not None:
                lines.append(f"    below {f.from_size} B (LL/LL128): alpha {us(lf.small.alpha)} per step, "
                             f"beta {lf.small.beta / 1e9:.2f} GB/s")  # fmt: skip
    for lg in sorted(f.logs, key=lambda x: x.world):
        lines += log_lines(f, lg)
    return "\n".join(lines)


def log_lines(f: Fit, lg: Log, label: str = "") -> list[str]:
    """One log's sizes: measured and fitted busbw, and the residual."""
    lines = [f"  {label}{lg.path}: {lg.coll}, {lg.world} ranks on {lg.nodes} node(s)",
             "          size   measured busbw   fitted busbw   residual"]  # fmt: skip
    for r in lg.rows:
        fitted = f.busbw(lg.coll, lg.world, r.size)
        if fitted is None:
            continue
        res = f"{(fitted / r.busbw - 1) * 100:+7.1f}%" if r.busbw > 0 else "      -"
        mark = "   (LL/LL128)" if f.low_latency(lg.coll, lg.world, r.size) else ""
        lines.append(f"  {r.size:>12}   {r.busbw:>10.2f}      {fitted:>10.2f}   {res}{mark}")
    return lines


def median_error(f: Fit, log: Log, from_size: int) -> float:
    """The median |fitted/measured - 1| of a log's busbw over sizes from `from_size`."""
    errs = sorted(abs(f.busbw(log.coll, log.world, r.size) / r.busbw - 1)
                  for r in log.rows if r.size >= from_size and r.busbw > 0)  # fmt: skip
    if not errs:
        return math.nan
    mid = len(errs) // 2
    return errs[mid] if len(errs) % 2 else (errs[mid - 1] + errs[mid]) / 2
