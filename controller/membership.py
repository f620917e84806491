"""Membership and dialing: the process groups the controller stands in for, and which
pairs it opens between their real and emulated members, and when.

The default group's emulated records go to the store at the rendezvous, a later
group's when a real rank's observer reports it. Each real member's own record, once
in the store, says where its pairs are: the controller dials those it must and
expects the ones the real rank dials (GLOO_WIRE.md). Store work runs in threads of
its own and never touches a pair: pairs open in the loop (`call_soon`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from neuronabox.errors import NeuronaBoxError
from neuronabox.schedules.gloo import BinomialBroadcast, DisseminationBarrier, RealRanks
from neuronabox.store import HEAD_KEY, store_listener
from neuronabox.store_wire import StoreClient, StoreError, StoreServer, StoreTimeout

from .config import ControllerConfig
from .dialects.gloo.driver import GlooDriver
from .dialects.gloo.protocol import GlooPair
from .dialects.gloo.wire import Address, RankRecord, UnsupportedRecord, dialer_is_local
from .engine import Engine
from .groups import Conn, Group
from .lifecycle import StoreLost
from .outcomes import ProtocolError
from .rendezvous import EmulatedAgents, emulated_records, group_key, open_store, publish_records, store_client
from .watchdog import Watchdog

REJOIN_POLL_S = 0.1  # how often a store thread looks for the record of a rank that left the default group
LAZY_DIAL_ALL = 256  # lazy mode: in groups this small the controller dials every emulated peer up front


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


def store_wait(store: StoreClient, key: str) -> bool:
    """Block until `key` is in the store (True) or ten seconds have passed (False)."""
    try:
        store.wait([key], 10.0)
        return True
    except StoreTimeout:
        return False


class Membership:
    """The groups and their pairs. `on_joined`: the emulated agents joined the run (store
    thread); `on_error`: a store thread's error, which ends the run; `after_store_open`:
    the store is open (start-up's imports are done); `nccl_start`: the default group's NCCL
    communicator, given the store once the agents joined (backend nccl: no Gloo records)."""

    def __init__(
        self,
        cfg: ControllerConfig,
        driver: GlooDriver,
        engine: Engine,
        watchdog: Watchdog,
        clock: Callable[[], float],
        log: Callable[[str], None],
        on_joined: Callable[[], None],
        on_error: Callable[[BaseException], None],
        after_store_open: Callable[[], None],
        nccl_start: Callable[[object], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self._nccl_start = nccl_start  # the default group is NCCL's: its communicator starts given the store
        self.driver = driver
        self.engine = engine
        self.watchdog = watchdog
        self.clock = clock
        self.log = log
        self._on_joined = on_joined
        self._on_error = on_error
        self._after_store_open = after_store_open
        self.on_generation: Callable[[], None] = lambda: None  # a new generation reset the engine (the observer link's)
        world = cfg.world_size
        self.default = Group("0", world, RealRanks(cfg.real_ranks, world))
        self.groups: dict[str, Group] = {"0": self.default}
        self._seq_base: dict[str, int] = {"0": 0}  # each group's block of the pair ids its emulated records publish
        self._next_seq = world**2
        self.conns: dict[tuple[str, int, int], Conn] = {}
        self.store: StoreClient | None = None
        self.store_server: StoreServer | None = None  # when node 0 is emulated: the run's store
        # When the controller hosts the store it listens from the start, before the ranks
        # are started: an agent that dials a refused port backs off (0.67 s), one whose
        # connection is accepted waits only until the store serves it (torch's import here).
        self._store_listener = None if 0 in cfg.real_nodes else store_listener(cfg.master_addr, cfg.master_port)
        # The default group's generations: a real rank that destroys it and inits again, or
        # whose process torchrun restarts (--max-restarts), publishes a new record at the
        # same key; the first rank to do so starts a new generation of the whole world.
        self._records: dict[int, bytes] = {}  # each real member's record, as last read
        self._open: dict[int, int] = {}  # real member -> its open default-group pairs
        self._left: set[int] = set()  # real members whose default-group pairs all closed
        self._generation_of: dict[int, int] = {}  # real member -> how often it made the group again

    # -- pairs ------------------------------------------------------------------------------
    def open_conn(self, group: Group, real: int, emu: int) -> Conn | None:
        """The pair between real rank `real` and emulated rank `emu` of `group`, if it is open."""
        conn = self.conns.get((group.name, real, emu))
        return conn if conn is not None and conn in self.driver.socks else None

    def may_dial_in(self, seq: int) -> bool:
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

    def connect_real_rank(self, group: Group, r: int, rec: RankRecord) -> None:
        """Runs in the loop: open (or await) the pair between real rank r and every emulated peer."""
        if rec.lazy != self.cfg.lazy:
            raise UnsupportedRecord(
                f"real rank {r} uses Gloo's {'lazy' if rec.lazy else 'full-mesh'} connection mode, "
                f"the controller was configured for the other one"
            )
        self.watchdog.watch(group.global_rank(r), self.clock())
        host, port = self.driver.address
        peers = lazy_peers(group, r) if self.cfg.lazy else [e for e in range(group.world) if e not in group.real]
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

    def on_pair_open(self, conn: Conn) -> None:
        """The driver opened a pair (loop thread): count it, then let the engine post to it."""
        if conn.group is self.default:
            self._open[conn.real] = self._open.get(conn.real, 0) + 1
        self.engine.on_connected(conn)

    def on_pair_closed(self, conn: Conn) -> None:
        """A pair's socket closed (loop thread). When every default-group pair of a real
        rank has closed, the rank left the group: it destroyed it (to init again, or for
        good) or its process ended (torchrun may start it again). Its pairs are forgotten,
        the watchdog no longer waits for it, and a store thread looks for its next record."""
        self.engine.clear_starters()  # a native start connects the pairs it saw open
        if conn.group is not self.default or self.conns.get((conn.group.name, conn.real, conn.emu)) is not conn:
            return
        r = conn.real
        self._open[r] = self._open.get(r, 1) - 1
        if self._open[r] > 0 or r in self._left:
            return
        self._left.add(r)
        rank = self.default.global_rank(r)
        for key in list(self.conns):  # its pairs in every group it was in
            group = self.groups.get(key[0])
            if group is None or group.global_rank(key[1]) == rank:
                del self.conns[key]
        self.watchdog.leave(rank)
        self.log(f"real rank {rank} left the default process group (its pairs closed)")
        threading.Thread(target=self._await_rejoin, args=(r,), name=f"rejoin-{rank}", daemon=True).start()

    def _await_rejoin(self, r: int) -> None:
        """A store thread: wait for real rank r's next record of the default group."""
        try:
            with store_client(self.cfg) as store:
                self._watch_record(store, r)
        except BaseException as exc:  # noqa: BLE001
            if self.driver.running:
                self._on_error(self._store_lost(exc))

    def _watch_record(self, store: StoreClient, r: int) -> None:
        key, last = group_key("0", r), self._records.get(r)
        while self.driver.running:
            if store.check([key]):
                raw = store.get(key)
                if raw != last:
                    rec = RankRecord.decode(raw, self.default.world)
                    self.driver.call_soon(lambda raw=raw, rec=rec: self._rejoin(r, raw, rec))
                    return
            time.sleep(REJOIN_POLL_S)

    def _rejoin(self, r: int, raw: bytes, rec: RankRecord) -> None:
        """Real rank r joined the default group again (loop thread). The first of a new
        generation to do so resets what the old one left: instances in flight, later groups."""
        gen = self._generation_of.get(r, 0) + 1
        if gen > max(self._generation_of.values(), default=0):  # the first of its generation
            self.engine.reset()
            self.groups = {"0": self.default}
            self.on_generation()
        self._generation_of[r] = gen
        self._records[r] = raw
        self._left.discard(r)
        self.log(f"real rank {self.default.global_rank(r)} joined the default process group again (generation {gen})")
        self.connect_real_rank(self.default, r, rec)

    # -- what the observers report (loop thread) ------------------------------------------
    def on_group(self, name: str, ranks: list[int]) -> None:
        """A real rank's observer reports a group it joins: stand in for its emulated
        members. Groups with no real member never reach the controller."""
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

    def on_anysource(self, rank: int, name: str, tag: int, nbytes: int) -> None:
        """Real rank `rank` posted a receive from any source in group `name`."""
        group = self.groups.get(name)
        if group is None:
            raise ProtocolError(f"real rank {rank} receives from any source in group {name!r}, which it never joined")
        r = group.ranks.index(rank) if group.ranks else rank
        self.engine.p2p.answer_any_source(group, r, tag, nbytes)

    # -- store threads ------------------------------------------------------------------------
    def rendezvous(self) -> None:
        """The run's start (a thread of its own): open the store, publish the default group's
        emulated records, do what the emulated nodes' agents do, then read the real ranks' records."""
        try:
            # Kept for the whole run: when node 0 is emulated our server is the run's
            # TCPStore, which the real agents use up to their exit barrier.
            self.store, self.store_server = store, _ = open_store(self.cfg, self._store_listener, self.log)
            self.log("store open")
            self._after_store_open()
            if self.cfg.member_link:  # a run on several hosts: where the other hosts' launchers find the head
                store.set(HEAD_KEY, self.cfg.member_link)
            agents = EmulatedAgents(self.cfg, store)
            if self._nccl_start is None:
                records = emulated_records(self.cfg, self.driver.address, self.default)
                publish_records(store, records, key=lambda e: group_key("0", e))
                self.log("emulated rank records published")
            agents.join()
            agents.assign_ranks_if_node0_emulated()
            self.log("emulated agents joined")
            self._on_joined()
            if self._nccl_start is not None:
                self._nccl_start(store)
                return
            self.driver.call_soon(self._expect_members)
            self._await_records(store, self.default)
        except BaseException as exc:  # noqa: BLE001
            self._on_error(self._store_lost(exc))

    def _expect_members(self) -> None:
        """The emulated ranks are in init_process_group now: they wait for each real rank's
        record as long as a real peer would (the watchdog's timeout)."""
        now = self.clock()
        for g in self.default.real.sorted:
            self.watchdog.expect(self.default.global_rank(g), now)

    def _setup_group(self, group: Group) -> None:
        try:
            with store_client(self.cfg) as store:
                records = emulated_records(self.cfg, self.driver.address, group, seq_base=self._seq_base[group.name])
                publish_records(store, records, key=lambda g: group_key(group.name, g))
                self._await_records(store, group)
        except BaseException as exc:  # noqa: BLE001
            self._on_error(self._store_lost(exc))

    def _await_records(self, store: StoreClient, group: Group) -> None:
        """Wait for each real member's record and open its pairs in the loop."""
        for g in group.real.sorted:
            key = group_key(group.name, g)
            while not store_wait(store, key):  # wakes now and then to see whether the run still goes
                if not self.driver.running:
                    return
            raw = store.get(key)
            rec = RankRecord.decode(raw, group.world)
            if group is self.default:
                self._records[g] = raw
            self.log(f"real rank {group.global_rank(g)} published its record for group {group.name!r}")
            self.driver.call_soon(lambda g=g, rec=rec: self.connect_real_rank(group, g, rec))

    def _store_lost(self, exc: BaseException) -> BaseException:
        """When a real node's agent hosts the store, the store failing means that node's
        torchrun is gone: the launcher names the node's own exit rather than this."""
        ours = isinstance(exc, (ProtocolError, UnsupportedRecord, NeuronaBoxError)) and not isinstance(exc, StoreError)
        if 0 in self.cfg.real_nodes and not ours:
            return StoreLost(f"the run's store (real node 0's torchrun agent) went away: {exc}")
        return exc
