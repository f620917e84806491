"""What-if resolution: does an injected latency move the real rank's time by that much?

    python scripts/bench_whatif_resolution.py [--runs 5] [--nnodes 16] [--bytes 1048576] [--reps 12]
        [--warmup N] [--local-work measured,topology] [--within-run [--windows 8]] [--realtime]

Per amount (+2 ms and +0.5 ms, `latency=+X,per=collective,op=allreduce`), per
`--local-work` setting and per run: one run without the what-if and one with it,
interleaved (order flipped every run), each timing `--reps` allreduces of `--bytes` on
real rank 0 of `--nnodes` nodes after `--warmup` more (scripts/collective_loop.py; the
measured local work is first charged after 8 ring collectives). The run's figure is the
median allreduce time; the shift is the with-run's median less the without-run's. Prints
a markdown table: each run's shift, and whether it is within 10% of the amount.

--within-run compares inside each run instead: one live run per amount and setting
loops the allreduce, and the script turns the what-if on and off through the run's
control service (`Inject`, as `neuronabox inject` does) `--windows` times each, `--reps`
repetitions a window after 5 more that let the change land. The run's shift is the
median of the with-windows' medians less that of the without-windows'. Two runs differ
in what they measured of the real rank's own work (the charge emulated ranks pay under
`--local-work measured`) and in which phase of this VM's scheduler-tick stalls they met;
windows of one run share both, so the shift is the what-if's alone. The windows go
off, on, on, off, ... after 60 repetitions (`--warmup`): the measured local work's fit
rises over a run's first hundred or so collectives (at 16 nodes the allreduce went from
about 2 to 4.5 ms), and alternating windows (off, on, off, on) read that drift as part of
the shift (+0.5 ms read +0.56 to +0.61 in three runs of five).

--realtime runs the real rank in the real-time class (`neuronabox torchrun --realtime`):
on this VM the normal class leaves its wake-ups for the next 4 ms tick now and then,
which moves a median by more than a +0.5 ms what-if (docs/fidelity.md, "Tick stalls").
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOOP = str(ROOT / "scripts" / "collective_loop.py")


def median_ms(
    nnodes: int, nbytes: int, reps: int, warmup: int, local_work: str, inject: str | None, flags: list[str]
) -> float:
    cmd = [sys.executable, "-m", "neuronabox.cli", "torchrun", "--nnodes", str(nnodes), "--local-work", local_work]
    cmd += flags
    cmd += ["--inject", inject] if inject else []
    cmd += [LOOP, "--kinds", "allreduce", "--bytes", str(nbytes), "--reps", str(reps), "--warmup", str(warmup)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        sys.exit(f"run failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(line[7:])["allreduce"]["median_s"] * 1e3


def live_shift(
    nnodes: int, nbytes: int, reps: int, warmup: int, local_work: str, spec: str, windows: int, flags: list[str]
) -> tuple:
    """One live run, the what-if toggled: (without windows' median, with windows' median) in ms."""
    from neuronabox.controller import control_pb2
    from neuronabox.controller.service import connect

    from neuronabox.cli.status import token_for
    from neuronabox.launcher.registry import RUNS_DIR

    cmd = [sys.executable, "-m", "neuronabox.cli", "torchrun", "--nnodes", str(nnodes), "--local-work", local_work]
    cmd += [*flags, LOOP, "--kinds", "allreduce", "--bytes", str(nbytes), "--reps", "1000000", "--warmup", "0"]
    cmd += ["--announce"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
    try:
        reps_out = (float(ln.split()[2]) * 1e3 for ln in proc.stdout if ln.startswith("REP "))
        take = lambda n: [next(reps_out) for _ in range(n)]  # noqa: E731
        take(warmup)  # the run's start, and the measured local work's fit settling (it rises over ~50 repetitions)
        entry = RUNS_DIR / f"{proc.pid}.json"
        address = json.loads(entry.read_text())["control"]
        stub = connect(address, timeout=3, token=token_for(address))
        got: dict[bool, list[float]] = {False: [], True: []}
        was = False
        for w in range(2 * windows):
            on = w % 4 in (1, 2)  # off, on, on, off: a drift within the run (the local work's fit) cancels
            if on != was:  # a second Inject of the spec would add a second latency
                stub.Inject(control_pb2.InjectRequest(specs=[spec] if on else [], clear=not on), timeout=5)
                was = on
            take(5)  # the repetition in flight, and the inject's own load
            got[on].append(statistics.median(take(reps)))
        return statistics.median(got[False]), statistics.median(got[True])
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--nnodes", type=int, default=16)
    p.add_argument("--bytes", type=int, default=1 << 20)
    p.add_argument("--reps", type=int, default=12)
    p.add_argument("--warmup", type=int, help="repetitions before timing (10; --within-run: 60, the local work's fit)")
    p.add_argument("--local-work", default="measured,topology")
    p.add_argument("--within-run", action="store_true", help="toggle the what-if inside each run")
    p.add_argument("--windows", type=int, default=8, help="--within-run: windows with it, and as many without")
    p.add_argument("--realtime", action="store_true", help="the real rank in the real-time class")
    ns = p.parse_args()
    flags = ["--realtime"] if ns.realtime else []
    warmup = ns.warmup if ns.warmup is not None else 60 if ns.within_run else 10
    print("| injected | --local-work | run | without (ms) | with (ms) | shift (ms) | within 10% |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | :---: |")
    for amount in (2.0, 0.5):
        spec = f"latency=+{amount:g}ms,per=collective,op=allreduce"
        for run in range(ns.runs):
            for work in ns.local_work.split(","):  # the settings interleaved too
                if ns.within_run:
                    without, with_ = live_shift(ns.nnodes, ns.bytes, ns.reps, warmup, work, spec, ns.windows, flags)
                    got = {None: without, spec: with_}
                else:
                    order = (None, spec) if run % 2 == 0 else (spec, None)
                    got = {s: median_ms(ns.nnodes, ns.bytes, ns.reps, warmup, work, s, flags) for s in order}
                shift = got[spec] - got[None]
                ok = abs(shift - amount) <= 0.1 * amount
                cells = f"{got[None]:.3f} | {got[spec]:.3f} | {shift:+.3f} | {'yes' if ok else 'no'}"
                print(f"| +{amount:g} ms | {work} | {run} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
