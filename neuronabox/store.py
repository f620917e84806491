"""The run's TCPStore server, listening on the run's address (--master-addr) only.

TCPStore's own server binds every interface (`*:PORT`); it takes a bound socket instead.
The store has one of two hosts. When node 0 is emulated, the controller, with a server of
its own in the store's wire (`store_wire`, `controller.rendezvous.open_store`). When node
0 is real, its stock torchrun agent, whose static rendezvous makes `TCPStore(...,
is_master, multi_tenant=True)`: c10d keeps one server per port in a process, for as long
as a store holds it, and a multi-tenant store reuses it. So `sitecustomize` starts this
server in node 0's agent before torchrun's code runs (`host_in_node0_agent`), and
torchrun's store is served by it; torch is not changed.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import MutableMapping, Sequence
from datetime import timedelta

from neuronabox.store_wire import StoreClient

ADDR_ENV, PORT_ENV = "NEURONABOX_STORE_ADDR", "NEURONABOX_STORE_PORT"  # set for the real nodes' torchruns
NODE0 = "--node-rank=0"  # how the launcher names node 0 on its torchrun's command line (`ranks.node_command`)
HEAD_KEY = "neuronabox/head"  # a run on several hosts: the head launcher's link, which the controller publishes
_held: list = []  # the agent's store: its server lives as long as this reference


def store_listener(host: str, port: int) -> socket.socket:
    """A listening socket on `host`:`port` (IPv4 or IPv6, as `host` resolves) for the store."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    return socket.create_server((host, port), family=family, backlog=1024)


def bound_store(
    host: str, port: int, timeout: timedelta, world_size: int | None = None, sock: socket.socket | None = None
):
    """A TCPStore whose server listens on `host`:`port` only (on `sock` when the caller
    bound it already). Multi-tenant, so a later multi-tenant store of this process on
    the same port shares its server."""
    import torch.distributed as dist

    sock = sock or store_listener(host, port)
    try:
        store = dist.TCPStore(
            host,
            port,
            world_size=world_size,
            is_master=True,
            wait_for_workers=False,
            timeout=timeout,
            multi_tenant=True,
            master_listen_fd=sock.fileno(),
        )
    except BaseException:
        sock.close()
        raise
    sock.detach()  # the store's server owns the descriptor now, and closes it
    return store


def agent_env(host: str, port: int) -> dict[str, str]:
    """What the real nodes' torchruns are given when node 0 is real: node 0's hosts the store."""
    return {ADDR_ENV: host, PORT_ENV: str(port)}


def is_node0_agent(argv: Sequence[str]) -> bool:
    """Whether this process is node 0's torchrun: the launcher gives every real node's
    torchrun the same environment, and each its --node-rank before the script, so the
    first one on the command line is its own."""
    rank = next((a for a in argv if a.startswith("--node-rank=")), None)
    return list(argv[1:3]) == ["-m", "torch.distributed.run"] and rank == NODE0


def host_in_node0_agent(environ: MutableMapping[str, str] = os.environ, argv: Sequence[str] | None = None) -> None:
    """In node 0's torchrun agent, start the store's server on the run's address before
    torchrun starts its own on every interface. The variables are taken out of the
    environment first, so no process the agent starts (its workers, helpers) acts on them."""
    host, port = environ.pop(ADDR_ENV, None), environ.pop(PORT_ENV, None)
    if not host or not port or not is_node0_agent(sys.orig_argv if argv is None else argv):
        return
    try:
        _held.append(bound_store(host, int(port), timedelta(seconds=300)))
    except Exception as exc:  # torchrun would listen on every interface instead: stop here
        cause = f"the store cannot listen on {host}:{port}: {exc}"
        print(f"neuronabox node 0 agent: error: {cause}", file=sys.stderr, flush=True)
        os._exit(1)


def read_head(host: str, port: int, timeout_s: float, every_s: float = 0.1) -> str:
    """A run on several hosts: the head launcher's link address, from the run's store at
    `host`:`port`, waiting up to `timeout_s` for the store and the key. Spoken in the
    store's own wire (`store_wire`), so a launcher does not import torch for one key
    (seconds of CPU). TimeoutError, with what was last seen, when neither came."""
    deadline = time.monotonic() + timeout_s
    seen = "nothing answered"
    while time.monotonic() < deadline:
        try:
            with StoreClient(host, port, max(0.1, deadline - time.monotonic())) as store:
                seen = "the store is up, without the head's key"
                while time.monotonic() < deadline:
                    if store.check([HEAD_KEY]):
                        return store.get(HEAD_KEY).decode()
                    time.sleep(every_s)
        except OSError as exc:
            seen = exc.strerror or str(exc)
            time.sleep(every_s)
    raise TimeoutError(seen)
