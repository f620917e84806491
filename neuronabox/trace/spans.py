"""Every real rank's span of every collective: what the Chrome and PNG exports draw."""

from __future__ import annotations

from dataclasses import dataclass

GAP_TRACK, COLL_TRACK = 1, 0


@dataclass
class Span:
    """One real rank's part of one collective, in epoch microseconds."""

    rank: int  # global
    start: float
    end: float
    record: dict


def spans(doc: dict) -> list[Span]:
    """Every real rank's span of every collective, in start order."""
    out = [Span(int(r), a, b, rec) for rec in doc["instances"] for r, (a, b) in rec["per_rank"].items()]
    return sorted(out, key=lambda s: (s.start, s.rank))
