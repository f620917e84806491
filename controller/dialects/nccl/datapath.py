"""One ring collective on one channel of NCCL's Socket net, seen from the controller (sans-IO).

The real rank R sends its ring successor (an emulated rank) `[i32 size][bytes]` frames on
one connection and receives its predecessor's on another (NCCL_SOCKET_NTHREADS=0: one
socket per direction, no acks, no credits). NCCL's Simple receiver never reads a size, so
the controller must send exactly the messages R's proxy posts, each within the posted
buffer: `NcclRing.recvs(R)` says how many and how large, and `NcclRing.echo_plan(R)` what
each carries (zeros, or the bytes of one of R's own earlier messages).

`RingDataPath` is fed the bytes R sends and hands back, in order, the frames to write to
R as soon as what they carry has arrived. The bytes R sent after this collective's last
message stay in `rest` for the next one on the same connection.
"""

from __future__ import annotations

from neuronabox.schedules.nccl import NcclRing

from .errors import NcclWireError
from .wire import FrameReader, encode_frame


class RingDataPath:
    """What the emulated neighbours of rank `rank` exchange with it on `channel` for one
    collective under the data policy (emulated ranks contribute zeros; an allgather mirrors)."""

    def __init__(self, ring: NcclRing, rank: int, channel: int) -> None:
        self.ring = ring
        self.rank = rank
        self.channel = channel
        sends, recvs, plan = ring.sends(rank), ring.recvs(rank), ring.echo_plan(rank)
        mine = [i for i, m in enumerate(sends) if m.channel == channel]
        self._in_sizes = [sends[i].nbytes for i in mine]  # what R sends on this channel, in order
        local = {i: j for j, i in enumerate(mine)}  # R's message index -> its index on this channel
        self._out: list[tuple[int, int | None]] = []  # (bytes, index of R's message it echoes)
        for m, echo in zip(recvs, plan, strict=True):
            if m.channel != channel:
                continue
            if echo is not None and echo not in local:
                raise NcclWireError(f"rank {rank} channel {channel}: an echo of another channel's message")
            self._out.append((m.nbytes, None if echo is None else local[echo]))
        self._reader = FrameReader(max(self._in_sizes, default=0), what=f"rank {rank}'s net frame on channel "
                                   f"{channel}", limit=len(self._in_sizes))  # fmt: skip
        # R's messages are kept only until their last echo has gone: an allgather's own
        # block is echoed W-1 times, an allreduce chunk once, a zeros-only collective never.
        self._uses: dict[int, int] = {}
        for _, echo in self._out:
            if echo is not None:
                self._uses[echo] = self._uses.get(echo, 0) + 1
        self._got: dict[int, bytes] = {}
        self._arrived = 0
        self._next_out = 0

    @property
    def done(self) -> bool:
        return self._reader.finished and self._next_out == len(self._out)

    @property
    def held(self) -> int:
        """Bytes of R's kept for echoes still to send."""
        return sum(map(len, self._got.values()))

    @property
    def rest(self) -> bytes:
        """Bytes R sent beyond this collective: the next one's."""
        return self._reader.rest

    def start(self) -> list[bytes]:
        """The frames that need nothing from R (R's first receives carry zeros)."""
        return self._ready()

    def feed(self, data: bytes) -> list[bytes]:
        """Bytes from R's connection to its successor in; frames for R's predecessor
        connection out. A frame of another size than the schedule's is refused, naming it."""
        for payload in self._reader.feed(data):
            i = self._arrived
            if len(payload) != self._in_sizes[i]:
                raise NcclWireError(
                    f"rank {self.rank} sent {len(payload)} bytes as message {i} of its {self.ring.kind} on channel "
                    f"{self.channel}; NCCL's schedule says {self._in_sizes[i]}"
                )
            if i in self._uses:
                self._got[i] = payload
            self._arrived += 1
        return self._ready()

    def _ready(self) -> list[bytes]:
        out = []
        while self._next_out < len(self._out):
            nbytes, echo = self._out[self._next_out]
            if echo is None:
                out.append(encode_frame(bytes(nbytes)))
            elif echo < self._arrived:
                out.append(encode_frame(self._got[echo]))
                self._uses[echo] -= 1
                if not self._uses[echo]:
                    del self._got[echo]
            else:
                break  # waits for R's message `echo`
            self._next_out += 1
        return out
