"""`neuronabox status`: what every live run (or one controller) is doing; and the runs
registry the status and inject commands read."""

from __future__ import annotations

import json
import sys

import psutil

from neuronabox.args import ArgParser
from neuronabox.launcher import registry  # its RUNS_DIR read at each call (tests move it)

NAME = "status"
SUMMARY = "show what every live run (or the controller at --address) is doing"


def build_parser() -> ArgParser:
    p = ArgParser(prog="neuronabox status", description="Ask each live run's controller (or one) for its state.")
    p.add_argument("--address", help="the controller's control address (default: every live run)")
    return p


def live_runs() -> list[dict]:
    """Every run registered in registry.RUNS_DIR/<launcher pid>.json whose launcher lives; the
    files of dead ones are removed."""
    runs = []
    if registry.why_not_ours(registry.RUNS_DIR):  # a registry someone else made is not trusted
        return runs
    for f in sorted(registry.RUNS_DIR.glob("*.json")):
        if not f.stem.isdigit():
            continue
        try:
            entry = _entry(f)
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
    for entry in [*live_runs(), _entry(registry.RUNS_DIR / "latest.json")]:
        if entry and entry.get("control") == address:
            return entry.get("token", "")
    return ""


def _entry(path) -> dict:
    """A registry entry: only from this user's own registry, and bounded (an entry is a few
    hundred bytes)."""
    if registry.why_not_ours(path.parent):
        return {}
    try:
        with open(path, "rb") as f:
            return json.loads(f.read(1 << 16))
    except (OSError, ValueError):
        return {}


def _control_address(given: str | None) -> str | None:
    """The run a command without --address means: the one live run. With several live, or
    none, it says so (the latest entry may name a run that has ended while an older one
    still runs)."""
    if given is not None:
        return given
    runs = live_runs()
    if len(runs) == 1:
        return runs[0]["control"]
    if runs:
        pids = ", ".join(str(r["pid"]) for r in runs)
        print(f"neuronabox: error: {len(runs)} runs are live (launchers {pids}); pass --address "
              "(neuronabox status lists them)", file=sys.stderr)  # fmt: skip
    else:
        print("neuronabox: error: no live run found; pass --address", file=sys.stderr)
    return None


def main(argv: list[str]) -> int:
    from neuronabox.controller import control_pb2
    from neuronabox.controller.service import connect

    ns = build_parser().parse_args(argv)
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
