"""The `neuronabox` command."""

from __future__ import annotations

import argparse
import json
import sys

USAGE = """usage: neuronabox torchrun [torchrun flags] [--real-nodes N[,N..]] [--gloo-mode auto|full|lazy]
                             [--no-observer] [--trace FILE] script.py [script args]
       neuronabox status [--address HOST:PORT]
       neuronabox topology show NAME|FILE"""


def status_main(argv: list[str]) -> int:
    from neuronabox.controller import control_pb2
    from neuronabox.controller.service import connect

    from .launcher import RUNS_DIR

    p = argparse.ArgumentParser(prog="neuronabox status")
    p.add_argument("--address", help="the controller's control address (default: the latest run)")
    ns = p.parse_args(argv)
    address = ns.address
    if address is None:
        try:
            address = json.loads((RUNS_DIR / "latest.json").read_text())["control"]
        except (OSError, KeyError, ValueError):
            print("neuronabox: error: no run found; pass --address", file=sys.stderr)
            return 2
    try:
        reply = connect(address, timeout=3).Status(control_pb2.StatusRequest(), timeout=5)
    except Exception:
        print(f"neuronabox: error: no controller answers at {address}", file=sys.stderr)
        return 1
    print(
        f"state {reply.state}  world {reply.world_size}  real ranks {list(reply.real_ranks)}  "
        f"connections {reply.connections}  boundary messages {reply.boundary_messages}  "
        f"uptime {reply.uptime_s:.1f} s  controller CPU {reply.cpu_s:.2f} s"
    )
    for k in reply.kinds:
        print(f"  {k.kind:<10} count {k.count:>6}  bytes {k.bytes:>12}  real-rank time {k.seconds:.4f} s")
    for line in reply.pending:
        print(f"  in flight: {line}")
    if reply.error:
        print(f"  error: {reply.error}")
    return 0


def topology_main(argv: list[str]) -> int:
    from neuronabox.topology import PRESETS, TopologyError, load

    if len(argv) != 2 or argv[0] != "show":
        print(f"usage: neuronabox topology show NAME|FILE  (presets: {', '.join(sorted(PRESETS))})", file=sys.stderr)
        return 2
    try:
        print(load(argv[1]).describe())
    except TopologyError as exc:
        print(f"neuronabox: error: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "torchrun":
        from .launcher import torchrun_main

        return torchrun_main(rest)
    if cmd == "status":
        return status_main(rest)
    if cmd == "topology":
        return topology_main(rest)
    print(f"neuronabox: error: unknown command {cmd!r}\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
