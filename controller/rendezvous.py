"""Stand-ins for the torchrun agents of the emulated nodes, and the rank records
of the emulated ranks (GLOO_WIRE.md, "torchrun" and "Store keys").

Talks to the run's TCPStore in its own wire (`neuronabox.store_wire`), without torch:
importing it cost the controller about 1.2 s of CPU, for the store alone.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable

from neuronabox.store import store_listener
from neuronabox.store_wire import StoreClient, StoreServer

from .config import ControllerConfig
from .dialects.gloo.wire import Address, RankRecord

TERMINAL_STATE = "torchelastic/agent/terminal_state"
ROLE_INFO = "torchelastic/role_info/"
ASSIGNED_RANKS = "torchelastic/assigned_ranks/"
RECORD_BATCH = 256


def group_key(group: str, rank: int) -> str:
    """Where ProcessGroupGloo publishes group rank `rank` of `group`: the default group
    ("0") under the run's prefix, a later group under the default group's store."""
    if group == "0":
        return f"default_pg/0//cpu//0/{rank}"
    return f"default_pg/0//{group}//cpu//0/{rank}"


def store_client(cfg: ControllerConfig) -> StoreClient:
    """Another connection to the run's store, for a thread of its own."""
    return StoreClient(cfg.master_addr, cfg.master_port, cfg.store_timeout_s)


def open_store(
    cfg: ControllerConfig, listener: socket.socket | None = None, log: Callable[[str], None] = print
) -> tuple[StoreClient, StoreServer | None]:
    """The run's store: hosted by the real node-0 agent, or by us when node 0 is emulated
    (on `listener`, bound to the run's address only, as TCPStore's own server is not).
    Returns a client of it, and our server if we host it."""
    if 0 in cfg.real_nodes:  # the client retries a refused connection every 20 ms until the agent listens
        return store_client(cfg), None
    server = StoreServer(listener or store_listener(cfg.master_addr, cfg.master_port), log=log)
    try:
        return StoreClient(*server.address, cfg.store_timeout_s), server
    except BaseException:
        server.close()
        raise


STORE_INIT_KEY = b"init/"  # TCPStore::initKey_, outside the "/"-prefixed user keys


def count_in_workers(store: StoreClient, n: int) -> None:
    """Node 0's TCPStore waits until `nnodes` clients have counted themselves in by
    bumping `init/`, a key torch's own calls cannot reach (user keys get a "/" prefix):
    the emulated nodes count in with one ADD."""
    if n:
        store.add_raw(STORE_INIT_KEY, n)


class EmulatedAgents:
    """Does, for every emulated node, what its torchrun agent would do in the store."""

    def __init__(self, cfg: ControllerConfig, store) -> None:
        self.cfg = cfg
        self.store = store
        self.emulated_nodes = [n for n in range(cfg.nnodes) if n not in cfg.real_nodes]

    def key(self, k: str) -> str:
        return f"{self.cfg.run_id}/{k}"

    def join(self) -> None:
        cfg, n_emu = self.cfg, len(self.emulated_nodes)
        if 0 in cfg.real_nodes:
            count_in_workers(self.store, n_emu)
        keys = [self.key(f"{ROLE_INFO}{n}") for n in self.emulated_nodes]
        vals = [
            json.dumps({"role": "default", "rank": n, "local_world_size": cfg.nproc_per_node})
            for n in self.emulated_nodes
        ]
        for i in range(0, len(keys), RECORD_BATCH):
            self.store.multi_set(keys[i : i + RECORD_BATCH], vals[i : i + RECORD_BATCH])
        if n_emu:  # emulated agents are done as soon as they start
            self.store.add(self.key(f"{TERMINAL_STATE}/num_members"), n_emu)

    def assign_ranks_if_node0_emulated(self) -> None:
        """Node 0's agent computes every node's ranks; play it when node 0 is emulated."""
        cfg = self.cfg
        if 0 in cfg.real_nodes:
            return
        self.store.wait([self.key(f"{ROLE_INFO}{n}") for n in cfg.real_nodes])
        world = cfg.world_size
        keys, vals = [], []
        for n in range(cfg.nnodes):
            base = n * cfg.nproc_per_node
            keys.append(self.key(f"{ASSIGNED_RANKS}{n}"))
            vals.append(json.dumps([base, world, base, world]))
        for i in range(0, len(keys), RECORD_BATCH):
            self.store.multi_set(keys[i : i + RECORD_BATCH], vals[i : i + RECORD_BATCH])


def emulated_records(
    cfg: ControllerConfig, gloo_addr: tuple[str, int], group, seq_base: int = 0
) -> dict[int, RankRecord]:
    """The records of `group`'s emulated members (group ranks), all on the controller's listener."""
    world = group.world
    out = {}
    for e in range(world):
        if e in group.real:
            continue
        pair_ids = () if cfg.lazy else tuple(seq_base + e * world + p for p in range(world))
        node = cfg.node_of(group.global_rank(e))
        out[e] = RankRecord(f"nbx-node{node}", Address(gloo_addr[0], gloo_addr[1], -1), pair_ids)
    return out


def publish_records(store, records: dict[int, RankRecord], key) -> None:
    items = sorted(records.items())
    for i in range(0, len(items), RECORD_BATCH):
        chunk = items[i : i + RECORD_BATCH]
        store.multi_set([key(e) for e, _ in chunk], [r.encode() for _, r in chunk])
