"""The controller's end of the observer link: real ranks' observers dial in, the
controller asks them for what the wire does not carry (an allreduce's element
count and size) and hears of groups, receives from any source and optimizer steps. JSON lines over TCP.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable

from .net import listener


class ObserverHub:
    def __init__(
        self, host: str, register: Callable[[object, Callable[[int], None]], None], unregister: Callable[[object], None]
    ) -> None:
        self.sock = listener(host, 64)
        self.address = self.sock.getsockname()
        self._register, self._unregister = register, unregister
        self.by_rank: dict[int, socket.socket] = {}
        self._bufs: dict[socket.socket, bytearray] = {}
        self._rank_of: dict[socket.socket, int] = {}
        self.on_step: Callable[[int, float], None] | None = None  # (real rank, time) of an optimizer step
        self.on_reply: Callable[[dict], None] | None = None
        self.on_lost: Callable[[int], None] | None = None
        self.on_group: Callable[[str, list[int]], None] | None = None
        self.on_anysource: Callable[[int, str, int, int], None] | None = None
        register(self.sock, self._accept)

    def _accept(self, _mask: int) -> None:
        try:
            s, _ = self.sock.accept()
        except BlockingIOError:
            return
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # questions gate collectives: no Nagle
        s.setblocking(False)
        self._bufs[s] = bytearray()
        self._register(s, lambda m, s=s: self._read(s))

    def _read(self, s: socket.socket) -> None:
        try:
            data = s.recv(1 << 20)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._close(s)
            return
        buf = self._bufs[s]
        seen = len(buf)
        buf += data  # in place: a mirrored input is one line of megabytes
        if b"\n" not in data:
            return
        end = buf.rindex(b"\n", seen)
        lines = buf[:end].split(b"\n")  # json takes bytearrays
        del buf[: end + 1]
        for line in lines:
            msg = json.loads(line)
            if "hello" in msg:
                self.by_rank[msg["rank"]] = s
                self._rank_of[s] = msg["rank"]
            elif "group" in msg:
                if self.on_group:
                    self.on_group(msg["group"], msg["ranks"])
            elif "anysource" in msg:
                if self.on_anysource and s in self._rank_of:
                    self.on_anysource(self._rank_of[s], msg["anysource"], msg["tag"], msg["nbytes"])
            elif "step" in msg:
                if self.on_step:
                    self.on_step(self._rank_of.get(s, -1), msg["t"])
            elif "q" in msg and self.on_reply:
                self.on_reply(msg)

    def _close(self, s: socket.socket) -> None:
        self._unregister(s)
        self._bufs.pop(s, None)
        r = self._rank_of.pop(s, None)
        if r is not None and self.by_rank.get(r) is s:
            del self.by_rank[r]
        s.close()
        if r is not None and self.on_lost:
            self.on_lost(r)

    def ask(self, rank: int, query: dict) -> bool:
        s = self.by_rank.get(rank)
        if s is None:
            return False
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
        self._unregister(self.sock)
        self.sock.close()
