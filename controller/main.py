"""The controller process: impersonates every emulated rank of the run.

`python -m neuronabox.controller.main CONFIG_JSON` (the launcher starts it).
Threads: the selector loop (Gloo pairs, observer link) runs in the main thread;
store work (agents, rank records, watching real ranks' records) in one helper
thread; gRPC in its own pool. Exit status 0 on a clean stop, 3 on an error, 4 when
the watchdog ended the run (a real rank made no progress for the timeout), 5 when
the store a real node's agent hosts went away (that node ended),
whose one-line cause goes to stderr and to the status reply.
"""

from __future__ import annotations

import gc
import json
import os
import secrets
import socket
import sys
import threading
import time

from neuronabox.delay_models.whatif import WhatIf

from neuronabox import delay_models, topology
from neuronabox.errors import NeuronaBoxError
from neuronabox.limits import read_bounded
from neuronabox.observer.clock import clock_id

from .config import ControllerConfig
from .dialects.gloo.driver import GlooDriver, LoopPolls, TurnLog, raise_fd_limit
from .dialects.gloo.protocol import GLOO
from .engine import Engine
from .lifecycle import STALLED, Lifecycle, RunState, StoreLost
from .membership import Membership
from .nccl_comm import TorchNcclComm
from .net import OBSERVER_BACKLOG, listener
from .observer_link import ObserverLink
from .recorder import RunRecorder
from .release import ReleaseTiming
from .skew import Skew
from .status import StatusService
from .watchdog import RankStalled, Watchdog

STORE_LOST_GRACE_S = 10.0  # see Controller._store_failed
CLOCK = clock_id()  # an observer that reads the same has its times on this clock


class Controller:
    """Wires the run's components and runs the loop. Each component gets what it needs
    in its constructor; the engine is made inside the driver's (it writes through it),
    before the components it reports to, so its hooks look them up when called.

    membership: groups and their pairs (the store threads, dialing); observers: the
    real ranks' observer link; recorder: the totals and the trace; status: the gRPC
    control calls; lifecycle: the run's state, error and exit status."""

    def __init__(self, cfg: ControllerConfig) -> None:
        raise_fd_limit()
        self.cfg = cfg
        self.t0 = time.monotonic()
        self.lifecycle = Lifecycle()
        self.stop_reason = ""
        topo = topology.load(cfg.topology).with_nodes(cfg.nnodes, cfg.nproc_per_node)
        self.timing = ReleaseTiming(
            delay_models.load(cfg.delay_model, topo),
            WhatIf.from_specs(cfg.inject),
            modeled_boundary=cfg.boundary == "modeled",
            limit_s=cfg.timeout_s,
            skew=Skew.parse(cfg.skew),
            measure_work=cfg.local_work == "measured" and cfg.backend == "gloo",  # the NCCL relay has no meter yet
        )
        self.watchdog = Watchdog(cfg.timeout_s)
        polls = os.environ.get("NEURONABOX_BUSY_POLL", "1") != "0"  # 0: the loop sleeps (a check)
        spins = os.environ.get("NEURONABOX_SPIN_POLL", "1") != "0"  # 0: it sleeps past the busy window
        busy, spin = (cfg.busy_poll_s, cfg.spin_poll_s if spins else 0.0) if polls else (0.0, 0.0)
        hold = os.environ.get("NEURONABOX_HOLD_IN_FLIGHT", "1") != "0"  # 0: idle work waits for the window alone
        self.driver = driver = GlooDriver(self._make_engine, cfg.gloo_host, LoopPolls(busy, spin, hold))
        if turn_log := os.environ.get("NEURONABOX_TURN_LOG"):  # developer aid: the loop's Python turns, to a file
            driver.turn_log = TurnLog(turn_log)
        engine = driver.engine
        # Backend nccl: the default group is an NCCL communicator, played in a thread of its
        # own; its collectives reach the recorder in the loop, as Gloo's do. Every rank real
        # (the all-real baseline): NCCL's ranks reach one another, the controller keeps the store.
        self.nccl = (
            TorchNcclComm(
                cfg,
                self.timing,
                lambda rec: driver.call_soon(lambda: self.recorder.on_record(rec)),
                fail=self.fail,
                log=self.log,
            )
            if cfg.backend == "nccl" and len(cfg.real_ranks) < cfg.world_size
            else None
        )
        self.membership = Membership(
            cfg,
            driver,
            engine,
            self.watchdog,
            clock=time.monotonic,
            log=self.log,
            on_joined=lambda: self.lifecycle.move(RunState.RUNNING),
            on_error=self._store_failed,
            after_store_open=settle_heap,
            nccl_start=self.nccl.start if self.nccl is not None else None,
        )
        self.recorder = RunRecorder(
            cfg,
            topo,
            self.timing,
            self.watchdog,
            group_of=self.membership.groups.get,
            open_entries=engine.open_entries,
            clock=time.monotonic,
            epoch=time.time,
        )
        self.observers = ObserverLink(
            observer_listener(cfg),
            cfg.observer_secret or secrets.token_hex(32),
            engine,
            driver.register_extra,
            driver.unregister_extra,
            driver.call_at,
            log=self.log,
            on_group=self.membership.on_group,
            on_anysource=self.membership.on_anysource,
            on_step=self._stepped,
            on_dtypes=self.recorder.on_dtypes,
            on_loaded=lambda rank: self.watchdog.expect(rank, time.monotonic()),
            on_held=self._held,
        )
        self.membership.on_generation = self.observers.forget_notes
        driver.accept_router = self.membership.may_dial_in
        driver.log = self.log
        driver.periodic = self._periodic
        engine.notes = self.observers.drain_notes
        driver.idle_work = engine.publish_next
        driver.idle_pending = lambda: bool(engine.finished)
        driver.on_open = self.membership.on_pair_open
        driver.on_close = self.membership.on_pair_closed
        self.status = StatusService(
            cfg,
            self.lifecycle,
            self.recorder.totals,
            self.timing,
            connections=lambda: len(driver.socks),
            pending=engine.pending,
            stop=self.request_stop,
            log=self.log,
            clock=time.monotonic,
            started=self.t0,
            cpu=lambda: time.process_time() - engine.core.polled(),  # the busy window's polls are no work
        )

    def _make_engine(self, driver: GlooDriver) -> Engine:
        """Made in the driver's constructor, before the components the engine reports to:
        its hooks find them when called."""
        observed = self.cfg.observer
        engine = Engine(
            emit=driver.write,
            dialect=GLOO,
            request_meta=(lambda *question: self.observers.request_meta(*question)) if observed else None,
            on_complete=lambda rec: self.recorder.on_record(rec),
            conn_of=lambda *pair: self.membership.open_conn(*pair),
            timing=self.timing,
            call_at=driver.call_at,
            data=self.cfg.data,
            request_input=(lambda *question: self.observers.request_input(*question)) if observed else None,
            native_timers=True,
            defer_records=True,
            native_start=os.environ.get("NEURONABOX_NATIVE_START", "1") != "0",  # 0: every book from Python (a check)
            note_start=os.environ.get("NEURONABOX_NOTE_START", "1") != "0",  # a noted ring starts as its note comes
        )
        # A repeating shape's next receives go with an instance's last sends (0: at its note or first frame).
        engine.core.guess_ahead(os.environ.get("NEURONABOX_GUESS_AHEAD", "1") != "0")
        return engine

    def _stepped(self, rank: int, t: float) -> None:
        """A real rank's optimizer stepped (its observer's report, in the loop)."""
        self.recorder.on_step(rank, t)
        if rank == self.cfg.real_ranks[0]:
            self.timing.skew.on_step()  # --skew auto: the first real rank's iteration begins

    def _held(self, rank: int, start: float, end: float, cpu: float, clock: str) -> None:
        """A real rank's observer used `cpu` seconds of its core between `start` and `end`
        (a flight-recorder dump): into the run's totals always (a duration reads alike on
        any clock); into the trace, and out of --skew auto's gaps when it is the first real
        rank's, only when its clock is this one (the same boot, no time namespace between)."""
        same_clock = bool(clock) and clock == CLOCK
        self.recorder.on_held(rank, start, end, cpu, same_clock)
        if same_clock and rank == self.cfg.real_ranks[0]:
            self.timing.skew.held(start, end, cpu)

    def log(self, what: str) -> None:
        print(f"[controller {time.monotonic() - self.t0:8.3f}s] {what}", file=sys.stderr, flush=True)

    # -- lifecycle -------------------------------------------------------------------------
    def fail(self, exc: BaseException) -> None:
        self.lifecycle.fail(exc)
        self._end_loop()

    def _store_failed(self, exc: BaseException) -> None:
        """A store thread's error ends the run, unless a stop is under way (the store may go
        with it). A lost store whose host is real node 0's agent waits STORE_LOST_GRACE_S
        first: that agent ends with its node, which may be the job's clean end (a script
        that exits without a collective), and the launcher's stop says so."""
        if self.lifecycle.state is RunState.STOPPING:
            return
        if isinstance(exc, StoreLost):
            self.log(f"{exc}; the run ends in {STORE_LOST_GRACE_S:g} s unless the launcher stops it first")
            later = lambda: self._store_failed_now(exc)  # noqa: E731
            self.driver.call_soon(lambda: self.driver.call_at(time.monotonic() + STORE_LOST_GRACE_S, later))
            return
        self.fail(exc)

    def _store_failed_now(self, exc: BaseException) -> None:
        if self.lifecycle.state is not RunState.STOPPING:
            self.fail(exc)

    def request_stop(self, reason: str) -> None:
        self.stop_reason = reason  # the trace's footer says why the run stopped
        self.lifecycle.move(RunState.STOPPING)
        self._end_loop()

    def _end_loop(self) -> None:
        self.driver.running = False
        self.driver.call_soon(lambda: None)

    def _periodic(self) -> None:
        if os.getppid() == 1:  # the launcher is gone: nothing to serve
            raise RuntimeError("the launcher exited; controller stopping")
        self.driver.engine.publish_finished()  # a loop with no idle turn still reports each 0.5 s
        cause = self.watchdog.check(time.monotonic(), list(self.driver.engine.instances.values()))
        if cause is not None:
            raise RankStalled(cause)

    def run(self) -> int:
        self._write_ready()
        t = threading.Thread(target=self.membership.rendezvous, name="rendezvous", daemon=True)
        t.start()
        self.driver.run()
        self.driver.engine.publish_finished()
        if self.driver.error is not None and not self.lifecycle.error:
            self.fail(self.driver.error)
        if self.nccl is not None:
            self.nccl.close()
        self.driver.close_all()
        self.observers.close()
        state = self.lifecycle.end()
        if state is RunState.FAILED:
            print(f"neuronabox controller: error: {self.lifecycle.error}", file=sys.stderr, flush=True)
        self.recorder.close(state.value, self.lifecycle.error, self.stop_reason)
        self.status.close()
        if isinstance(self.driver.error, RankStalled):
            return STALLED
        return self.lifecycle.exit_status if self.lifecycle.error else 0

    def _write_ready(self) -> None:
        if self.cfg.ready_file:
            info = {
                "control": f"{self.cfg.control_host}:{self.status.port}",
                "observer": f"{self.observers.address[0]}:{self.observers.address[1]}",
                "observer_secret": self.observers.secret,
                "control_token": self.status.token,
                "pid": os.getpid(),
            }
            tmp = self.cfg.ready_file + ".tmp"
            with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:  # it holds the secret
                json.dump(info, f)
            os.replace(tmp, self.cfg.ready_file)


def observer_listener(cfg: ControllerConfig) -> socket.socket:
    """The real ranks' observer port: the launcher's, bound before this process started so
    that the ranks could start beside it (their environment names it), or one of its own."""
    if cfg.observer_fd < 0:
        return listener(cfg.observer_host, OBSERVER_BACKLOG)
    sock = socket.socket(fileno=cfg.observer_fd)
    sock.setblocking(False)
    return sock


def settle_heap() -> None:
    """Move what start-up made (torch, gRPC: millions of objects) out of the garbage
    collector's reach. A full collection walks every tracked object, and with torch
    imported that took 35-40 ms of the loop thread, stalling every boundary message
    and observer answer behind it (an MLP's DDP bucket waited 41 ms for its ring size).
    Objects made after this are collected as usual."""
    gc.collect()
    gc.freeze()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m neuronabox.controller.main CONFIG_JSON", file=sys.stderr)
        return 2
    cfg = ControllerConfig.loads(read_bounded(argv[0], 64 << 20, "controller configuration").decode())
    try:
        controller = Controller(cfg)
    except NeuronaBoxError as exc:  # refused at start (an NCCL release it does not speak): the launcher's line
        print(f"neuronabox controller: error: {exc}", file=sys.stderr, flush=True)
        return 1
    profile = os.environ.get("NEURONABOX_PROFILE")
    if profile:  # developer aid: cProfile the controller into this file
        import cProfile

        prof = cProfile.Profile()
        try:
            return prof.runcall(controller.run)
        finally:
            prof.dump_stats(profile)
    return controller.run()


if __name__ == "__main__":
    sys.exit(main())
