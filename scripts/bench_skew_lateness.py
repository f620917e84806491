"""How late a second real rank enters each collective, against what `--skew auto` draws.

    python scripts/bench_skew_lateness.py [--workloads mlp,lightning] [--repeat 3] [--steps 60] [--realtime]
                                          [--keep DIR]

`--skew auto` stands in for the ranks an emulated run does not have: each emulated rank
enters each collective late by a draw of the real rank's own variation. This checks the
draws at the mechanism, against all-real runs, where an iteration-time comparison
(`validate`) cannot resolve them on a noisy machine. Per workload and repetition, W = 2:

- all-real, under the stock `torch.distributed.run`, each rank on a core of its own: both
  ranks' entry times of every collective, from PyTorch's flight recorder (a sitecustomize
  in a temporary folder dumps it as each rank ends). A rank's lateness at a collective is
  its entry less the other's: what the other waited for it;
- emulated, `neuronabox torchrun --nnodes 2 --skew none --trace`: the real rank's
  collectives as recorded, replayed through `controller/skew.py` as a live run feeds it
  (entries, ends, optimizer steps: `Skew.replayed`), and at each entry the emulated rank's
  drawn lateness (`latest_entry`). The recording made no waits for draws, so none is taken
  out of its spans.

It prints a markdown table per collective kind over the later three quarters of each run:
the mean lateness of rank 1 after rank 0 (and of rank 0 after rank 1) all-real, the mean
drawn lateness of the emulated rank, and the ratio of the drawn to the mean of the two
real ones (which rank stays real is the user's choice). A lateness is one part of what a peer costs;
its stalls inside a collective (the draws' stall term) are the other, which entry times
cannot show. `--realtime` runs every real rank of both in the real-time class (SCHED_RR 1), as
`validate --realtime` and `scripts/fidelity.py --realtime` do: the draws are then checked
under the conditions the fidelity table is measured in. `--keep DIR` keeps each repetition's
recordings (the all-real ranks' entries, the emulated run's trace) in DIR, to replay again.
"""

from __future__ import annotations

import argparse
import collections
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = {
    "mlp": ["examples/mlp.py", "--warmup", "5"],
    "cnn": ["examples/cnn.py", "--warmup", "5"],
    "gpt": ["examples/gpt.py", "--warmup", "5"],
    "gpt-fsdp": ["examples/gpt.py", "--fsdp", "--warmup", "5"],
    "lightning": ["examples/lightning_job.py"],
    "hf-trainer": ["examples/hf_trainer_job.py"],
}
# Loaded by each all-real rank: pin it to its local rank's core, dump the flight recorder
# (every collective's entry time) when it ends, also through os._exit (the framework
# examples leave that way).
RECORDER = """\
import os
if os.environ.get("RANK") is not None:
    os.sched_setaffinity(0, {int(os.environ.get("LOCAL_RANK", "0")) % os.cpu_count()})
    _dumped = []
    def _dump():
        if _dumped:
            return
        _dumped.append(1)
        import pickle, torch._C._distributed_c10d as C
        entries = pickle.loads(C._dump_fr_trace(True, False, False)).get("entries", [])
        with open(os.path.join(os.environ["NBX_LATENESS_OUT"], "rank%s.pkl" % os.environ["RANK"]), "wb") as f:
            pickle.dump([(e["profiling_name"], e["time_created_ns"])
                         for e in entries if e.get("collective_seq_id", 0) > 0], f)
    import atexit
    atexit.register(_dump)
    _exit = os._exit
    def _exit_dumped(code):
        _dump()
        _exit(code)
    os._exit = _exit_dumped
"""
KINDS = {"all_reduce": "allreduce", "all_gather": "allgather", "_allgather_base": "allgather",
         "_reduce_scatter_base": "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter",
         "allgather_into_tensor_coalesced": "allgather"}  # fmt: skip


def run(argv: list[str], env: dict[str, str] | None = None) -> None:
    """`argv` in the project's root with `env` added; exit naming it and its last error line if it fails."""
    proc = subprocess.run(argv, cwd=ROOT, env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    if proc.returncode != 0:
        sys.exit(f"{' '.join(argv[:6])} failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")


def real_lateness(folder: Path) -> dict[str, list[float]]:
    """Kind -> rank 1's entry less rank 0's (ms), per collective of the later three quarters."""
    ranks = [pickle.loads((folder / f"rank{r}.pkl").read_bytes()) for r in (0, 1)]
    n = min(map(len, ranks))
    late: dict[str, list[float]] = collections.defaultdict(list)
    for k in range(n // 4, n):
        (name, t0), (_, t1) = ranks[0][k], ranks[1][k]
        kind = name.split(":")[-1]
        late[KINDS.get(kind, kind)].append((t1 - t0) / 1e6)
    return late


def drawn_lateness(trace: Path) -> dict[str, list[float]]:
    """Kind -> the emulated rank's drawn lateness (ms) at each collective of the later three
    quarters: the recorded real rank's collectives and steps replayed through `Skew` as a
    live run feeds it (`Skew.replayed`, as `simulate --skew auto` does), each entry's draw
    for the one emulated rank of W = 2."""
    from neuronabox.controller.skew import Skew, latest_entry

    from neuronabox.sim.simulate import program_of, skew_entries
    from neuronabox.trace.records import load

    prog = program_of(load(trace))
    entries = skew_entries(prog)
    late: dict[str, list[float]] = collections.defaultdict(list)
    for i, entry in Skew("auto", seed=1).replayed(entries, prog.steps, prog.held):
        if i >= len(entries) // 4:
            late[str(prog.ops[i].kind)].append(latest_entry(entry, 2, frozenset({0})) * 1e3)
    return late


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--realtime", action="store_true", help="every real rank of both runs in the real-time class")
    p.add_argument("--keep", type=Path, help="keep each repetition's recordings in this folder")
    ns = p.parse_args()
    logs = tempfile.TemporaryDirectory(prefix="torchelastic-")  # the stock torchruns' logs, removed at exit
    os.environ["PET_LOG_DIR"] = logs.name
    print("| workload | kind | collectives | all-real: rank 1 late (ms) | rank 0 late (ms) | drawn late (ms) "
          "| drawn / all-real, either rank |")  # fmt: skip
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as tmp:
        if ns.keep is not None:
            ns.keep.mkdir(parents=True, exist_ok=True)
        Path(tmp, "sitecustomize.py").write_text(RECORDER)
        for name in ns.workloads.split(","):
            real: dict[str, list[float]] = collections.defaultdict(list)
            drawn: dict[str, list[float]] = collections.defaultdict(list)
            for rep in range(ns.repeat):
                folder = Path(ns.keep or tmp, f"{name}-{rep}")
                folder.mkdir(exist_ok=ns.keep is not None)
                argv = [*WORKLOADS[name], "--steps", str(ns.steps)]
                run([*(["chrt", "-r", "1"] if ns.realtime else []), sys.executable, "-m", "torch.distributed.run",
                     "--nproc-per-node", "2", *argv],
                    {"PYTHONPATH": tmp, "NBX_LATENESS_OUT": str(folder), "TORCH_FR_BUFFER_SIZE": "20000"})  # fmt: skip
                run([sys.executable, "-m", "neuronabox.cli", "torchrun", "--nnodes", "2", "--skew", "none", "--trace",
                     str(folder / "trace.jsonl"), *(["--realtime"] if ns.realtime else []), *argv])  # fmt: skip
                for kind, xs in real_lateness(folder).items():
                    real[kind] += xs
                for kind, xs in drawn_lateness(folder / "trace.jsonl").items():
                    drawn[kind] += xs
            for kind in sorted(real):
                late1 = statistics.mean(max(0.0, x) for x in real[kind])
                late0 = statistics.mean(max(0.0, -x) for x in real[kind])
                got = statistics.mean(drawn[kind]) if drawn.get(kind) else float("nan")
                either = (late1 + late0) / 2  # which rank stays real is the user's choice: either's lateness
                ratio = got / either if either > 0 else float("nan")
                print(f"| {name} | {kind} | {len(real[kind])} | {late1:.3f} | {late0:.3f} | {got:.3f} | {ratio:.2f} |",
                      flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
