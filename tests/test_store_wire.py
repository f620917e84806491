"""The store's wire without torch (`neuronabox.store_wire`), against torch's own: our client
with torch's TCPStore server, torch's client with our server, over real sockets."""

from __future__ import annotations

import socket
import struct
import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from neuronabox.store_wire import (
    MAX_FIELD,
    Query,
    RequestReader,
    StoreClient,
    StoreClosed,
    StoreServer,
    StoreTimeout,
    hello,
    request,
)


@pytest.fixture
def ours():
    logged: list[str] = []
    server = StoreServer(socket.create_server(("127.0.0.1", 0)), log=logged.append)
    server.logged = logged
    yield server
    server.close()
    assert not server.thread.is_alive()


def waiting(wait, key: str) -> tuple[threading.Thread, list]:
    """`wait([key])` in a thread of its own; the list gets "done" once it returned."""
    done: list = []
    t = threading.Thread(target=lambda: (wait([key]), done.append("done")))
    t.start()
    return t, done


def test_our_client_speaks_to_torchs_server():
    srv = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    with StoreClient("127.0.0.1", srv.port, 10.0) as c:
        c.set("k", "v")
        assert c.get("k") == b"v" and srv.get("k") == b"v"
        assert c.add("n", 3) == 3 and srv.add("n", 2) == 5 and c.add("n", 0) == 5
        assert c.check(["k"]) and not c.check(["k", "absent"])
        c.multi_set(["a", "b"], ["x", b"yy"])
        assert srv.multi_get(["a", "b"]) == [b"x", b"yy"]
        with pytest.raises(StoreTimeout, match="absent"):
            c.wait(["absent"], 0.2)
        c.set("after", "still served")  # the cancelled wait left the connection in step
        assert srv.get("after") == b"still served"
        t, done = waiting(c.wait, "late")
        srv.set("late", "L")  # before or after the wait reached the server: either settles it
        t.join(10)
        assert done == ["done"]
        assert c.add_raw(b"init/", 1) == 1  # c10d's own key, outside the user keys


def test_torchs_client_speaks_to_our_server(ours):
    host, port = ours.address
    cl = dist.TCPStore(host, port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=10))
    cl.set("k", "v")
    assert cl.get("k") == b"v"
    assert cl.add("n", 3) == 3 and cl.add("n", 2) == 5 and cl.get("n") == b"5"
    assert cl.check(["k"]) and not cl.check(["k", "absent"])
    with pytest.raises(dist.DistStoreError):
        cl.wait(["absent"], timedelta(milliseconds=200))
    cl.multi_set(["a", "b"], ["x", "yy"])
    assert cl.multi_get(["a", "b"]) == [b"x", b"yy"]
    assert cl.compare_set("a", "x", "z") == b"z"  # expected: swapped
    assert cl.compare_set("a", "wrong", "w") == b"z"  # not: the value stays
    assert cl.compare_set("new", "", "q") == b"q"  # absent, nothing expected: set
    assert cl.compare_set("gone", "e", "w") == b"e" and not cl.check(["gone"])
    assert cl.delete_key("a") and not cl.delete_key("a")
    assert cl.num_keys() == 4  # k, n, b, new
    cl.append("b", "!")
    assert cl.get("b") == b"yy!"
    with StoreClient(host, port, 10.0) as c:
        t, done = waiting(cl.wait, "late")
        deadline = time.monotonic() + 10
        while not ours.table.waiters and time.monotonic() < deadline:  # the wait is held at the server
            threading.Event().wait(0.001)
        assert ours.table.waiters and not done
        c.set("late", "L")  # a wait settled by another connection's write
        t.join(10)
        assert done == ["done"]
    # torch's client counts itself in on c10d's init key when it waits for workers
    dist.TCPStore(host, port, world_size=2, is_master=False, wait_for_workers=True, timeout=timedelta(seconds=10))
    with StoreClient(host, port, 10.0) as c:
        assert c.add_raw(b"init/", 0) == 1
    assert not ours.logged


def test_a_request_split_anywhere_reads_the_same():
    wire = hello() + request(Query.SET, b"/k", b"value") + request(Query.WAIT, keys=[b"/k", b"/j"])
    reader = RequestReader()
    got = [r for i in range(len(wire)) for r in reader.feed(wire[i : i + 1])]
    assert [(r.query, r.keys, r.values) for r in got] == [
        (Query.SET, (b"/k",), (b"value",)),
        (Query.WAIT, (b"/k", b"/j"), ()),
    ]


@pytest.mark.parametrize(
    "wire, cause",
    [
        (request(Query.SET, b"/k", b"v"), "did not begin with TCPStore's hello"),
        (hello() + bytes([99]), "query 99"),
        (hello() + bytes([Query.SET]) + struct.pack("<Q", MAX_FIELD + 1), "a field of"),
        (hello() + request(Query.BARRIER), "BARRIER, which this store does not serve"),
        (
            hello() + request(Query.SET, b"/t", b"text") + request(Query.ADD, b"/t", tail=struct.pack("<q", 1)),
            "not a number",
        ),
    ],
    ids=["no hello", "unknown query", "field past the bound", "a query not served", "ADD to a word"],
)
def test_a_connection_that_breaks_the_wire_is_closed_and_named(ours, wire, cause):
    with socket.create_connection(ours.address, timeout=10) as s:
        s.sendall(wire)
        assert s.recv(1) == b""  # closed by the server, which named it first
    assert len(ours.logged) == 1 and cause in ours.logged[0] and "127.0.0.1:" in ours.logged[0], ours.logged
    with StoreClient(*ours.address, 10.0) as c:  # the others are still served
        c.set("k", "v")
        assert c.get("k") == b"v"


def test_a_client_of_nothing_or_of_a_stranger_fails_within_its_timeout():
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never answers
        port = silent.getsockname()[1]
        t0 = time.monotonic()
        with pytest.raises(StoreTimeout):
            StoreClient("127.0.0.1", port, 0.5)
        assert time.monotonic() - t0 < 30  # its own timeout, not the store's 300 s
    # closed now: refused until the timeout
    with pytest.raises(OSError):
        StoreClient("127.0.0.1", port, 0.3)


def test_a_closed_server_releases_its_port_and_ends_its_waits(ours):
    with StoreClient(*ours.address, 10.0) as c:
        c.sock.sendall(request(Query.WAIT, keys=[b"/never"]))
        ours.close()
        with pytest.raises(StoreClosed):
            c._recv(1)
    with pytest.raises(OSError):
        socket.create_connection(ours.address, timeout=1).close()


def test_a_client_that_does_not_read_its_answers_is_not_read_either(ours):
    """For a client that reads none of its answers the server holds at most its high water
    and one answer (64 MiB asked, past what loopback's buffers take: without the bound it
    held the rest), and serves the others. Reading again, the client gets every answer,
    in order."""
    value = bytes(range(256)) * 2048  # 512 KiB
    asks = 128  # 64 MiB of answers, past what loopback's buffers take (32 MiB to the reader, 4 to the sender)
    with StoreClient(*ours.address, 30.0) as other:
        other.set("big", value)
        assert other.get("big") == value  # served before the raw GETs below, which do not wait
        greedy = socket.socket()
        greedy.settimeout(30)
        with greedy:
            greedy.connect(ours.address)
            greedy.sendall(hello() + request(Query.GET, b"/big") * asks)
            for _ in range(30):  # while nobody reads: bounded, and the others served
                assert ours.held()[0] <= ours.HIGH_WATER + len(value) + 8
                other.set("k", "v")
                assert other.get("k") == b"v"
            answer = struct.pack("<Q", len(value)) + value
            for _ in range(asks):
                got = b""
                while len(got) < len(answer):
                    chunk = greedy.recv(len(answer) - len(got))
                    assert chunk, "the server closed the connection"
                    got += chunk
                assert got == answer


def test_a_reset_connection_reads_as_the_store_closing():
    """A store that resets the connection (it closed with a request unread) is StoreClosed,
    as an orderly close is, not a bare socket error."""
    with socket.create_server(("127.0.0.1", 0)) as listener:

        def answer_the_ping_then_reset() -> None:
            peer, _ = listener.accept()
            hello_and_ping = b""
            while len(hello_and_ping) < 10:
                hello_and_ping += peer.recv(10 - len(hello_and_ping))
            peer.sendall(hello_and_ping[-4:])  # the nonce back
            peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            peer.close()  # with linger 0: a reset

        t = threading.Thread(target=answer_the_ping_then_reset)
        t.start()
        with StoreClient(*listener.getsockname()[:2], 10.0) as c:
            t.join(10)
            with pytest.raises(StoreClosed):
                c.check(["k"])
