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

import base64
import gc
import json
import os
import secrets
import sys
import threading
import time
import traceback
from datetime import timedelta

from neuronabox.delay_models.whatif import WhatIf

from neuronabox import delay_models, topology
from neuronabox.errors import NeuronaBoxError
from neuronabox.schedules.gloo import (
    BinomialBroadcast,
    DisseminationBarrier,
    RealRanks,
)
from neuronabox.trace.records import RunTotals, TraceWriter

from . import control_pb2
from .config import ControllerConfig
from .dialects.gloo.driver import GlooDriver, raise_fd_limit
from .dialects.gloo.protocol import GLOO, GlooPair
from .dialects.gloo.wire import (
    Address,
    RankRecord,
    UnsupportedRecord,
    dialer_is_local,
    split_slot,
)
from .engine import Conn, Engine, Group, InstanceRecord, ProtocolError
from .mirror import DTYPES, MirrorInput
from .observers import ObserverHub
from .release import ReleaseTiming
from .rendezvous import (
    EmulatedAgents,
    emulated_records,
    group_key,
    open_store,
    publish_records,
    store_client,
)
from .service import ControlService, serve
from .watchdog import RankStalled, Watchdog

STALLED = 4  # exit status: the watchdog ended the run (a real rank is hung; it will not fail on its own)
STORE_LOST = 5  # exit status: the store a real node's agent hosts went away (that node ended)


class StoreLost(NeuronaBoxError, ConnectionError):
    """The run's store, hosted by a real node's torchrun agent, went away."""
LAZY_DIAL_ALL = 256  # lazy mode: in groups this small the controller dials every emulated peer up front
ELEM_SIZES = {
    "Float": 4,
    "Double": 8,
    "Half": 2,
    "BFloat16": 2,
    "Char": 1,
    "Byte": 1,
    "Short": 2,
    "Int": 4,
    "Long": 8,
    "Bool": 1,
}


class Controller:
    def __init__(self, cfg: ControllerConfig) -> None:
        raise_fd_limit()
        self.cfg = cfg
        self.t0 = time.monotonic()
        self.state = "starting"
        self.error = ""
        self.world = cfg.world_size
        self.group = Group("0", self.world, RealRanks(cfg.real_ranks, self.world))
        self.groups: dict[str, Group] = {"0": self.group}
        self.topology = topology.load(cfg.topology).with_nodes(cfg.nnodes, cfg.nproc_per_node)
        self.timing = ReleaseTiming(
            delay_models.load(cfg.delay_model, self.topology),
            WhatIf.from_specs(cfg.inject),
            modeled_boundary=cfg.boundary == "modeled",
        )
        self.totals = RunTotals()
        self.watchdog = Watchdog(cfg.timeout_s)
        # One reading of both clocks: the trace's monotonic times map to epoch time through it.
        self.clock_anchor = {"monotonic": time.monotonic(), "epoch": time.time()}
        offset = self.clock_anchor["epoch"] - self.clock_anchor["monotonic"]  # the trace's clock is epoch
        self.trace = TraceWriter(cfg.trace_file, self._trace_header(), offset) if cfg.trace_file else None
        self.driver = GlooDriver(self._make_engine, cfg.gloo_host)
        self.driver.accept_router = self._may_dial_in
        self.driver.log = self.log
        self._seq_base: dict[str, int] = {"0": 0}  # each group's block of the pair ids its emulated records publish
        self._next_seq = self.world**2
        self.driver.periodic = self._periodic
        self.driver.on_open = lambda conn: self.driver.engine.on_connected(conn)
        self.conns: dict[tuple[str, int, int], Conn] = {}
        self.observer_secret = secrets.token_hex(32)  # an observer's hello carries it (the ready file has it)
        self.hub = ObserverHub(
            cfg.observer_host,
            self.driver.register_extra,
            self.driver.unregister_extra,
            self.observer_secret,
            call_at=self.driver.call_at,
            log=self.log,
        )
        self.hub.on_reply = self._on_meta_reply
        self.hub.on_lost = self._observer_lost
        self.hub.on_group = self._on_group
        self.hub.on_anysource = self._on_anysource
        self.hub.on_step = self._on_step
        self.hub.on_dtypes = self._on_dtypes
        self._queries: dict[int, tuple[str, int, int]] = {}
        self._qid = 0
        self.finished = threading.Event()  # the loop has stopped and the state is final
        self.control_token = secrets.token_hex(16)  # every control call carries it (the ready file has it)
        self.service = ControlService(
            self.snapshot, self.request_stop, self.inject, self.finished, token=self.control_token
        )
        self.server, self.control_port = serve(self.service, cfg.control_host)
        self._reply_done = threading.Event()
        self._stop_asked = False
        self.exit_status = 3  # on an error
        self.store = None

    # -- engine hooks ------------------------------------------------------------------
    def _make_engine(self, driver: GlooDriver) -> Engine:
        return Engine(
            emit=driver.write,
            dialect=GLOO,
            request_meta=self._request_meta if self.cfg.observer else None,
            on_complete=self._on_record,
            conn_of=self._open_conn,
            timing=self.timing,
            call_at=driver.call_at,
            data=self.cfg.data,
            request_input=self._request_input if self.cfg.observer else None,
            native_timers=True,
        )

    def _on_record(self, rec: InstanceRecord) -> None:
        """A finished instance: into the totals and the trace on disk, and then forgotten."""
        self.totals.add(rec.kind, rec.nbytes, rec.per_rank, rec.boundary_messages, rec.predicted)
        group = self.groups.get(rec.group)
        if group is not None:
            done = f"{rec.kind} #{rec.tag} of group {rec.group!r}"
            for r, (_, end) in rec.per_rank.items():
                self.watchdog.touch(group.global_rank(int(r)), end, done)
        if self.trace is not None:
            self.trace.instance(rec, self.driver.engine.open_entries())

    def _on_step(self, rank: int, t: float) -> None:
        self.totals.step(rank, t)
        self.watchdog.touch(rank, time.monotonic())
        if self.trace is not None:
            self.trace.step(rank, t)

    def _on_dtypes(self, dtypes: list[list]) -> None:
        if self.trace is not None:
            self.trace.dtypes(dtypes)

    def _open_conn(self, group: Group, real: int, emu: int) -> Conn | None:
        conn = self.conns.get((group.name, real, emu))
        return conn if conn is not None and conn in self.driver.socks else None

    def _ask(self, group: str, slot: int, real: int, what: dict, reply_bytes: int = 0) -> bool:
        """Ask real rank `real`'s observer about instance (group, slot)."""
        tag = split_slot(slot)[1]
        if not self.hub.ask(real, {"q": self._qid + 1, "pg": group, "tag": tag, **what}, reply_bytes):
            return False
        self._qid += 1
        self._queries[self._qid] = (group, slot, real, "input" in what)
        return True

    def _request_meta(self, group: str, slot: int, real: int, kind: str) -> bool:
        return self._ask(group, slot, real, {"kind": kind})

    def _request_input(self, group: str, slot: int, real: int) -> bool:
        inst = self.driver.engine.instances.get((group, slot))  # the input is at most the instance's bytes
        return self._ask(group, slot, real, {"input": 1}, inst.nbytes if inst is not None else 0)

    def _observer_lost(self, rank: int) -> None:
        """A real rank's observer went away: its open questions fall back to the wire
        (inputs to zeros)."""
        for q, (group, slot, real, is_input) in list(self._queries.items()):
            if real == rank:
                del self._queries[q]
                if is_input:
                    self.driver.engine.on_input(group, slot, None)
                else:
                    self.driver.engine.on_meta(group, slot, None)

    def _on_meta_reply(self, msg: dict) -> None:
        group, slot, _, is_input = self._queries.pop(msg["q"], (None, None, None, False))
        if group is None:
            return
        if "root" in msg:
            self.driver.engine.on_root(group, slot, msg["root"])
            return
        if is_input:
            data = msg.get("data")
            mirror = None
            if data is not None and msg.get("dtype") in DTYPES:
                mirror = MirrorInput(base64.b64decode(data), msg["dtype"], msg.get("op", "SUM"), msg.get("splits"))
            self.driver.engine.on_input(group, slot, mirror)
            return
        numel, dtype = msg.get("numel"), msg.get("dtype")
        if numel is None or dtype not in ELEM_SIZES:
            self.driver.engine.on_meta(group, slot, None)
        else:
            self.driver.engine.on_meta(group, slot, numel, ELEM_SIZES[dtype], dtype)

    def inject(self, specs: list[str], clear: bool) -> list[str]:
        """Change the what-if modifiers during the run (control service threads): instances
        that start from now on see them. Raises WhatIfError on a bad spec."""
        mods = [] if clear else list(self.timing.whatif.mods)
        mods += WhatIf.from_specs(specs).mods
        self.timing.set_whatif(WhatIf(mods))
        self.log(f"what-if now: {', '.join(m.spec for m in mods) or 'none'}")
        return [m.spec for m in mods]

    # -- pairs ------------------------------------------------------------------------------
    def _may_dial_in(self, seq: int) -> bool:
        """Is `seq` a pair id an emulated record published to a real rank whose own record
        the controller has not read yet? Such a dialer waits for `connect_real_rank`, which
        expects the pairs real ranks dial (full-mesh mode only; the rest are refused)."""
        if self.cfg.lazy:
            return False
        for name, base in list(self._seq_base.items()):
            group = self.groups.get(name)
            if group is not None and base <= seq < base + group.world**2:
                e, r = divmod(seq - base, group.world)
                return r in group.real and e not in group.real and (name, r, e) not in self.conns
        return False

    @staticmethod
    def lazy_peers(group: Group, r: int) -> set[int]:
        """Peers a real rank reaches, dialed up front in lazy mode: every peer in a group
        of up to LAZY_DIAL_ALL ranks; in larger ones those of the rings, trees and
        dissemination rounds (gather, scatter, alltoall and point-to-point traffic with
        other peers need a smaller group there)."""
        w = group.world
        if w <= LAZY_DIAL_ALL:
            return {p for p in range(w) if p not in group.real}
        peers = {(r + 1) % w, (r - 1) % w}
        barrier = DisseminationBarrier(w)
        peers |= {m.peer for m in barrier.sends(r) + barrier.recvs(r)}
        for root in set(group.real.sorted) | {0}:
            b = BinomialBroadcast(w, root, 0)
            peers |= {m.peer for m in b.sends(r) + b.recvs(r)}
        return {p for p in peers if p not in group.real and p != r}

    # -- process groups beyond the default ------------------------------------------------
    def _on_group(self, name: str, ranks: list[int]) -> None:
        """A real rank's observer reports a group it joins (loop thread): stand in for its
        emulated members. Groups with no real member never reach the controller."""
        if name in self.groups:
            return
        real = set(self.cfg.real_ranks)
        mine = [g for g, x in enumerate(ranks) if x in real]
        if not mine:
            return
        group = self.groups[name] = Group(name, len(ranks), RealRanks(mine, len(ranks)), tuple(ranks))
        self._seq_base[name], self._next_seq = self._next_seq, self._next_seq + group.world**2  # unique per listener
        self.log(f"group {name!r}: {len(ranks)} ranks, real members {[ranks[g] for g in mine]}")
        threading.Thread(target=self._setup_group, args=(group,), name=f"group-{name}", daemon=True).start()

    def _on_anysource(self, rank: int, name: str, tag: int, nbytes: int) -> None:
        """Real rank `rank` posted a receive from any source in group `name` (loop thread)."""
        group = self.groups.get(name)
        if group is None:
            raise ProtocolError(f"real rank {rank} receives from any source in group {name!r}, which it never joined")
        r = group.ranks.index(rank) if group.ranks else rank
        self.driver.engine.p2p.answer_any_source(group, r, tag, nbytes)

    def _setup_group(self, group: Group) -> None:
        try:
            store = store_client(self.cfg)
            records = emulated_records(self.cfg, self.driver.address, group, seq_base=self._seq_base[group.name])
            publish_records(store, records, key=lambda g: group_key(group.name, g))
            self._await_records(store, group)
        except BaseException as exc:  # noqa: BLE001
            if self.state != "stopping":
                self.fail(self._store_lost(exc))

    def _await_records(self, store, group: Group) -> None:
        """Wait for each real member's record and open its pairs in the loop."""
        for g in group.real.sorted:
            key = group_key(group.name, g)
            while not self._store_wait(store, key):  # wakes now and then to see whether the run still goes
                if not self.driver.running:
                    return
            rec = RankRecord.decode(store.get(key), group.world)
            self.log(f"real rank {group.global_rank(g)} published its record for group {group.name!r}")
            self.driver.call_soon(lambda g=g, rec=rec: self.connect_real_rank(group, g, rec))

    def connect_real_rank(self, group: Group, r: int, rec: RankRecord) -> None:
        """Runs in the loop: open (or await) the pair between real rank r and every emulated peer."""
        if rec.lazy != self.cfg.lazy:
            raise UnsupportedRecord(
                f"real rank {r} uses Gloo's {'lazy' if rec.lazy else 'full-mesh'} connection mode, "
                f"the controller was configured for the other one"
            )
        self.watchdog.watch(group.global_rank(r), time.monotonic())
        host, port = self.driver.address
        peers = self.lazy_peers(group, r) if self.cfg.lazy else [e for e in range(group.world) if e not in group.real]
        for e in sorted(peers):
            conn = Conn(group, r, e, GlooPair())
            self.conns[(group.name, r, e)] = conn
            if self.cfg.lazy:
                ours, theirs = Address(host, port, r), Address(rec.address.host, rec.address.port, e)
            else:
                ours = Address(host, port, self._seq_base[group.name] + e * group.world + r)  # its record's pair id
                theirs = Address(rec.address.host, rec.address.port, rec.pair_ids[e])
            if dialer_is_local(ours, theirs):
                self.driver.dial(conn, theirs.host, theirs.port, theirs.seq)
            elif not self.cfg.lazy:  # the real rank dials in, writing our pair id for it
                self.driver.expect(ours.seq, conn)
            elif self.cfg.lazy:
                raise ConnectionError(
                    f"real rank {r} listens on {theirs.host}, which compares above the controller's "
                    f"{host}: in lazy mode the controller must dial; use --gloo-host with a larger address"
                )

    # -- store thread ------------------------------------------------------------------------
    def rendezvous(self) -> None:
        try:
            # Kept for the whole run: when node 0 is emulated this object is the run's
            # TCPStore server, which the real agents use up to their exit barrier.
            self.store = store = open_store(self.cfg)
            self.log("store open")
            settle_heap()
            agents = EmulatedAgents(self.cfg, store)
            records = emulated_records(self.cfg, self.driver.address, self.group)
            publish_records(store, records, key=lambda e: group_key("0", e))
            self.log("emulated rank records published")
            agents.join()
            agents.assign_ranks_if_node0_emulated()
            self.log("emulated agents joined")
            self.state = "running"
            self._await_records(store, self.group)
        except BaseException as exc:  # noqa: BLE001
            if self.state != "stopping":
                self.fail(self._store_lost(exc))

    @staticmethod
    def _store_wait(store, key: str) -> bool:
        """Block until `key` is in the store (True) or ten seconds have passed (False)."""
        import torch.distributed as dist

        try:
            store.wait([key], timedelta(seconds=10))
            return True
        except getattr(dist, "DistStoreError", RuntimeError):
            return False

    def log(self, what: str) -> None:
        print(f"[controller {time.monotonic() - self.t0:8.3f}s] {what}", file=sys.stderr, flush=True)

    # -- lifecycle -------------------------------------------------------------------------
    def _store_lost(self, exc: BaseException) -> BaseException:
        """When a real node's agent hosts the store, the store failing means that node's
        torchrun is gone: the launcher names the node's own exit rather than this."""
        if 0 in self.cfg.real_nodes and not isinstance(exc, (ProtocolError, UnsupportedRecord, NeuronaBoxError)):
            return StoreLost(f"the run's store (real node 0's torchrun agent) went away: {exc}")
        return exc

    def fail(self, exc: BaseException) -> None:
        if isinstance(exc, StoreLost):
            self.exit_status = STORE_LOST
        if not self.error:
            if not isinstance(exc, (ProtocolError, UnsupportedRecord, ConnectionError, RuntimeError)):
                # not one of ours: the traceback goes to controller.log, which the launcher keeps
                traceback.print_exception(exc, file=sys.stderr)
            self.error = f"{type(exc).__name__}: {exc}" if not str(exc) or isinstance(exc, LookupError) else str(exc)
        self.state = "failed"
        self.driver.running = False
        self.driver.call_soon(lambda: None)

    def request_stop(self, reason: str) -> None:
        self._stop_asked = True
        if self.state not in ("failed",):
            self.state = "stopping"
        self.driver.running = False
        self.driver.call_soon(lambda: None)

    def _periodic(self) -> None:
        if os.getppid() == 1:  # the launcher is gone: nothing to serve
            raise RuntimeError("the launcher exited; controller stopping")
        cause = self.watchdog.check(time.monotonic(), list(self.driver.engine.instances.values()))
        if cause is not None:
            raise RankStalled(cause)

    def run(self) -> int:
        self._write_ready()
        t = threading.Thread(target=self.rendezvous, name="rendezvous", daemon=True)
        t.start()
        self.driver.run()
        if self.driver.error is not None and not self.error:
            self.fail(self.driver.error)
        self.driver.close_all()
        self.hub.close()
        if self.error:
            self.state = "failed"
            print(f"neuronabox controller: error: {self.error}", file=sys.stderr, flush=True)
        else:
            self.state = "stopped"
        if self.trace is not None:
            self.trace.close(self._trace_footer())
        self.finished.set()
        if self._stop_asked:  # the Shutdown call that asked waits for the final status
            self._reply_done.wait(timeout=3)
        self.server.stop(grace=1).wait(2)
        if isinstance(self.driver.error, RankStalled):
            return STALLED
        return self.exit_status if self.error else 0

    def _write_ready(self) -> None:
        if self.cfg.ready_file:
            info = {
                "control": f"{self.cfg.control_host}:{self.control_port}",
                "observer": f"{self.hub.address[0]}:{self.hub.address[1]}",
                "observer_secret": self.observer_secret,
                "control_token": self.control_token,
                "pid": os.getpid(),
            }
            tmp = self.cfg.ready_file + ".tmp"
            with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:  # it holds the secret
                json.dump(info, f)
            os.replace(tmp, self.cfg.ready_file)

    # -- reporting -----------------------------------------------------------------------------
    def _trace_header(self) -> dict:
        return {
            "world_size": self.world,
            "nnodes": self.cfg.nnodes,
            "nproc_per_node": self.cfg.nproc_per_node,
            "real_ranks": self.cfg.real_ranks,
            "delay_model": self.cfg.delay_model,
            "topology": self.topology.name,
            "topology_spec": topology.as_spec(self.topology),
            "boundary": self.cfg.boundary,
            "inject": self.timing.whatif.specs(),
            "data": self.cfg.data,
            "started_us": round(self.clock_anchor["epoch"] * 1e6, 3),
        }

    def _trace_footer(self) -> dict:
        return {
            "state": self.state,
            "error": self.error,
            "inject": self.timing.whatif.specs(),  # what-if may change during the run
            "release": self.timing.lateness_summary(),
        }

    def snapshot(self, final: bool) -> control_pb2.StatusReply:
        kinds = list(self.totals.kinds.items())  # one step under the GIL: the loop adds meanwhile
        steps, iteration = self.totals.iteration()
        reply = control_pb2.StatusReply(
            state=self.state,
            world_size=self.world,
            real_ranks=self.cfg.real_ranks,
            kinds=[
                control_pb2.KindCounters(
                    kind=n,
                    count=k.count,
                    bytes=k.nbytes,
                    seconds=k.seconds,
                    boundary_messages=k.boundary_messages,
                    predicted_s=k.predicted,
                )
                for n, k in sorted(kinds)
            ],
            boundary_messages=sum(k.boundary_messages for _, k in kinds),
            connections=len(self.driver.socks),
            pending=self.driver.engine.pending(),
            error=self.error,
            uptime_s=time.monotonic() - self.t0,
            cpu_s=time.process_time(),
            steps=steps,
            iteration_s=iteration,
        )
        if final and self.state in ("stopped", "failed"):
            self._reply_done.set()
        return reply


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
    with open(argv[0]) as f:
        cfg = ControllerConfig.loads(f.read())
    profile = os.environ.get("NEURONABOX_PROFILE")
    if profile:  # developer aid: cProfile the controller into this file
        import cProfile

        prof = cProfile.Profile()
        try:
            return prof.runcall(Controller(cfg).run)
        finally:
            prof.dump_stats(profile)
    return Controller(cfg).run()


if __name__ == "__main__":
    sys.exit(main())
