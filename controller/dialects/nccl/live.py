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
import selectors
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from .bootstrap import RingAllGather, RingSide
from .errors import NcclError, NcclWireError
from .layouts import (
    check_own_all_gather_info,
    check_own_peer_info,
    check_own_ring_info,
    clone_all_gather_info,
    clone_peer_info,
    clone_ring_info,
    decode_recv_connect_info,
)
from .relay import CollParams, Instance, NcclRelay
from .setup import PeerRole, SetupResponder
from .versions import Layout
from .wire import (
    HANDSHAKE,
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
    encode_sockaddr,
)

ALLGATHERS = 3  # ringAllInfo, ncclPeerInfo, allGatherInfo: what init sends around the ring
TOKEN_BASE = 0x4E42580000000000  # "NBX": the net handle magic that names (real rank, position)
MAX_P2P = 1 << 20
READ = 1 << 18
DEBUG = os.environ.get("NEURONABOX_NCCL_DEBUG") == "1"  # each read, on stderr


class Role(Enum):
    NODE_NEW = "an emulated rank's bootstrap connection, not yet classified"
    ROOT_REPLY = "the root's reply to an emulated rank"
    RING_NEXT = "a real rank's ring link to its emulated successor"
    RING_PREV = "the ring link to a real rank from its emulated predecessor"
    P2P_IN = "a real rank's bootstrap message to an emulated rank"
    NET_NEW = "a Socket-net connection, not yet named"
    NET_IN = "a real rank's Socket-net connection to its emulated successor"
    NET_OUT = "the Socket-net connection to a real rank from its emulated predecessor"
    ROOT_IN = "a real rank's check-in with the emulated root"
    ONE_SHOT = "a message the controller sends and closes"


@dataclass(eq=False)
class Conn:
    sock: socket.socket
    role: Role
    rank: int = -1  # the emulated rank (NODE_*, ROOT_REPLY, P2P_IN) or the real rank (the rest)
    channel: int = -1
    inbuf: bytearray = field(default_factory=bytearray)
    outbuf: bytearray = field(default_factory=bytearray)
    close_after_flush: bool = False
    reader: FrameReader | None = None
    p2p: tuple[int, int] | None = None  # (src rank, tag) once its preamble came


class RingOfRank:
    """One real rank's two ring sockets and its allgathers, one after the other."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.conns: dict[RingSide, Conn | None] = {RingSide.AS_NEXT: None, RingSide.AS_PREV: None}
        self.pending: dict[RingSide, bytearray] = {s: bytearray() for s in RingSide}  # before its socket exists
        self.index = 0  # which allgather
        self.stepper: RingAllGather | None = None


class NcclLive:
    """The controller's side of one NCCL communicator of `world` ranks whose `real` ranks run.

    When real rank 0 is the root, its unique id comes through `join` once the ports are
    open; otherwise the controller is the root and `unique_id` is the id for the real
    ranks. `profile_fd`: the read end of
    the profiler's FIFO. `on_instance`: each finished collective. `clock`: monotonic seconds.
    """

    def __init__(self, layout: Layout, world: int, real: list[int], relay: NcclRelay, profile_fd: int,
                 host: str = "127.0.0.1",
                 on_instance: Callable[[Instance], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 log: Callable[[str], None] | None = None) -> None:  # fmt: skip
        if not real or any(not 0 <= r < world for r in real):
            raise NcclError(f"real ranks {real} do not fit a world of {world}")
        if len(set(real)) == world:
            raise NcclError("every rank is real: there is nobody to emulate")
        close = [r for r in real if (r + 1) % world in real]
        if close:
            raise NcclError(f"real ranks {close[0]} and {(close[0] + 1) % world} are ring neighbours; the live NCCL "
                            "dialect plays real ranks with emulated ranks on both sides")  # fmt: skip
        sizes = {layout.root_reply_size, 8, layout.ring_info_size}
        if len(sizes) != 3:
            raise NcclError(f"NCCL {layout.name}: a ring slice is as large as a root reply or a p2p preamble")
        self.layout, self.world, self.real, self.relay, self.host = layout, world, sorted(set(real)), relay, host
        self.members = set(self.real)
        self.emulated = [r for r in range(world) if r not in self.members]
        self.mirror = relay.real.mirror
        self.clock, self.on_instance, self.log = clock, on_instance, log or (lambda _m: None)
        self.sel = selectors.DefaultSelector()
        self.conns: set[Conn] = set()
        self.node_listen: dict[int, socket.socket] = {}
        self.node_addr: dict[int, bytes] = {}
        for e in self.emulated:
            s = self._listener()
            self.node_listen[e] = s
            self.node_addr[e] = encode_sockaddr(host, s.getsockname()[1])
            self.sel.register(s, selectors.EVENT_READ, ("listen", e))
        self.net_listen = self._listener()
        self.net_addr = SockAddr(host, self.net_listen.getsockname()[1])
        self.sel.register(self.net_listen, selectors.EVENT_READ, ("listen", "net"))
        self.root_listen: socket.socket | None = None
        self.checked_in: dict[int, ExtInfo] = {}
        self.uid: UniqueId | None = None
        if 0 not in self.members:
            self.root_listen = self._listener()
            root = SockAddr(host, self.root_listen.getsockname()[1])
            self.uid = UniqueId(int.from_bytes(os.urandom(8), "little"), root)
            self.sel.register(self.root_listen, selectors.EVENT_READ, ("listen", "root"))
        self.rings = {r: RingOfRank(r) for r in self.real if (r + 1) % world not in self.members
                      or (r - 1) % world not in self.members}  # fmt: skip
        self.slices: list[dict[int, bytes]] = [{} for _ in range(ALLGATHERS)]  # allgather -> real rank -> its slice
        self.p2p_addr: dict[int, SockAddr] = {}  # real rank -> its bootstrap p2p address (its ringAllInfo)
        self.responders = {r: SetupResponder(layout, r, world, self._recv_handle_for(r)) for r in self.real}
        self.net_out: dict[tuple[int, int], Conn] = {}
        self.net_pending: dict[tuple[int, int], bytearray] = {}
        self.profile_fd = profile_fd
        self.profile_buf = bytearray()
        self.sel.register(profile_fd, selectors.EVENT_READ, ("profile", None))
        self.stopped = False
        self.error: BaseException | None = None
        self.collectives = 0

    # ---------------------------------------------------------------- set-up
    def _listener(self) -> socket.socket:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((self.host, 0))
        s.listen(128)
        s.setblocking(False)
        return s

    @property
    def unique_id(self) -> bytes:
        if self.uid is None:
            raise NcclError("real rank 0 makes the unique id: the controller has none to give")
        return self.uid.encode()

    def join(self, uid: UniqueId) -> None:
        """Real rank 0 made the unique id: check every emulated rank in with its root now."""
        if self.root_listen is not None or self.uid is not None:
            raise NcclError("the unique id is the controller's own, or came already")
        self.uid = uid
        hello = encode_handshake(self.uid.magic, SocketType.BOOTSTRAP)
        for e in self.emulated:
            info = ExtInfo(e, self.world, 0, 1, self.node_addr[e], self.node_addr[e])
            self._dial(self.uid.root, Role.ONE_SHOT, hello + encode_frame(info.encode(self.layout)), close=True)

    def _dial(self, addr: SockAddr, role: Role, data: bytes = b"", close: bool = False, rank: int = -1,
              channel: int = -1) -> Conn:  # fmt: skip
        s = socket.create_connection((addr.host, addr.port), timeout=10)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.setblocking(False)
        c = Conn(s, role, rank, channel)
        c.close_after_flush = close
        self.conns.add(c)
        self.sel.register(s, selectors.EVENT_READ, ("conn", c))
        if data:
            self._write(c, data)
        return c

    # ---------------------------------------------------------------- the loop
    def run(self, until: Callable[[], bool] = lambda: False) -> None:
        """Serve until `stop()`, `until()` or an error (re-raised)."""
        if self.uid is None:
            raise NcclError("no unique id yet: real rank 0's comes through join()")
        while not self.stopped and not until():
            now = self.clock()
            wait = min(max(self.relay.next_release() - now, 0.0), 0.2)
            for key, mask in self.sel.select(wait):
                kind, what = key.data
                if kind == "listen":
                    self._accept(key.fileobj, what)
                elif kind == "profile":
                    self._read_profile()
                else:
                    self._service(what, mask)
            self._release()

    def stop(self) -> None:
        self.stopped = True

    def close(self) -> None:
        for c in list(self.conns):
            self._drop(c)
        for s in [*self.node_listen.values(), self.net_listen, self.root_listen]:
            if s is not None:
                try:
                    self.sel.unregister(s)
                except (KeyError, ValueError):
                    pass
                s.close()
        try:
            self.sel.unregister(self.profile_fd)
        except (KeyError, ValueError):
            pass
        self.sel.close()

    def _accept(self, listener: socket.socket, what) -> None:
        try:
            s, _ = listener.accept()
        except BlockingIOError:
            return
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.setblocking(False)
        if what == "net":
            c = Conn(s, Role.NET_NEW)
        elif what == "root":
            c = Conn(s, Role.ROOT_IN)
        else:
            c = Conn(s, Role.NODE_NEW, rank=what)
        self.conns.add(c)
        self.sel.register(s, selectors.EVENT_READ, ("conn", c))

    def _service(self, c: Conn, mask: int) -> None:
        if mask & selectors.EVENT_WRITE:
            self._flush(c)
        if mask & selectors.EVENT_READ and c in self.conns:
            try:
                data = c.sock.recv(READ)
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionResetError:
                data = b""
            if not data:
                self._eof(c)
                return
            self._on_data(c, data)

    def _write(self, c: Conn, data: bytes) -> None:
        c.outbuf += data
        self._flush(c)

    def _flush(self, c: Conn) -> None:
        while c.outbuf:
            try:
                n = c.sock.send(c.outbuf)
            except (BlockingIOError, InterruptedError):
                break
            except (BrokenPipeError, ConnectionResetError) as exc:
                raise NcclWireError(f"{c.role.value} (rank {c.rank}) closed while the controller wrote: "
                                    f"{exc}") from None  # fmt: skip
            del c.outbuf[:n]
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if c.outbuf else 0)
        if c in self.conns:
            self.sel.modify(c.sock, events, ("conn", c))
        if not c.outbuf and c.close_after_flush:
            self._drop(c)

    def _drop(self, c: Conn) -> None:
        if c not in self.conns:
            return
        self.conns.discard(c)
        try:
            self.sel.unregister(c.sock)
        except (KeyError, ValueError):
            pass
        c.sock.close()

    def _eof(self, c: Conn) -> None:
        """A peer closed: expected for one-shot messages and at the end; refused mid-protocol."""
        if c.role in (Role.NODE_NEW, Role.ROOT_REPLY, Role.P2P_IN, Role.ROOT_IN) and c.inbuf:
            raise NcclWireError(f"{c.role.value} (rank {c.rank}) closed with {len(c.inbuf)} bytes of a message")
        if c.role == Role.P2P_IN and c.p2p is None:
            raise NcclWireError(f"{c.role.value} (rank {c.rank}) closed before its message")
        self._drop(c)

    # ---------------------------------------------------------------- bytes in
    def _on_data(self, c: Conn, data: bytes) -> None:
        if DEBUG:
            print(f"nbx-nccl: {c.role.name} rank {c.rank} ch {c.channel}: {len(data)} B {data[:16].hex()}",
                  file=sys.stderr, flush=True)  # fmt: skip
        if c.role is Role.NET_IN:
            self.relay.feed(c.rank, c.channel, data, self.clock())
            return
        if c.role in (Role.RING_NEXT, Role.RING_PREV):
            self._ring_feed(c.rank, RingSide.AS_NEXT if c.role is Role.RING_NEXT else RingSide.AS_PREV, data)
            return
        if c.role in (Role.ONE_SHOT, Role.NET_OUT):
            raise NcclWireError(f"rank {c.rank} sent {len(data)} bytes on {c.role.value}, which carries none back")
        c.inbuf += data
        if c.role is Role.NODE_NEW:
            self._classify(c)
        elif c.role is Role.NET_NEW:
            self._name_net(c)
        if c in self.conns:
            if c.role is Role.ROOT_REPLY:
                self._root_reply(c)
            elif c.role is Role.P2P_IN:
                self._p2p(c)
            elif c.role is Role.ROOT_IN:
                self._check_in(c)

    def _handshake(self, c: Conn, want: SocketType, magic: int) -> bool:
        """Strip and check the 12-byte connect handshake; False while it is incomplete."""
        if len(c.inbuf) < HANDSHAKE.size:
            return False
        got_magic, kind = decode_handshake(bytes(c.inbuf[: HANDSHAKE.size]))
        if kind != want or (magic is not None and got_magic != magic):
            raise NcclWireError(f"{c.role.value} (rank {c.rank}) opened with type {kind.name} magic {got_magic:#x}; "
                                f"expected {want.name} magic {magic:#x}")  # fmt: skip
        del c.inbuf[: HANDSHAKE.size]
        return True

    def _classify(self, c: Conn) -> None:
        """The first frame's size names the connection: a root reply, a p2p message, a ring link."""
        if len(c.inbuf) < HANDSHAKE.size + SIZE.size:
            return
        self._handshake(c, SocketType.BOOTSTRAP, self.uid.magic)
        (size,) = SIZE.unpack_from(c.inbuf, 0)
        e = c.rank
        if size == self.layout.root_reply_size:
            c.role = Role.ROOT_REPLY
        elif size == 8:
            c.role = Role.P2P_IN
        elif size == self.layout.ring_info_size:
            prev = (e - 1) % self.world
            if prev not in self.members:
                raise NcclWireError(f"a ring link reached emulated rank {e} from {prev}, which is not real")
            c.role, c.rank = Role.RING_NEXT, prev
            data, c.inbuf = bytes(c.inbuf), bytearray()
            ring = self.rings[prev]
            if ring.conns[RingSide.AS_NEXT] is not None:
                raise NcclWireError(f"real rank {prev} opened a second ring link to emulated rank {e}")
            ring.conns[RingSide.AS_NEXT] = c
            self._flush_ring_pending(ring, RingSide.AS_NEXT)
            self._ring_feed(prev, RingSide.AS_NEXT, data)
        else:
            raise NcclWireError(f"emulated rank {e}'s bootstrap port got a {size}-byte first frame: not a root reply "
                                f"({self.layout.root_reply_size}), a p2p preamble (8) or a ring slice "
                                f"({self.layout.ring_info_size})")  # fmt: skip

    def _root_reply(self, c: Conn) -> None:
        n = SIZE.size + self.layout.root_reply_size
        if len(c.inbuf) < n:
            return
        info = bytes(c.inbuf[SIZE.size : n])
        del c.inbuf[:n]
        e, nxt = c.rank, (c.rank + 1) % self.world
        addr = SockAddr.decode(info[:28])
        if nxt in self.members:
            self._dial_ring_prev(nxt, addr)
        elif info[:28] != self.node_addr[nxt]:
            raise NcclWireError(f"the root told emulated rank {e} its successor is at {addr}, not the controller's "
                                f"{SockAddr.decode(self.node_addr[nxt])}")  # fmt: skip

    def _dial_ring_prev(self, rank: int, addr: SockAddr) -> None:
        ring = self.rings[rank]
        if ring.conns[RingSide.AS_PREV] is not None:
            raise NcclWireError(f"real rank {rank}'s ring address came twice")
        c = self._dial(addr, Role.RING_PREV, encode_handshake(self.uid.magic, SocketType.BOOTSTRAP), rank=rank)
        ring.conns[RingSide.AS_PREV] = c
        self._flush_ring_pending(ring, RingSide.AS_PREV)

    def _check_in(self, c: Conn) -> None:
        """A real rank checks in with the emulated root: keep it; once all have, reply."""
        if not c.inbuf or (c.reader is None and not self._handshake(c, SocketType.BOOTSTRAP, self.uid.magic)):
            return
        if c.reader is None:
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
            if (info.rank - 1) % self.world not in self.members:
                self._dial_ring_prev(info.rank, SockAddr.decode(info.connect_info[:28]))
        if len(self.checked_in) == len(self.real):
            hello = encode_handshake(self.uid.magic, SocketType.BOOTSTRAP)
            for r, info in sorted(self.checked_in.items()):
                nxt = (r + 1) % self.world
                ring = self.checked_in[nxt].connect_info if nxt in self.members else self.node_addr[nxt]
                ring = bytes(ring) + bytes(self.layout.root_reply_size - len(ring))
                self._dial(SockAddr.decode(info.listen_root), Role.ONE_SHOT, hello + encode_frame(ring), close=True)

    def _p2p(self, c: Conn) -> None:
        if c.p2p is None:
            if len(c.inbuf) < SIZE.size + 8:
                return
            c.p2p = decode_p2p_preamble(bytes(c.inbuf[SIZE.size : SIZE.size + 8]))
            del c.inbuf[: SIZE.size + 8]
            c.reader = FrameReader(MAX_P2P, what=f"rank {c.p2p[0]}'s bootstrap message to rank {c.rank}", limit=1)
        assert c.reader is not None
        if c.reader.finished:
            if c.inbuf:
                raise NcclWireError(f"rank {c.p2p[0]} sent bytes after its bootstrap message to rank {c.rank}")
            return
        data, c.inbuf = bytes(c.inbuf), bytearray()
        for payload in c.reader.feed(data):
            self._answer(c.p2p[0], c.rank, c.p2p[1], payload)
        if c.reader.finished and c.reader.rest:
            raise NcclWireError(f"rank {c.p2p[0]} sent bytes after its bootstrap message to rank {c.rank}")

    def _answer(self, src: int, peer: int, tag: int, payload: bytes) -> None:
        """A real rank's transport-setup message to emulated `peer`: answer it, and dial
        (or expect) the Socket-net connections it sets up."""
        if src not in self.members:
            raise NcclWireError(f"a bootstrap message to rank {peer} names sender {src}, which is not a real rank")
        if src not in self.p2p_addr:
            raise NcclWireError(f"rank {src} sent a bootstrap message before its address went round the ring")
        reply = self.responders[src].respond(peer, tag, payload)
        wire = encode_handshake(self.uid.magic, SocketType.BOOTSTRAP) + encode_p2p_preamble(peer, tag)
        self._dial(self.p2p_addr[src], Role.ONE_SHOT, wire + encode_frame(reply.payload), close=True)
        if reply.sync:
            return
        if reply.role in (PeerRole.SENDS_TO_R, PeerRole.BOTH):
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
        c = self._dial(handle.connect_addr, Role.NET_OUT, encode_net_socket_preamble(handle.magic, 0), rank=rank,
                       channel=channel)  # fmt: skip
        self.net_out[key] = c
        if self.net_pending.get(key):
            self._write(c, bytes(self.net_pending.pop(key)))

    def _recv_handle_for(self, rank: int):
        def handle(peer: int, tag: int, position: int) -> bytes:
            return SocketNetHandle(self.net_addr, magic=TOKEN_BASE | rank << 8 | position).encode()

        return handle

    def _name_net(self, c: Conn) -> None:
        n = HANDSHAKE.size + 1
        if len(c.inbuf) < n:
            return
        magic, index = decode_net_socket_preamble(bytes(c.inbuf[:n]))
        del c.inbuf[:n]
        if magic & ~0xFFFFFF != TOKEN_BASE or index != 0:
            raise NcclWireError(f"a Socket-net connection with magic {magic:#x} socket {index}: not a handle the "
                                "controller gave")  # fmt: skip
        rank, channel = (magic >> 8) & 0xFFFF, magic & 0xFF
        if rank not in self.members or channel >= self.relay.config.channels:
            raise NcclWireError(f"a Socket-net connection names rank {rank} channel {channel}, not a real rank's")
        c.role, c.rank, c.channel = Role.NET_IN, rank, channel
        rest, c.inbuf = bytes(c.inbuf), bytearray()
        if rest:
            self.relay.feed(rank, channel, rest, self.clock())

    # ---------------------------------------------------------------- the ring allgathers
    def _ring_feed(self, rank: int, side: RingSide, data: bytes) -> None:
        ring = self.rings[rank]
        while data:
            if ring.stepper is None:
                if ring.index >= ALLGATHERS:
                    raise NcclWireError(f"rank {rank} began bootstrap allgather {ring.index + 1} on its ring; NCCL's "
                                        f"init sends {ALLGATHERS} (ringAllInfo, peerInfo, allGatherInfo)")  # fmt: skip
                ring.stepper = RingAllGather(rank, self.world, self.layout.bidirectional_ring,
                                             self._slot_of(ring.index), max_size=1 << 20)  # fmt: skip
            st = ring.stepper
            self._ring_out(ring, st.feed(side, data))
            data = b""
            if st.own is not None and rank not in self.slices[ring.index]:
                self._own_slice(rank, ring.index, st.own)
            if st.done:
                rests = {s: st.leftover(s) for s in RingSide}
                ring.stepper, ring.index = None, ring.index + 1
                for s, rest in rests.items():
                    if rest:
                        self._ring_feed(rank, s, rest)

    def _own_slice(self, rank: int, index: int, own: bytes) -> None:
        """A real rank's own slice: check it against the layout, keep it, let the others go on."""
        if index == 0:
            check_own_ring_info(self.layout, own)
            off = self.layout.ring_info_p2p_off
            self.p2p_addr[rank] = SockAddr.decode(own[off : off + 28])
        elif index == 1:
            check_own_peer_info(self.layout, own, rank)
        else:
            check_own_all_gather_info(self.layout, own, rank)
        self.slices[index][rank] = own
        for other in self.rings.values():
            if other.stepper is not None and other.index == index:
                self._ring_out(other, other.stepper.poke())

    def _slot_of(self, index: int):
        def slot(r: int, _own: bytes) -> bytes | None:
            if r in self.members:
                return self.slices[index].get(r)
            template = self.slices[index].get(self.mirror)
            if index == 0:
                return clone_ring_info(self.layout, self.node_addr[r])
            if template is None:
                return None
            if index == 1:
                return clone_peer_info(self.layout, template, r)
            return clone_all_gather_info(self.layout, template, r)

        return slot

    def _ring_out(self, ring: RingOfRank, writes: dict[RingSide, bytes]) -> None:
        for side, data in writes.items():
            if not data:
                continue
            c = ring.conns[side]
            if c is None:
                ring.pending[side] += data
            else:
                self._write(c, data)

    def _flush_ring_pending(self, ring: RingOfRank, side: RingSide) -> None:
        c = ring.conns[side]
        if c is not None and ring.pending[side]:
            self._write(c, bytes(ring.pending[side]))
            ring.pending[side].clear()

    # ---------------------------------------------------------------- collectives
    def _read_profile(self) -> None:
        try:
            data = os.read(self.profile_fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError as exc:
            if exc.errno == errno.EAGAIN:
                return
            raise
        self.profile_buf += data
        if len(self.profile_buf) > 1 << 20:
            raise NcclError("the profiler's FIFO carries a line over 1 MiB: not the NeuronaBox profiler")
        while b"\n" in self.profile_buf:
            line, _, rest = bytes(self.profile_buf).partition(b"\n")
            self.profile_buf = bytearray(rest)
            self._profile_line(line)

    def _profile_line(self, line: bytes) -> None:
        try:
            doc = json.loads(line)
        except ValueError:
            raise NcclError(f"the profiler's FIFO carried a line that is not JSON: {line[:80]!r}") from None
        if doc.get("nccl") != "coll_start":
            return
        if doc.get("nranks") != self.world:
            raise NcclError(f"rank {doc.get('rank')} started {doc.get('func')} on a communicator of "
                            f"{doc.get('nranks')} ranks; the live NCCL dialect plays the world's only "
                            f"({self.world})")  # fmt: skip
        self.relay.collective(int(doc["rank"]), CollParams.from_line(doc), self.clock())
        self._release()

    def _release(self) -> None:
        now = self.clock()
        for rank, channel, frame in self.relay.due(now):
            c = self.net_out.get((rank, channel))
            if c is None:
                self.net_pending.setdefault((rank, channel), bytearray()).extend(frame)
            else:
                self._write(c, frame)
        while self.relay.finished:
            inst = self.relay.finished.pop(0)
            self.collectives += 1
            if self.on_instance is not None:
                self.on_instance(inst)


def open_profile_fifo(path: str) -> tuple[int, int]:
    """Make the FIFO the profiler plugin appends to and open it (read end, non-blocking;
    plus a write end of our own, so it never reads as closed between the ranks' opens)."""
    os.mkfifo(path, 0o600)
    rfd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    wfd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    return rfd, wfd

