"""Point-to-point traffic (send/recv, monitored_barrier): slot = the user's tag.

No schedule ties these messages together, so each is its own unit. Under the
symmetry assumption the emulated peer runs the same program: it receives what a
real rank sends it (the receive is posted as soon as the send notice comes, with
the announced length) and sends what a real rank receives from it (zeros, of the
length the real rank posted), released one message time after the real rank
posted its receive.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING

from .dialects.gloo.protocol import Data, Event, RecvReady, SendReady
from .outcomes import InstanceRecord, ProtocolError

if TYPE_CHECKING:
    from .engine import Conn, Engine


class PointToPoint:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.pending: dict[tuple[Conn, int], deque[tuple[int, float]]] = {}  # real sends awaiting data

    def on_event(self, conn: Conn, ev: Event) -> None:
        now = time.monotonic()
        if isinstance(ev, SendReady):
            self.pending.setdefault((conn, ev.slot), deque()).append((ev.length, now))
            self.engine.emit(conn, conn.pair.recv_ready(ev.slot, ev.length))
        elif isinstance(ev, Data):
            q = self.pending.get((conn, ev.slot))
            if not q:
                where = f"point-to-point tag {ev.slot} of group {conn.group.name!r} rank pair {conn.real}<->{conn.emu}"
                raise ProtocolError(f"{where}: data without a send notice")
            n, start = q.popleft()
            self._record("send", conn, ev.slot, n, start, 0.0)
        elif isinstance(ev, RecvReady):
            self._reply(conn, ev.slot, ev.length, now)

    def _reply(self, conn: Conn, slot: int, n: int, posted: float) -> None:
        eng = self.engine
        timing = eng.timing
        if timing is None or not timing.active:
            self._send(conn, slot, n, posted, 0.0)
            return
        g = conn.group
        delay = timing.message("send", g.global_rank(conn.emu), g.global_rank(conn.real), n)
        release = posted + delay
        eng.call_at(release, lambda: self._send(conn, slot, n, posted, delay, release))

    def _send(
        self, conn: Conn, slot: int, n: int, posted: float, predicted: float, release: float | None = None
    ) -> None:
        if release is not None and self.engine.timing is not None:
            self.engine.timing.record_lateness(time.monotonic() - release)
        self.engine.emit(conn, conn.pair.send(slot, bytes(n)))
        self._record("recv", conn, slot, n, posted, predicted)

    def _record(self, kind: str, conn: Conn, slot: int, n: int, start: float, predicted: float) -> None:
        end = time.monotonic()
        src, dst = (conn.real, conn.emu) if kind == "send" else (conn.emu, conn.real)
        self.engine.publish(InstanceRecord(
            conn.group.name, slot, kind, n, 1, start, end, {conn.real: (start, end)},
            f"{src}->{dst}", time.thread_time(), predicted,
        ))  # fmt: skip

    def pending_summary(self) -> list[str]:
        return [
            f"send tag {slot} of group {c.group.name!r} {c.real}->{c.emu}: {len(q)} awaiting data"
            for (c, slot), q in list(self.pending.items())
            if q
        ]
