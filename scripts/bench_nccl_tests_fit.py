"""The A100 cluster's nccl-tests logs: fit on the small worlds, predict a larger one.

    python scripts/bench_nccl_tests_fit.py [--fit 1,2,4,8,16] [--predict 32] [--model nccl-ring]

`neuronabox calibrate --from-nccl-tests` fits a topology to the logs of the `--fit`
worlds (tests/fixtures/nccl-tests-a100: all_reduce_perf on Azure ND A100 v4, 8 GPUs a
server); `neuronabox perf all_reduce --simulate` runs the predicted world on it (its
nodes of 8 ranks), and the table compares its busbw with the measured one, per size
from 1 KiB, with the median error from 1 MiB (NCCL's Simple protocol, which the fit
prices from there) and below it (the fit's low-latency protocols). Prints markdown.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
A100 = ROOT / "tests" / "fixtures" / "nccl-tests-a100"
sys.path.insert(0, str(ROOT))

from neuronabox.fidelity import nccl_tests_fit as ntf  # noqa: E402
from neuronabox.trace.busbw import bandwidths  # noqa: E402


def cli(*argv: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "neuronabox.cli", *argv], capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        sys.exit(f"{argv[0]} failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    return proc


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fit", default="1,2,4,8,16")
    p.add_argument("--predict", type=int, default=32)
    p.add_argument("--model", default="nccl-ring")
    ns = p.parse_args()
    held = ntf.read(str(A100 / f"nccl_{ns.predict}.log"), "all_reduce")
    sizes = [r.size for r in held.rows if r.size >= 1 << 10]
    with tempfile.TemporaryDirectory() as tmp:
        topo, rows = Path(tmp) / "fitted.yaml", Path(tmp) / "rows.json"
        logs = [str(A100 / f"nccl_{w}.log") for w in ns.fit.split(",")]
        fit_out = cli("calibrate", "--from-nccl-tests", *logs, "--coll", "all_reduce", "--model", ns.model,
                      "--out", str(topo)).stdout  # fmt: skip
        cli("perf", "all_reduce", "--simulate", "--nnodes", str(held.nodes), "--nproc-per-node",
            str(held.ranks_per_node), "--delay-model", ns.model, "--topology", str(topo), "-b", str(sizes[0]),
            "-e", str(sizes[-1]), "-f", "2", "-n", "1", "-w", "0", "-J", str(rows))  # fmt: skip
        doc = json.loads(rows.read_text())
        simulated = {r["size"]: bandwidths("allreduce", r["size"], r["time_us"] * 1e-6, doc["world"])[1]
                     for r in doc["rows"]}  # fmt: skip
    print("\n".join(line for line in fit_out.splitlines() if "alpha" in line))
    print(f"\nall_reduce at {held.world} GPUs ({held.nodes} servers), fitted on {ns.fit} GPUs, {ns.model}:\n")
    print("| size | measured busbw (GB/s) | perf --simulate busbw (GB/s) | error |")
    print("| ---: | ---: | ---: | ---: |")
    errs: dict[bool, list[float]] = {True: [], False: []}
    for r in held.rows:
        if r.size in simulated:
            err = simulated[r.size] / r.busbw - 1
            errs[r.size >= 1 << 20].append(abs(err))
            print(f"| {r.size} | {r.busbw:.2f} | {simulated[r.size]:.2f} | {err * 100:+.1f}% |")
    for large, label in ((True, "from 1 MiB"), (False, "below 1 MiB")):
        if errs[large]:
            median = statistics.median(errs[large]) * 100
            print(f"\nmedian |error| {label}: {median:.1f}% over {len(errs[large])} sizes")


if __name__ == "__main__":
    main()
