"""Check every NCCL wire fact the dialect relies on against real recordings.

scripts/nccl_record.py leaves, per world size, OUT/w<N>/rank<r>.<pid>.tap (every TCP
connection of real rank r, nccl_patch/wiretap.c) and result.json (torch and NCCL versions,
world size, the collectives run). This script classifies each rank's connections
(controller/dialects/nccl/classify.py) and checks what docs/nccl_wire.md says NCCL sends:
bootstrap handshakes, root check-in and reply, the ring allgathers and R's own slices,
the transport-setup exchange (against `SetupResponder`), the Socket net's preamble and
every data message's size (against `NcclRing`). One table per world size, one line per
fact: PASS, FAIL (with the first failure: rank, connection, index, expected vs observed)
or UNSEEN (nothing in the recording bears on it).

    python scripts/nccl_verify.py OUT [--version 2.28.9]

Exit status: 0 when every fact seen passes, 1 when one fails, 2 when OUT is missing or
malformed (one line says what).
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import struct
import sys
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from neuronabox.controller.dialects.nccl.classify import (  # noqa: E402
    ConnKind,
    NetSocket,
    P2pMessage,
    Record,
    RingLink,
    classify,
    nccl_magics,
    ring_frames_per_allgather,
    split_allgathers,
)
from neuronabox.controller.dialects.nccl.errors import LayoutMismatch, NcclError, NcclWireError  # noqa: E402
from neuronabox.controller.dialects.nccl.layouts import (  # noqa: E402
    check_own_all_gather_info,
    check_own_peer_info,
    check_own_ring_info,
    decode_recv_connect_info,
    decode_send_connect_info,
)
from neuronabox.controller.dialects.nccl.setup import PeerRole, SetupResponder  # noqa: E402
from neuronabox.controller.dialects.nccl.transcript import Connection, connections, read_records  # noqa: E402
from neuronabox.controller.dialects.nccl.versions import Layout, NcclVersion, layout_for  # noqa: E402
from neuronabox.controller.dialects.nccl.wire import (  # noqa: E402
    NCCL_SOCKET_MAGIC,
    SOCKADDR_SIZE,
    SockAddr,
    SocketNetHandle,
    SocketType,
)

from neuronabox.schedules.kinds import Kind  # noqa: E402
from neuronabox.schedules.nccl import NcclConfig, NcclRing  # noqa: E402

BOOTSTRAP_KINDS = (ConnKind.ROOT_CHECKIN, ConnKind.ROOT_REPLY, ConnKind.RING_LINK, ConnKind.P2P,
                   ConnKind.BOOTSTRAP_OTHER)  # fmt: skip
ALLGATHER_NAMES = ("ringAllInfo", "peerInfo", "allGatherInfo")
TAP_NAME = re.compile(r"rank(\d+)\.(\d+)\.tap(\.gz)?")  # committed fixtures are gzipped
ELEM_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "float64": 8, "double": 8,
              "int32": 4, "int64": 8, "uint8": 1, "int8": 1}  # fmt: skip
TIMING_REPS = (20, 5)  # nccl_record.py --timing: 20 repetitions up to 4 MiB, 5 above, each after 3 warm-ups
TIMING_WARMUP = 3
SHOWN = 12  # list items shown in an observed value


class BadInput(Exception):
    """OUT is missing or malformed: one line, exit 2."""


class Status(Enum):
    PASS = "PASS"
    FAIL = "FAIL"
    UNSEEN = "UNSEEN"


@dataclass(frozen=True)
class Fact:
    name: str
    status: Status
    expected: str
    observed: str

    def line(self) -> str:
        return f"{self.status.value:<6} {self.name:<22} expected {self.expected}; observed {self.observed}"


@dataclass
class Tally:
    """Evidence for one fact gathered over every rank: the first failure is what the line shows."""

    name: str
    expected: str
    fails: list[str] = field(default_factory=list)
    seen: int = 0
    notes: list[str] = field(default_factory=list)

    def ok(self) -> None:
        self.seen += 1

    def fail(self, why: str) -> None:
        self.seen += 1
        self.fails.append(why)

    def check(self, good: bool, why: str) -> None:
        self.ok() if good else self.fail(why)

    def fact(self, observed: str) -> Fact:
        if self.fails:
            more = f" (+{len(self.fails) - 1} more)" if len(self.fails) > 1 else ""
            return Fact(self.name, Status.FAIL, self.expected, self.fails[0] + more)
        if not self.seen:
            return Fact(self.name, Status.UNSEEN, self.expected, "; ".join(self.notes) or "nothing recorded")
        return Fact(self.name, Status.PASS, self.expected, "; ".join([observed, *self.notes]) if observed else
                    "; ".join(self.notes))  # fmt: skip


def shown(items: Any) -> str:
    items = list(items)
    head = ", ".join(str(i) for i in items[:SHOWN])
    return f"[{head}{', ...' if len(items) > SHOWN else ''}]"


# ---------------------------------------------------------------- what nccl_record.py ran

class Item(NamedTuple):
    """One collective of the recorded program, as NCCL sees it."""

    label: str
    kind: Kind
    count: int  # elements: whole tensor (allreduce, broadcast), per rank (allgather, reduce-scatter)
    elem: int
    root: int = 0  # broadcast's root


def elem_bytes(dtype: str) -> int:
    name = dtype.rsplit(".", 1)[-1]
    if name not in ELEM_BYTES:
        raise BadInput(f"result.json names a dtype {dtype!r} this verifier does not size")
    return ELEM_BYTES[name]


def barrier(label: str) -> Item:
    # PyTorch's ProcessGroupNCCL::barrier is an allreduce of at::zeros({1}, kFloat) on the
    # bound device (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp): one float32 on the wire.
    return Item(label, Kind.ALLREDUCE, 1, 4)


def collective(kind: str, nbytes: int, dtype: str, label: str, root: int = 0) -> Item:
    if kind == "barrier":
        return barrier(label)
    elem = elem_bytes(dtype)
    try:
        k = Kind(kind)
    except ValueError:
        raise BadInput(f"result.json names a collective {kind!r} this verifier has no schedule for") from None
    return Item(label, k, max(1, nbytes // elem), elem, root)  # nccl_record.run: n = max(1, nbytes // element size)


def program(result: dict[str, Any]) -> list[Item]:
    """The collectives nccl_record.py's worker ran, in order: result.json's `checks` (its run
    order: KINDS x CHECK_SIZES, allreduce also in bfloat16, one barrier), then with --timing
    per kind and size 3 warm-ups + 20 (<= 4 MiB) or 5 repetitions, each a barrier then the
    collective in float32, and last the barrier every rank runs before destroy_process_group."""
    items: list[Item] = []
    for c in result.get("checks", []):
        try:
            kind, nbytes, dtype = c["kind"], int(c["bytes"]), str(c.get("dtype", "torch.float32"))
            root = int(c.get("root", 0))
        except (KeyError, TypeError, ValueError):
            raise BadInput(f"result.json has a malformed check {c!r}") from None
        items.append(collective(kind, nbytes, dtype, f"{kind} {nbytes} B {dtype.rsplit('.', 1)[-1]}", root))
    for kind, sizes in (result.get("median_s") or {}).items():
        for key in sizes:
            nbytes = int(key)
            reps = TIMING_REPS[0] if nbytes <= 1 << 22 else TIMING_REPS[1]
            for rep in range(TIMING_WARMUP + reps):
                items.append(barrier(f"timing barrier before {kind} {nbytes} B #{rep}"))
                items.append(collective(kind, nbytes, "torch.float32", f"timing {kind} {nbytes} B #{rep}"))
    if result.get("closing_barrier", True):  # torch's barrier before destroy; the rig (scripts/nccl_rig.py) has none
        items.append(barrier("closing barrier"))
    return items


class Expected(NamedTuple):
    nbytes: int
    item: int  # index in the program
    msg: int  # message index inside that collective


def expected_messages(items: list[Item], world: int, rank: int, channel: int, channels: int,
                      send: bool, min_traffic: int) -> Iterator[Expected]:  # fmt: skip
    config = NcclConfig(channels=channels, min_traffic_per_channel=min_traffic)
    for i, it in enumerate(items):
        ring = NcclRing(it.kind, world, it.count, it.elem, it.root, config)
        msgs = ring.sends(rank) if send else ring.recvs(rank)
        for j, m in enumerate(x for x in msgs if x.channel == channel):
            yield Expected(m.nbytes, i, j)


# ---------------------------------------------------------------- loading OUT/w<N>

@dataclass
class RankData:
    rank: int
    conns: list[Connection]
    records: list[Record] = field(default_factory=list)

    def of(self, kind: ConnKind, outgoing: bool | None = None) -> list[Any]:
        return [r for r in self.records if r.kind is kind and (outgoing is None or r.outgoing is outgoing)]


@dataclass
class WorldData:
    name: str
    result: dict[str, Any]
    world: int
    ranks: dict[int, RankData]


def load_world(path: Path) -> WorldData:
    rj = path / "result.json"
    if not rj.is_file():
        raise BadInput(f"{path} has no result.json (did nccl_record.py finish?)")
    try:
        result = json.loads(rj.read_text())
        world = int(result["world"])
    except (ValueError, KeyError, TypeError) as exc:
        raise BadInput(f"{rj} is malformed: {exc}") from None
    by_rank: dict[int, list[Connection]] = defaultdict(list)
    for tap in sorted(path.glob("rank*.tap*")):
        m = TAP_NAME.fullmatch(tap.name)
        if m is None:
            continue
        try:
            raw = gzip.decompress(tap.read_bytes()) if m[3] else tap.read_bytes()
            by_rank[int(m[1])].extend(connections(read_records(raw)))
        except (NcclWireError, OSError, EOFError) as exc:
            raise BadInput(f"{tap}: {exc}") from None
    ranks = {r: RankData(r, sorted(c, key=lambda x: x.opened_ns)) for r, c in sorted(by_rank.items())}
    return WorldData(path.name, result, world, ranks)


def classify_world(data: WorldData, layout: Layout) -> None:
    """Classify every rank with the magics any rank of the world showed: one communicator, one magic."""
    magics: set[int] = set()
    for rd in data.ranks.values():
        magics |= nccl_magics(rd.conns)
    for rd in data.ranks.values():
        rd.records = classify(rd.conns, layout, magics)


# ---------------------------------------------------------------- the checks

def addr_of(raw: bytes | None) -> SockAddr | None:
    if raw is None or len(raw) < SOCKADDR_SIZE:
        return None
    try:
        return SockAddr.decode(raw[:SOCKADDR_SIZE])
    except NcclWireError:
        return None


def find_unique_id(conns: list[Connection], magic: int) -> tuple[str, SockAddr] | None:
    """The 128-byte unique id inside a c10d store SET ([u8 query][u64 len][key][u64 128][id],
    torch/csrc/distributed/c10d/TCPStore.cpp): its key and the root address it names."""
    needle = struct.pack("<Q", magic)
    keyless = None
    for conn in conns:
        for stream in (bytes(conn.sent), bytes(conn.received)):
            at = stream.find(needle)
            while at >= 0:
                root = addr_of(stream[at + 8 : at + 8 + SOCKADDR_SIZE])
                if root is not None and at >= 8 and struct.unpack_from("<Q", stream, at - 8)[0] == 128:
                    key = ""
                    for n in range(1, min(512, at - 16) + 1):
                        start = at - 16 - n
                        if struct.unpack_from("<Q", stream, start)[0] == n:
                            key = stream[start + 8 : at - 8].decode("utf-8", "replace")
                            break
                    if key:
                        return key, root
                    keyless = keyless or ("", root)  # a GET reply: the id without its key
                at = stream.find(needle, at + 1)
    return keyless


class WorldCheck:
    """Every fact for one world size; `facts()` returns the table's lines in order."""

    def __init__(self, data: WorldData, layout: Layout, version_arg: NcclVersion | None):
        self.data, self.layout, self.version_arg = data, layout, version_arg
        self.w = data.world
        self.ranks = data.ranks
        self.ext: dict[int, Any] = {}  # rank -> ExtInfo from its own check-in
        self.comm_magic: int | None = None

    # -- helpers
    def recs(self, kind: ConnKind, outgoing: bool | None = None) -> Iterator[tuple[int, Any]]:
        for r, rd in self.ranks.items():
            for rec in rd.of(kind, outgoing):
                yield r, rec

    def facts(self) -> list[Fact]:
        out = [self.taps(), self.version()]
        out += self.handshakes()
        out += self.root()
        out += self.allgathers()
        out += self.setup()
        out += self.net()
        return out

    # -- recording and version
    def taps(self) -> Fact:
        t = Tally("recording", f"one transcript per rank 0..{self.w - 1}")
        missing = [r for r in range(self.w) if r not in self.ranks]
        extra = [r for r in self.ranks if not 0 <= r < self.w]
        t.check(not missing and not extra, f"missing ranks {missing}, unexpected ranks {extra}")
        cut = sum(1 for rd in self.ranks.values() for c in rd.conns if not c.complete)
        n = sum(len(rd.conns) for rd in self.ranks.values())
        return t.fact(f"{len(self.ranks)} ranks, {n} connections ({cut} cut by the recording's cap)")

    def version(self) -> Fact:
        recorded = str(self.data.result.get("nccl", "?"))
        t = Tally("nccl.version", f"NCCL {self.layout.version} (layout {self.layout.first}..{self.layout.last})")
        if self.version_arg is not None and recorded != "?":
            try:
                same = NcclVersion.parse(recorded) == self.version_arg
            except ValueError:
                same = False
            t.check(same, f"result.json says NCCL {recorded}, --version says {self.version_arg}")
        else:
            t.ok()
        return t.fact(f"result.json: NCCL {recorded}, torch {self.data.result.get('torch', '?')}")

    # -- handshakes and the unique id
    def handshakes(self) -> list[Fact]:
        t = Tally("bootstrap.handshake", "type 1 (BOOTSTRAP) and one magic for the communicator on every "
                  "bootstrap connection")  # fmt: skip
        magics: Counter[int] = Counter()
        for kind in BOOTSTRAP_KINDS:
            for _r, rec in self.recs(kind):
                magics[rec.handshake.magic] += 1
                t.check(rec.handshake.type == SocketType.BOOTSTRAP, f"type {rec.handshake.type}")
        if magics:
            self.comm_magic = magics.most_common(1)[0][0]
        if len(magics) > 1:
            t.fail(f"{len(magics)} magics: {', '.join(hex(m) for m in magics)}")
        for r, rd in self.ranks.items():
            if not any(rec.kind in BOOTSTRAP_KINDS for rec in rd.records):
                t.fail(f"rank {r}: no bootstrap connection recognised")
        obs = f"{sum(magics.values())} connections, type 1, magic {hex(self.comm_magic or 0)}"
        facts = [t.fact(obs)]
        u = Tally("uid.store", "the 128-byte unique id (comm magic, root address) in a c10d store SET, "
                  "the root address where every rank checks in")  # fmt: skip
        found = None
        if self.comm_magic is not None:
            for rd in self.ranks.values():
                found = find_unique_id(rd.conns, self.comm_magic)
                if found:
                    break
        obs = ""
        if found:
            key, root = found
            dialled = {rec.peer for _r, rec in self.recs(ConnKind.ROOT_CHECKIN, outgoing=True)}
            u.check(dialled <= {str(root)}, f"the id names root {root}, check-ins dialled {shown(sorted(dialled))}")
            obs = f"key {key!r}, root {root}"
        elif self.data.result.get("unique_id_via"):  # the rig (scripts/nccl_rig.py) passes it without a store
            u.notes.append(f"no store traffic: the unique id went {self.data.result['unique_id_via']}")
        else:
            u.notes.append("no store traffic carried the comm magic")
        facts.append(u.fact(obs))
        return facts

    # -- root check-in and reply
    def root(self) -> list[Fact]:
        lay, w = self.layout, self.w
        size = Tally("extinfo.size", f"{lay.ext_info_size} bytes, one check-in per rank, {w} received by the root")
        fields = Tally("extinfo.fields", f"rank = the tap's rank, nranks {w}, iroot 0, nroots 1"
                       + (", offset 0" if lay.ext_offset_off is not None else "") + ", IPv4 addresses")
        for r, rd in self.ranks.items():
            mine = rd.of(ConnKind.ROOT_CHECKIN, outgoing=True)
            if len(mine) != 1:
                odd = [rec.frames.sizes[0] for rec in rd.of(ConnKind.BOOTSTRAP_OTHER)
                       if rec.frames and len(rec.frames.sizes) == 1]  # fmt: skip
                size.fail(f"rank {r}: {len(mine)} check-ins of {lay.ext_info_size} B sent"
                          + (f"; one-frame bootstrap connections of sizes {shown(odd)}" if odd else ""))
                continue
            size.ok()
            ext = mine[0].ext
            if ext is None:
                fields.notes.append(f"rank {r}: extInfo not kept")
                continue
            self.ext[r] = ext
            want = {"rank": r, "nranks": w, "iroot": 0, "nroots": 1}
            if lay.ext_offset_off is not None:
                want["offset"] = 0
            bad = [f"{k} {getattr(ext, k)} (expected {v})" for k, v in want.items() if getattr(ext, k) != v]
            for name, raw in (("listenRootAddress", ext.listen_root), ("connectInfo", ext.connect_info)):
                if addr_of(raw) is None:
                    bad.append(f"{name} is not an IPv4 address")
            fields.check(not bad, f"rank {r}'s extInfo: {', '.join(bad)}")
        got = sorted(rec.ext.rank for _r, rec in self.recs(ConnKind.ROOT_CHECKIN, outgoing=False) if rec.ext)
        if got or self.ranks:
            size.check(got == list(range(w)), f"the root received check-ins from ranks {shown(got)}")
        sizes = {rec.size for _r, rec in self.recs(ConnKind.ROOT_CHECKIN)}
        facts = [size.fact(f"{shown(sorted(sizes))} B, root got ranks {shown(got)}"),
                 fields.fact(f"ranks {shown(sorted(self.ext))} as named, nranks {w}, single root")]

        rsize = Tally("rootreply.size", f"one {lay.root_reply_size}-byte reply to each rank, {w} sent by the root")
        content = Tally("rootreply.ring", "rank r's reply = rank r+1's ring address (its extInfo.connectInfo), "
                        "and rank r dials it for its ring link")  # fmt: skip
        for r, rd in self.ranks.items():
            mine = rd.of(ConnKind.ROOT_REPLY, outgoing=False)
            if len(mine) != 1:
                rsize.fail(f"rank {r}: {len(mine)} replies of {lay.root_reply_size} B received")
                continue
            rsize.ok()
            nxt = self.ext.get((r + 1) % w)
            if nxt is None or mine[0].ring_addr is None:
                content.notes.append(f"rank {r}: reply or rank {(r + 1) % w}'s extInfo not seen")
                continue
            want = addr_of(nxt.connect_info)
            content.check(mine[0].ring_addr == want,
                          f"rank {r}'s reply names {mine[0].ring_addr}, rank {(r + 1) % w}'s ring address is {want}")
            links = rd.of(ConnKind.RING_LINK, outgoing=True)
            if links:
                content.check(links[0].peer == str(want),
                              f"rank {r} dialled {links[0].peer} for its ring, the reply named {want}")
        sent = sum(1 for _ in self.recs(ConnKind.ROOT_REPLY, outgoing=True))
        if got:  # the root's process was recorded (PyTorch's rank 0 calls ncclGetUniqueId: the root thread)
            rsize.check(sent == w, f"the root sent {sent} replies for {w} ranks")
        return facts + [rsize.fact(f"{lay.root_reply_size} B to every rank, the root sent {sent}"),
                content.fact("every reply names the successor's ring address, every ring link dials it")]

    # -- ring allgathers and R's own slices
    def allgathers(self) -> list[Fact]:
        lay, w = self.layout, self.w
        want = [lay.ring_info_size, lay.peer_info_size, lay.all_gather_info_size]
        n0, n1 = ring_frames_per_allgather(w, lay.bidirectional_ring)
        form = "bidirectional" if lay.bidirectional_ring else "one-directional"
        sizes = Tally("allgather.sizes", f"{shown(want)} ({', '.join(ALLGATHER_NAMES)}) first, in that order")
        direction = Tally("allgather.direction", f"{form}: per allgather {n0} frame(s) to the successor, "
                          f"{n1} back")  # fmt: skip
        ring = Tally("ringinfo.own", "R's ringAllInfo: an IPv4 p2p address @0, where p2p messages to R arrive")
        peer = Tally("peerinfo.own", f"rank @{lay.peer_rank_off}, version {lay.version.code if lay.version else '?'} "
                     f"@{lay.peer_version_off}, distinct hostHash @{lay.peer_host_hash_off}")  # fmt: skip
        agi = Tally("allgatherinfo.own", f"ringRecv[0] = rank @{lay.topo.ring_recv}, ringPrev[0] = -1 "
                    f"@{lay.topo.ring_prev}")  # fmt: skip
        hashes: dict[int, int] = {}
        seen_sizes: dict[int, list[int]] = {}
        for r, rd in self.ranks.items():
            outs: list[RingLink] = rd.of(ConnKind.RING_LINK, outgoing=True)
            ins: list[RingLink] = rd.of(ConnKind.RING_LINK, outgoing=False)
            if len(outs) != 1 or len(ins) != 1:
                direction.fail(f"rank {r}: {len(outs)} ring links dialled, {len(ins)} accepted (expected 1 and 1)")
                if not outs:
                    continue
            link = outs[0]
            ags = split_allgathers(link, w, lay.bidirectional_ring)
            other = split_allgathers(link, w, not lay.bidirectional_ring)
            if ags is None and other is None:
                direction.fail(f"rank {r}: frames fit neither form: to successor {shown(link.forward.sizes)}, "
                               f"back {shown(link.backward.sizes)}")
                sizes.fail(f"rank {r}: allgathers unreadable; frames to successor {shown(link.forward.sizes)}")
                continue
            if ags is None:
                fits = "one-directional" if lay.bidirectional_ring else "bidirectional"
                direction.fail(f"rank {r}: {len(link.forward.sizes)} frames to successor and "
                               f"{len(link.backward.sizes)} back fit {fits}, not {form}")
                ags = other
            else:
                direction.ok()
            assert ags is not None
            got = [a.size for a in ags]
            seen_sizes[r] = got
            for i, name in enumerate(ALLGATHER_NAMES):
                if i >= len(got):
                    sizes.fail(f"rank {r}: only {len(got)} allgathers, no {name}")
                    break
                sizes.check(got[i] == want[i], f"rank {r}, allgather {i} ({name}): expected {want[i]} B, "
                            f"observed {got[i]} B")  # fmt: skip
            own = [a.own for a in ags]
            self._own_slices(r, own, ring, peer, agi, hashes)
        if w == 2 and direction.seen and not direction.fails:
            direction.notes.append("W = 2: one frame one way per allgather in both forms, so not told apart")
        dup = [h for h, n in Counter(hashes.values()).items() if n > 1]
        if dup:
            peer.fail(f"hostHash {hex(dup[0])} shared by ranks {sorted(r for r, h in hashes.items() if h == dup[0])}")
        extra = sorted({tuple(s[3:]) for s in seen_sizes.values() if len(s) > 3})
        obs = shown(next(iter(seen_sizes.values()), [])) + (f"; later allgathers {extra}" if extra else "")
        return [sizes.fact(obs), direction.fact(f"{form} on every rank"),
                ring.fact("every rank's p2p address is where its p2p messages arrive"),
                peer.fact(f"ranks as named, version {lay.version.code if lay.version else '?'}, "
                          f"{len(set(hashes.values()))} distinct hostHash"),
                agi.fact("every rank alone on its node")]

    def _own_slices(self, r: int, own: list[bytes | None], ring: Tally, peer: Tally, agi: Tally,
                    hashes: dict[int, int]) -> None:  # fmt: skip
        lay = self.layout
        checks = ((0, ring, lambda s: check_own_ring_info(lay, s)),
                  (1, peer, lambda s: check_own_peer_info(lay, s, r)),
                  (2, agi, lambda s: check_own_all_gather_info(lay, s, r)))  # fmt: skip
        for i, tally, fn in checks:
            if i >= len(own) or own[i] is None:
                continue
            try:
                fn(own[i])
                tally.ok()
            except LayoutMismatch as exc:
                tally.fail(f"rank {r}: {exc}")
        if own and own[0] is not None and len(own[0]) >= SOCKADDR_SIZE:
            p2p = addr_of(own[0][lay.ring_info_p2p_off :])
            for rec in self.ranks[r].of(ConnKind.P2P, outgoing=False):
                ring.check(rec.local == str(p2p), f"rank {r}: a p2p message arrived at {rec.local}, "
                           f"its ringAllInfo says {p2p}")  # fmt: skip
        if len(own) > 1 and own[1] is not None and len(own[1]) >= lay.peer_host_hash_off + 8:
            hashes[r] = struct.unpack_from("<Q", own[1], lay.peer_host_hash_off)[0]

    # -- transport setup over bootstrap p2p
    def setup(self) -> list[Fact]:
        lay, w = self.layout, self.w
        sync_bit = lay.sync_tag_bit
        ring_tag = (1 << 8) + 0 + 1  # distance 1, ring graph id 0
        n = 1 if w == 2 else 2
        tags = Tally("setup.tags", f"each rank sends {n} x tag {ring_tag} (first ring) then {n} x tag "
                     f"{ring_tag + sync_bit} (its sync)")  # fmt: skip
        sizes = Tally("setup.sizes", f"one payload per message, a positive multiple of {lay.connect_size} B")
        sync = Tally("setup.sync", f"sync messages (tag bit {sync_bit}) carry {lay.sync_payload_size} B")
        reply = Tally("setup.reply", "SetupResponder's reply size = what the real peer sent back")
        entries = Tally("setup.entries", "send entry proxyRank = sender, recv entry a Socket-net handle (magic "
                        f"{hex(NCCL_SOCKET_MAGIC)}, nSocks 0), useGdr 0, handle address = where the sender dials")
        # every message by (sender, receiver, tag), from the receiving end (it names the sender)
        msgs: dict[tuple[int, int, int], P2pMessage] = {}
        for r, rec in self.recs(ConnKind.P2P, outgoing=False):
            msgs.setdefault((rec.sender, r, rec.tag), rec)
        for r, rd in self.ranks.items():
            sent_tags = [rec.tag for rec in rd.of(ConnKind.P2P, outgoing=True)]
            setup_tags = [t for t in sent_tags if t in (ring_tag, ring_tag + sync_bit)]
            if sent_tags:
                tags.check(setup_tags == [ring_tag] * n + [ring_tag + sync_bit] * n,
                           f"rank {r} sent tags {shown(sent_tags)}")
        for (s, d, tag), rec in sorted(msgs.items()):
            if not 1 <= tag >> 8 < w or not tag & (sync_bit - 1):
                continue  # not a transport-setup tag
            if tag & sync_bit:
                sync.check(rec.sizes == (lay.sync_payload_size,),
                           f"rank {s} -> {d} tag {tag}: payload sizes {shown(rec.sizes)}")
            else:
                sizes.check(len(rec.sizes) == 1 and rec.sizes[0] > 0 and rec.sizes[0] % lay.connect_size == 0,
                            f"rank {s} -> {d} tag {tag}: payload sizes {shown(rec.sizes)}")
                self._entries(s, d, tag, rec, entries)
            self._reply(s, d, tag, rec, msgs, reply)
        setup_sizes = sorted({rec.sizes[0] for (_s, _d, t), rec in msgs.items() if rec.sizes and not t & sync_bit})
        return [tags.fact(f"{ring_tag} then {ring_tag + sync_bit} on every rank"),
                sizes.fact(f"{shown(setup_sizes)} B"), sync.fact("empty"),
                reply.fact("every reply size as predicted"), entries.fact("as expected")]

    def _reply(self, s: int, d: int, tag: int, rec: P2pMessage, msgs: dict, reply: Tally) -> None:
        if d not in self.ranks or s not in self.ranks or not rec.sizes:
            return
        responder = SetupResponder(self.layout, s, self.w, lambda *_: bytes(128))
        payload = rec.payloads[0] if rec.payloads[0] is not None else bytes(rec.sizes[0])
        back = msgs.get((d, s, tag))
        try:
            predicted = len(responder.respond(d, tag, payload).payload)
        except NcclWireError as exc:
            reply.fail(f"rank {s} -> {d} tag {tag}: the responder refuses: {exc}")
            return
        if back is None or not back.sizes:
            reply.fail(f"rank {s} -> {d} tag {tag}: rank {d} sent nothing back with tag {tag}")
            return
        reply.check(back.sizes[0] == predicted, f"rank {s} -> {d} tag {tag}: responder answers {predicted} B, "
                    f"rank {d} sent {back.sizes[0]} B")  # fmt: skip

    def _entries(self, s: int, d: int, tag: int, rec: P2pMessage, entries: Tally) -> None:
        lay = self.layout
        raw = rec.payloads[0] if rec.payloads else None
        if raw is None:
            return
        try:
            _t, role = SetupResponder(lay, s, self.w, lambda *_: bytes(128)).role_of(d, tag)
        except NcclWireError as exc:
            entries.fail(f"rank {s} -> {d} tag {tag}: {exc}")
            return
        blobs = [raw[o : o + lay.connect_size] for o in range(0, len(raw), lay.connect_size)]
        half = len(blobs) // 2
        recv_blobs = blobs if role is PeerRole.SENDS_TO_R else blobs[:half] if role is PeerRole.BOTH else []
        send_blobs = blobs if role is PeerRole.RECEIVES_FROM_R else blobs[half:] if role is PeerRole.BOTH else []
        where = f"rank {s} -> {d} tag {tag}"
        for b in send_blobs:
            proxy, gdr = decode_send_connect_info(lay, b)
            entries.check(proxy == s and gdr == 0, f"{where}: send entry proxyRank {proxy}, useGdr {gdr}")
        dialled = {rec2.peer for rec2 in self.ranks[d].of(ConnKind.NET_SOCKET, outgoing=True)} if d in self.ranks \
            else None  # fmt: skip
        for b in recv_blobs:
            handle, gdr = decode_recv_connect_info(lay, b)
            try:
                h = SocketNetHandle.decode(handle)
            except NcclWireError as exc:
                entries.fail(f"{where}: recv entry handle: {exc}")
                continue
            entries.check(h.magic == NCCL_SOCKET_MAGIC and h.n_socks == 0 and gdr == 0,
                          f"{where}: handle magic {hex(h.magic)}, nSocks {h.n_socks}, useGdr {gdr}")
            if dialled is not None:  # rank d sends to s through s's handle
                entries.check(str(h.connect_addr) in dialled,
                              f"{where}: handle address {h.connect_addr}, rank {d} dialled {shown(sorted(dialled))}")

    # -- the Socket net's data
    def net(self) -> list[Fact]:
        w = self.w
        pre = Tally("net.preamble", f"type 3, magic {hex(NCCL_SOCKET_MAGIC)}, socket index 0 (nSocks 0), "
                    "one connection each way per channel, nothing sent back")  # fmt: skip
        items = program(self.data.result)
        sends = Tally("net.sends", f"each frame's size = NcclRing(...).sends(rank) over {len(items)} collectives "
                      "(result.json's checks, its timing loop if any, the closing barrier)")  # fmt: skip
        recvs = Tally("net.recvs", "each frame's size = NcclRing(...).recvs(rank), same program")
        algo = str(self.data.result.get("algo", "Ring"))
        if algo != "Ring":  # the tree's peers and its channel-to-tree mapping are not matched here yet
            for t in (pre, sends, recvs):
                t.notes.append(f"NCCL_ALGO={algo}: the Socket-net checks cover the ring only")
            return [pre.fact(""), sends.fact(""), recvs.fact("")]
        counts = []
        for r, rd in self.ranks.items():
            outs: list[NetSocket] = rd.of(ConnKind.NET_SOCKET, outgoing=True)
            ins: list[NetSocket] = rd.of(ConnKind.NET_SOCKET, outgoing=False)
            pre.check(len(outs) == len(ins) and outs,
                      f"rank {r}: {len(outs)} Socket-net connections dialled, {len(ins)} accepted")
            for rec in outs + ins:
                bad = []
                if rec.handshake.magic != NCCL_SOCKET_MAGIC:
                    bad.append(f"magic {hex(rec.handshake.magic)}")
                if rec.sock_index != 0:
                    bad.append(f"socket index {rec.sock_index}")
                if rec.reverse_bytes:
                    bad.append(f"{rec.reverse_bytes} B sent back")
                pre.check(not bad, f"rank {r}, connection {rec.index}: {', '.join(bad)}")
            channels = max(1, len(outs))
            for tally, group, send in ((sends, outs, True), (recvs, ins, False)):
                for ch, rec in enumerate(group):
                    exp = list(expected_messages(items, w, r, ch, channels, send, self.layout.min_traffic_per_channel))
                    counts.append(len(exp))
                    self._match(tally, r, ch, rec, exp, items, send)
        total = f"{sum(counts)} messages on {len(counts)} connections"
        return [pre.fact("as expected"), sends.fact(total), recvs.fact(total)]

    def _match(self, tally: Tally, r: int, ch: int, rec: NetSocket, exp: list[Expected], items: list[Item],
               send: bool) -> None:  # fmt: skip
        obs = rec.frames.sizes
        where = f"rank {r} {'to next' if send else 'from prev'} (connection {rec.index}, channel {ch})"
        for i, (o, e) in enumerate(zip(obs, exp, strict=False)):
            if o != e.nbytes:
                tally.fail(f"{where}, message {i} ({items[e.item].label}, its message {e.msg}): "
                           f"expected {e.nbytes} B, observed {o} B")
                return
        if len(obs) > len(exp):
            tally.fail(f"{where}, message {len(exp)}: expected none (the program has {len(exp)}), "
                       f"observed {obs[len(exp)]} B")
            return
        if len(obs) < len(exp):
            e = exp[len(obs)]
            if rec.frames.cut:
                tally.ok()
                tally.notes.append(f"{where}: {len(obs)} of {len(exp)} checked, the recording lost the rest")
                return
            why = rec.frames.bad or ("the stream ends mid-frame" if rec.frames.partial else "the stream ends")
            tally.fail(f"{where}, message {len(obs)} ({items[e.item].label}, its message {e.msg}): "
                       f"expected {e.nbytes} B, observed none ({why})")
            return
        tally.ok()


# ---------------------------------------------------------------- main

def world_dirs(out: Path) -> list[Path]:
    if not out.is_dir():
        raise BadInput(f"{out} is not a directory")
    dirs = sorted((p for p in out.iterdir() if p.is_dir() and re.fullmatch(r"w\d+", p.name)),
                  key=lambda p: int(p.name[1:]))  # fmt: skip
    if not dirs:
        raise BadInput(f"{out} holds no w<N>/ directory (nccl_record.py --out {out})")
    return dirs


def verify(out: Path, version: str | None) -> tuple[list[tuple[str, list[Fact]]], int]:
    """(per world: header and facts, exit status)."""
    tables = []
    status = 0
    version_arg = NcclVersion.parse(version) if version else None
    for path in world_dirs(out):
        data = load_world(path)
        named = version or str(data.result.get("nccl") or "")
        if not named:
            raise BadInput(f"{path}/result.json names no NCCL version; pass --version")
        try:
            layout = layout_for(named)
        except (NcclError, ValueError) as exc:
            raise BadInput(str(exc)) from None
        classify_world(data, layout)
        facts = WorldCheck(data, layout, version_arg).facts()
        head = (f"== {path.name}: world {data.world}, NCCL {layout.version} "
                f"(torch {data.result.get('torch', '?')}, {data.result.get('gpu', '?')}) ==")  # fmt: skip
        tables.append((head, facts))
        if any(f.status is Status.FAIL for f in facts):
            status = 1
    return tables, status


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", help="the --out directory of scripts/nccl_record.py (holds w<N>/)")
    p.add_argument("--version", help="NCCL version to check against (default: result.json's)")
    args = p.parse_args(argv)
    try:
        tables, status = verify(Path(args.out), args.version)
    except BadInput as exc:
        print(f"nccl_verify: {exc}")
        return 2
    except ValueError as exc:  # a --version that does not parse
        print(f"nccl_verify: {exc}")
        return 2
    for head, facts in tables:
        print(head)
        for f in facts:
            print(f.line())
        counts = Counter(f.status for f in facts)
        print(f"-- {counts[Status.PASS]} PASS, {counts[Status.FAIL]} FAIL, {counts[Status.UNSEEN]} UNSEEN")
    return status


if __name__ == "__main__":
    sys.exit(main())
