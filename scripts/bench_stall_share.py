"""What a peer's stalls inside a collective cost all-real, against the stall term `--skew auto` draws.

    python scripts/bench_stall_share.py [--repeat 2] [--steps 300] [--realtime] [--recorder-off]

`--skew auto` draws each emulated rank's lateness at a place as the real rank's gap excess
(how much longer than its least recent gap it computed since its last collective ended)
plus a stall term (how much longer than the place's usual span its last span there took).
`scripts/bench_skew_lateness.py` finds the draws 1x to 3x a second real rank's entry
lateness, but entry times cannot show a stall inside a collective, which holds the peer
up as surely. This measures both parts all-real, on a loop whose collectives are all
synchronous, so that a rank's return from each is its end: per step, a forward and
backward pass, a 4-byte, a 64 KiB and a 4-byte allreduce, an optimizer step. W = 2:

- all-real, under the stock `torch.distributed.run`, each rank on a core of its own: each
  rank's entry into and return from every collective (one monotonic clock: one host),
  gathered at the end. A rank's gap is its entry less its return from the collective
  before; the correlation of the two ranks' gaps says how much of their variation they
  share. The part of a collective both ranks spend after the later one entered (from the
  later entry to the earlier return), in excess of its median at the place, is the stalls
  of either rank that held both; one rank's share of it is half;
- emulated, `neuronabox torchrun --nnodes 2 --skew none --trace`: the real rank's
  collectives replayed through `controller/skew.py` as a live run feeds it
  (`Skew.replayed`): its gap excess as timed and less the time its observer's own work
  held its core (flight-recorder dumps, which `--skew auto` leaves out), its stall samples
  at each place, and the lateness drawn for the one emulated rank.

It prints a markdown table per place, the means over the later three quarters of each run.
`--realtime`: every real rank of both runs in the real-time class (SCHED_RR 1, as validate
--realtime; the all-real torchrun under `chrt`), where this VM's tick stalls leave the
wake-ups (docs/fidelity.md, "Tick stalls"). `--recorder-off`: the emulated run without
PyTorch's flight recorder (TORCH_FR_BUFFER_SIZE=0), so its observer never dumps it: the
gap as the controller times it, without the observer's holds on the rank.
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import pickle
import statistics
import sys
import tempfile
from pathlib import Path

from bench_skew_lateness import run

PLACES = ("4 B after compute", "64 KiB", "4 B")
WORKER = """\
import os, pickle, sys, time, torch, torch.distributed as dist
if os.environ.get("NBX_PIN"):
    os.sched_setaffinity(0, {int(os.environ["LOCAL_RANK"]) % os.cpu_count()})
torch.set_num_threads(1)
dist.init_process_group("gloo")
net = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
opt = torch.optim.SGD(net.parameters(), lr=1e-6)
x, tensors = torch.randn(32, 256), (torch.ones(1), torch.ones(16384), torch.ones(1))
times = []
for _ in range(int(sys.argv[1])):
    net(x).sum().backward()
    for t in tensors:
        a = time.monotonic()
        dist.all_reduce(t)
        times.append((a, time.monotonic()))
    opt.step()
    opt.zero_grad()
if os.environ.get("NBX_TIMES"):  # all-real: both ranks' times to rank 0
    mine = torch.tensor(times, dtype=torch.float64)
    both = [torch.zeros_like(mine) for _ in range(2)]
    dist.all_gather(both, mine)
    if dist.get_rank() == 0:
        with open(os.environ["NBX_TIMES"], "wb") as f:
            pickle.dump([b.tolist() for b in both], f)
os._exit(0)
"""


def excess_over_median(xs: list[float]) -> float:
    med = statistics.median(xs)
    return statistics.mean(max(0.0, x - med) for x in xs)


def correlation(a: list[float], b: list[float]) -> float:
    try:
        return statistics.correlation(a, b)
    except statistics.StatisticsError:  # a constant series (a gap of nothing between two collectives)
        return 0.0


def all_real(path: Path) -> dict[int, dict[str, float]]:
    """Place -> the all-real figures (ms), over the later three quarters."""
    ranks = pickle.loads(path.read_bytes())
    n = len(ranks[0])
    per: dict[int, dict[str, list]] = collections.defaultdict(lambda: collections.defaultdict(list))
    for k in range(max(1, n // 4), n):
        (a0, b0), (a1, b1) = ranks[0][k], ranks[1][k]
        p = per[k % len(PLACES)]
        p["gap0"].append(a0 - ranks[0][k - 1][1])
        p["gap1"].append(a1 - ranks[1][k - 1][1])
        p["late"].append(abs(a1 - a0) / 2)  # either rank's lateness, the mean of the two
        p["shared"].append(min(b0, b1) - max(a0, a1))
    out = {}
    for place, p in per.items():
        gaps = [statistics.mean(g) - min(g) for g in (p["gap0"], p["gap1"])]
        out[place] = {
            "gap excess": 1e3 * statistics.mean(gaps),
            "gap corr": correlation(p["gap0"], p["gap1"]),
            "late": 1e3 * statistics.mean(p["late"]),
            "share": 1e3 * excess_over_median(p["shared"]) / 2,
        }
    return out


def place_of(nbytes: int, after: int | None) -> int:
    """A collective's index in PLACES, from its bytes and those of the collective before it."""
    return 1 if nbytes == 65536 else 2 if after == 65536 else 0


def emulated(trace: Path) -> dict[int, dict[str, float]]:
    """Place -> the emulated run's figures (ms), over the later three quarters: the real
    rank's gap excess (as all-real: entry less the end of the collective before), and, its
    collectives replayed through a Skew as a live run feeds it, the stall samples and the
    lateness drawn for the one emulated rank."""
    from neuronabox.controller.skew import Skew, latest_entry

    from neuronabox.sim.simulate import program_of, skew_entries
    from neuronabox.trace.records import load

    prog = program_of(load(trace))
    entries = skew_entries(prog)
    later = len(entries) // 4

    def place(i: int) -> int:
        return place_of(entries[i][0][2], entries[i - 1][0][2] if i else None)

    per: dict[int, dict[str, list]] = collections.defaultdict(lambda: collections.defaultdict(list))
    for i in range(max(1, later), len(entries)):
        since, t = entries[i - 1][2], entries[i][1]
        held = math.fsum(max(0.0, min(b, t) - max(a, since)) * min(cpu / (b - a), 1.0)
                         for a, b, cpu in prog.held if a < t and b > since and b > a)  # fmt: skip
        per[place(i)]["gaps"].append(t - since)
        per[place(i)]["own gaps"].append(t - since - held)
    skew = Skew("auto", seed=1)
    ended = skew.ended

    def ended_noting_stalls(instance: str, t: float, lag: float = 0.0) -> None:
        opened = skew._open.get(instance)
        ended(instance, t, lag)
        i = int(instance)
        if opened is not None and i >= later:
            per[place(i)]["stall"].append(skew._stalls[opened[0]])

    skew.ended = ended_noting_stalls
    for i, entry in skew.replayed(entries, prog.steps, prog.held):
        if i >= later:
            per[place(i)]["drawn"].append(latest_entry(entry, 2, frozenset({0})))
    out = {}
    for index, d in per.items():
        out[index] = {k: 1e3 * statistics.mean(v) for k, v in d.items() if v and "gaps" not in k}
        for gaps in ("gaps", "own gaps"):
            out[index][gaps] = 1e3 * (statistics.mean(d[gaps]) - min(d[gaps]))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--realtime", action="store_true", help="every real rank of both runs in the real-time class")
    p.add_argument("--recorder-off", action="store_true", help="the emulated run without the flight recorder")
    ns = p.parse_args()
    chrt = ["chrt", "-r", "1"] if ns.realtime else []
    print("| run | place | all-real: gap excess (ms) | gaps' correlation | entry lateness, either rank (ms) "
          "| in-collective stall, one rank's share (ms) | emulated: gap excess (ms) | less the observer's holds (ms) "
          "| stall samples (ms) | drawn lateness (ms) |")  # fmt: skip
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as tmp:
        worker = Path(tmp, "stall_loop.py")
        worker.write_text(WORKER)
        os.environ["PET_LOG_DIR"] = tmp  # the stock torchruns' logs go with the folder
        for rep in range(ns.repeat):
            times, trace = Path(tmp, f"times{rep}.pkl"), Path(tmp, f"trace{rep}.jsonl")
            run([*chrt, sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(worker),
                 str(ns.steps)], {"NBX_PIN": "1", "NBX_TIMES": str(times)})  # fmt: skip
            run([sys.executable, "-m", "neuronabox.cli", "torchrun", "--nnodes", "2", "--skew", "none", "--trace",
                 str(trace), *(["--realtime"] if ns.realtime else []), str(worker), str(ns.steps)],
                {"TORCH_FR_BUFFER_SIZE": "0"} if ns.recorder_off else {})  # fmt: skip
            real, emu = all_real(times), emulated(trace)
            for place, name in enumerate(PLACES):
                r, e = real[place], emu.get(place, {})
                emu_cells = " | ".join(f"{e.get(k, 0.0):.3f}" for k in ("gaps", "own gaps", "stall", "drawn"))
                print(f"| {rep} | {name} | {r['gap excess']:.3f} | {r['gap corr']:+.2f} | {r['late']:.3f} "
                      f"| {r['share']:.3f} | {emu_cells} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
