"""What a run listens on: every listening TCP socket of every process of a run (the
launcher, the controller, node 0's torchrun agent with the store it hosts, the real
ranks with Gloo's and the observer's sockets) is on loopback, and the store on the
address --master-addr names (issue "Reliability under faults and bad input")."""

import ipaddress

import psutil
from conftest import SCRIPTS, Live, tagged_processes

from neuronabox.launcher.ports import free_port

WAITER = str(SCRIPTS / "allreduce_then_wait.py")


def run_processes(live: Live) -> list[psutil.Process]:
    """The launcher, everything it started (its descendants), and anything of the run's
    that was reparented away from it (tagged by the test's environment variable)."""
    root = psutil.Process(live.proc.pid)
    found = {p.pid: p for p in [root, *root.children(recursive=True), *tagged_processes(live.tag)]}
    return list(found.values())


def listeners(procs: list[psutil.Process]) -> list[tuple[str, str, int]]:
    """(process name, address, port) of every listening TCP socket, IPv4 and IPv6, of `procs`."""
    out = []
    for p in procs:
        try:
            name = " ".join(p.cmdline()[1:4]) or p.name()
            conns = p.net_connections(kind="tcp")
        except psutil.NoSuchProcess:
            continue
        out += [(name, c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN]
    return out


def is_loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(addr, "ipv4_mapped", None)  # ::ffff:127.0.0.1, a dual-stack socket's IPv4 side
    return (mapped or addr).is_loopback


def test_a_listener_survey_during_a_run_with_node_0_real_finds_nothing_beyond_loopback(tmp_path):
    go, port = tmp_path / "go", free_port("127.0.0.3")
    live = Live("torchrun", "--nnodes", "2", "--master-addr", "127.0.0.3", "--master-port", str(port), WAITER, str(go))
    try:
        live.wait_line(r"rank 0: allreduced", timeout=60)  # the store, Gloo, the observer: all up
        procs = run_processes(live)
        found = listeners(procs)
        go.touch()
        assert live.finish(timeout=60) == 0, live.err[-2000:]
    finally:
        go.touch()
        live.stop()
    assert len(procs) >= 4, [p.pid for p in procs]  # the launcher, the controller, node 0's agent, rank 0
    assert len({name for name, _, _ in found}) >= 3, found  # the controller's, the agent's (the store), rank 0's
    beyond = [f for f in found if not is_loopback(f[1])]
    assert not beyond, f"listening beyond loopback: {beyond}"
    store = [(ip, p) for _, ip, p in found if p == port]
    assert store == [("127.0.0.3", port)], found  # where --master-addr says, and nowhere else
