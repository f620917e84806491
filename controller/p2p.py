"""Point-to-point traffic (send/recv, monitored_barrier): slot = the user's tag.

No schedule ties these messages together, so each is its own unit. Under the
symmetry assumption the emulated peer runs the same program: it receives what a
real rank sends it (the receive is posted as soon as the send notice comes, with
the announced length) and sends what a real rank receives from it (zeros, of the
length the real rank posted), released one message time after the real rank
posted its receive.

A receive from any source puts nothing on the wire: the observer reports it, and
the emulated members answer such receives in turn (lowest group rank first, per
real rank and tag) by announcing a send, as Gloo's sender would; the real rank's
NOTIFY_RECV_READY then draws the data. Real senders are matched by Gloo itself.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from neuronabox.schedules import Kind

from .dialect import Data, Event, RecvReady, SendReady
from .groups import Conn, Group
from .outcomes import InstanceRecord, ProtocolError
from .release import ReleaseTiming


class PointToPoint:
    def __init__(
        self,
        emit: Callable[[Conn], None],
        conn_of: Callable[[Group, int, int], Conn | None],
        publish: Callable[[InstanceRecord], None],
        timing: ReleaseTiming | None,
        call_at: Callable[[float, Callable[[], None]], None] | None,
        clock: Callable[[], float],
        cpu: Callable[[], float] = time.thread_time,
    ) -> None:
        """`cpu`: the loop's CPU seconds at work (each record's `loop_cpu`)."""
        self.emit, self.conn_of, self.publish = emit, conn_of, publish
        self.timing, self.call_at, self.clock, self.cpu = timing, call_at, clock, cpu
        self.pending: dict[tuple[Conn, int], deque[tuple[int, float]]] = {}  # real sends awaiting data
        self.announced: dict[tuple[Conn, int], int] = {}  # our send notices awaiting a receive
        self.any_turn: dict[tuple[str, int, int], int] = {}  # (group, real, tag) -> receives answered
        self.generation = 0  # of the world (`reset`)

    def reset(self) -> None:
        """A new generation: the old one's messages are gone with its pairs."""
        self.pending.clear()
        self.announced.clear()
        self.any_turn.clear()
        self.generation += 1  # releases the old one timed are dropped when due

    def answer_any_source(self, group: Group, r: int, tag: int, nbytes: int) -> None:
        """Real group rank r posted a receive from any source: the next emulated member in
        turn announces a send of `nbytes` on the tag."""
        peers = [e for e in range(group.world) if e not in group.real]
        if not peers:
            return  # only real members: Gloo matches their sends itself
        turn = self.any_turn.get((group.name, r, tag), 0)
        self.any_turn[(group.name, r, tag)] = turn + 1
        e = peers[turn % len(peers)]
        conn = self.conn_of(group, r, e)
        if conn is None:
            raise ProtocolError(
                f"receive from any source, tag {tag} of group {group.name!r}: real rank "
                f"{group.global_rank(r)} has no open pair with emulated rank {group.global_rank(e)}"
            )
        self.announced[(conn, tag)] = self.announced.get((conn, tag), 0) + 1
        conn.pair.send_ready(tag, nbytes)
        self.emit(conn)

    def on_event(self, conn: Conn, ev: Event) -> None:
        now = self.clock()
        if isinstance(ev, SendReady):
            self.pending.setdefault((conn, ev.slot), deque()).append((ev.length, now))
            conn.pair.recv_ready(ev.slot, ev.length)
            self.emit(conn)
        elif isinstance(ev, Data):
            q = self.pending.get((conn, ev.slot))
            if not q:
                where = f"point-to-point tag {ev.slot} of group {conn.group.name!r} rank pair {conn.real}<->{conn.emu}"
                raise ProtocolError(f"{where}: data without a send notice")
            n, start = q.popleft()
            self._record(Kind.SEND, conn, ev.slot, n, start, 0.0)
        elif isinstance(ev, RecvReady):
            self._reply(conn, ev.slot, ev.length, now)

    def _reply(self, conn: Conn, slot: int, n: int, posted: float) -> None:
        timing = self.timing
        if timing is None or not timing.active:
            self._send(conn, slot, n, posted, 0.0)
            return
        g = conn.group
        delay = timing.message(Kind.SEND, g.global_rank(conn.emu), g.global_rank(conn.real), n)
        timing.within_limit(f"a {n}-byte message from emulated rank {g.global_rank(conn.emu)}", delay)
        release, gen = posted + delay, self.generation
        self.call_at(release, lambda: gen == self.generation and self._send(conn, slot, n, posted, delay, release))

    def _send(
        self, conn: Conn, slot: int, n: int, posted: float, predicted: float, release: float | None = None
    ) -> None:
        if release is not None and self.timing is not None:
            self.timing.record_lateness(self.clock() - release)
        key = (conn, slot)
        if self.announced.get(key):  # the send notice went out already (a receive from any source)
            self.announced[key] -= 1
            conn.pair.data(slot, bytes(n))
        else:
            conn.pair.send(slot, bytes(n))
        self.emit(conn)
        self._record(Kind.RECV, conn, slot, n, posted, predicted)

    def _record(self, kind: Kind, conn: Conn, slot: int, n: int, start: float, predicted: float) -> None:
        end = self.clock()
        src, dst = (conn.real, conn.emu) if kind == Kind.SEND else (conn.emu, conn.real)
        self.publish(InstanceRecord(
            conn.group.name, slot, kind, n, 1, start, end, {conn.real: (start, end)},
            f"{src}->{dst}", self.cpu(), predicted,
        ))  # fmt: skip

    def pending_summary(self) -> list[str]:
        return [
            f"send tag {slot} of group {c.group.name!r} {c.real}->{c.emu}: {len(q)} awaiting data"
            for (c, slot), q in list(self.pending.items())
            if q
        ]
