"""The data plane of the NCCL dialect for any number of real ranks, sans-IO: every
collective's Socket-net messages on every (real rank, channel) stream, what each
message the controller sends carries, and when it may leave.

Streams, named from the real rank's side (one connection each, NCCL_SOCKET_NTHREADS=0):
- IN (R, c): R's sends to its emulated successor on channel c: `[i32 size][bytes]` frames
  whose sizes the schedule fixes (a frame of another size is refused, naming it);
- OUT (R, c): what R's emulated predecessor sends it on channel c: exactly the messages
  R's proxy posts, each carrying what `ring_sources` says (zeros, or bytes a real rank
  sent, forwarded along the emulated ranks unchanged).

A collective is known by its parameters (the profiler plugin's start line, `CollParams`),
which must come before the controller can parse R's bytes or write R's receives; bytes
that come first wait in the stream. Each stream moves through the collectives in order,
on its own. A message leaves at its release time (`ring_arrivals` priced by the run's
delay model and what-if: the emulated predecessor's pace, every emulated rank entering
when R did) and not before what it forwards has arrived. A real rank's message is kept
only until its last forward has gone. Time is passed in.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field

from neuronabox.topology import LinkClass

from neuronabox.schedules import Kind
from neuronabox.schedules.gloo import RealRanks
from neuronabox.schedules.nccl import NcclConfig, NcclRing, pipeline_arrivals, ring_arrivals
from neuronabox.schedules.nccl_sources import Source, ring_sources

from .errors import NcclError, NcclWireError
from .wire import SIZE, FrameReader

PLAN_CACHE = 256  # shapes kept (a DDP step has a handful)
IDENTITY_CACHE = 16  # identity payloads kept, one per (dtype, message size): at most 16 steps' worth
REDOPS = ("sum", "prod", "max", "min", "avg")  # ncclRedOp_t's built-ins (avg: NCCL pre-divides, then sums)
_FLOATS = {"float16": "e", "float32": "f", "float64": "d"}
_INTS = {"int8": (1, True), "uint8": (1, False), "int32": (4, True), "uint32": (4, False), "int64": (8, True),
         "uint64": (8, False)}  # fmt: skip


# NCCL's profiler names (ncclFuncToString, ncclDatatypeToString) -> ours
FUNCS = {"AllReduce": Kind.ALLREDUCE, "AllGather": Kind.ALLGATHER, "ReduceScatter": Kind.REDUCE_SCATTER,
         "Broadcast": Kind.BROADCAST}  # fmt: skip
DTYPES = {"ncclInt8": ("int8", 1), "ncclUint8": ("uint8", 1), "ncclInt32": ("int32", 4), "ncclUint32": ("uint32", 4),
          "ncclInt64": ("int64", 8), "ncclUint64": ("uint64", 8), "ncclFloat16": ("float16", 2),
          "ncclFloat32": ("float32", 4), "ncclFloat64": ("float64", 8), "ncclBfloat16": ("bfloat16", 2),
          "ncclFloat8e4m3": ("float8_e4m3fn", 1), "ncclFloat8e5m2": ("float8_e5m2", 1)}  # fmt: skip


class UnspokenCollective(NcclError):
    """A collective the live NCCL dialect does not play (an algorithm, protocol or kind)."""


def identity(op: str, dtype: str) -> bytes:
    """One element of `op`'s identity in `dtype`, little endian: what adds nothing to a reduction."""
    if op in ("sum", "avg"):
        value: float = 0.0
    elif op == "prod":
        value = 1.0
    else:
        value = -math.inf if op == "max" else math.inf
    if dtype == "bfloat16":  # the high half of a float32
        return struct.pack("<f", value)[2:]
    if dtype in _FLOATS:
        return struct.pack("<" + _FLOATS[dtype], value)
    if dtype in _INTS:
        size, signed = _INTS[dtype]
        low, high = (-(1 << (8 * size - 1)), (1 << (8 * size - 1)) - 1) if signed else (0, (1 << (8 * size)) - 1)
        n = int(value) if math.isfinite(value) else (low if value < 0 else high)
        return n.to_bytes(size, "little", signed=signed)
    raise UnspokenCollective(f"no {op} identity for NCCL datatype {dtype}")


class Nothing:
    """What an emulated rank adds to a message: the reduction's identity (zeros where
    nothing reduces). Made once per (dtype, size) and sent again (bytes are immutable): a
    512 KiB step's identity cost 0.3 ms to build each time."""

    def __init__(self, redop: str) -> None:
        self.redop = redop
        self._made: dict[tuple[str, int], bytes] = {}  # (dtype, or "" for zeros; size) -> payload

    def __call__(self, p: CollParams, nbytes: int) -> bytes:
        dtype = p.dtype if p.kind in (Kind.ALLREDUCE, Kind.REDUCE_SCATTER) else ""
        payload = self._made.get((dtype, nbytes))
        if payload is None:
            payload = identity(self.redop, dtype) * (nbytes // p.elem) if dtype else bytes(nbytes)
            if len(self._made) >= IDENTITY_CACHE:
                self._made.pop(next(iter(self._made)))
            self._made[(dtype, nbytes)] = payload
        return payload


@dataclass(frozen=True)
class CollParams:
    """One collective as the real rank's NCCL planned it (the profiler's Coll event)."""

    seq: int
    kind: Kind
    count: int  # NCCL's own count: per rank for allgather and reduce-scatter
    dtype: str
    elem: int
    root: int
    channels: int  # what NCCL's plan gave it (the schedule re-derives and checks it)
    algo: str
    proto: str

    @classmethod
    def from_line(cls, doc: dict) -> CollParams:
        """From the profiler plugin's JSON line; an unspoken choice is refused, naming it."""
        func, algo, proto = doc.get("func"), doc.get("algo"), doc.get("proto")
        if func not in FUNCS:
            raise UnspokenCollective(f"NCCL {func} is not played by the live NCCL dialect "
                                     f"(played: {', '.join(FUNCS)})")  # fmt: skip
        if algo != "RING" or proto != "SIMPLE":
            raise UnspokenCollective(f"NCCL ran {func} seq {doc.get('seq')} as {algo}/{proto}; the live dialect "
                                     "plays RING/SIMPLE (the launcher's pins)")  # fmt: skip
        if doc.get("dtype") not in DTYPES:
            raise UnspokenCollective(f"NCCL datatype {doc.get('dtype')} is not known to the live dialect")
        dtype, elem = DTYPES[doc["dtype"]]
        return cls(int(doc["seq"]), FUNCS[func], int(doc["count"]), dtype, elem, int(doc["root"]),
                   int(doc["channels"]), algo, proto)  # fmt: skip

    def total_count(self, world: int) -> int:
        """The elements the collective is about (what a trace records and a delay model prices):
        the gathered total for allgather, the whole input for reduce-scatter, else the buffer."""
        return self.count * (world if self.kind in (Kind.ALLGATHER, Kind.REDUCE_SCATTER) else 1)


@dataclass
class _Out:
    nbytes: int
    source: Source | None
    release: float = 0.0


@dataclass(frozen=True)
class _Plan:
    """One shape's messages on every stream (`NcclRelay._plan`)."""

    ring: NcclRing
    sends: dict[tuple[int, int], list[int]]
    outs: dict[tuple[int, int], list[tuple[int, Source | None]]]
    uses: dict[tuple[int, int, int], int]
    free_times: dict[tuple, float] = field(default_factory=dict)  # (hop, work) -> the model's time
    arrivals: dict[tuple, list[float]] = field(default_factory=dict)  # (rank, channel, hop, work) -> times


@dataclass
class Instance:
    """One collective in flight on every stream."""

    params: CollParams
    plan: _Plan
    created: float
    predicted: float
    hop: LinkClass
    work: float
    outs: dict[tuple[int, int], list[_Out]]  # OUT (R, c) -> what the controller sends R
    uses: dict[tuple[int, int, int], int]  # (Q, c, index) -> forwards still to make
    got: dict[tuple[int, int, int], bytes] = field(default_factory=dict)
    arrived: dict[tuple[int, int], int] = field(default_factory=dict)  # IN stream -> frames in
    lines: dict[int, float] = field(default_factory=dict)  # real rank -> when its start line came
    entered: dict[int, float] = field(default_factory=dict)  # real rank -> when it began (its stream reached it)
    ranks_done: dict[int, int] = field(default_factory=dict)  # real rank -> its streams done with this one
    left: dict[int, float] = field(default_factory=dict)  # real rank -> its last message, either way
    streams_done: set = field(default_factory=set)

    @property
    def ring(self) -> NcclRing:
        return self.plan.ring

    @property
    def sends(self) -> dict[tuple[int, int], list[int]]:
        """IN (R, c) -> the sizes R sends."""
        return self.plan.sends

    @property
    def boundary_messages(self) -> int:
        return sum(map(len, self.sends.values())) + sum(map(len, self.outs.values()))


class _Stream:
    """One connection's progress through the collectives."""

    def __init__(self) -> None:
        self.at = 0  # index into the relay's instance list (absolute: the relay's `base` + position)
        self.pending = bytearray()  # IN: bytes not yet parsed
        self.reader: FrameReader | None = None
        self.next_out = 0  # OUT: the next message of the current instance
        self.unclaimed_since: float | None = None  # IN: when bytes came that no announced collective claims


class NcclRelay:
    """The controller's half of every collective's data on every real rank's streams.

    `timing`: the run's `ReleaseTiming` (delay model, what-if, the emulated ranks' local
    work). The driver feeds bytes and collective parameters in with the time, asks `due`
    for the frames to write now, and `next_release` for its timer.
    """

    def __init__(self, world: int, real: list[int], config: NcclConfig, timing, redop: str = "sum",
                 buffer_limit: int = 1 << 30) -> None:  # fmt: skip
        if redop not in REDOPS:
            raise NcclError(f"reduction {redop!r} is not known (known: {', '.join(REDOPS)})")
        self.redop = redop  # NCCL's profiler does not say a collective's op: the run names the one it uses
        self.world = world
        self.real = RealRanks(real, world)
        self.config = config
        self.timing = timing
        self.buffer_limit = buffer_limit
        members = self.real.members
        self.in_ranks = [r for r in self.real.sorted if (r + 1) % world not in members]
        self.out_ranks = [r for r in self.real.sorted if (r - 1) % world not in members]
        self._in = {(r, c): _Stream() for r in self.in_ranks for c in range(config.channels)}
        self._out = {(r, c): _Stream() for r in self.out_ranks for c in range(config.channels)}
        self._instances: list[Instance] = []
        self._plans: dict[tuple, _Plan] = {}
        self._nothing = Nothing(redop)
        self._rank_at = dict.fromkeys(self.real.sorted, 0)  # real rank -> the collective it is in (absolute)
        self._rank_streams = {r: sum(k[0] == r for k in [*self._in, *self._out]) for r in self.real.sorted}
        self._base = 0  # absolute index of _instances[0]
        self._by_key: dict[tuple[Kind, int], int] = {}  # (kind, seq) -> absolute index
        self._last_seq: dict[Kind, int] = {}  # NCCL numbers each function's collectives on its own
        self.finished: list[Instance] = []  # completed, for the driver to record and clear

    # -- parameters ------------------------------------------------------------------
    def collective(self, rank: int, params: CollParams, now: float) -> None:
        """Real rank `rank` starts a collective (its profiler start line)."""
        key = (params.kind, params.seq)
        at = self._by_key.get(key)
        if at is None:
            last = self._last_seq.get(params.kind, -1)
            if params.seq <= last:
                return  # a late line of a collective every stream is done with
            if params.seq != last + 1:
                raise NcclWireError(f"rank {rank} started {params.kind} seq {params.seq}; the next is {last + 1}")
            self._last_seq[params.kind] = params.seq
            at = self._base + len(self._instances)
            self._instances.append(self._instance(params, now))
            self._by_key[key] = at
            for (r, c), st in self._in.items():  # bytes that came before the parameters, or none to come
                self._parse(r, c, st, now)
        inst = self._instances[at - self._base]
        if inst.params != params:
            raise NcclWireError(f"rank {rank} runs collective {params.seq} as {params}, another rank as {inst.params}")
        if rank in inst.lines:
            return
        inst.lines[rank] = now
        if self._rank_at[rank] == at:
            self._enter(inst, rank, now)

    def _enter(self, inst: Instance, rank: int, now: float) -> None:
        """`rank` begins `inst`: when its line came, or, if NCCL queued it behind the one
        before (a start line comes at enqueue), when that one ended for it: collectives of
        one communicator run one after the other on the real rank."""
        inst.entered[rank] = max(inst.lines[rank], now)
        self._retime(inst, rank)

    def _instance(self, p: CollParams, now: float) -> Instance:
        plan = self._plan(p)
        ring = plan.ring
        timing = self.timing
        hop = timing.hop(p.kind, p.total_count(self.world) * p.elem, self.world, ring)
        work = ring.edge_work(timing.work)
        key = (hop.latency, hop.bandwidth, work)
        free = plan.free_times.get(key)
        if free is None:
            free = plan.free_times[key] = ring.free_time(hop, work)
        modeled = self._late(p.kind) + free
        predicted = timing.within_limit(f"{p.kind} of {p.count} x {p.elem} B", modeled)
        outs = {key: [_Out(n, src) for n, src in msgs] for key, msgs in plan.outs.items()}
        return Instance(p, plan, now, predicted, hop, work, outs, dict(plan.uses))

    def _plan(self, p: CollParams) -> _Plan:
        """What a collective of this shape moves on every stream: built once per shape (a
        training step repeats its shapes) and shared by its instances."""
        key = (p.kind, p.count, p.elem, p.root, p.channels)
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        if p.root < 0 or p.root >= self.world:
            raise NcclWireError(f"collective {p.seq} has root {p.root} outside the world of {self.world}")
        ring = NcclRing(p.kind, self.world, p.count, p.elem, root=p.root, config=self.config)
        used = len(ring.parts)
        if used != p.channels:
            raise NcclWireError(f"NCCL ran {p.kind} seq {p.seq} ({p.count} x {p.elem} B) on {p.channels} channel(s); "
                                f"the schedule says {used}: the channel partition is out of step with NCCL")
        sources = ring_sources(ring, self.real.sorted, self.real.mirror)
        channels = range(self.config.channels)
        sends = {(r, c): [m.nbytes for m in ring.sends(r) if m.channel == c] for r in self.in_ranks for c in channels}
        outs: dict[tuple[int, int], list[tuple[int, Source | None]]] = {}
        uses: dict[tuple[int, int, int], int] = {}
        for r in self.out_ranks:
            recvs = ring.recvs(r)
            for c in channels:
                sizes = [m.nbytes for m in recvs if m.channel == c]
                srcs = sources.get(r, {}).get(c, [])
                outs[(r, c)] = list(zip(sizes, srcs, strict=True))
                for src in srcs:
                    if src is not None:
                        uses[(src.rank, c, src.index)] = uses.get((src.rank, c, src.index), 0) + 1
        if len(self._plans) >= PLAN_CACHE:
            self._plans.pop(next(iter(self._plans)))
        plan = self._plans[key] = _Plan(ring, sends, outs, uses)
        return plan

    def _retime(self, inst: Instance, rank: int) -> None:
        """Release times of what `rank` receives, from its entry (the model's arrivals)."""
        if rank not in self.out_ranks or not self.timing.active:
            return
        kind = inst.params.kind
        t0 = inst.entered[rank] + self._late(kind)
        whatif = self.timing.whatif
        jitter = whatif.has_jitter(kind)
        plan, ring, hop, work = inst.plan, inst.ring, inst.hop, inst.work
        for part in ring.parts:
            outs = inst.outs[(rank, part.channel)]
            key = (rank, part.channel, hop.latency, hop.bandwidth, work)
            times = plan.arrivals.get(key)
            if times is None and ring.kind == Kind.BROADCAST:
                hops = (rank - ring.root) % self.world  # 0: the root, which receives nothing
                chunks = [sum(op.slices) for op in ring.ops(ring.root, part)] if hops else []
                times = plan.arrivals[key] = pipeline_arrivals(chunks, hops, hop, work)
            elif times is None:
                times = plan.arrivals[key] = ring_arrivals(ring.program(rank)[part.channel], hop, work)
            for o, t in zip(outs, times, strict=True):
                o.release = t0 + t + (whatif.jitter(kind) if jitter else 0.0)

    def _late(self, kind: Kind) -> float:
        """How much later than the real rank the emulated ranks begin: the what-if's entry
        delay, and its slowest straggler (a ring moves at its slowest member's pace)."""
        whatif = self.timing.whatif
        return whatif.entry_delay(kind) + max(whatif.stragglers(kind).values(), default=0.0)

    # -- bytes -----------------------------------------------------------------------
    def feed(self, rank: int, channel: int, data: bytes, now: float) -> None:
        """Bytes from real rank `rank`'s connection to its successor on `channel`."""
        st = self._in.get((rank, channel))
        if st is None:
            raise NcclWireError(f"rank {rank} sent data on channel {channel}, which no stream of the controller has")
        self._parse(rank, channel, st, now, data)
        if len(st.pending) > self.buffer_limit:
            raise NcclWireError(f"rank {rank} sent {len(st.pending)} bytes on channel {channel} ahead of any "
                                "collective the profiler announced (is the profiler plugin loaded?)")  # fmt: skip

    def _parse(self, rank: int, channel: int, st: _Stream, now: float, data: bytes = b"") -> None:
        """Frames of each collective in turn; what no announced collective claims waits in `pending`."""
        key = (rank, channel)
        if st.pending:
            data, st.pending = bytes(st.pending) + data, bytearray()
        while st.at < self._base + len(self._instances):
            inst = self._instances[st.at - self._base]
            sizes = inst.sends[key]
            if st.reader is None:
                st.reader = FrameReader(max(sizes, default=0), what=f"rank {rank}'s net frame on channel {channel}",
                                        limit=len(sizes))  # fmt: skip
            frames = st.reader.feed(data) if data else []
            data = b""
            for payload in frames:
                i = inst.arrived.get(key, 0)
                if len(payload) != sizes[i]:
                    raise NcclWireError(f"rank {rank} sent {len(payload)} bytes as message {i} of {inst.params.kind} "
                                        f"seq {inst.params.seq} on channel {channel}; NCCL's schedule says "
                                        f"{sizes[i]}")  # fmt: skip
                if (rank, channel, i) in inst.uses:
                    inst.got[(rank, channel, i)] = payload
                inst.arrived[key] = i + 1
                inst.left[rank] = now
            if not st.reader.finished:
                return
            data = st.reader.rest
            st.reader = None
            self._stream_done(inst, ("in",) + key, now)
            st.at += 1
        if data:
            st.pending += data
            if st.unclaimed_since is None:
                st.unclaimed_since = now
        else:
            st.unclaimed_since = None

    def due(self, now: float) -> list[tuple[int, int, bytes, bytes]]:
        """(real rank, channel, size header, payload) to write now, in order per stream."""
        out: list[tuple[int, int, bytes, bytes]] = []
        for key, st in self._out.items():
            while st.at < self._base + len(self._instances):
                inst = self._instances[st.at - self._base]
                if key[0] not in inst.entered:
                    break  # this rank has not started it: its receives are not posted
                msgs = inst.outs[key]
                if st.next_out < len(msgs):
                    m = msgs[st.next_out]
                    if m.release > now:
                        break
                    if m.release:
                        self.timing.record_lateness(now - m.release)
                    if m.source is None:
                        payload = self._nothing(inst.params, m.nbytes)
                    else:
                        skey = (m.source.rank, key[1], m.source.index)
                        payload = inst.got.get(skey)
                        if payload is None:
                            break  # what it forwards has not arrived
                        inst.uses[skey] -= 1
                        if not inst.uses[skey]:
                            del inst.got[skey]
                        if len(payload) != m.nbytes:
                            raise NcclWireError(f"rank {m.source.rank}'s message {m.source.index} is {len(payload)} "
                                                f"bytes; rank {key[0]} posts {m.nbytes}")  # fmt: skip
                    out.append((key[0], key[1], SIZE.pack(len(payload)), payload))
                    st.next_out += 1
                    inst.left[key[0]] = now
                    continue
                st.next_out = 0
                self._stream_done(inst, ("out",) + key, now)
                st.at += 1
        return out

    def next_release(self) -> float:
        """The earliest release time of a message waiting only for its time (inf: none)."""
        soonest = math.inf
        for key, st in self._out.items():
            if st.at >= self._base + len(self._instances):
                continue
            inst = self._instances[st.at - self._base]
            msgs = inst.outs[key]
            if key[0] not in inst.entered or st.next_out >= len(msgs):
                continue
            m = msgs[st.next_out]
            if m.source is None or (m.source.rank, key[1], m.source.index) in inst.got:
                soonest = min(soonest, m.release)
        return soonest

    def _stream_done(self, inst: Instance, key: tuple, now: float) -> None:
        inst.streams_done.add(key)
        rank = key[1]
        inst.ranks_done[rank] = inst.ranks_done.get(rank, 0) + 1
        if inst.ranks_done[rank] == self._rank_streams[rank]:
            self._rank_at[rank] += 1
            at = self._rank_at[rank] - self._base
            if at < len(self._instances) and rank in self._instances[at].lines:
                self._enter(self._instances[at], rank, now)
        if len(inst.streams_done) == len(self._in) + len(self._out):
            self.finished.append(inst)
            self._drop_finished()

    def _drop_finished(self) -> None:
        while self._instances and len(self._instances[0].streams_done) == len(self._in) + len(self._out):
            done = self._instances.pop(0)
            del self._by_key[(done.params.kind, done.params.seq)]
            self._base += 1

    def waiting(self, rank: int, channel: int) -> bytes:
        """Bytes of `rank`'s on `channel` that no announced collective has claimed yet."""
        return bytes(self._in[(rank, channel)].pending)

    @property
    def in_flight(self) -> list[Instance]:
        return list(self._instances)

    def unannounced(self, now: float, limit: float) -> str | None:
        """Why the run cannot go on, when a real rank's bytes have waited `limit` seconds for a
        collective no start line announced (its NCCL loads no profiler that announces), else None."""
        for (rank, channel), st in self._in.items():
            if st.unclaimed_since is not None and now - st.unclaimed_since >= limit:
                return (f"rank {rank} sent {len(st.pending)} bytes on channel {channel} that no collective claims "
                        f"after {limit:g} s: no profiler start line announced it (NEURONABOX_NCCL_TRACE_START=1 and "
                        "the NeuronaBox profiler plugin must be loaded)")  # fmt: skip
        return None

    def describe(self) -> str:
        """Where each stream stands: what a stuck run reports."""
        lines = []
        for inst in self._instances:
            p = inst.params
            lines.append(f"{p.kind} seq {p.seq} ({p.count} x {p.elem} B): entered {sorted(inst.entered)}, "
                         f"frames in {inst.arrived}, streams done {sorted(inst.streams_done)}")  # fmt: skip
        for key, st in self._out.items():
            lines.append(f"out {key}: instance {st.at}, message {st.next_out}")
        for key, st in self._in.items():
            lines.append(f"in {key}: instance {st.at}, {len(st.pending)} bytes waiting")
        return "; ".join(lines)
