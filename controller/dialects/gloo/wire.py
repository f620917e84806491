"""Gloo TCP wire formats: frame preamble, slots, addresses and rank records.

Pure encoding and decoding; see shared/GLOO_WIRE.md for where each fact comes from.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from enum import IntEnum

from neuronabox.errors import NeuronaBoxError

PREAMBLE = struct.Struct("<6Q")  # nbytes, opcode, slot, offset, length, roffset
PREAMBLE_SIZE = PREAMBLE.size  # 48
ADDRESS_SIZE = 136  # sizeof(sockaddr_storage) + sizeof(ssize_t)
SEQ = struct.Struct("<q")


class Opcode(IntEnum):
    SEND_BUFFER = 0
    SEND_UNBOUND_BUFFER = 1
    NOTIFY_SEND_READY = 2
    NOTIFY_RECV_READY = 3


class SlotPrefix(IntEnum):
    GATHER = 1
    ALLGATHER = 2
    REDUCE = 3
    ALLREDUCE = 4
    SCATTER = 5
    BROADCAST = 6
    BARRIER = 7
    ALLTOALL = 8


def make_slot(prefix: int, tag: int, delta: int = 0) -> int:
    return (prefix << 56) | ((tag & 0xFFFFFFFF) << 24) | delta


SLOT_PREFIX_MASK = 0xFF << 56  # a slot: prefix (the collective) | tag << 24 | delta (a sub-slot)
SLOT_TAG_SHIFT, SLOT_TAG_MASK = 24, 0xFFFFFFFF
SLOT_DELTA_MASK = 0xFFFFFF


def split_slot(slot: int) -> tuple[int, int, int]:
    """(prefix, tag, delta) of a slot."""
    return slot >> 56, (slot >> SLOT_TAG_SHIFT) & SLOT_TAG_MASK, slot & SLOT_DELTA_MASK


def encode_address(host: str, port: int, seq: int = -1) -> bytes:
    """A raw `{sockaddr_storage; ssize_t seq}` for an IPv4 address."""
    buf = bytearray(ADDRESS_SIZE)
    struct.pack_into("<H", buf, 0, socket.AF_INET)
    struct.pack_into(">H", buf, 2, port)
    buf[4:8] = socket.inet_aton(host)
    SEQ.pack_into(buf, 128, seq)
    return bytes(buf)


@dataclass(frozen=True)
class Address:
    host: str
    port: int
    seq: int

    @classmethod
    def decode(cls, raw: bytes) -> Address:
        if len(raw) != ADDRESS_SIZE:
            raise ValueError(f"address is {len(raw)} bytes, expected {ADDRESS_SIZE}")
        (family,) = struct.unpack_from("<H", raw, 0)
        if family != socket.AF_INET:
            raise ValueError(f"address family {family} is not AF_INET (IPv6 is not supported yet)")
        (port,) = struct.unpack_from(">H", raw, 2)
        return cls(socket.inet_ntoa(raw[4:8]), port, SEQ.unpack_from(raw, 128)[0])

    def encode(self) -> bytes:
        return encode_address(self.host, self.port, self.seq)


def dialer_is_local(local: Address, remote: Address) -> bool:
    """Gloo's rule for which side of a pair dials: the larger address.

    IPv4 bytes compared with memcmp, then the network-order ports read as host
    (little-endian) integers, then the sequence numbers.
    """
    a, b = socket.inet_aton(local.host), socket.inet_aton(remote.host)
    if a != b:
        return a > b
    pa = struct.unpack("<H", struct.pack(">H", local.port))[0]
    pb = struct.unpack("<H", struct.pack(">H", remote.port))[0]
    if pa != pb:
        return pa > pb
    if local.seq == remote.seq:
        raise ValueError("cannot connect to self")
    return local.seq > remote.seq


class UnsupportedRecord(NeuronaBoxError, ValueError):
    """A rank record whose layout this dialect does not speak."""


@dataclass(frozen=True)
class RankRecord:
    """What a rank publishes in the store: hostname, listener address, pair ids.

    `pair_ids` is empty in lazy mode (the dialer writes its own rank as seq).
    """

    hostname: str
    address: Address
    pair_ids: tuple[int, ...] = ()

    def encode(self) -> bytes:
        host = self.hostname.encode()
        out = [struct.pack("<Q", len(host)), host, struct.pack("<Q", ADDRESS_SIZE)]
        out.append(self.address.encode())
        out.append(struct.pack(f"<{len(self.pair_ids)}q", *self.pair_ids))
        return b"".join(out)

    @classmethod
    def decode(cls, raw: bytes, world_size: int) -> RankRecord:
        """Decode and check the layout against the two torch >= 2.2 forms."""
        try:
            (hlen,) = struct.unpack_from("<Q", raw, 0)
            off = 8 + hlen
            if hlen > 1024 or off + 8 + ADDRESS_SIZE > len(raw):
                raise struct.error("no hostname header")
            hostname = raw[8:off].decode()
            (alen,) = struct.unpack_from("<Q", raw, off)
        except (struct.error, UnicodeDecodeError) as exc:
            raise UnsupportedRecord(
                f"unreadable Gloo rank record ({len(raw)} bytes): this torch/Gloo rank-record layout is not supported "
                "(need torch >= 2.2)"
            ) from exc
        if alen != ADDRESS_SIZE:
            raise UnsupportedRecord(
                f"Gloo rank record carries a {alen}-byte address, expected {ADDRESS_SIZE}: "
                "this torch/Gloo rank-record layout is not supported (need torch >= 2.2)"
            )
        off += 8
        address = Address.decode(raw[off : off + ADDRESS_SIZE])
        off += ADDRESS_SIZE
        rest = len(raw) - off
        if rest == 0:
            return cls(hostname, address, ())
        if rest != 8 * world_size:
            raise UnsupportedRecord(
                f"Gloo rank record has {rest} bytes of pair ids, expected 0 or {8 * world_size} "
                f"for world size {world_size}: this torch/Gloo layout is not supported"
            )
        return cls(hostname, address, struct.unpack_from(f"<{world_size}q", raw, off))

    @property
    def lazy(self) -> bool:
        return not self.pair_ids
