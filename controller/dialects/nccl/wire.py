"""NCCL's TCP wire formats: socket addresses, the unique id, the connect handshake, size framing,
the bootstrap p2p preamble, the root check-in (extInfo) and the built-in Socket net's handle.

Pure encoding and decoding (bytes in, values out); docs/nccl_wire.md says which tag and file
each layout was checked against. Version-dependent offsets come from a `Layout`.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from enum import IntEnum

from .errors import NcclWireError
from .versions import Layout

SOCKADDR_SIZE = 28  # union ncclSocketAddress: sockaddr / sockaddr_in / sockaddr_in6
UNIQUE_ID_SIZE = 128  # NCCL_UNIQUE_ID_BYTES
NET_HANDLE_SIZE = 128  # NCCL_NET_HANDLE_MAXSIZE; also sizeof(union ringConnectInfo)
NCCL_SOCKET_MAGIC = 0x564AB9F2FC4B9D6C  # the built-in Socket net's handle magic
NCCL_MAGIC = 0x0280028002800280  # the unique-id magic when NCCL_COMM_ID is set

HANDSHAKE = struct.Struct("<Qi")  # u64 magic, i32 socket type: what every connecting side sends first
SIZE = struct.Struct("<i")  # the bootstrap frame header
P2P_ACK = struct.Struct("<ii")  # rank, tag
SOCKET_HANDLE = struct.Struct("<28s4xQii")  # connectAddr, magic@32, nSocks@40, nThreads@44; stage@48..71 zero


class SocketType(IntEnum):
    """enum ncclSocketType: the accepting side compares it with its own after the magic."""

    UNKNOWN = 0
    BOOTSTRAP = 1
    PROXY = 2
    NET_SOCKET = 3
    NET_IB = 4
    RAS = 5


@dataclass(frozen=True)
class SockAddr:
    """An IPv4 endpoint as NCCL stores it (native sockaddr_in, zero padding to 28 bytes)."""

    host: str
    port: int

    def encode(self) -> bytes:
        return encode_sockaddr(self.host, self.port)

    @classmethod
    def decode(cls, raw: bytes) -> SockAddr:
        if len(raw) < SOCKADDR_SIZE:
            raise NcclWireError(f"a socket address is {SOCKADDR_SIZE} bytes, got {len(raw)}")
        (family,) = struct.unpack_from("<H", raw, 0)
        if family != socket.AF_INET:
            raise NcclWireError(
                f"socket address family {family} is not AF_INET (run R with NCCL_SOCKET_FAMILY=AF_INET)"
            )
        (port,) = struct.unpack_from(">H", raw, 2)
        return cls(socket.inet_ntoa(bytes(raw[4:8])), port)

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def encode_sockaddr(host: str, port: int) -> bytes:
    """28 bytes: family u16 native (LE) = AF_INET, port big endian, address, then zeros.

    NCCL memcmp's addresses against an all-zero one, so the padding must be zero.
    """
    if not 0 <= port <= 0xFFFF:
        raise ValueError(f"port {port} out of range")
    buf = bytearray(SOCKADDR_SIZE)
    struct.pack_into("<H", buf, 0, socket.AF_INET)
    struct.pack_into(">H", buf, 2, port)
    buf[4:8] = socket.inet_aton(host)
    return bytes(buf)


def _pad(raw: bytes, size: int, what: str) -> bytes:
    if len(raw) > size:
        raise ValueError(f"{what} is {len(raw)} bytes, at most {size}")
    return bytes(raw) + bytes(size - len(raw))


@dataclass(frozen=True)
class UniqueId:
    """ncclUniqueId = ncclBootstrapHandle + zeros: magic@0, root address@8, nRanks@36 (2.29+, else 0)."""

    magic: int
    root: SockAddr
    n_ranks: int = 0

    def encode(self) -> bytes:
        buf = bytearray(UNIQUE_ID_SIZE)
        struct.pack_into("<Q", buf, 0, self.magic)
        buf[8 : 8 + SOCKADDR_SIZE] = self.root.encode()
        struct.pack_into("<i", buf, 36, self.n_ranks)
        return bytes(buf)

    @classmethod
    def decode(cls, raw: bytes) -> UniqueId:
        if len(raw) != UNIQUE_ID_SIZE:
            raise NcclWireError(f"an NCCL unique id is {UNIQUE_ID_SIZE} bytes, got {len(raw)}")
        (magic,) = struct.unpack_from("<Q", raw, 0)
        (n_ranks,) = struct.unpack_from("<i", raw, 36)
        return cls(magic, SockAddr.decode(raw[8 : 8 + SOCKADDR_SIZE]), n_ranks)


def encode_handshake(magic: int, kind: SocketType) -> bytes:
    """The 12 bytes a connecting side sends before anything else; no reply ever comes."""
    return HANDSHAKE.pack(magic, int(kind))


def decode_handshake(raw: bytes) -> tuple[int, SocketType]:
    if len(raw) != HANDSHAKE.size:
        raise NcclWireError(f"a connect handshake is {HANDSHAKE.size} bytes, got {len(raw)}")
    magic, kind = HANDSHAKE.unpack(raw)
    try:
        return magic, SocketType(kind)
    except ValueError:
        raise NcclWireError(f"unknown NCCL socket type {kind} in a connect handshake") from None


def encode_frame(payload: bytes) -> bytes:
    """A bootstrap message: [i32 size][size bytes]; size 0 is legal."""
    return SIZE.pack(len(payload)) + bytes(payload)


class FrameReader:
    """Incremental reader of [i32 size][bytes] frames: feed bytes, get complete payloads.

    Bounded: a declared size above `max_size` is refused when its header arrives, so a
    wrong stream never makes us buffer without limit. `limit` frames, if given, is where
    this reader stops: later bytes stay in `rest` for whoever reads next on the socket.
    """

    def __init__(self, max_size: int, *, what: str = "bootstrap frame", limit: int | None = None):
        if max_size < 0:
            raise ValueError("max_size must be >= 0")
        self.max_size = max_size
        self.what = what
        self.limit = limit
        self.count = 0  # complete frames returned so far
        self._head = bytearray()  # a size header in pieces
        self._parts: list[bytes] = []  # the frame in progress, in the pieces it came in
        self._have = 0
        self._rest = bytearray()  # what came after the `limit`-th frame
        self._declared: int | None = None

    @property
    def declared(self) -> int | None:
        """The size announced by the frame in progress (None until its header is complete)."""
        return self._declared

    @property
    def finished(self) -> bool:
        return self.limit is not None and self.count >= self.limit

    @property
    def rest(self) -> bytes:
        """Bytes held but not consumed (beyond `limit`, or an incomplete frame)."""
        return bytes(self._head) + b"".join(self._parts) + bytes(self._rest)

    def feed(self, data: bytes) -> list[bytes]:
        """Complete payloads in order. A payload that arrives whole is copied once; one
        that spans reads is joined once when its last piece comes."""
        out: list[bytes] = []
        if self.finished:
            self._rest += data
            return out
        view = memoryview(data)
        pos, end = 0, len(view)
        while not self.finished:
            if self._declared is None:
                take = view[pos : pos + SIZE.size - len(self._head)]
                self._head += take
                pos += len(take)
                if len(self._head) < SIZE.size:
                    break
                (size,) = SIZE.unpack(self._head)
                if size < 0 or size > self.max_size:
                    self._head = self._head[: SIZE.size]  # kept: the stream stays refused, it never resyncs
                    raise NcclWireError(
                        f"{self.what} declares {size} bytes, more than the {self.max_size} expected"
                        if size >= 0
                        else f"{self.what} declares a negative size {size}"
                    )
                self._head = bytearray()
                self._declared = size
            take = view[pos : pos + self._declared - self._have]
            pos += len(take)
            if not self._parts and len(take) == self._declared:
                payload = take.tobytes()
            else:
                self._parts.append(take.tobytes())
                self._have += len(take)
                if self._have < self._declared:
                    break
                payload = b"".join(self._parts)
                self._parts, self._have = [], 0
            out.append(payload)
            self._declared = None
            self.count += 1
        if pos < end:
            self._rest += view[pos:]
        return out


def encode_p2p_preamble(rank: int, tag: int) -> bytes:
    """What bootstrapSend writes after the handshake (2.23+): [i32 8][i32 rank, i32 tag]."""
    return encode_frame(P2P_ACK.pack(rank, tag))


def decode_p2p_preamble(payload: bytes) -> tuple[int, int]:
    """(rank, tag) from the preamble's payload (the frame header already stripped)."""
    if len(payload) != P2P_ACK.size:
        raise NcclWireError(f"a bootstrap p2p preamble is {P2P_ACK.size} bytes, got {len(payload)}")
    return P2P_ACK.unpack(payload)


@dataclass(frozen=True)
class ExtInfo:
    """struct extInfo: a rank's check-in with the root (ring listen address rides in connect_info)."""

    rank: int
    nranks: int
    iroot: int
    nroots: int
    listen_root: bytes  # 28-byte address the root dials back
    connect_info: bytes  # 128 bytes: the ring listen address (socket bootstrap) or a net handle
    offset: int = 0  # 2.29+ only (grow); 0 for a normal init

    def encode(self, layout: Layout) -> bytes:
        if self.offset and layout.ext_offset_off is None:
            raise ValueError(f"extInfo has no offset field in NCCL {layout.name}")
        buf = bytearray(layout.ext_info_size)
        for off, value in ((layout.ext_rank_off, self.rank), (layout.ext_nranks_off, self.nranks),
                           (layout.ext_iroot_off, self.iroot), (layout.ext_nroots_off, self.nroots)):
            struct.pack_into("<i", buf, off, value)
        if layout.ext_offset_off is not None:
            struct.pack_into("<i", buf, layout.ext_offset_off, self.offset)
        buf[layout.ext_listen_root_off : layout.ext_listen_root_off + SOCKADDR_SIZE] = _pad(
            self.listen_root, SOCKADDR_SIZE, "listen_root"
        )
        buf[layout.ext_connect_info_off : layout.ext_connect_info_off + NET_HANDLE_SIZE] = _pad(
            self.connect_info, NET_HANDLE_SIZE, "connect_info"
        )
        return bytes(buf)

    @classmethod
    def decode(cls, raw: bytes, layout: Layout) -> ExtInfo:
        if len(raw) != layout.ext_info_size:
            raise NcclWireError(
                f"extInfo is {layout.ext_info_size} bytes in NCCL {layout.name}, got {len(raw)}"
            )
        ints = [struct.unpack_from("<i", raw, off)[0] for off in
                (layout.ext_rank_off, layout.ext_nranks_off, layout.ext_iroot_off, layout.ext_nroots_off)]
        offset = 0 if layout.ext_offset_off is None else struct.unpack_from("<i", raw, layout.ext_offset_off)[0]
        lr = bytes(raw[layout.ext_listen_root_off : layout.ext_listen_root_off + SOCKADDR_SIZE])
        ci = bytes(raw[layout.ext_connect_info_off : layout.ext_connect_info_off + NET_HANDLE_SIZE])
        return cls(*ints, listen_root=lr, connect_info=ci, offset=offset)


@dataclass(frozen=True)
class SocketNetHandle:
    """The built-in Socket net's listen handle (first 72 of 128 bytes; the rest, and the
    connect-state bytes 48..71, zero). The connector echoes `magic` in its handshake, so a
    receiver may put a per-connection token there."""

    connect_addr: SockAddr
    magic: int = NCCL_SOCKET_MAGIC
    n_socks: int = 0
    n_threads: int = 0

    def encode(self) -> bytes:
        head = SOCKET_HANDLE.pack(self.connect_addr.encode(), self.magic, self.n_socks, self.n_threads)
        return head + bytes(NET_HANDLE_SIZE - len(head))

    @classmethod
    def decode(cls, raw: bytes) -> SocketNetHandle:
        if len(raw) != NET_HANDLE_SIZE:
            raise NcclWireError(f"a net handle is {NET_HANDLE_SIZE} bytes, got {len(raw)}")
        addr, magic, n_socks, n_threads = SOCKET_HANDLE.unpack_from(raw, 0)
        return cls(SockAddr.decode(addr), magic, n_socks, n_threads)


def encode_net_socket_preamble(magic: int, index: int) -> bytes:
    """What a Socket-net connector sends on each of its nSocks+1 connections: handshake
    (magic from the receiver's handle, type NET_SOCKET) then one byte, the socket's index
    (data sockets 0..nSocks-1, the control socket = nSocks)."""
    if not 0 <= index <= 0xFF:
        raise ValueError(f"socket index {index} does not fit the one-byte preamble")
    return encode_handshake(magic, SocketType.NET_SOCKET) + bytes([index])


def decode_net_socket_preamble(raw: bytes) -> tuple[int, int]:
    """(magic, index); the type must be NET_SOCKET."""
    if len(raw) != HANDSHAKE.size + 1:
        raise NcclWireError(f"a Socket-net preamble is {HANDSHAKE.size + 1} bytes, got {len(raw)}")
    magic, kind = decode_handshake(raw[: HANDSHAKE.size])
    if kind != SocketType.NET_SOCKET:
        raise NcclWireError(f"a Socket-net connection announced type {kind.name}, expected NET_SOCKET")
    return magic, raw[HANDSHAKE.size]
