"""The launchers of one run on several hosts, and the link that keeps them one run.

torchrun's way: the host of every real node runs the same `neuronabox torchrun` command
with its own --node-rank. One launcher is the head and runs the controller: node 0's when
node 0 is real, else `neuronabox controller` on a host of the user's choice. Every other
host's launcher (a member) starts its own node's torchrun only. The head listens for the
members on the cluster's address (--master-addr), at a port the controller publishes in the
run's store (`store.HEAD_KEY`). Each member holds one TCP connection to it for the whole run,
one JSON document a line:

    member -> head   {"hello": K, "job": {...}}     first; the head checks K and the flags
    head -> member   {"welcome": {...}}              the observer's address and secret
                     {"refused": cause}              or why not
    member -> head   {"done": true} | {"failed": cause}     how its node ended
    head -> member   {"end": cause, "summary": text}          the run's end ("": success)

A connection that closes is a host gone: a launcher's sockets close when it dies, at once
(a host that loses power is found by TCP keepalive, within about 11 s). A member that has
not said hello by the join deadline never joined. Either ends the run on every host, with a
line that names the node. The secret travels as the store's contents do: on the cluster's
network, unauthenticated, as torchrun's own rendezvous does.

Sockets and one small state machine per member (`MemberState`); the launcher's loop calls
`HeadLink.poll` between its other checks, `MemberLink.poll` likewise."""

from __future__ import annotations

import enum
import json
import selectors
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from neuronabox.errors import NeuronaBoxError
from neuronabox.store import store_listener

MAX_LINE = 1 << 20  # a summary is a few KiB; a longer line is not ours
HELLO_WITHIN_S = 10.0  # a connection that says nothing this long is dropped
MAX_PENDING = 64  # connections not yet said hello: beyond this, new ones are closed
KEEPALIVE = (5, 2, 3)  # idle s, interval s, probes: a silent dead host is found in ~11 s


class HostLinkError(NeuronaBoxError, RuntimeError):
    """The link between a run's hosts failed; the message is the one-line cause."""


class MemberState(enum.Enum):
    AWAITED = "awaited"  # no hello yet
    RUNNING = "running"  # said hello, its node runs
    DONE = "done"  # its node finished
    FAILED = "failed"  # its node failed (the cause came with it)
    GONE = "gone"  # its connection closed while its node ran
    ABSENT = "absent"  # never joined by the deadline


# The transitions, in one place: a member's state only moves along these.
_MOVES = {
    MemberState.AWAITED: {MemberState.RUNNING, MemberState.ABSENT},
    MemberState.RUNNING: {MemberState.DONE, MemberState.FAILED, MemberState.GONE},
    MemberState.DONE: set(),
    MemberState.FAILED: set(),
    MemberState.GONE: set(),
    MemberState.ABSENT: set(),
}


@dataclass(frozen=True)
class HostEvent:
    """A member's state changed: `cause` says how, for FAILED, GONE and ABSENT."""

    node: int
    state: MemberState
    cause: str = ""


def encode(msg: dict) -> bytes:
    return json.dumps(msg, separators=(",", ":")).encode() + b"\n"


class Lines:
    """Bytes in, JSON documents out, one a line; a line over MAX_LINE is an error."""

    def __init__(self) -> None:
        self.buf = b""

    def feed(self, data: bytes) -> list[dict]:
        self.buf += data
        out = []
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            try:
                msg = json.loads(line)
            except ValueError:
                raise HostLinkError("a line that is not JSON") from None
            if not isinstance(msg, dict):
                raise HostLinkError("a line that is not a JSON object")
            out.append(msg)
        if len(self.buf) > MAX_LINE:
            raise HostLinkError(f"a line over {MAX_LINE} bytes")
        return out


def send_line(sock: socket.socket, msg: dict, timeout: float = 5.0) -> None:
    """One message on a non-blocking link, waiting up to `timeout` for the peer to take it;
    a peer that does not (gone, or stuck) is found by the next read, not here."""
    try:
        sock.settimeout(timeout)
        sock.sendall(encode(msg))
    except OSError:
        pass
    finally:
        if sock.fileno() >= 0:
            sock.setblocking(False)


def keep_alive(sock: socket.socket) -> None:
    idle, interval, probes = KEEPALIVE
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, probes)


def job_facts(job) -> dict:
    """What every host's command must agree on, compared at hello (`Job` duck-typed: this
    module sits below the job's)."""
    return {
        "nnodes": job.nnodes,
        "nproc_per_node": job.nproc_per_node,
        "real_nodes": list(job.real_nodes),
        "run_id": job.run_id,
        "backend": job.backend,
    }


def differences(mine: dict, theirs: object) -> str:
    """The first fact two hosts' commands disagree on, in words; "" when none."""
    if not isinstance(theirs, dict):
        return "its hello carries no job"
    for key, value in mine.items():
        if theirs.get(key) != value:
            return f"{key} is {theirs.get(key)!r} there and {value!r} here"
    return ""


def host_cause(ev: HostEvent) -> str:
    """The one line that ends a run on several hosts, naming the node."""
    if ev.state is MemberState.GONE:
        return f"real node {ev.node}'s host is gone: {ev.cause}"
    if ev.state is MemberState.ABSENT:
        return f"real node {ev.node} never joined: {ev.cause}"
    return f"the job failed on real node {ev.node}: {ev.cause}"


class _Peer:
    def __init__(self, sock: socket.socket, since: float, where: tuple) -> None:
        self.sock = sock
        self.since = since
        self.lines = Lines()
        self.node: int | None = None  # once it was welcomed
        self.hello: dict | None = None  # its hello, until answered (the welcome may not be known yet)
        self.where = "{}:{}".format(*where[:2])  # as accepted: a peer gone since has no name to ask


class HeadLink:
    """The head's side: listens on `host` for the members `members` (real nodes whose
    launchers run elsewhere), tells each the run's `welcome` once it has it, and tracks
    their states. `facts`: this host's `job_facts`, which every member must match; a
    member not joined `join_s` after `now` never joined."""

    def __init__(self, host: str, members: list[int], facts: dict, join_s: float, now: float) -> None:
        self.states = {n: MemberState.AWAITED for n in members}
        self.facts = facts
        self.join_s = join_s
        self.join_by = now + join_s
        self.welcome: dict | None = None
        self.listener = store_listener(host, 0)
        self.listener.setblocking(False)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.listener, selectors.EVENT_READ)
        self.peers: dict[socket.socket, _Peer] = {}
        self.closed = False

    @property
    def address(self) -> str:
        host, port = self.listener.getsockname()[:2]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    @property
    def all_done(self) -> bool:
        return all(s is MemberState.DONE for s in self.states.values())

    def move(self, node: int, to: MemberState, cause: str = "") -> HostEvent:
        now = self.states[node]
        if to not in _MOVES[now]:
            raise HostLinkError(f"real node {node}: {now.value} cannot become {to.value}")
        self.states[node] = to
        return HostEvent(node, to, cause)

    def poll(self, now: float, wait: float = 0.0) -> list[HostEvent]:
        """What happened since the last call, waiting up to `wait` seconds for a member to say
        something (0: never blocks)."""
        events: list[HostEvent] = []
        for key, _ in self.sel.select(timeout=wait):
            if key.fileobj is self.listener:
                self._accept(now)
            else:
                events += self._read(self.peers[key.fileobj])
        for peer in list(self.peers.values()):
            if peer.node is None and peer.hello is None and now - peer.since > HELLO_WITHIN_S:
                self._drop(peer)
            elif peer.hello is not None and self.welcome is not None:
                events += self._greet(peer, peer.hello)
        if now > self.join_by:
            for node, state in self.states.items():
                if state is MemberState.AWAITED:
                    cause = f"no launcher with --node-rank {node} reached {self.address} in {self.join_s:g} s"
                    events.append(self.move(node, MemberState.ABSENT, cause))
        return events

    def verdict(self, clock: Callable[[], float], local_failure: bool, settle_s: float,
                on_join: Callable[[HostEvent], None]) -> str:  # fmt: skip
        """The one line that ends the run, or "" while none does: a member's node failed, its
        host is gone, or it never joined. A node's failure, here or there, may be the echo
        of a host's loss (its peer vanished): the link gets `settle_s` to tell of a loss,
        which is then the cause. `local_failure` (a node of the head's own failed): only a
        loss is a cause, else "" and the local failure stands. Joins go to `on_join`."""
        lost = (MemberState.GONE, MemberState.ABSENT)
        causes = lost if local_failure else (*lost, MemberState.FAILED)

        def bad_events(wait: float = 0.0) -> list[HostEvent]:
            events = self.poll(clock(), wait)
            for ev in events:
                if ev.state is MemberState.RUNNING:
                    on_join(ev)
            return [ev for ev in events if ev.state in causes]

        bad = bad_events()
        if not bad and not local_failure:
            return ""
        settle_by = clock() + settle_s
        while not any(ev.state in lost for ev in bad) and clock() < settle_by:
            bad += bad_events(wait=max(0.0, settle_by - clock()))
        return host_cause(min(bad, key=lambda ev: ev.state not in lost)) if bad else ""

    def _accept(self, now: float) -> None:
        try:
            sock, where = self.listener.accept()
        except BlockingIOError:
            return
        if sum(p.node is None for p in self.peers.values()) >= MAX_PENDING:
            sock.close()
            return
        keep_alive(sock)
        sock.setblocking(False)
        self.peers[sock] = _Peer(sock, now, where)
        self.sel.register(sock, selectors.EVENT_READ)

    def _read(self, peer: _Peer) -> list[HostEvent]:
        try:
            data = peer.sock.recv(65536)
        except BlockingIOError:
            return []
        except OSError:
            data = b""
        if not data:
            return self._closed(peer)
        try:
            msgs = peer.lines.feed(data)
        except HostLinkError:
            return self._closed(peer)
        events: list[HostEvent] = []
        for msg in msgs:
            events += self._on(peer, msg)
        return events

    def _on(self, peer: _Peer, msg: dict) -> list[HostEvent]:
        if peer.node is None:
            if "hello" not in msg or peer.hello is not None:
                self._drop(peer)
                return []
            peer.hello = msg
            return self._greet(peer, msg) if self.welcome is not None else []
        node = peer.node
        if "done" in msg and self.states[node] is MemberState.RUNNING:
            return [self.move(node, MemberState.DONE)]
        if "failed" in msg and self.states[node] is MemberState.RUNNING:
            return [self.move(node, MemberState.FAILED, str(msg["failed"])[:2000])]
        return []

    def _greet(self, peer: _Peer, msg: dict) -> list[HostEvent]:
        peer.hello = None
        node = msg.get("hello")
        refused = ""
        if not isinstance(node, int) or node not in self.states:
            nodes = ",".join(map(str, sorted(self.states))) or "none"
            refused = f"--node-rank {node} is not a real node another host runs (those are {nodes})"
        elif self.states[node] is not MemberState.AWAITED:
            refused = f"real node {node} joined already ({self.states[node].value})"
        else:
            diff = differences(self.facts, msg.get("job"))
            if diff:
                refused = f"this host's flags differ from the head's: {diff}"
        if refused:
            self._send(peer, {"refused": refused})
            self._drop(peer)
            return []
        peer.node = node
        self._send(peer, {"welcome": self.welcome})
        return [self.move(node, MemberState.RUNNING, peer.where)]

    def _closed(self, peer: _Peer) -> list[HostEvent]:
        self._drop(peer)
        if peer.node is not None and self.states[peer.node] is MemberState.RUNNING:
            cause = f"its launcher's link from {peer.where} closed while its node ran"
            return [self.move(peer.node, MemberState.GONE, cause)]
        return []

    def _send(self, peer: _Peer, msg: dict) -> None:
        send_line(peer.sock, msg)  # a member that cannot be told is seen closed at the next poll

    def _drop(self, peer: _Peer) -> None:
        self.peers.pop(peer.sock, None)
        try:
            self.sel.unregister(peer.sock)
        except (KeyError, ValueError):
            pass
        peer.sock.close()

    def end(self, cause: str, summary: str = "") -> None:
        """Tell every member still connected how the run ended, then close (once)."""
        if self.closed:
            return
        for peer in list(self.peers.values()):
            if peer.node is not None:
                self._send(peer, {"end": cause, "summary": summary})
        self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for peer in list(self.peers.values()):
            self._drop(peer)
        try:
            self.sel.unregister(self.listener)
        except (KeyError, ValueError):
            pass
        self.listener.close()
        self.sel.close()


class MemberLink:
    """A member's side: one connection to the head for the whole run."""

    def __init__(self, sock: socket.socket, welcome: dict) -> None:
        self.sock = sock
        self.welcome = welcome
        self.lines = Lines()
        self.ended: dict | None = None  # the head's end message, or {"end": <why gone>}

    @classmethod
    def join(cls, link: str, node: int, facts: dict, timeout_s: float) -> MemberLink:
        """Say hello as real node `node`; the head's welcome, or HostLinkError with its refusal."""
        host, _, port = link.rpartition(":")
        host = host.strip("[]")
        try:
            sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        except (OSError, ValueError) as exc:
            raise HostLinkError(f"cannot reach the head's link at {link}: {exc}") from None
        keep_alive(sock)
        lines = Lines()
        deadline = time.monotonic() + timeout_s
        try:
            sock.sendall(encode({"hello": node, "job": facts}))
            while True:
                sock.settimeout(max(0.01, deadline - time.monotonic()))
                data = sock.recv(65536)
                if not data:
                    raise HostLinkError(f"the head at {link} closed the link before it answered")
                for msg in lines.feed(data):
                    if "refused" in msg:
                        raise HostLinkError(f"the head refused real node {node}: {msg['refused']}")
                    if "welcome" in msg:
                        sock.setblocking(False)
                        member = cls(sock, msg["welcome"] or {})
                        member.lines = lines
                        return member
        except (OSError, HostLinkError) as exc:
            sock.close()
            if isinstance(exc, HostLinkError):
                raise
            raise HostLinkError(f"the head at {link} did not answer: {exc}") from None

    def send(self, msg: dict) -> None:
        send_line(self.sock, msg)  # a head that cannot be told is seen gone at the next poll

    def poll(self, timeout: float = 0.0) -> dict | None:
        """The head's end message once it came (a closed link ends with a cause of its own)."""
        if self.ended is not None:
            return self.ended
        if timeout > 0:
            self.sock.settimeout(timeout)
        else:
            self.sock.setblocking(False)
        try:
            data = self.sock.recv(65536)
        except (BlockingIOError, TimeoutError):
            return None
        except OSError:
            data = b""
        if not data:
            self.ended = {"end": "the head's link closed (its host is gone, or its launcher was stopped)"}
            return self.ended
        try:
            msgs = self.lines.feed(data)
        except HostLinkError as exc:
            self.ended = {"end": f"the head's link broke: {exc}"}
            return self.ended
        for msg in msgs:
            if "end" in msg:
                self.ended = msg
        return self.ended

    def close(self) -> None:
        self.sock.close()

