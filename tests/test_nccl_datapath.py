"""The Socket-net data path (the relay, controller/dialects/nccl/relay.py, with one real rank)
against a byte-level model of the real rank's device loop, written here from NCCL v2.28.9's src/device/all_reduce.h,
all_gather.h, reduce_scatter.h and broadcast.h (offsets, the partial last loop, which ops
reduce and which copy): fed only what the data path sends, the real rank must end with
what the data policy predicts, exactly, and every frame must be the size NCCL moves."""

from __future__ import annotations

import itertools
import struct

import numpy as np
import pytest
from neuronabox.controller.dialects.nccl.errors import NcclWireError
from neuronabox.controller.dialects.nccl.relay import CollParams, NcclRelay
from neuronabox.controller.dialects.nccl.wire import FrameReader
from neuronabox.controller.release import ReleaseTiming

from neuronabox import delay_models, topology
from neuronabox.schedules import Kind
from neuronabox.schedules.gloo import round_up
from neuronabox.schedules.nccl import NcclConfig, NcclRing, div_up, slice_sizes


class RelayPath:
    """One channel of a relay with one real rank, as that rank's sockets see it: its frames
    in, the frames for it out (`due` answers for every channel: the others' wait their turn)."""

    def __init__(self, relay: NcclRelay, rank: int, channel: int, outbox: dict[int, list[bytes]]) -> None:
        self.relay, self.rank, self.channel, self.outbox = relay, rank, channel, outbox

    def start(self) -> list[bytes]:
        return self._mine()

    def feed(self, data: bytes) -> list[bytes]:
        self.relay.feed(self.rank, self.channel, data, 0.0)
        return self._mine()

    def _mine(self) -> list[bytes]:
        for _, c, head, payload in self.relay.due(0.0):
            self.outbox.setdefault(c, []).append(head + payload)
        return self.outbox.pop(self.channel, [])


def relay_of(ring: NcclRing, rank: int, dtype: str = "float32", model: str = "zero") -> NcclRelay:
    """A relay with `rank` the one real rank of `ring`'s world, its collective announced
    (a model other than zero times every release from the real rank's entry)."""
    timing = ReleaseTiming(delay_models.load(model, topology.load("cpu-25gbe").with_nodes(ring.world, 1)))
    relay = NcclRelay(ring.world, [rank], ring.config, timing)
    relay.collective(rank, CollParams(0, ring.kind, ring.count, dtype, ring.elem, ring.root, len(ring.parts), "RING",
                                      "SIMPLE"), 0.0)  # fmt: skip
    return relay


class RealRank:
    """Rank `rank`'s buffers and device loop on one channel part, NCCL's way, speaking
    [i32 size][bytes] frames: `sent` collects what it writes to its successor, `inbox`
    holds what it has read from its predecessor and not consumed yet."""

    def __init__(self, ring: NcclRing, rank: int, x: np.ndarray) -> None:
        self.ring, self.rank, self.w = ring, rank, ring.world
        self.x = x  # the input (allgather: this rank's block; reduce-scatter: W blocks)
        self.out = {
            Kind.ALLREDUCE: x.copy(),
            Kind.ALLGATHER: np.full(len(x) * self.w, np.nan, dtype=x.dtype),
            Kind.REDUCE_SCATTER: np.full(len(x) // self.w, np.nan, dtype=x.dtype),
            Kind.BROADCAST: x.copy(),
        }[ring.kind]
        self.inbox = FrameReader(1 << 30, what="test inbox")
        moved_as_bytes = ring.kind in (Kind.ALLGATHER, Kind.BROADCAST)  # NCCL counts these in bytes
        self.wire = np.dtype(np.uint8) if moved_as_bytes else x.dtype
        self.frames: list[bytes] = []

    # the primitives: one message per slice, as prims_simple.h cuts an op
    def _slices(self, n: int) -> list[tuple[int, int]]:
        r = self.ring
        sizes = slice_sizes(n, r.slices_per_chunk, r.steps_per_slice, r.step_elems)
        starts = itertools.accumulate((0, *sizes[:-1]))
        return list(zip(starts, sizes, strict=True))

    def send(self, values: np.ndarray, n: int, path: RelayPath) -> None:
        for a, k in self._slices(n):
            data = values[a : a + k].tobytes()
            self.frames.extend(path.feed(struct.pack("<i", len(data)) + data))

    def recv(self, n: int, path: RelayPath) -> np.ndarray:
        parts = []
        for _, k in self._slices(n):
            if not self.frames:
                raise AssertionError("the real rank waits for a message the data path never sent: deadlock")
            (payload,) = self.inbox.feed(self.frames.pop(0))
            assert len(payload) == k * self.wire.itemsize, "a frame of the wrong size"
            parts.append(np.frombuffer(payload, dtype=self.wire))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=self.wire)

    def run(self, part, path: RelayPath) -> None:
        self.frames.extend(path.start())
        k, w, r = self.ring.kind, self.w, self.rank
        if k == Kind.ALLREDUCE:
            chunk0 = part.chunk
            for base in range(0, part.count, w * chunk0):
                rem = part.count - base
                chunk = chunk0 if rem >= w * chunk0 else round_up(div_up(rem, w), 16 // self.x.itemsize)

                def at(c: int, base=base, rem=rem, chunk=chunk) -> tuple[int, int]:
                    return part.offset + base + c * chunk, max(0, min(chunk, rem - c * chunk))

                o, n = at((r - 1) % w)
                self.send(self.out[o : o + n], n, path)  # step 0: push
                for j in range(2, w):  # reduce and forward
                    o, n = at((r - j) % w)
                    self.out[o : o + n] += self.recv(n, path)
                    self.send(self.out[o : o + n], n, path)
                o, n = at(r)  # reduce the own chunk: final
                self.out[o : o + n] += self.recv(n, path)
                self.send(self.out[o : o + n], n, path)
                for j in range(1, w - 1):  # copy the finished chunks and forward
                    o, n = at((r - j) % w)
                    self.out[o : o + n] = self.recv(n, path)
                    self.send(self.out[o : o + n], n, path)
                o, n = at((r + 1) % w)
                self.out[o : o + n] = self.recv(n, path)
            return
        # allgather, reduce-scatter and broadcast loop over the part in chunks
        x = self.x.view(np.uint8) if k in (Kind.ALLGATHER, Kind.BROADCAST) else self.x
        out = self.out.view(np.uint8) if k in (Kind.ALLGATHER, Kind.BROADCAST) else self.out
        block = len(x) if k == Kind.ALLGATHER else len(x) // w
        for base in range(0, part.count, part.chunk):
            n = min(part.chunk, part.count - base)
            off = part.offset + base
            if k == Kind.BROADCAST:
                root = self.ring.root
                if r == root:
                    self.send(x[off : off + n], n, path)
                elif (r + 1) % w == root:
                    out[off : off + n] = self.recv(n, path)
                else:
                    out[off : off + n] = self.recv(n, path)
                    self.send(out[off : off + n], n, path)
                continue
            if k == Kind.ALLGATHER:
                out[r * block + off : r * block + off + n] = x[off : off + n]
                self.send(x[off : off + n], n, path)
                for j in range(1, w - 1):
                    b = (r - j) % w
                    out[b * block + off : b * block + off + n] = self.recv(n, path)
                    self.send(out[b * block + off : b * block + off + n], n, path)
                b = (r + 1) % w
                out[b * block + off : b * block + off + n] = self.recv(n, path)
                continue
            # reduce-scatter: push block R-1, reduce and forward W-2 blocks, reduce the own one
            b = (r - 1) % w
            acc = x[b * block + off : b * block + off + n].copy()
            self.send(acc, n, path)
            for j in range(2, w):
                b = (r - j) % w
                acc = x[b * block + off : b * block + off + n] + self.recv(n, path)
                self.send(acc, n, path)
            out[off : off + n] = x[r * block + off : r * block + off + n] + self.recv(n, path)


def play(kind: Kind, world: int, count: int, dtype, rank: int, channels: int, root: int = 0, model: str = "zero"):
    rng = np.random.default_rng(world * 1000 + count)
    elem = np.dtype(dtype).itemsize
    ring = NcclRing(kind, world, count, elem, root=root, config=NcclConfig(channels=channels))
    n = count * world if kind == Kind.REDUCE_SCATTER else count
    x = rng.integers(-1000, 1000, size=n).astype(dtype)
    real = RealRank(ring, rank, x)
    relay, outbox = relay_of(ring, rank, np.dtype(dtype).name, model), {}
    for part in ring.parts:
        path = RelayPath(relay, rank, part.channel, outbox)
        real.run(part, path)
        assert not relay.waiting(rank, part.channel) and not real.frames, "every message of the schedule moved"
    assert [i.params.seq for i in relay.finished] == [0] and not relay.in_flight and not any(outbox.values())
    assert not relay.finished[0].got  # nothing of the real rank's held past its last forward
    return real


CASES = [(2, 10), (3, 1000), (4, (1 << 20) + 5), (5, 3 << 18), (8, 4096)]


@pytest.mark.parametrize("channels", [1, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_allreduce_leaves_the_real_rank_its_input(dtype, channels):
    for (world, count), rank in itertools.product(CASES, (0, 1)):
        real = play(Kind.ALLREDUCE, world, count, dtype, rank, channels)
        assert np.array_equal(real.out, real.x), (world, count, rank)


@pytest.mark.parametrize("channels", [1, 2])
def test_allgather_mirrors_the_real_rank(channels):
    for (world, count), rank in itertools.product(CASES, (0, 2)):
        real = play(Kind.ALLGATHER, world, count, np.float32, rank % world, channels)
        assert np.array_equal(real.out, np.tile(real.x, world)), (world, count, rank)


def test_reduce_scatter_leaves_the_own_block_and_broadcast_zeros():
    for world, count in CASES:
        real = play(Kind.REDUCE_SCATTER, world, count, np.float32, 1 % world, 1)
        r = 1 % world
        assert np.array_equal(real.out, real.x[r * count : (r + 1) * count])
        real = play(Kind.BROADCAST, world, count, np.float32, 0, 1, root=world - 1)  # an emulated root: zeros
        assert not real.out.any()
        for model in ("zero", "alpha-beta"):  # the real root only sends, and has nothing to be timed
            real = play(Kind.BROADCAST, world, count, np.float32, 0, 1, root=0, model=model)
            assert np.array_equal(real.out, real.x)


def test_a_frame_of_the_wrong_size_is_refused_naming_it():
    ring = NcclRing(Kind.ALLREDUCE, 4, 1 << 16, 4)
    path = RelayPath(relay_of(ring, 0), 0, 0, {})
    path.start()
    first = ring.sends(0)[0].nbytes
    with pytest.raises(NcclWireError, match=f"sent {first - 4} bytes as message 0 of allreduce seq 0 on channel 0"):
        path.feed(struct.pack("<i", first - 4) + bytes(first - 4))
    with pytest.raises(NcclWireError, match="more than the"):
        RelayPath(relay_of(ring, 0), 0, 0, {}).feed(struct.pack("<i", ring.posted_bytes + 1))


def test_bytes_beyond_the_collective_are_left_for_the_next():
    ring = NcclRing(Kind.ALLGATHER, 2, 64, 1)
    relay = relay_of(ring, 0, "uint8")
    path = RelayPath(relay, 0, 0, {})
    frames = [struct.pack("<i", m.nbytes) + bytes([7]) * m.nbytes for m in ring.sends(0)]
    out = path.start() + path.feed(b"".join(frames) + b"NEXT")
    assert len(relay.finished) == 1 and relay.waiting(0, 0) == b"NEXT"
    assert [len(f) - 4 for f in out] == [m.nbytes for m in ring.recvs(0)]
    assert all(f[4:] == bytes([7]) * (len(f) - 4) for f in out)  # the mirror: the rank's own bytes back
