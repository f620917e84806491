"""Allreduce under emulation vs an all-real 2-rank run, zero-delay model.

Prints a table: the allreduce's median time on the real rank at several
emulated world sizes, the same allreduce in an all-real 2-rank run, and the
controller's CPU time per boundary message (its loop thread, over the timed
repetitions only). Usage: python scripts/bench_allreduce.py [--reps N]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from neuronabox.launcher.ports import free_port
from neuronabox.trace.records import load as load_trace

HERE = Path(__file__).resolve().parent
WORKER = str(HERE / "collective_loop.py")
SIZES = [("4 KiB", 4 << 10), ("1 MiB", 1 << 20), ("25 MiB", 25 << 20)]
WORLDS = [2, 64, 512]


def write_pinned_placement(path: Path) -> None:
    """The paper's setup on loopback: the real node on core 0, the controller on core 1."""
    from neuronabox.fidelity.testbed import Host, Placement

    placement = Placement({0: Host("node0", "127.0.0.1", cpus=[0])}, Host("ctl", "127.0.0.2", cpus=[1]))
    path.write_text(placement.dumps())


def result(out: str) -> dict:
    for line in out.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"no result in output:\n{out[-2000:]}")


def all_real(nbytes: int, reps: int) -> float:
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        "--nproc-per-node=2",
        f"--master-port={free_port()}",
        WORKER,
        "--bytes",
        str(nbytes),
        "--reps",
        str(reps),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, check=True).stdout
    return result(out)["allreduce"]["median_s"]


def emulated(
    nnodes: int, nbytes: int, reps: int, warmup: int = 3, flags: tuple = (), cpus: set[int] | None = None
) -> tuple[float, float, int]:
    """(median time on the real rank, controller CPU per boundary message, messages per op);
    `cpus` pins the launcher and what it starts unless a placement says otherwise."""
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    with tempfile.TemporaryDirectory() as d:
        trace = Path(d) / "trace.json"
        cmd = [
            sys.executable,
            "-m",
            "neuronabox.cli",
            "torchrun",
            "--nnodes",
            str(nnodes),
            "--delay-model",
            "zero",
            "--trace",
            str(trace),
            *flags,
            WORKER,
            "--bytes",
            str(nbytes),
            "--reps",
            str(reps),
            "--warmup",
            str(warmup),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, preexec_fn=pin)
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-3000:])
        med = result(proc.stdout)["allreduce"]["median_s"]
        inst = [i for i in load_trace(trace)["instances"] if i["kind"] == "allreduce"]
        timed = inst[-reps:]
        before = inst[-reps - 1]
        # barriers between the allreduces complete inside the window too: count their messages
        allinst = load_trace(trace)["instances"]
        window = [i for i in allinst if before["loop_cpu_s"] < i["loop_cpu_s"] <= timed[-1]["loop_cpu_s"]]
        msgs = sum(i["boundary_messages"] for i in window)
        cpu = timed[-1]["loop_cpu_s"] - before["loop_cpu_s"]
        return med, cpu / msgs, timed[0]["boundary_messages"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    logs = tempfile.TemporaryDirectory(prefix="torchelastic-")  # the stock torchruns' logs, removed at exit
    os.environ["PET_LOG_DIR"] = logs.name
    rows = []
    for label, nbytes in SIZES:
        ref = all_real(nbytes, args.reps)
        for w in WORLDS:
            med, per_msg, msgs = emulated(w, nbytes, args.reps)
            rows.append((label, w, med, ref, msgs, per_msg))
            print(f"  done {label} nnodes={w}", file=sys.stderr, flush=True)
    cols = [
        "allreduce",
        "--nnodes",
        "time on real rank (median)",
        "all-real 2 ranks",
        "boundary msgs / op",
        "controller CPU / msg",
    ]
    print("| " + " | ".join(cols) + " |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, w, med, ref, msgs, per_msg in rows:
        print(f"| {label} | {w} | {med * 1e3:.3f} ms | {ref * 1e3:.3f} ms | {msgs} | {per_msg * 1e6:.1f} us |")


if __name__ == "__main__":
    main()
