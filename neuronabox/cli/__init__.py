"""The `neuronabox` command."""

from __future__ import annotations

import argparse
import json
import sys

import psutil

USAGE = """usage: neuronabox torchrun [torchrun flags] [--real-nodes N[,N..]] [--gloo-mode auto|full|lazy]
                             [--topology NAME|FILE] [--delay-model NAME] [--boundary modeled|real]
                             [--inject SPEC]... [--no-observer] [--trace FILE] [--timeout S] script.py [args]
       neuronabox status [--address HOST:PORT]
       neuronabox inject [--address HOST:PORT] [--clear] [SPEC ...]
       neuronabox whatif --sweep KEY=V1,V2,... [--with OPTS] [--out PREFIX] [launch flags] -- script.py [args]
       neuronabox calibrate [--testbed loopback|netns] [--rate RATE] --out FILE.yaml
       neuronabox validate [torchrun flags] [--real-ranks ...] [--testbed loopback|netns] [--rate RATE]
                           [--repeat K] [--csv FILE] -- script.py [args]
       neuronabox export TRACE --format chrome|png [--out PATH] [--sample-emulated K] [--window FROM,TO]
       neuronabox simulate TRACE [--nnodes N] [--nproc-per-node P] [--topology T] [--delay-model M]
                           [--inject SPEC]... [--trace OUT]
       neuronabox topology show NAME|FILE"""


class ArgParser(argparse.ArgumentParser):
    """argparse, its errors in the tool's one line (exit status 2)."""

    def error(self, message: str):
        print(f"neuronabox: error: {message}", file=sys.stderr)
        sys.exit(2)


def live_runs() -> list[dict]:
    """Every run registered in RUNS_DIR/<launcher pid>.json whose launcher lives; the
    files of dead ones are removed."""
    from neuronabox.launcher.run import RUNS_DIR

    runs = []
    for f in sorted(RUNS_DIR.glob("*.json")):
        if not f.stem.isdigit():
            continue
        try:
            entry = json.loads(f.read_text())
            alive = psutil.pid_exists(int(entry["pid"])) and bool(entry["control"])
        except (OSError, KeyError, ValueError, TypeError):
            continue  # being written, or gone
        if alive:
            runs.append(entry)
        else:
            f.unlink(missing_ok=True)
    return runs


def unreachable(address: str, exc: BaseException) -> str:
    """Why a control call to `address` got no answer, in one line."""
    code = getattr(exc, "code", None)
    if callable(code) and getattr(code(), "name", "") == "PERMISSION_DENIED":
        return f"the controller at {address} refused the call: it is not a run of this user's registry (no token)"
    return f"no controller answers at {address}"


def token_for(address: str) -> str:
    """The control token of the registered run at `address` ("" if none: refused)."""
    from neuronabox.launcher.run import RUNS_DIR

    for entry in [*live_runs(), _entry(RUNS_DIR / "latest.json")]:
        if entry and entry.get("control") == address:
            return entry.get("token", "")
    return ""


def _entry(path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _control_address(given: str | None) -> str | None:
    from neuronabox.launcher.run import RUNS_DIR

    if given is not None:
        return given
    try:
        return json.loads((RUNS_DIR / "latest.json").read_text())["control"]
    except (OSError, KeyError, ValueError):
        print("neuronabox: error: no run found; pass --address", file=sys.stderr)
        return None


def status_main(argv: list[str]) -> int:
    from neuronabox.controller import control_pb2
    from neuronabox.controller.service import connect

    p = ArgParser(prog="neuronabox status")
    p.add_argument("--address", help="the controller's control address (default: every live run)")
    ns = p.parse_args(argv)
    if ns.address is None:
        runs = live_runs()
        if not runs:
            print("neuronabox: error: no run found; pass --address", file=sys.stderr)
            return 2
        answered = 0
        for n, entry in enumerate(runs):
            print(("\n" if n else "") + f"run of launcher {entry['pid']} (--address {entry['control']})")
            try:
                stub = connect(entry["control"], timeout=3, token=entry.get("token", ""))
                reply = stub.Status(control_pb2.StatusRequest(), timeout=5)
            except Exception as exc:  # noqa: BLE001 - gRPC raises several kinds
                print(f"  {unreachable(entry['control'], exc)}")
                continue
            answered += 1
            _print_status(reply)
        return 0 if answered else 1
    try:
        stub = connect(ns.address, timeout=3, token=token_for(ns.address))
        reply = stub.Status(control_pb2.StatusRequest(), timeout=5)
    except Exception as exc:  # noqa: BLE001
        print(f"neuronabox: error: {unreachable(ns.address, exc)}", file=sys.stderr)
        return 1
    _print_status(reply)
    return 0


def _print_status(reply) -> None:
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


def inject_main(argv: list[str]) -> int:
    """Change the what-if modifiers of a live run; collectives that start later see them."""
    from neuronabox.controller import control_pb2
    from neuronabox.controller.service import connect
    from neuronabox.delay_models.whatif import WhatIfError, parse

    p = ArgParser(prog="neuronabox inject")
    p.add_argument("--address", help="the controller's control address (default: the latest run)")
    p.add_argument("--clear", action="store_true", help="drop the active modifiers first")
    p.add_argument("specs", nargs="*", help="as for --inject, e.g. latency=+2ms,per=collective")
    ns = p.parse_args(argv)
    if not ns.specs and not ns.clear:
        print("neuronabox: error: inject needs a spec or --clear", file=sys.stderr)
        return 2
    try:
        for spec in ns.specs:
            parse(spec)
    except WhatIfError as exc:
        print(f"neuronabox: error: {exc}", file=sys.stderr)
        return 2
    address = _control_address(ns.address)
    if address is None:
        return 2
    try:
        stub = connect(address, timeout=3, token=token_for(address))
        reply = stub.Inject(control_pb2.InjectRequest(specs=ns.specs, clear=ns.clear), timeout=5)
    except Exception as exc:  # noqa: BLE001
        print(f"neuronabox: error: {unreachable(address, exc)}", file=sys.stderr)
        return 1
    if reply.error:
        print(f"neuronabox: error: {reply.error}", file=sys.stderr)
        return 2
    print("what-if now: " + (", ".join(reply.active) or "none"))
    return 0


def topology_main(argv: list[str]) -> int:
    from neuronabox.topology import PRESETS, TopologyError, load

    if argv in (["-h"], ["--help"]):
        print(f"usage: neuronabox topology show NAME|FILE  (presets: {', '.join(sorted(PRESETS))})")
        return 0
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
        from neuronabox.launcher.run import torchrun_main

        return torchrun_main(rest)
    if cmd == "status":
        return status_main(rest)
    if cmd == "topology":
        return topology_main(rest)
    if cmd == "inject":
        return inject_main(rest)
    if cmd == "calibrate":
        from neuronabox.fidelity.calibrate import calibrate_main

        return calibrate_main(rest)
    if cmd == "simulate":
        from neuronabox.sim.simulate import simulate_main

        return simulate_main(rest)
    if cmd == "export":
        from neuronabox.trace.export import export_main

        return export_main(rest)
    if cmd == "validate":
        from neuronabox.fidelity.validate import validate_main

        return validate_main(rest)
    if cmd == "whatif":
        from neuronabox.sim.sweep import sweep_main

        return sweep_main(rest)
    print(f"neuronabox: error: unknown command {cmd!r}\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
