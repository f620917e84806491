"""One vocabulary for the kinds of traffic: what a schedule runs, a trace record
names, a delay model prices and a what-if selects.

A `Kind` is a str, so it is written to traces and YAML as its plain name and
compares equal to it (delay-model plugins may keep testing `kind == "allreduce"`).
"""

from __future__ import annotations

from enum import Enum


class Kind(str, Enum):
    ALLREDUCE = "allreduce"
    ALLGATHER = "allgather"
    BROADCAST = "broadcast"
    BARRIER = "barrier"
    REDUCE = "reduce"
    REDUCE_SCATTER = "reduce_scatter"  # NCCL only: Gloo's dialect has no schedule for it
    GATHER = "gather"
    SCATTER = "scatter"
    ALLTOALL = "alltoall"
    SEND = "send"  # a real rank's point-to-point send to an emulated rank
    RECV = "recv"  # a real rank's point-to-point receive from an emulated rank

    # Written as the plain name everywhere (an f-string included, on every Python).
    __str__ = str.__str__
    __format__ = str.__format__


POINT_TO_POINT = (Kind.SEND, Kind.RECV)
COLLECTIVE_KINDS = tuple(k for k in Kind if k not in POINT_TO_POINT)
KINDS = tuple(Kind)
NCCL_ONLY = (Kind.REDUCE_SCATTER,)
GLOO_KINDS = tuple(k for k in Kind if k not in NCCL_ONLY)  # what the Gloo dialect schedules
GLOO_COLLECTIVES = tuple(k for k in COLLECTIVE_KINDS if k not in NCCL_ONLY)
