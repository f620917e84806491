"""Frame matching: each boundary frame of a real rank against the message its
schedule has next on that pair (per pair, in program order, as Gloo matches).

Three queues per (real, emulated) pair: the real rank's sends still to be
announced, the announced sends whose data is still to come, and the receives it
still has to post. A frame that matches nothing, or matches with the wrong
length, is a ProtocolError that names the instance, the pair and the step.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Sequence

from neuronabox.schedules.gloo import Msg, RealRanks, RingReduce, Schedule

from .groups import Conn
from .outcomes import ProtocolError

Pair = tuple[int, int]  # (real group rank, emulated group rank)


def post_len(schedule: Schedule, m: Msg) -> int:
    """The receive an emulated rank posts for real send `m`: its length, a whole
    segment (chunk, for a reduce's gather) when only the wire tells the last one,
    or -1 when only the real rank's notice tells it (pairwise messages)."""
    geo = getattr(schedule, "geo", None)
    if m.nbytes >= 0 or geo is None:
        return m.nbytes
    if isinstance(schedule, RingReduce) and m.step == schedule.gather_step:
        return geo.per_rank * geo.segment_bytes
    return geo.segment_bytes


class FrameMatcher:
    def __init__(self, name: str, schedule: Schedule) -> None:
        self.name = name
        self.schedule = schedule
        self.sends: dict[Pair, deque[Msg]] = {}
        self.data: defaultdict[Pair, deque[Msg]] = defaultdict(deque)
        self.recvs: dict[Pair, deque[Msg]] = {}

    def expect(
        self, real: RealRanks, sends: Callable[[int], Sequence[Msg]], recvs: Callable[[int], Sequence[Msg]]
    ) -> tuple[dict[Pair, list[Msg]], int]:
        """Queue the boundary messages of every real rank; returns the real sends (the
        emulated ranks' receives to post), per pair, and how many messages were queued."""
        new: dict[Pair, list[Msg]] = {}
        n = 0
        for r in real.sorted:
            for m in sends(r):
                if m.peer not in real:
                    self.sends.setdefault((r, m.peer), deque()).append(m)
                    new.setdefault((r, m.peer), []).append(m)
                    n += 1
            for m in recvs(r):
                if m.peer not in real:
                    self.recvs.setdefault((r, m.peer), deque()).append(m)
                    n += 1
        return new, n

    def has_send(self, conn: Conn) -> bool:
        return bool(self.sends.get((conn.real, conn.emu)))

    def has_recv(self, conn: Conn) -> bool:
        return bool(self.recvs.get((conn.real, conn.emu)))

    def send_notice(self, conn: Conn, length: int) -> tuple[Msg, bool]:
        """A NOTIFY_SEND_READY: the message it announces, and whether the emulated
        receive waited for this notice to learn its length."""
        q = self.sends.get((conn.real, conn.emu))
        if not q:
            raise ProtocolError(self._unexpected(conn, "NOTIFY_SEND_READY", length, "send"))
        posted = q.popleft()
        m = self._check_len(conn, posted, length, "sends")
        self.data[(conn.real, conn.emu)].append(m)
        return m, posted.nbytes < 0 and self.post_len(posted) < 0

    def data_frame(self, conn: Conn, length: int) -> Msg:
        """A payload: the announced send it belongs to."""
        q = self.data.get((conn.real, conn.emu))
        if not q:
            raise ProtocolError(self.where(conn, "data without a matching send notice"))
        m = q.popleft()
        if length != m.nbytes:
            raise ProtocolError(self.where(conn, f"{length} data bytes, schedule expects {m.nbytes}", m.step))
        return m

    def recv_notice(self, conn: Conn, length: int) -> Msg:
        """A NOTIFY_RECV_READY: the message the real rank posted a receive for."""
        q = self.recvs.get((conn.real, conn.emu))
        if not q:
            raise ProtocolError(self._unexpected(conn, "NOTIFY_RECV_READY", length, "recv"))
        return self._check_len(conn, q.popleft(), length, "receives")

    def post_len(self, m: Msg) -> int:
        return post_len(self.schedule, m)

    def where(self, conn: Conn, what: str, step: int | None = None) -> str:
        at = "" if step is None else f" step {step}"
        return f"{self.name} rank pair {conn.real}<->{conn.emu}{at}: {what}"

    def _unexpected(self, conn: Conn, frame: str, length: int, way: str) -> str:
        msgs = self.schedule.sends(conn.real) if way == "send" else self.schedule.recvs(conn.real)
        steps = [m.step for m in msgs if m.peer == conn.emu]
        where = f"after its last (step {steps[-1]})" if steps else "none at all with this peer"
        return self.where(conn, f"unexpected {frame} of {length} bytes: the schedule has no {way} here, {where}")

    def _check_len(self, conn: Conn, m: Msg, length: int, verb: str) -> Msg:
        if m.nbytes < 0:  # a length the wire tells (the last ring segment, pairwise messages)
            limit = self.post_len(m)
            if 0 <= limit < length:
                raise ProtocolError(self.where(conn, f"{length} bytes exceed the {limit} posted", m.step))
            return Msg(m.peer, m.step, length)
        if length != m.nbytes:
            raise ProtocolError(
                self.where(conn, f"real rank {verb} {length} bytes, schedule expects {m.nbytes}", m.step)
            )
        return m
