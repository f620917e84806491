"""The fidelity table (docs/fidelity.md): `neuronabox validate` over the validation workloads.

    python scripts/fidelity.py [--only loopback|netns] [--nnodes W] [--rate R] [--repeat K] [--steps N] [--out DIR]
                               [--noise-floor] [--skew auto|none|FILE] [--realtime] [--huge-pages [MODE]]
                               [--resolve PCT [--max-repeat M]]
                               [--cpu-share CORES]

For each testbed (loopback W=2; netns W=4 and W=8 with one real rank, at two link
rates) it calibrates once, then validates every workload against that topology,
interleaved K times, and prints one markdown row per case: the all-real and emulated
medians with their spread, the error of the medians with the per-repetition range,
validate's resolution (the error that sets of K all-real runs drawn from these show
between themselves: a smaller error is not resolved), and the controller's CPU per
boundary message next to the model's time per message
(where the controller is slower than the network it emulates, the error is the
controller's: the native data plane's issue). The CSVs stay in DIR. `--noise-floor`
puts a second all-real run in the emulated run's place: the same table of the testbed
against itself, the error below which a row resolves nothing. `--resolve PCT` has
validate go on past K repetitions, in pairs, until its all-real runs resolve PCT (or
`--max-repeat`); the table then gives how many it took and also the error of the first K
alone, the figure a fixed K of repetitions would have read. `--cpu-share` sets each netns node's
CPU quota (validate's default leaves a fifth of the machine to the kernel's network work).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
from pathlib import Path

from neuronabox.controller.skew import DEFAULT as DEFAULT_SKEW

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = {
    "mlp": ["examples/mlp.py"],
    "cnn": ["examples/cnn.py"],
    "gpt": ["examples/gpt.py"],
    "gpt-fsdp": ["examples/gpt.py", "--fsdp"],
    "lightning": ["examples/lightning_job.py"],
    "hf-trainer": ["examples/hf_trainer_job.py"],
}
FRAMEWORKS = {"lightning", "hf-trainer"}  # unmodified framework jobs: --steps only, no warm-up of their own
# (testbed, rate, nnodes); loopback pins a core per rank, so W=2 is all two cores allow.
CASES = [
    ("loopback", None, 2),
    ("netns", "1gbit", 4),
    ("netns", "200mbit", 4),
    ("netns", "1gbit", 8),
    ("netns", "200mbit", 8),
]


def nbx(*argv: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "neuronabox.cli", *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(argv[:6])} ... failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    return proc


def row(path: Path, testbed: str, rate: str | None, nnodes: int, workload: str, second: str, first: int = 0) -> str:
    """The table's row from validate's CSV; `first`: also the error of the first this many
    repetitions (under --resolve)."""
    rows = list(csv.DictReader(path.open()))
    real = [float(r["median_ms"]) for r in rows if r["mode"] == "all-real"]
    emu = [float(r["median_ms"]) for r in rows if r["mode"] == second]
    head = f" {statistics.median(emu[:first]) / statistics.median(real[:first]) * 100 - 100:+.1f}% |" if first else ""
    errs = [e / r - 1 for r, e in zip(real, emu, strict=True)]
    err = statistics.median(emu) / statistics.median(real) - 1
    cpu = [float(r["controller_cpu_per_msg_us"]) for r in rows if r["controller_cpu_per_msg_us"]]
    interval = [float(r["model_interval_us"]) for r in rows if r["model_interval_us"]]
    pace = f"{statistics.median(cpu):.0f} / {statistics.median(interval):.0f} us" if cpu else "-"
    resolution = next((f"{float(r['error_pct']):.1f}%" for r in rows if r["mode"] == "resolution"), "-")

    def ms(xs: list[float]) -> str:
        return f"{statistics.median(xs):.1f} ({min(xs):.1f}-{max(xs):.1f})"

    return (
        f"| {testbed} | {rate or '-'} | {nnodes} | {workload} | {ms(real)} | {ms(emu)} | "
        f"{err * 100:+.1f}% ({min(errs) * 100:+.1f} .. {max(errs) * 100:+.1f}) | {resolution} | {len(real)} |{head} "
        f"{pace} |"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=("loopback", "netns"))
    p.add_argument("--nnodes", type=int, help="only the testbeds of this world size")
    p.add_argument("--rate", help="only the netns testbeds of this link rate (e.g. 1gbit)")
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--steps", type=int, default=40)  # 10 left the noise floor at up to 9% (docs/fidelity.md)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--out", default="fidelity-runs")
    p.add_argument("--skew", default=DEFAULT_SKEW, help="the emulated runs' --skew (auto, the default; none; a file)")
    p.add_argument("--noise-floor", action="store_true", help="all-real against all-real (validate --noise-floor)")
    p.add_argument("--realtime", action="store_true", help="every real rank in the real-time class (validate's)")
    p.add_argument("--huge-pages", nargs="?", const="transparent", choices=("transparent", "reserved"),
                   help="malloc on 2 MiB pages, transparent or from the reserved pool (validate's)")  # fmt: skip
    p.add_argument("--resolve", metavar="PCT", help="go on past --repeat until the resolution reaches PCT (validate's)")
    p.add_argument("--max-repeat", type=int, help="--resolve's cap on the repetitions (validate's)")
    p.add_argument("--cpu-share", help="netns: cores per node (validate's; its default 0.8 x the cores / nodes)")
    ns = p.parse_args()
    resolving = (
        (["--resolve", ns.resolve] + (["--max-repeat", str(ns.max_repeat)] if ns.max_repeat else []))
        if ns.resolve
        else []
    )
    second, floor = ("all-real-again", ["--noise-floor"]) if ns.noise_floor else ("emulated", [])
    out = Path(ns.out).resolve()
    out.mkdir(exist_ok=True)
    first = f" error of the first {ns.repeat} |" if ns.resolve else ""
    print(f"| testbed | rate | W | workload | all-real ms (min-max) | {second} ms (min-max) | error (per rep) "
          f"| resolution | repetitions |{first} controller CPU / model time per message |")  # fmt: skip
    print("|---|---|---:|---|---:|---:|---:|---:|---:|" + "---:|" * bool(ns.resolve))
    for testbed, rate, nnodes in CASES:
        if (ns.only and testbed != ns.only) or (ns.nnodes and nnodes != ns.nnodes) or (ns.rate and rate != ns.rate):
            continue
        shaping = ["--testbed", testbed] + (["--rate", rate] if rate else [])
        topo = out / f"calibrated-{testbed}{'-' + rate if rate else ''}.yaml"
        if not topo.exists() and not ns.noise_floor:
            nbx("calibrate", *shaping, "--out", str(topo))
        for name in ns.workloads.split(","):
            tail = ("noise-floor" if ns.noise_floor else f"skew-{Path(ns.skew).name}") + ("-rt" if ns.realtime else "")
            tail += {"transparent": "-huge", "reserved": "-reserved", None: ""}[ns.huge_pages]
            tail += f"-cpu{ns.cpu_share}" if ns.cpu_share and testbed == "netns" else ""
            csv_path = out / f"{testbed}-{rate or 'lo'}-w{nnodes}-{name}-{tail}.csv"
            if name in FRAMEWORKS:
                runs = ["--steps", str(ns.steps + ns.warmup)]
            else:
                runs = ["--steps", str(ns.steps), "--warmup", str(ns.warmup)]
            # every workload timed alike: between rank 0's optimizer steps, after the warm-up's
            topology = [] if ns.noise_floor else ["--topology", str(topo)]
            skew = [] if ns.noise_floor else ["--skew", ns.skew]
            nbx("validate", "--nnodes", str(nnodes), *shaping, *topology, "--repeat", str(ns.repeat),
                "--warmup-steps", str(ns.warmup), *skew, *floor, *(["--realtime"] if ns.realtime else []),
                *([f"--huge-pages={ns.huge_pages}"] if ns.huge_pages else []), *resolving,
                *(["--cpu-share", ns.cpu_share] if ns.cpu_share and testbed == "netns" else []),
                "--csv", str(csv_path), "--",
                *WORKLOADS[name], *runs)  # fmt: skip
            print(row(csv_path, testbed, rate, nnodes, name, second, ns.repeat if ns.resolve else 0), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
