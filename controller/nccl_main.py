"""The controller process for an NCCL communicator: `python -m neuronabox.controller.nccl_main`.

It plays every emulated rank of one communicator (`dialects/nccl/live.py`), prices each
collective with the run's delay model and what-if, and writes the run's trace. Its
caller (the rig's job runner, `neuronabox perf --backend nccl`) talks to it on
stdin/stdout, one line each way:

- it prints `ready` once its ports and the profiler's FIFO are open, with `uid=HEX`
  when it is the root (rank 0 emulated): the unique id for the real ranks;
- when rank 0 is real, it then reads `uid HEX` (the id real rank 0 made).

It serves until SIGTERM or SIGINT (then closes the trace, exit 0); an error is one line on
stderr and exit 3.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from neuronabox.delay_models.whatif import WhatIf

from neuronabox import delay_models, topology
from neuronabox.errors import NeuronaBoxError
from neuronabox.schedules.nccl import NcclConfig
from neuronabox.trace.records import TraceWriter

from .dialects.gloo.driver import raise_fd_limit
from .dialects.nccl.errors import NcclError
from .dialects.nccl.live import NcclLive
from .dialects.nccl.relay import Instance, NcclRelay
from .dialects.nccl.sockets import open_profile_fifo
from .dialects.nccl.versions import layout_for
from .dialects.nccl.wire import UniqueId
from .nccl_comm import record_of
from .release import ReleaseTiming

EXIT_ERROR = 3


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="neuronabox.controller.nccl_main", description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--real", required=True, help="the real ranks, comma-separated")
    p.add_argument("--nccl", default="2.28.9", help="the real ranks' NCCL release")
    p.add_argument("--channels", type=int, default=1)
    p.add_argument("--buffsize", type=int, default=4 << 20)
    p.add_argument("--redop", default="sum", help="the reduction the real ranks use (NCCL's profiler does not say)")
    p.add_argument("--profile", required=True, help="the FIFO to make for the profiler plugin's lines")
    p.add_argument("--trace", default="")
    p.add_argument("--delay-model", default="zero")
    p.add_argument("--topology", default="cpu-25gbe")
    p.add_argument("--nproc-per-node", type=int, default=1)
    p.add_argument("--inject", action="append", default=[])
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--silence", type=float, default=10.0,
                   help="seconds a real rank's bytes may wait for their collective's profiler line")
    return p.parse_args(argv)


def read_uid(line: str) -> UniqueId:
    """Real rank 0's unique id, as the runner writes it: `uid HEX`."""
    words = line.split()
    try:
        if len(words) != 2 or words[0] != "uid":
            raise ValueError("not 'uid HEX'")
        return UniqueId.decode(bytes.fromhex(words[1]))
    except (ValueError, NcclError) as exc:
        raise NeuronaBoxError(f"expected 'uid HEX' (128 bytes) on stdin, got {line.strip()[:80]!r}: {exc}") from None


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        profile = os.environ.get("NEURONABOX_PROFILE")
        if profile:  # developer aid, as the Gloo controller's: cProfile the controller into this file
            import cProfile

            prof = cProfile.Profile()
            try:
                return prof.runcall(serve, args)
            finally:
                prof.dump_stats(profile)
        return serve(args)
    except NeuronaBoxError as exc:
        print(f"neuronabox controller: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_ERROR


def serve(args: argparse.Namespace) -> int:
    raise_fd_limit()
    real = sorted({int(r) for r in args.real.split(",") if r})
    layout = layout_for(args.nccl)
    nnodes = args.world // args.nproc_per_node
    topo = topology.load(args.topology).with_nodes(nnodes, args.nproc_per_node)
    timing = ReleaseTiming(delay_models.load(args.delay_model, topo), WhatIf.from_specs(args.inject),
                           limit_s=args.timeout)  # fmt: skip
    config = NcclConfig(buffsize=args.buffsize, channels=args.channels,
                        min_traffic_per_channel=layout.min_traffic_per_channel)  # fmt: skip
    relay = NcclRelay(args.world, real, config, timing, redop=args.redop)
    rfd, wfd = open_profile_fifo(args.profile)
    anchor_mono, anchor_epoch = time.monotonic(), time.time()
    trace = None
    if args.trace:
        header = {"world_size": args.world, "nnodes": nnodes, "nproc_per_node": args.nproc_per_node,
                  "real_ranks": real, "delay_model": args.delay_model, "topology": topo.name,
                  "topology_spec": topology.as_spec(topo), "boundary": "modeled", "inject": timing.whatif.specs(),
                  "data": "zeros", "observer": False, "backend": "nccl", "nccl": str(layout.version),
                  "started_us": round(anchor_epoch * 1e6, 3)}  # fmt: skip
        trace = TraceWriter(args.trace, header, anchor_epoch - anchor_mono)

    def on_instance(inst: Instance, order: int) -> None:
        if trace is not None:
            trace.instance(record_of(inst, order, args.world))

    live = None
    state, error = "finished", ""
    try:
        live = NcclLive(layout, args.world, real, relay, rfd, host=args.host, on_instance=on_instance,
                        silence_s=args.silence)
        if 0 in real:
            print("ready", flush=True)
            live.join(read_uid(sys.stdin.readline(1024)))
        else:
            print(f"ready uid={live.unique_id.hex()}", flush=True)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: live.stop())
        live.run()
    except NeuronaBoxError as exc:
        state, error = "failed", str(exc)
        raise
    finally:
        if live is not None:
            if os.environ.get("NEURONABOX_NCCL_DEBUG") == "1":
                print(f"nbx-nccl: at the end: {relay.describe()}", file=sys.stderr, flush=True)
            live.close()
        if trace is not None:
            trace.close({"state": state, "error": error, "stopped_because": "", "inject": timing.whatif.specs(),
                         "release": timing.lateness_summary(),
                         "collectives": live.collectives if live else 0})  # fmt: skip
        for fd in (rfd, wfd):
            os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
