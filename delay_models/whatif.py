"""What-if modifiers: changes to the emulated network on top of any delay model.

One spec is a comma list of key=value, the first pair naming the modifier:

    latency=+2ms[,per=hop|collective][,op=KIND]   added latency per hop, or once per collective
    bandwidth=x0.5[,op=KIND]                      every link's bandwidth scaled (the x is optional)
    jitter=200us[,seed=1][,op=KIND]               each released message up to this much later (uniform)
    straggler=rank:5,delay=3ms[,op=KIND]          emulated rank 5 enters every collective late

`op` limits a modifier to one kind of instance: a collective (allreduce, allgather,
broadcast, barrier, reduce, gather, scatter, alltoall) or a point-to-point send or recv.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from neuronabox.topology import LinkClass
from neuronabox.topology.presets import parse_latency

from neuronabox.errors import NeuronaBoxError
from neuronabox.schedules import KINDS


class WhatIfError(NeuronaBoxError, ValueError):
    """A modifier spec that cannot be used; the message says which part."""


# The ranges of a modifier's numbers. A link a million times slower or faster than the
# model's is a different network (a topology file says that better), and a message held
# a day is a stalled run: past these the model's times overflow or never come.
MAX_ADDED_S = 86400.0
BANDWIDTH_FACTORS = (1e-6, 1e6)


@dataclass(frozen=True)
class Modifier:
    what: str  # latency | bandwidth | jitter | straggler
    value: float  # seconds, or a bandwidth factor
    per: str = "hop"
    op: str = ""
    seed: int = 0
    rank: int = -1
    spec: str = ""

    def applies(self, kind: str) -> bool:
        return not self.op or self.op == kind


def _seconds(text: str, field: str) -> float:
    try:
        value = parse_latency(text, field)
    except ValueError as exc:
        raise WhatIfError(str(exc)) from None
    if not value <= MAX_ADDED_S:
        raise WhatIfError(f"{field} is at most {MAX_ADDED_S:g} s, got {text!r}")
    return value


def parse(spec: str) -> Modifier:
    pairs = []
    for part in spec.split(","):
        key, eq, value = part.strip().partition("=")
        if not eq or not key or not value:
            raise WhatIfError(f"{spec!r}: expected key=value pairs, got {part!r}")
        pairs.append((key, value))
    what, raw = pairs[0]
    opts = dict(pairs[1:])
    allowed = {"latency": {"per", "op"}, "bandwidth": {"op"}, "jitter": {"seed", "op"}, "straggler": {"delay", "op"}}
    if what not in allowed:
        raise WhatIfError(f"{spec!r}: unknown modifier {what!r} (latency, bandwidth, jitter, straggler)")
    extra = set(opts) - allowed[what]
    if extra:
        raise WhatIfError(f"{spec!r}: {what} takes no {sorted(extra)[0]!r}")
    op = opts.get("op", "")
    if op and op not in KINDS:
        raise WhatIfError(f"{spec!r}: op must be one of {', '.join(KINDS)}, got {op!r}")
    if what == "latency":
        per = opts.get("per", "hop")
        if per not in ("hop", "collective"):
            raise WhatIfError(f"{spec!r}: per is hop or collective, got {per!r}")
        value = _seconds(raw.lstrip("+"), f"{spec!r}: latency")
        return Modifier("latency", value, per=per, op=op, spec=spec)
    if what == "bandwidth":
        try:
            factor = float(raw.removeprefix("x"))
        except ValueError:
            factor = 0.0
        if not (math.isfinite(factor) and factor > 0):
            raise WhatIfError(f"{spec!r}: bandwidth takes a positive factor such as x0.5, got {raw!r}")
        low, high = BANDWIDTH_FACTORS
        if not low <= factor <= high:
            raise WhatIfError(f"{spec!r}: a bandwidth factor is between x{low:g} and x{high:g}, got {raw!r}")
        return Modifier("bandwidth", factor, op=op, spec=spec)
    if what == "jitter":
        try:
            seed = int(opts.get("seed", "0"))
        except ValueError:
            raise WhatIfError(f"{spec!r}: seed must be a whole number, got {opts['seed']!r}") from None
        return Modifier("jitter", _seconds(raw, f"{spec!r}: jitter"), op=op, seed=seed, spec=spec)
    name, colon, num = raw.partition(":")
    if name != "rank" or not colon or not num.isdigit():
        raise WhatIfError(f"{spec!r}: straggler takes rank:N, got {raw!r}")
    if "delay" not in opts:
        raise WhatIfError(f"{spec!r}: straggler needs delay=TIME")
    return Modifier("straggler", _seconds(opts["delay"], f"{spec!r}: delay"), op=op, rank=int(num), spec=spec)


class WhatIf:
    """The active modifiers, and what they do to one collective instance."""

    def __init__(self, mods: list[Modifier] | None = None) -> None:
        self.mods = list(mods or [])
        self._rngs: dict[Modifier, random.Random] = {}

    @classmethod
    def from_specs(cls, specs: list[str]) -> WhatIf:
        return cls([parse(s) for s in specs])

    def specs(self) -> list[str]:
        return [m.spec for m in self.mods]

    def check(self, world: int, real_ranks: list[int], timeout_s: float | None = None) -> None:
        """Refuse what no run of `world` ranks with these real ranks can do: a straggler that
        is not an emulated rank of the world; in a live run (`timeout_s`, the watchdog's),
        a time added to one message or collective that reaches the timeout, which would
        hold a real rank until the watchdog blames it. The launcher, a live `inject` and
        the simulation all ask here, so they refuse alike."""
        real = set(real_ranks)
        for m in self.mods:
            if timeout_s is not None and m.what != "bandwidth" and m.value >= timeout_s:
                raise WhatIfError(f"{m.spec!r}: adds {m.value:g} s, not less than the run's --timeout "
                                  f"({timeout_s:g} s): every real rank would wait past it")  # fmt: skip
            if m.what == "straggler" and not (0 <= m.rank < world and m.rank not in real):
                raise WhatIfError(f"{m.spec!r}: a straggler must be an emulated rank of the world "
                                  f"(0..{world - 1}, not real rank{'s' if len(real) > 1 else ''} "
                                  f"{', '.join(map(str, sorted(real)))})")  # fmt: skip

    def hop(self, kind: str, link: LinkClass) -> LinkClass:
        lat, bw = link.latency, link.bandwidth
        for m in self.mods:
            if m.applies(kind):
                if m.what == "latency" and m.per == "hop":
                    lat += m.value
                elif m.what == "bandwidth":
                    bw *= m.value
        return LinkClass(link.name, bw, lat)

    def entry_delay(self, kind: str) -> float:
        """Latency added once per collective: it starts that much later, so every emulated
        rank enters that much later and no real rank's send counts before then (`Entry.hold_real`)."""
        return sum(m.value for m in self.mods if m.what == "latency" and m.per == "collective" and m.applies(kind))

    def stragglers(self, kind: str) -> dict[int, float]:
        out: dict[int, float] = {}
        for m in self.mods:
            if m.what == "straggler" and m.applies(kind):
                out[m.rank] = out.get(m.rank, 0.0) + m.value
        return out

    def jitter(self, kind: str) -> float:
        """A random extra delay for one released message (0 without jitter)."""
        extra = 0.0
        for m in self.mods:
            if m.what == "jitter" and m.applies(kind):
                rng = self._rngs.setdefault(m, random.Random(m.seed))
                extra += rng.uniform(0.0, m.value)
        return extra

    def has_jitter(self, kind: str) -> bool:
        return any(m.what == "jitter" and m.applies(kind) for m in self.mods)

    def any(self) -> bool:
        return bool(self.mods)
