"""The Gloo wire codec and the sans-IO pair machine, driven with bytes."""

import socket
import struct

import pytest
from neuronabox.controller.dialects.gloo.protocol import Data, GlooPair, RecvReady, SendReady, WireError
from neuronabox.controller.dialects.gloo.wire import (
    PREAMBLE,
    Address,
    Opcode,
    RankRecord,
    SlotPrefix,
    UnsupportedRecord,
    dialer_is_local,
    encode_address,
    make_slot,
    split_slot,
)

SLOT = make_slot(SlotPrefix.ALLREDUCE, 7)


def frame(op: int, slot: int, length: int, payload: bytes = b"") -> bytes:
    nbytes = 48 + (len(payload) if op == Opcode.SEND_UNBOUND_BUFFER else 0)
    return PREAMBLE.pack(nbytes, op, slot, 0, length, 0) + payload


def test_slot_layout_matches_gloo():
    assert make_slot(SlotPrefix.ALLREDUCE, 7) == (4 << 56) | (7 << 24)
    assert split_slot(make_slot(SlotPrefix.BARRIER, 0xFFFFFFFF, 3)) == (7, 0xFFFFFFFF, 3)


def test_address_is_sockaddr_storage_plus_seq():
    raw = encode_address("127.0.0.1", 0x1234, 42)
    assert len(raw) == 136
    assert struct.unpack_from("<H", raw, 0)[0] == socket.AF_INET
    assert raw[2:4] == b"\x12\x34"  # port in network order
    assert raw[4:8] == bytes([127, 0, 0, 1])
    assert struct.unpack_from("<q", raw, 128)[0] == 42
    assert Address.decode(raw) == Address("127.0.0.1", 0x1234, 42)


def test_rank_record_roundtrip_full_mesh_and_lazy():
    addr = Address("127.0.0.1", 5000, -1)
    full = RankRecord("host", addr, (3, 4, 5))
    raw = full.encode()
    assert len(raw) == 8 + 4 + 8 + 136 + 8 * 3
    assert RankRecord.decode(raw, 3) == full
    lazy = RankRecord("host", addr)
    assert RankRecord.decode(lazy.encode(), 3).lazy


def test_torch_2_1_concatenated_address_record_is_refused():
    # torch 2.1: one listener, a concatenated list of W-1 addresses and no hostname header.
    legacy = b"".join(encode_address("127.0.0.1", 5000, s) for s in range(3))
    with pytest.raises(UnsupportedRecord, match="not supported"):
        RankRecord.decode(legacy, 4)


def test_record_with_wrong_pair_id_count_is_refused():
    raw = RankRecord("h", Address("127.0.0.1", 1, -1), (1, 2)).encode()
    with pytest.raises(UnsupportedRecord, match="pair ids"):
        RankRecord.decode(raw, 5)


def test_dialer_rule_compares_ip_then_swapped_port_then_seq():
    a = Address("127.0.0.2", 1000, 0)
    b = Address("127.0.0.1", 60000, 0)
    assert dialer_is_local(a, b) and not dialer_is_local(b, a)
    # same IP: ports compared as network-order bytes read little-endian
    p, q = Address("127.0.0.1", 0x01FF, 0), Address("127.0.0.1", 0xFF01, 0)
    assert dialer_is_local(p, q)  # 0xFF01 > 0x01FF once swapped
    s1, s2 = Address("127.0.0.1", 5, 1), Address("127.0.0.1", 5, 2)
    assert dialer_is_local(s2, s1)


def test_parses_frames_split_at_any_byte():
    stream = frame(Opcode.NOTIFY_RECV_READY, SLOT, 16) + frame(Opcode.NOTIFY_SEND_READY, SLOT, 4)
    pair = GlooPair()
    pair.recv_ready(SLOT, 4)  # we posted a receive of 4 bytes
    stream += frame(Opcode.SEND_UNBOUND_BUFFER, SLOT, 4, b"abcd")
    events = []
    for i in range(len(stream)):
        events += pair.receive(stream[i : i + 1])
    assert events == [RecvReady(SLOT, 16), SendReady(SLOT, 4), Data(SLOT, b"abcd")]
    assert [type(e) for e in events] == [RecvReady, SendReady, Data]


def test_no_data_before_the_peers_receive_notice():
    pair = GlooPair()
    pair.send_ready(SLOT, 4)
    with pytest.raises(WireError, match="before the peer's NOTIFY_RECV_READY"):
        pair.data(SLOT, b"abcd")


def test_send_ready_must_precede_data():
    pair = GlooPair()
    pair.receive(frame(Opcode.NOTIFY_RECV_READY, SLOT, 4))
    with pytest.raises(WireError, match="before NOTIFY_SEND_READY"):
        pair.data(SLOT, b"abcd")


def test_payload_longer_than_posted_receive_is_refused():
    pair = GlooPair()
    pair.receive(frame(Opcode.NOTIFY_RECV_READY, SLOT, 2))
    pair.send_ready(SLOT, 4)
    with pytest.raises(WireError, match="exceeds"):
        pair.data(SLOT, b"abcd")


def test_receives_are_filled_first_in_first_out_per_slot():
    pair = GlooPair()
    other = make_slot(SlotPrefix.ALLREDUCE, 8)
    pair.receive(frame(Opcode.NOTIFY_RECV_READY, SLOT, 8) + frame(Opcode.NOTIFY_RECV_READY, SLOT, 2))
    pair.send_ready(SLOT, 8)
    pair.send_ready(SLOT, 2)
    pair.data(SLOT, b"x" * 8)
    with pytest.raises(WireError):  # the second posted receive is only 2 bytes
        pair.data(SLOT, b"x" * 3)
    with pytest.raises(WireError):  # no receive posted on another slot
        pair.send_ready(other, 1)
        pair.data(other, b"y")


def test_incoming_data_needs_our_receive_and_its_notice():
    pair = GlooPair()
    with pytest.raises(WireError, match="before NOTIFY_SEND_READY"):
        pair.receive(frame(Opcode.SEND_UNBOUND_BUFFER, SLOT, 1, b"z"))
    pair = GlooPair()
    with pytest.raises(WireError, match="without a posted receive"):
        pair.receive(frame(Opcode.NOTIFY_SEND_READY, SLOT, 1) + frame(Opcode.SEND_UNBOUND_BUFFER, SLOT, 1, b"z"))


def test_bound_buffer_opcode_is_refused():
    with pytest.raises(WireError, match="opcode 0"):
        GlooPair().receive(frame(Opcode.SEND_BUFFER, SLOT, 0))


def test_a_guessed_receive_is_one_notice_that_the_next_book_claims_whatever_its_length():
    """A receive posted on a guess (the core's, for a repeating shape's next instance) goes
    out as one NOTIFY_RECV_READY; data of any length then takes it (the book checks the
    length), and the slot's next recv_ready, of any length, sends nothing more."""
    pair = GlooPair()
    pair.post_guess(SLOT, 4)
    assert pair.take() == frame(Opcode.NOTIFY_RECV_READY, SLOT, 4) and pair.guesses == 1
    events = pair.receive(
        frame(Opcode.NOTIFY_SEND_READY, SLOT, 6) + frame(Opcode.SEND_UNBOUND_BUFFER, SLOT, 6, b"abcdef")
    )
    assert events == [SendReady(SLOT, 6), Data(SLOT, b"abcdef")]  # before the book: a longer block than guessed
    pair.recv_ready(SLOT, 6)  # the book's own receive, claimed by the guess
    assert pair.take() == b"" and pair.guesses == 0
    pair.recv_ready(SLOT, 6)  # a second receive of the slot is a notice of its own
    assert pair.take() == frame(Opcode.NOTIFY_RECV_READY, SLOT, 6)


def test_a_forgotten_guess_takes_no_more_data_and_a_plain_post_ahead_keeps_its_length():
    pair = GlooPair()
    pair.post_guess(SLOT, 4)
    assert pair.forget_guess(SLOT) and not pair.forget_guess(SLOT) and pair.guesses == 0
    with pytest.raises(WireError, match="without a posted receive"):
        pair.receive(frame(Opcode.NOTIFY_SEND_READY, SLOT, 4) + frame(Opcode.SEND_UNBOUND_BUFFER, SLOT, 4, b"abcd"))
    pair = GlooPair()
    pair.post_guess(SLOT, 4)
    pair.recv_ready(SLOT, 2)  # claimed: nothing left to forget
    assert not pair.forget_guess(SLOT)
