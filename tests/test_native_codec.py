"""The native Gloo pair under hostile input: fuzzed with hypothesis through the same
bindings the driver uses, and over real sockets.

What must hold for any bytes a peer sends: the pair returns events or raises
WireError with a cause, never crashes or hangs, and holds at most one partial
header plus one payload it posted a receive for."""

import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from neuronabox.controller.dialects.gloo.protocol import Data, GlooPair, Payload, RecvReady, SendReady, WireError
from neuronabox.controller.dialects.gloo.wire import PREAMBLE, Opcode, SlotPrefix, make_slot

SCRATCH = 64 * 1024  # the pair's header buffer (gloo_pair.h)
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOTS = [make_slot(SlotPrefix.ALLREDUCE, 1), make_slot(SlotPrefix.BROADCAST, 9, 3), 5]


def preamble(op: int, slot: int, length: int, nbytes: int | None = None) -> bytes:
    return PREAMBLE.pack(48 + length if nbytes is None else nbytes, op, slot, 0, length, 0)


@st.composite
def conversations(draw):
    """A valid stream from a real rank: notices, and data frames into receives the
    controller posted, with the events it must produce and the receives to post."""
    stream, events, posted = [], [], []
    for _ in range(draw(st.integers(1, 12))):
        slot = draw(st.sampled_from(SLOTS))
        kind = draw(st.sampled_from(["recv", "send", "data"]))
        if kind == "recv":
            n = draw(st.integers(0, 1 << 40))
            stream.append(preamble(Opcode.NOTIFY_RECV_READY, slot, n, 48))
            events.append(RecvReady(slot, n))
        elif kind == "send":
            n = draw(st.integers(0, 1 << 40))
            stream.append(preamble(Opcode.NOTIFY_SEND_READY, slot, n, 48))
            events.append(SendReady(slot, n))
        else:
            size = draw(st.sampled_from([0, 1, 47, 48, 4096, SCRATCH - 1, SCRATCH + 13, 3 * SCRATCH]))
            payload = draw(st.binary(min_size=min(size, 64), max_size=min(size, 64))) * (size // 64 + 1)
            payload = payload[:size] if payload else bytes(size)
            posted.append((slot, size + draw(st.integers(0, 8))))
            stream.append(preamble(Opcode.NOTIFY_SEND_READY, slot, size, 48))
            stream.append(preamble(Opcode.SEND_UNBOUND_BUFFER, slot, size) + payload)
            events += [SendReady(slot, size), Data(slot, payload)]
    return b"".join(stream), events, posted


def cuts(data: bytes, points: list[int]) -> list[bytes]:
    edges = sorted({0, len(data), *(p % (len(data) + 1) for p in points)})
    return [data[a:b] for a, b in zip(edges, edges[1:], strict=False)]


@FUZZ
@given(conversations(), st.lists(st.integers(0, 1 << 20), max_size=12))
def test_any_split_of_a_valid_stream_gives_its_events(conv, points):
    data, expected, posted = conv
    pair = GlooPair()
    for slot, n in posted:
        pair.recv_ready(slot, n)
    got = []
    for chunk in cuts(data, points):
        got += pair.receive(chunk)
        assert pair.buffered <= SCRATCH + max((n for _, n in posted), default=0)
    assert got == expected
    assert [type(e) for e in got] == [type(e) for e in expected]
    assert pair.buffered == 0
    assert all(isinstance(e.payload, Payload) for e in got if isinstance(e, Data))


@FUZZ
@given(st.binary(max_size=4096), st.lists(st.integers(0, 4096), max_size=8), st.integers(0, 1 << 20))
def test_random_bytes_end_in_events_or_a_wire_error(data, points, posted_len):
    pair = GlooPair(max_payload=1 << 24)
    for slot in SLOTS:
        pair.recv_ready(slot, posted_len)
    try:
        for chunk in cuts(data, points):
            pair.receive(chunk)
            assert pair.buffered <= SCRATCH + posted_len
    except WireError as exc:
        assert str(exc)  # a cause, in words


@FUZZ
@given(
    st.sampled_from(SLOTS),
    st.integers(0, (1 << 64) - 1),
    st.integers(0, (1 << 64) - 1),
    st.integers(0, (1 << 64) - 1),
)
def test_a_hostile_data_header_is_refused_before_its_payload(slot, length, nbytes, posted):
    """An oversized or inconsistent data header fails on its 48 bytes alone: the pair
    never waits for (or allocates) a payload it did not post a receive for."""
    pair = GlooPair(max_payload=1 << 30)
    pair.recv_ready(slot, posted)
    notice = preamble(Opcode.NOTIFY_SEND_READY, slot, length, 48)
    head = notice + preamble(Opcode.SEND_UNBOUND_BUFFER, slot, length, nbytes)
    valid = nbytes == 48 + length and length <= min(posted, 1 << 30)
    if valid:
        pair.receive(head)
        assert pair.buffered == length  # exactly the payload it posted for
    else:
        with pytest.raises(WireError):
            pair.receive(head)


def test_truncated_stream_holds_only_what_it_needs_and_completes_later():
    pair = GlooPair()
    pair.recv_ready(SLOTS[0], 5 << 20)
    body = bytes(range(256)) * (5 << 12)
    data = preamble(Opcode.NOTIFY_SEND_READY, SLOTS[0], len(body), 48)
    data += preamble(Opcode.SEND_UNBOUND_BUFFER, SLOTS[0], len(body)) + body
    assert pair.receive(data[:100]) == [SendReady(SLOTS[0], len(body))]
    assert pair.buffered == len(body)
    assert pair.receive(data[100:]) == [Data(SLOTS[0], body)]
    assert pair.buffered == 0


def test_unknown_opcode_and_mismatched_nbytes_name_their_cause():
    with pytest.raises(WireError, match="unsupported opcode 9"):
        GlooPair().receive(preamble(9, SLOTS[0], 0, 48))
    pair = GlooPair()
    pair.recv_ready(SLOTS[0], 8)
    with pytest.raises(WireError, match="nbytes=40 does not match length=8"):
        pair.receive(preamble(Opcode.NOTIFY_SEND_READY, SLOTS[0], 8, 48) + preamble(1, SLOTS[0], 8, 40))


def test_frames_round_trip_through_a_pair_and_its_peer():
    """What one side's commands queue, the other side parses back, payloads intact; a
    received Payload is forwarded by reference and compares equal to its bytes."""
    ours, theirs = GlooPair(), GlooPair()
    theirs.recv_ready(SLOTS[0], 1 << 20)
    ours.receive(theirs.take())
    ours.recv_ready(SLOTS[1], 3)
    theirs.receive(ours.take())
    payload = bytes(range(256)) * 4096
    ours.send(SLOTS[0], payload)
    assert ours.pending == 96 + len(payload)
    (_, got) = theirs.receive(ours.take())
    assert got == Data(SLOTS[0], payload) and bytes(got.payload) == payload and len(got.payload) == len(payload)
    theirs.send_ready(SLOTS[1], 3)
    theirs.data(SLOTS[1], b"abc")
    (_, data) = ours.receive(theirs.take())
    theirs.recv_ready(SLOTS[1], 3)
    ours.receive(theirs.take())
    ours.send(SLOTS[1], data.payload)  # forwarded as received
    assert theirs.receive(ours.take())[-1] == Data(SLOTS[1], b"abc")


def test_reads_and_writes_over_a_real_socket():
    """`read(fd)` takes frames from a non-blocking socket (a large payload lands in place,
    in as many reads as the kernel needs), `flush(fd)` writes what is queued; a closed
    peer reads as None; a hostile frame raises WireError."""
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    try:
        ours, theirs = GlooPair(), GlooPair()
        ours.recv_ready(SLOTS[0], 3 << 20)
        while not ours.flush(a.fileno()):
            pass
        theirs.receive(b.recv(1 << 16))
        body = bytes(range(251)) * ((3 << 20) // 251)
        theirs.send(SLOTS[0], body)
        got = []
        while len(got) < 2:
            theirs.flush(b.fileno())
            got += ours.read(a.fileno()) or []
        assert got == [SendReady(SLOTS[0], len(body)), Data(SLOTS[0], body)]
        assert ours.read(a.fileno()) == []  # nothing more yet: would block
        b.sendall(preamble(Opcode.SEND_BUFFER, SLOTS[0], 0, 48))
        with pytest.raises(WireError, match="opcode 0"):
            ours.read(a.fileno())
        b.close()
        assert GlooPair().read(a.fileno()) is None
    finally:
        a.close()
        b.close()
