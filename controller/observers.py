"""The controller's end of the observer link: real ranks' observers dial in, the
controller asks them for what the wire does not carry (an allreduce's element
count and size) and hears of groups, receives from any source, optimizer steps,
the dtypes of the collectives issued, the sizes of rings the wire leaves open, and when
an observer's own work held its rank's core. JSON lines over TCP.

The port is open to every local process, so a connection counts only once its first
line is the run's hello, carrying the secret the controller wrote to its ready file
(the launcher hands it to the real ranks). Anything else, or nothing within
HELLO_TIMEOUT_S, and the connection is dropped with one line on stderr: a stranger
never reaches the run. Lines are bounded (a stranger's before its hello, a peer's
after), and an authenticated observer that breaks the protocol ends the run with
an ObserverError naming its rank.
"""

from __future__ import annotations

import hmac
import json
import socket
import sys
import time
from collections.abc import Callable

from neuronabox.errors import NeuronaBoxError

HELLO_TIMEOUT_S = 5.0  # an observer says hello as it connects
STRANGER_LINE_MAX = 4096  # bytes before the hello: the hello is ~150
PEER_LINE_MAX = 64 << 20  # any line of an observer; an input question raises it (`ask`, reply_bytes)
READ_CHUNK = 1 << 20

# What each message of an authenticated observer must carry, by the key that names it.
FIELDS: dict[str, tuple[tuple[str, type | tuple[type, ...]], ...]] = {
    "group": (("group", str), ("ranks", list)),
    "anysource": (("anysource", str), ("tag", int), ("nbytes", int)),
    "step": (("t", (int, float)),),
    "dtypes": (("dtypes", list),),
    "meta": (("meta", str), ("tag", int), ("kind", str), ("numel", int), ("dtype", str)),
    "buckets": (("buckets", str), ("sizes", list)),
    "q": (("q", int),),
    "loaded": (("loaded", str),),
    "held": (("held", list), ("cpu", (int, float)), ("clock", str)),
}
KEYS = ("hello", "meta", *(k for k in FIELDS if k != "meta"))  # what names a message (a note most often)
OPTIONAL = {"numel": int, "dtype": str, "root": int, "data": str, "op": str, "splits": list}  # in replies


class ObserverError(NeuronaBoxError, RuntimeError):
    """An authenticated observer broke the link's protocol: the run ends with this line."""


class ObserverHub:
    def __init__(
        self,
        sock: socket.socket,
        register: Callable[[object, Callable[[int], None]], None],
        unregister: Callable[[object], None],
        secret: str,
        call_at: Callable[[float, Callable[[], None]], None] | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.sock = sock  # listening, non-blocking (the launcher's, inherited, or `listener(host)`)
        self.address = self.sock.getsockname()
        self._register, self._unregister = register, unregister
        self._secret = secret.encode()
        self._call_at = call_at  # the hello deadline's timer (the loop's)
        self._log = log or (lambda what: print(what, file=sys.stderr, flush=True))
        self.by_rank: dict[int, socket.socket] = {}
        self._bufs: dict[socket.socket, bytearray] = {}
        # Every read lands here first: a fresh READ_CHUNK object per read (most are one note
        # of a call, 84 bytes, ahead of its frames) cost 20 us in malloc and page faults.
        self._chunk = bytearray(READ_CHUNK)
        self._view = memoryview(self._chunk)
        self._rank_of: dict[socket.socket, int] = {}
        self._strangers: dict[socket.socket, str] = {}  # connected, no hello yet: their address
        self._line_max: dict[int, int] = {}  # a rank's line limit, once raised past PEER_LINE_MAX
        self.on_step: Callable[[int, float], None] | None = None  # (real rank, time) of an optimizer step
        self.on_loaded: Callable[[int], None] | None = None  # a real rank's torch.distributed loaded
        # (real rank, start, end, CPU seconds, its monotonic clock's id): its observer's own work held its core
        self.on_held: Callable[[int, float, float, float, str], None] | None = None
        self.on_dtypes: Callable[[list[list]], None] | None = None  # [[group, tag, dtype], ...]
        self.on_reply: Callable[[dict], None] | None = None
        self.on_meta: Callable[[int, str, int, str, int, str], None] | None = None  # a ring's size, as its call entered
        # (real rank, its socket, bytes after its hello): its observer's note link, which the core reads
        self.on_note_link: Callable[[int, socket.socket, bytes], None] | None = None
        self.on_note_link_closed: Callable[[socket.socket], None] | None = None
        self.note_links: dict[int, socket.socket] = {}
        self.on_buckets: Callable[[str, list[tuple[int, str]]], None] | None = None  # a DDP model's buckets
        self.on_lost: Callable[[int], None] | None = None
        self.on_group: Callable[[str, list[int]], None] | None = None
        self.on_anysource: Callable[[int, str, int, int], None] | None = None
        register(self.sock, self._accept)

    def _accept(self, _mask: int) -> None:
        try:
            s, peer = self.sock.accept()
        except BlockingIOError:
            return
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # questions gate collectives: no Nagle
        s.setblocking(False)
        self._bufs[s] = bytearray()
        self._strangers[s] = f"{peer[0]}:{peer[1]}"
        self._register(s, lambda m, s=s: self._read(s))
        if self._call_at is not None:
            self._call_at(time.monotonic() + HELLO_TIMEOUT_S, lambda s=s: self._hello_due(s))

    def _hello_due(self, s: socket.socket) -> None:
        if s in self._strangers:
            self._drop(s, f"no hello within {HELLO_TIMEOUT_S:g} s")

    def _limit(self, s: socket.socket) -> int:
        r = self._rank_of.get(s)
        return STRANGER_LINE_MAX if r is None else max(PEER_LINE_MAX, self._line_max.get(r, 0))

    def _read(self, s: socket.socket) -> None:
        buf = self._bufs.get(s)
        if buf is None:  # dropped earlier in this loop turn
            return
        limit = self._limit(s)
        try:  # never more than the limit allows: a line past it is refused, not held
            n = s.recv_into(self._chunk, min(READ_CHUNK, limit + 1 - len(buf)))
        except BlockingIOError:
            return
        except OSError:
            n = 0
        if not n:
            if s in self._strangers:
                self._drop(s, "closed before its hello")
            else:
                self._close(s)
            return
        seen = len(buf)
        buf += self._view[:n]  # in place: a mirrored input is one line of megabytes
        if self._chunk.find(b"\n", 0, n) >= 0:
            end = buf.rindex(b"\n", seen)
            lines = buf[:end].split(b"\n")  # json takes bytearrays
            del buf[: end + 1]
            for i, line in enumerate(lines):
                if s in self._strangers:
                    if not self._hello(s, line):
                        return  # dropped
                    if s not in self._rank_of:  # a note link: the core reads the rest
                        self._to_core(s, b"".join(bytes(x) + b"\n" for x in lines[i + 1 :]) + bytes(buf))
                        return
                else:
                    self._handle(s, line)
            limit = self._limit(s)  # the hello raised it
        if len(buf) > limit:
            if s in self._strangers:
                self._drop(s, f"more than {limit} bytes without a hello")
                return
            raise ObserverError(
                f"the observer of real rank {self._rank_of[s]} sent a line longer than {limit} bytes, "
                "the observer link's limit"
            )

    def _hello(self, s: socket.socket, line: bytearray) -> bool:
        """A stranger's first line: the run's hello makes it the observer of its rank."""
        try:
            msg = json.loads(line)
        except ValueError:
            msg = None
        secret = msg.get("secret") if isinstance(msg, dict) else None
        rank = msg.get("rank") if isinstance(msg, dict) else None
        if (
            not isinstance(secret, str)
            or not hmac.compare_digest(secret.encode(), self._secret)
            or msg.get("hello") != 1
            or not isinstance(rank, int)
        ):
            self._drop(s, "its first line is not the run's hello")
            return False
        del self._strangers[s]
        if msg.get("notes") == 1:  # the rank's note link (neuronabox/observer/agent.py)
            old = self.note_links.pop(rank, None)
            if old is not None:
                self._close_note_link(old)
            self.note_links[rank] = s
            return True
        self.by_rank[rank] = s
        self._rank_of[s] = rank
        return True

    def _to_core(self, s: socket.socket, early: bytes) -> None:
        """A note link, past its hello, leaves Python's loop for the core's."""
        self._unregister(s)
        self._bufs.pop(s, None)
        rank = next(r for r, link in self.note_links.items() if link is s)
        if self.on_note_link is None:
            self._close_note_link(s)
            return
        self.on_note_link(rank, s, early)

    def _close_note_link(self, s: socket.socket) -> None:
        for rank, link in list(self.note_links.items()):
            if link is s:
                del self.note_links[rank]
        if self.on_note_link_closed is not None and s.fileno() >= 0:
            self.on_note_link_closed(s)
        s.close()

    def _handle(self, s: socket.socket, line: bytearray) -> None:
        rank = self._rank_of[s]
        try:
            msg = json.loads(line)
        except ValueError as exc:
            msg, why = None, str(exc)
        else:
            why = f"a JSON {type(msg).__name__}"
        if not isinstance(msg, dict):
            raise ObserverError(
                f"the observer of real rank {rank} sent a line that is not a JSON object ({why}): {bytes(line[:80])!r}"
            )
        key = next((k for k in KEYS if k in msg), None)
        if key is None or key == "hello":  # a repeated hello, or a message of a later observer: nothing to do
            return
        for name, kind in FIELDS[key]:
            if not isinstance(msg.get(name), kind):
                self._malformed(rank, key, name, msg)
        if key == "group":
            if not all(isinstance(r, int) for r in msg["ranks"]):
                self._malformed(rank, key, "ranks", msg)
            if self.on_group:
                self.on_group(msg["group"], msg["ranks"])
        elif key == "anysource":
            if self.on_anysource:
                self.on_anysource(rank, msg["anysource"], msg["tag"], msg["nbytes"])
        elif key == "step":
            if self.on_step:
                self.on_step(rank, msg["t"])
        elif key == "loaded":
            if self.on_loaded:
                self.on_loaded(rank)
        elif key == "held":
            span = msg["held"]
            if len(span) != 2 or not all(isinstance(t, (int, float)) for t in span):
                self._malformed(rank, key, "held", msg)
            if self.on_held:
                self.on_held(rank, span[0], span[1], msg["cpu"], msg["clock"])
        elif key == "buckets":
            if not all(isinstance(b, list) and list(map(type, b)) == [int, str] for b in msg["sizes"]):
                self._malformed(rank, key, "sizes", msg)
            if self.on_buckets:
                self.on_buckets(msg["buckets"], [tuple(b) for b in msg["sizes"]])
        elif key == "meta":
            if self.on_meta:
                self.on_meta(rank, msg["meta"], msg["tag"], msg["kind"], msg["numel"], msg["dtype"])
        elif key == "dtypes":
            if not all(isinstance(d, list) and list(map(type, d)) == [str, int, str] for d in msg["dtypes"]):
                self._malformed(rank, key, "dtypes", msg)
            if self.on_dtypes:
                self.on_dtypes(msg["dtypes"])
        elif self.on_reply:
            for name, kind in OPTIONAL.items():
                if msg.get(name) is not None and not isinstance(msg[name], kind):
                    self._malformed(rank, key, name, msg)
            self.on_reply(msg)

    @staticmethod
    def _malformed(rank: int, key: str, name: str, msg: dict) -> None:
        shown = json.dumps(msg)
        shown = shown if len(shown) <= 120 else shown[:117] + "..."
        raise ObserverError(
            f"the observer of real rank {rank} sent a {key!r} message without a valid {name!r}: {shown}"
        )

    def _drop(self, s: socket.socket, why: str) -> None:
        """A connection that is not an observer of this run: closed, and one line on stderr."""
        peer = self._strangers.get(s, "?")
        self._log(f"observer link: dropped the connection from {peer}: {why}")
        self._close(s)

    def _close(self, s: socket.socket) -> None:
        self._unregister(s)
        self._bufs.pop(s, None)
        self._strangers.pop(s, None)
        r = self._rank_of.pop(s, None)
        if r is not None and self.by_rank.get(r) is s:
            del self.by_rank[r]
            if (link := self.note_links.get(r)) is not None:  # its note link goes with it
                self._close_note_link(link)
        s.close()
        if r is not None and self.on_lost:
            self.on_lost(r)

    def ask(self, rank: int, query: dict, reply_bytes: int = 0) -> bool:
        """Send `query` to `rank`'s observer; `reply_bytes`: the raw size of what the reply
        carries (an input, base64 on the line), which the rank's line limit must admit."""
        s = self.by_rank.get(rank)
        if s is None:
            return False
        if reply_bytes:
            need = 4 * (reply_bytes // 3 + 1) + (64 << 10)
            self._line_max[rank] = max(self._line_max.get(rank, 0), need)
        s.setblocking(True)
        try:
            s.sendall(json.dumps(query).encode() + b"\n")
        except OSError:
            return False
        finally:
            s.setblocking(False)
        return True

    def close(self) -> None:
        for s in list(self._bufs):
            self._close(s)
        for s in list(self.note_links.values()):
            self._close_note_link(s)
        self._unregister(self.sock)
        self.sock.close()
