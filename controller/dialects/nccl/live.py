"""The NCCL dialect's socket driver: the controller plays every emulated rank of one NCCL
communicator to the real ranks, end to end, on NCCL's own TCP wire.

It composes the sans-IO layers (wire, bootstrap, layouts, setup, relay) and owns the
sockets, one selector loop, and the clock it passes in. Per emulated rank e it listens on
one loopback port, e's bootstrap address: the root dials it with e's root reply (128 B),
a real rank dials it as its ring successor (the first ring allgather's slice size comes
first) or for a bootstrap p2p message (an 8-byte preamble first); the first frame's size
tells them apart. One more port takes the real ranks' Socket-net connections, each named
by the token in the handle magic the controller gave it. What it does, in NCCL's order
(docs/nccl_wire.md, "The live controller"):

1. the unique id: the real rank 0 made it (the controller dials its root with every
   emulated rank's check-in), or rank 0 is emulated and the controller is the root;
2. the ring link and the bootstrap allgathers, emulated slices cloned from the mirror
   rank's own (`layouts`), other real ranks' slices forwarded;
3. the transport setup (`SetupResponder`) and the Socket-net connections;
4. every collective's data through `NcclRelay`, released at the delay model's times.

Each collective's parameters come from the profiler plugin's start lines on a FIFO.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import time
from collections.abc import Callable

from .bootstrap import RingSide, decode_root_reply, root_checkins
from .errors import NcclError, NcclWireError
from .layouts import decode_recv_connect_info
from .relay import CollParams, Instance, NcclRelay
from .ring_link import BootstrapRing
from .setup import PeerRole, SetupResponder
from .sockets import Conn, Role, SocketLoop
from .versions import Layout
from .wire import (
    HANDSHAKE,
    P2P_ACK,
    SIZE,
    ExtInfo,
    FrameReader,
    SockAddr,
    SocketNetHandle,
    SocketType,
    UniqueId,
    decode_handshake,
    decode_net_socket_preamble,
    decode_p2p_preamble,
    encode_frame,
    encode_handshake,
    encode_net_socket_preamble,
    encode_p2p_preamble,
)

TOKEN_BASE = 0x4E42580000000000  # "NBX": the net handle magic that names (real rank, position)
MAX_P2P = 1 << 20
SPIN = 1.5e-3  # the last stretch before a release is polled, not slept: epoll rounds its sleep up to 1 ms
DEBUG = os.environ.get("NEURONABOX_NCCL_DEBUG") == "1"  # each read, on stderr


def recv_handle_for(rank: int, net_addr: SockAddr):
    """The handles the controller gives `rank` to dial: its own listener, the magic naming
    (rank, position) so the connection names itself when it comes."""

    def handle(peer: int, tag: int, position: int) -> bytes:
        return SocketNetHandle(net_addr, magic=TOKEN_BASE | rank << 8 | position).encode()

    return handle


def token_owner(magic: int) -> tuple[int | None, int]:
    """(rank, position) a handle's magic names, or (None, 0) for one the controller never gave."""
    if magic & ~0xFFFFFF != TOKEN_BASE:
        return None, 0
    return (magic >> 8) & 0xFFFF, magic & 0xFF


def strip_handshake(c: Conn, want: SocketType, magic: int) -> bool:
    """Strip and check the 12-byte connect handshake off `c`'s input; False while it is incomplete."""
    if len(c.inbuf) < HANDSHAKE.size:
        return False
    got_magic, kind = decode_handshake(bytes(c.inbuf[: HANDSHAKE.size]))
    if kind != want or got_magic != magic:
        raise NcclWireError(f"{c} opened with type {kind.name} magic {got_magic:#x}; expected {want.name} "
                            f"magic {magic:#x}")  # fmt: skip
    del c.inbuf[: HANDSHAKE.size]
    return True


class ProfileLines:
    """The profiler plugin's lines off its FIFO: (rank, CollParams) of each collective start."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, CollParams]]:
        self.buf += data
        if len(self.buf) > 1 << 20:
            raise NcclError("the profiler's FIFO carries a line over 1 MiB: not the NeuronaBox profiler")
        out = []
        while b"\n" in self.buf:
            line, _, rest = bytes(self.buf).partition(b"\n")
            self.buf = bytearray(rest)
            try:
                doc = json.loads(line)
            except ValueError:
                raise NcclError(f"the profiler's FIFO carried a line that is not JSON: {line[:80]!r}") from None
            if doc.get("nccl") != "coll_start":
                continue
            if doc.get("nranks") != self.world:
                raise NcclError(f"rank {doc.get('rank')} started {doc.get('func')} on a communicator of "
                                f"{doc.get('nranks')} ranks; the live NCCL dialect plays the world's only "
                                f"({self.world})")  # fmt: skip
            out.append((int(doc["rank"]), CollParams.from_line(doc)))
        return out


class NcclLive:
    """The controller's side of one NCCL communicator of `world` ranks whose `real` ranks run.

    When real rank 0 is the root, its unique id comes through `join` once the ports are
    open; otherwise the controller is the root and `unique_id` is the id for the real
    ranks. `profile_fd`: the read end of the profiler's FIFO. `on_instance`: each finished
    collective, with its place in the run's order. `clock`: monotonic seconds.
    """

    def __init__(self, layout: Layout, world: int, real: list[int], relay: NcclRelay, profile_fd: int,
                 host: str = "127.0.0.1", on_instance: Callable[[Instance, int], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, silence_s: float = 10.0) -> None:  # fmt: skip
        if not real or any(not 0 <= r < world for r in real):
            raise NcclError(f"real ranks {real} do not fit a world of {world}")
        if len(set(real)) == world:
            raise NcclError("every rank is real: there is nobody to emulate")
        if len({layout.root_reply_size, P2P_ACK.size, layout.ring_info_size}) != 3:
            raise NcclError(f"NCCL {layout.name}: a ring slice is as large as a root reply or a p2p preamble")
        self.layout, self.world, self.real, self.relay = layout, world, sorted(set(real)), relay
        self.members = set(self.real)
        self.emulated = [r for r in range(world) if r not in self.members]
        self.clock, self.on_instance = clock, on_instance
        self.silence_s = silence_s  # how long a real rank's bytes may wait for their collective's start line
        self.io = SocketLoop(host)
        self.node_addr = {e: self.io.listen(e).encode() for e in self.emulated}  # root reply, ring, p2p: one port
        self.net_addr = self.io.listen("net")
        self.uid: UniqueId | None = None
        if 0 not in self.members:
            self.uid = UniqueId(int.from_bytes(os.urandom(8), "little"), self.io.listen("root"))
        self.checked_in: dict[int, ExtInfo] = {}
        self.ring_conns: dict[tuple[int, RingSide], Conn] = {}
        self.ring_pending: dict[tuple[int, RingSide], bytearray] = {}
        self.ring = BootstrapRing(layout, world, self.real, relay.real.mirror, self.node_addr, self._ring_write)
        self.responders = {r: SetupResponder(layout, r, world, recv_handle_for(r, self.net_addr)) for r in self.real}
        self.net_out: dict[tuple[int, int], Conn] = {}
        self.net_pending: dict[tuple[int, int], bytearray] = {}
        self.profile_fd = profile_fd
        self.profile = ProfileLines(world)
        self.io.watch(profile_fd, "profile")
        self.stopped = False
        self.collectives = 0

    @property
    def unique_id(self) -> bytes:
        if self.uid is None:
            raise NcclError("real rank 0 makes the unique id: the controller has none to give")
        return self.uid.encode()

    def join(self, uid: UniqueId) -> None:
        """Real rank 0 made the unique id: check every emulated rank in with its root now."""
        if 0 not in self.members or self.uid is not None:
            raise NcclError("the unique id is the controller's own, or came already")
        self.uid = uid
        for checkin in root_checkins(self.layout, uid, self.world, self.node_addr, self.node_addr, self.emulated):
            self.io.dial(uid.root, Role.ONE_SHOT, checkin.wire, close=True)

    # ---------------------------------------------------------------- the loop
    def run(self) -> None:
        """Serve until `stop()` or an error (raised: the caller ends the run with it)."""
        if self.uid is None:
            raise NcclError("no unique id yet: real rank 0's comes through join()")
        while not self.stopped:
            wait = min(self.relay.next_release() - self.clock(), 0.2)
            # the poller sleeps in whole milliseconds: sleep to just short of a release, then poll
            # without sleeping until it is due (the native loop's timer-then-spin, in Python)
            wait = wait - SPIN if wait > 2 * SPIN else 0.0
            for event in self.io.poll(wait):
                if event[0] == "accepted":
                    tag = event[1]
                    role = Role.NET_NEW if tag == "net" else Role.ROOT_IN if tag == "root" else Role.NODE_NEW
                    self.io.accept_as(event[2], role, tag if role is Role.NODE_NEW else -1)
                elif event[0] == "readable":
                    self._read_profile()
                elif event[0] == "eof":
                    self._eof(event[1])
                else:
                    self._on_data(event[1], event[2])
            self._release()
            why = self.relay.unannounced(self.clock(), self.silence_s)
            if why:
                raise NcclError(why)

    def stop(self) -> None:
        self.stopped = True

    def close(self) -> None:
        self.io.close()

    def _eof(self, c: Conn) -> None:
        """A peer closed: expected for one-shot messages and at the end; refused mid-message."""
        if c.inbuf or (c.role is Role.P2P_IN and (c.reader is None or not c.reader.finished)):
            raise NcclWireError(f"{c} closed in the middle of a message")
        self.io.drop(c)

    # ---------------------------------------------------------------- bytes in
    def _on_data(self, c: Conn, data: bytes) -> None:
        if DEBUG:
            print(f"nbx-nccl: {c.role.name} rank {c.rank} ch {c.channel}: {len(data)} B {data[:16].hex()}",
                  file=sys.stderr, flush=True)  # fmt: skip
        if c.role is Role.NET_IN:
            self.relay.feed(c.rank, c.channel, data, self.clock())
            return
        if c.role in (Role.RING_NEXT, Role.RING_PREV):
            self.ring.feed(c.rank, RingSide.AS_NEXT if c.role is Role.RING_NEXT else RingSide.AS_PREV, data)
            return
        if c.role in (Role.ONE_SHOT, Role.NET_OUT):
            raise NcclWireError(f"{c} got {len(data)} bytes back; it carries none that way")
        c.inbuf += data
        if c.role is Role.NODE_NEW:
            self._classify(c)
        elif c.role is Role.NET_NEW:
            self._name_net(c)
        if c.role is Role.ROOT_REPLY:
            self._root_reply(c)
        elif c.role is Role.P2P_IN:
            self._p2p(c)
        elif c.role is Role.ROOT_IN:
            self._check_in(c)

    def _classify(self, c: Conn) -> None:
        """The first frame's size names the connection: a root reply, a p2p message, a ring link."""
        if len(c.inbuf) < HANDSHAKE.size + SIZE.size:
            return
        strip_handshake(c, SocketType.BOOTSTRAP, self.uid.magic)
        (size,) = SIZE.unpack_from(c.inbuf, 0)
        e = c.rank
        if size == self.layout.root_reply_size:
            c.become(Role.ROOT_REPLY)
        elif size == P2P_ACK.size:
            c.become(Role.P2P_IN)
        elif size == self.layout.ring_info_size:
            prev = (e - 1) % self.world
            if prev not in self.members:
                raise NcclWireError(f"a ring link reached emulated rank {e} from {prev}, which is not real")
            if (prev, RingSide.AS_NEXT) in self.ring_conns:
                raise NcclWireError(f"real rank {prev} opened a second ring link to emulated rank {e}")
            c.become(Role.RING_NEXT, rank=prev)
            data, c.inbuf = bytes(c.inbuf), bytearray()
            self._ring_conn(prev, RingSide.AS_NEXT, c)
            self.ring.feed(prev, RingSide.AS_NEXT, data)
        else:
            raise NcclWireError(f"emulated rank {e}'s bootstrap port got a {size}-byte first frame: not a root reply "
                                f"({self.layout.root_reply_size}), a p2p preamble ({P2P_ACK.size}) or a ring slice "
                                f"({self.layout.ring_info_size})")  # fmt: skip

    def _root_reply(self, c: Conn) -> None:
        """Real rank 0's root tells emulated rank e where e+1 listens: a real rank's address
        is where the controller dials it as its predecessor."""
        n = SIZE.size + self.layout.root_reply_size
        if len(c.inbuf) < n:
            return
        info = decode_root_reply(self.layout, bytes(c.inbuf[SIZE.size : n]))
        del c.inbuf[:n]
        nxt = (c.rank + 1) % self.world
        addr = SockAddr.decode(info[:28])
        if nxt in self.members:
            self._dial_ring_prev(nxt, addr)
        elif info[:28] != self.node_addr[nxt]:
            raise NcclWireError(f"the root told emulated rank {c.rank} its successor is at {addr}, not the "
                                f"controller's {SockAddr.decode(self.node_addr[nxt])}")  # fmt: skip

    def _check_in(self, c: Conn) -> None:
        """A real rank checks in with the emulated root: keep it; once all have, reply to each."""
        if c.reader is None:
            if not strip_handshake(c, SocketType.BOOTSTRAP, self.uid.magic):
                return
            c.reader = FrameReader(self.layout.ext_info_size, what="a check-in", limit=1)
        data, c.inbuf = bytes(c.inbuf), bytearray()
        for payload in c.reader.feed(data):
            info = ExtInfo.decode(payload, self.layout)
            if info.rank not in self.members or info.nranks != self.world or info.nroots != 1:
                raise NcclWireError(f"a check-in from rank {info.rank} of {info.nranks} ({info.nroots} roots); "
                                    f"the emulated root expects real ranks {self.real} of {self.world}, "
                                    "one root")  # fmt: skip
            if info.rank in self.checked_in:
                raise NcclWireError(f"rank {info.rank} checked in twice")
            self.checked_in[info.rank] = info
            self._dial_ring_prev(info.rank, SockAddr.decode(info.connect_info[:28]))
        if len(self.checked_in) == len(self.real) and c.reader.finished:
            hello = encode_handshake(self.uid.magic, SocketType.BOOTSTRAP)
            for r, info in sorted(self.checked_in.items()):
                nxt = (r + 1) % self.world
                addr = self.checked_in[nxt].connect_info if nxt in self.members else self.node_addr[nxt]
                addr = bytes(addr) + bytes(self.layout.root_reply_size - len(addr))
                self.io.dial(SockAddr.decode(info.listen_root), Role.ONE_SHOT, hello + encode_frame(addr), close=True)

    def _p2p(self, c: Conn) -> None:
        if c.p2p is None:
            if len(c.inbuf) < SIZE.size + P2P_ACK.size:
                return
            c.p2p = decode_p2p_preamble(bytes(c.inbuf[SIZE.size : SIZE.size + P2P_ACK.size]))
            del c.inbuf[: SIZE.size + P2P_ACK.size]
            c.reader = FrameReader(MAX_P2P, what=f"rank {c.p2p[0]}'s bootstrap message to rank {c.rank}", limit=1)
        data, c.inbuf = bytes(c.inbuf), bytearray()
        for payload in c.reader.feed(data):
            self._answer(c.p2p[0], c.rank, c.p2p[1], payload)
        if c.reader.finished and c.reader.rest:
            raise NcclWireError(f"rank {c.p2p[0]} sent bytes after its bootstrap message to rank {c.rank}")

    def _answer(self, src: int, peer: int, tag: int, payload: bytes) -> None:
        """A real rank's transport-setup message to emulated `peer`: answer it, and dial the
        Socket-net connections it sets up from the emulated side."""
        if src not in self.members:
            raise NcclWireError(f"a bootstrap message to rank {peer} names sender {src}, which is not a real rank")
        if src not in self.ring.p2p_addr:
            raise NcclWireError(f"rank {src} sent a bootstrap message before its address went round the ring")
        reply = self.responders[src].respond(peer, tag, payload)
        wire = encode_handshake(self.uid.magic, SocketType.BOOTSTRAP) + encode_p2p_preamble(peer, tag)
        self.io.dial(self.ring.p2p_addr[src], Role.ONE_SHOT, wire + encode_frame(reply.payload), close=True)
        if not reply.sync and reply.role in (PeerRole.SENDS_TO_R, PeerRole.BOTH):
            for position, blob in enumerate(reply.r_recv_infos):
                handle_raw, _ = decode_recv_connect_info(self.layout, blob)
                self._dial_net_out(src, position, SocketNetHandle.decode(handle_raw))

    def _dial_net_out(self, rank: int, channel: int, handle: SocketNetHandle) -> None:
        key = (rank, channel)
        if key in self.net_out:
            raise NcclWireError(f"rank {rank} set up channel {channel} from its emulated predecessor twice")
        if handle.n_socks != 0:
            raise NcclWireError(f"rank {rank}'s net handle asks for {handle.n_socks} data sockets; the launcher pins "
                                "NCCL_SOCKET_NTHREADS=0 (one connection per peer)")  # fmt: skip
        c = self.io.dial(handle.connect_addr, Role.NET_OUT, encode_net_socket_preamble(handle.magic, 0), rank=rank,
                         channel=channel)  # fmt: skip
        self.net_out[key] = c
        if self.net_pending.get(key):
            self.io.write(c, bytes(self.net_pending.pop(key)))

    def _name_net(self, c: Conn) -> None:
        """A real rank dialled a handle the controller gave: its magic names the rank and channel."""
        n = HANDSHAKE.size + 1
        if len(c.inbuf) < n:
            return
        magic, index = decode_net_socket_preamble(bytes(c.inbuf[:n]))
        del c.inbuf[:n]
        rank, channel = token_owner(magic)
        if rank is None or index != 0 or rank not in self.members or channel >= self.relay.config.channels:
            raise NcclWireError(f"a Socket-net connection with magic {magic:#x} socket {index}: not a handle the "
                                "controller gave")  # fmt: skip
        c.become(Role.NET_IN, rank=rank, channel=channel)
        rest, c.inbuf = bytes(c.inbuf), bytearray()
        if rest:
            self.relay.feed(rank, channel, rest, self.clock())

    # ---------------------------------------------------------------- the ring's sockets
    def _dial_ring_prev(self, rank: int, addr: SockAddr) -> None:
        if (rank - 1) % self.world in self.members:
            return
        if (rank, RingSide.AS_PREV) in self.ring_conns:
            raise NcclWireError(f"real rank {rank}'s ring address came twice")
        hello = encode_handshake(self.uid.magic, SocketType.BOOTSTRAP)
        self._ring_conn(rank, RingSide.AS_PREV, self.io.dial(addr, Role.RING_PREV, hello, rank=rank))

    def _ring_conn(self, rank: int, side: RingSide, c: Conn) -> None:
        self.ring_conns[(rank, side)] = c
        pending = self.ring_pending.pop((rank, side), None)
        if pending:
            self.io.write(c, bytes(pending))

    def _ring_write(self, rank: int, side: RingSide, data: bytes) -> None:
        c = self.ring_conns.get((rank, side))
        if c is None:
            self.ring_pending.setdefault((rank, side), bytearray()).extend(data)
        else:
            self.io.write(c, data)

    # ---------------------------------------------------------------- collectives
    def _read_profile(self) -> None:
        """The profiler's lines: each collective's start is the relay's cue."""
        try:
            data = os.read(self.profile_fd, 1 << 16)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EINTR):
                return
            raise
        for rank, params in self.profile.feed(data):
            self.relay.collective(rank, params, self.clock())

    def _release(self) -> None:
        for rank, channel, head, payload in self.relay.due(self.clock()):
            c = self.net_out.get((rank, channel))
            if c is None:
                self.net_pending.setdefault((rank, channel), bytearray()).extend(head + payload)
            else:
                self.io.write(c, head, payload)
        while self.relay.finished:
            inst = self.relay.finished.pop(0)
            if self.on_instance is not None:
                self.on_instance(inst, self.collectives)
            self.collectives += 1
