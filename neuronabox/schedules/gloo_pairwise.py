"""Gloo's one-message-per-pair collectives as pure schedules (pytorch/gloo:
gather.cc, scatter.cc, alltoall.cc, alltoallv.cc).

Each rank exchanges at most one message with each peer, all posted before any
wait, so nothing an emulated rank sends depends on anything: its bytes are its
own block (zeros under the zero-data policy). Message lengths are read off the
wire (`WIRE`): the real rank's notice says how long each message is, which also
covers alltoallv's uneven (even zero-length) splits.

Timing: a rank's sends leave one after another on its link, and a root's
receives arrive one after another on its link (incast), so the k-th message of
a rank costs latency + k x bytes / bandwidth, after the sender's software cost
of one message (`edge_work`).
"""

from __future__ import annotations

from .gloo import Link, MirrorPlan, Msg, RealRanks, SendRef, Work
from .kinds import Kind

WIRE = -1  # a length the real rank's notice tells


class _Pairwise:
    kind: Kind

    def __init__(self, world: int, nbytes: int) -> None:
        self.world = world
        self.nbytes = nbytes  # one message's bytes, as first seen on the wire (timing only)

    def origin(self, rank: int, step: int, real: RealRanks) -> tuple[list[SendRef], SendRef | None]:
        return [], None  # an emulated rank's own block: zeros

    def edge_work(self, work: Work) -> float:
        """Nothing is received before a send: only the message's own software cost."""
        return work.message

    def _cost(self, hop: Link, k: int, work: float = 0.0) -> float:
        """The k-th message on a link: the sender's work, then the link."""
        return work + hop.latency + k * self.nbytes / hop.bandwidth

    def free_time(self, hop: Link, work: float = 0.0) -> float:
        return self._cost(hop, self.world - 1, work) if self.world > 1 else 0.0


class RootedPairwise(_Pairwise):
    """gather (every rank sends its block to the root) or scatter (the root sends each
    rank its block), the root walking its peers in ascending rank order."""

    def __init__(self, kind: Kind, world: int, root: int, nbytes: int) -> None:
        super().__init__(world, nbytes)
        self.kind = kind
        self.root = root

    def _index(self, rank: int) -> int:
        """Position of non-root `rank` in the root's ascending walk: the message's step."""
        return rank if rank < self.root else rank - 1

    def _own(self, rank: int) -> list[Msg]:
        return [] if rank == self.root else [Msg(self.root, self._index(rank), WIRE)]

    def _root_msgs(self, rank: int) -> list[Msg]:
        if rank != self.root:
            return []
        return [Msg(j, self._index(j), WIRE) for j in range(self.world) if j != self.root]

    def sends(self, rank: int) -> list[Msg]:
        return self._own(rank) if self.kind == Kind.GATHER else self._root_msgs(rank)

    def recvs(self, rank: int) -> list[Msg]:
        return self._own(rank) if self.kind == Kind.SCATTER else self._root_msgs(rank)

    def mirror_plan(self, rank: int, step: int, real: RealRanks) -> MirrorPlan:
        """A gather's emulated block is the mirrored input; so is each block an emulated
        root scatters (a scatter's list exists on the root only: the observer notes an input
        only for an object scatter, so a tensor scatter's blocks stay zeros)."""
        return MirrorPlan(None, 1)

    def lag(self, rank: int, step: int, hop: Link) -> float:
        """When the message of `step` arrives, after entry: the root's link carries the
        messages one after another in ascending order of the other rank."""
        return self._cost(hop, step + 1)

    def rank_time(self, hop: Link, rank: int, work: float = 0.0) -> float:
        if rank == self.root:
            return self.free_time(hop, work)
        return self._cost(hop, self._index(rank) + 1, work)


class PairwiseAlltoall(_Pairwise):
    """alltoall / alltoallv: at step i = 1..W-1 rank r sends to r+i and receives from r-i."""

    kind = Kind.ALLTOALL

    def sends(self, rank: int) -> list[Msg]:
        return [Msg((rank + i) % self.world, i, WIRE) for i in range(1, self.world)]

    def recvs(self, rank: int) -> list[Msg]:
        return [Msg((rank - i) % self.world, i, WIRE) for i in range(1, self.world)]

    def mirror_plan(self, rank: int, step: int, real: RealRanks) -> MirrorPlan:
        """Emulated `rank` sends the receiver the input's block meant for it."""
        return MirrorPlan(None, 1, block_for=(rank + step) % self.world)

    def lag(self, rank: int, step: int, hop: Link) -> float:
        return self._cost(hop, step)

    def rank_time(self, hop: Link, rank: int, work: float = 0.0) -> float:
        return self.free_time(hop, work)
