"""The NCCL relay in virtual time: real ranks played by their NCCL ring programs, punctual
(a rank sends the moment its op's receive is in), against the same `NcclRelay` a live run
uses. `neuronabox perf --simulate --backend nccl` runs its ladder through it, and the tests
run every collective for any set of real ranks through it. Time is the caller's: it jumps
from one release to the next."""

from __future__ import annotations

import math
import struct

from neuronabox.schedules.nccl import NcclRing

from .errors import NcclError
from .relay import CollParams, NcclRelay

MAX_ROUNDS = 10_000_000


class VirtualRanks:
    """The real ranks' side of a relay: each runs NCCL's ring program slice by slice; what a
    real rank sends its real successor goes straight there, the rest through the relay.
    `received[rank]` keeps what each real rank got (payloads tag their sender and index)."""

    def __init__(self, relay: NcclRelay) -> None:
        self.relay = relay
        self.real = relay.real.sorted
        self.world = relay.world
        self.received: dict[int, list[bytes]] = {r: [] for r in self.real}

    def run(self, params: CollParams, ring: NcclRing, start: float) -> float:
        """One collective every real rank enters at `start`; returns when the last real rank ends."""
        relay, world, real = self.relay, self.world, set(self.real)
        for r in self.real:
            relay.collective(r, params, start)
        steps = {(r, c): [(op.recv, op.send, n) for op in ops for n in op.slices]
                 for r in self.real for c, ops in ring.program(r).items()}  # fmt: skip
        pos = dict.fromkeys(steps, 0)
        sent = dict.fromkeys(steps, 0)
        inbox: dict[tuple[int, int], list[bytes]] = {key: [] for key in steps}
        now = start
        finished = len(relay.finished)
        for _ in range(MAX_ROUNDS):
            moved = False
            for r, c, head, payload in relay.due(now):
                if struct.unpack("<i", head) != (len(payload),):
                    raise NcclError(f"the relay framed {len(payload)} bytes for rank {r} as {head.hex()}")
                inbox[(r, c)].append(payload)
                moved = True
            for key, prog in steps.items():
                while pos[key] < len(prog):
                    recv, send, n = prog[pos[key]]
                    if recv:
                        if not inbox[key]:
                            break
                        payload = inbox[key].pop(0)
                        if len(payload) != n:
                            raise NcclError(f"rank {key[0]} got {len(payload)} bytes where its program posts {n}")
                        self.received[key[0]].append(payload)
                    if send:
                        tag = struct.pack("<HHI", key[0], key[1], sent[key])[:n] if n else b""
                        body = tag + bytes(n - len(tag))
                        succ = ((key[0] + 1) % world, key[1])
                        if succ[0] in real:  # a real link: straight to the next real rank
                            inbox[succ].append(body)
                        else:
                            relay.feed(key[0], key[1], struct.pack("<i", n) + body, now)
                        sent[key] += 1
                    pos[key] += 1
                    moved = True
            if len(relay.finished) > finished and all(pos[k] == len(v) for k, v in steps.items()):
                return now
            if not moved:
                nxt = relay.next_release()
                if not math.isfinite(nxt) or nxt <= now:
                    stuck = {k: f"{pos[k]}/{len(v)}" for k, v in steps.items() if pos[k] < len(v)}
                    raise NcclError(f"{params.kind} seq {params.seq} cannot go on in virtual time: {stuck}")
                now = nxt
        raise NcclError(f"{params.kind} seq {params.seq} took over {MAX_ROUNDS} rounds")
