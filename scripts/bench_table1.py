"""The NeuronaBox paper's Table 1 on this machine: collective overhead at W=2.

Allreduce and allgather from 1 KiB to 128 MiB. Each rank is pinned to a core of
its own: all-real, rank 0 on core 0 and rank 1 on core 1 (two torchrun agents on
a static rendezvous); emulated, the real rank on core 0 and the launcher and
controller on core 1, zero-delay model. The two runs alternate `--repeat` times
per size, the order flipped every repetition; the table gives the medians of
the per-run medians, their range, and the overhead of the emulated median; then
the same for each run's best repetition (the median over runs of the minimum),
which leaves out the scheduler-tick stalls this VM adds to any wake-up, all-real
or emulated (docs/fidelity.md, "Tick stalls").
Each reference flag adds a run to the rotation, the emulated side with one part changed:
--python-starts starts every book from Python (NEURONABOX_NATIVE_START=0), and
--sleeping-loop lets the controller's loop sleep between frames (NEURONABOX_BUSY_POLL=0)
rather than poll on its core of its own, and --recorder-sizes has the controller ask the
real rank for every ring size the wire leaves open (from 4 MiB here), answered from a dump
of PyTorch's flight recorder, instead of the call telling it (NEURONABOX_SIZE_NOTES=0), and
--frame-starts starts a ring whose size the call's note told at its first frame rather than
as the note comes (NEURONABOX_NOTE_START=0), and --python-notes sends the notes over the
observer link, each a Python turn of the controller's, not on the note link its core reads
(NEURONABOX_NOTE_LINK=0; docs/fidelity.md, "A note the core reads"), and --no-guesses posts
no repeating shape's receives ahead of its call (NEURONABOX_GUESS_AHEAD=0; docs/fidelity.md,
"Receives posted on a guess"). Sizes under 1 KiB are
in bytes (--sizes 28: a training loop's loss, a ring the call's note sizes).
--realtime runs every real rank of both sides in the real-time class (SCHED_RR 1, as
`neuronabox torchrun --realtime` does): this VM's tick stalls then leave the medians too.
--noise-floor adds a second all-real run to the rotation, compared with the first as the
emulated one is: the "overhead" two all-real runs show with no emulator at all. Each fresh
launch of the same pair runs at a speed of its own on this VM (docs/fidelity.md, "Fresh
launches"), so a cell whose floor is several percent cannot resolve a smaller overhead.
--huge-pages transparent|reserved runs every process of both sides with malloc on 2 MiB
pages, as `validate --huge-pages` does (reserved: from the hugetlb pool, vm.nr_hugepages).
Usage: python scripts/bench_table1.py [--repeat K] [--sizes 28,1K,1M,...] [--python-starts] [--sleeping-loop]
       [--recorder-sizes] [--frame-starts] [--python-notes] [--no-guesses] [--realtime] [--noise-floor]
       [--huge-pages transparent|reserved]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from bench_allreduce import result, write_pinned_placement

from neuronabox.fidelity.huge_pages import MODES, problem, with_huge_pages
from neuronabox.launcher.ports import free_port
from neuronabox.launcher.realtime import entering

HERE = Path(__file__).resolve().parent
WORKER = str(HERE / "collective_loop.py")
KINDS = "allreduce,allgather"
SIZES = "1K,4K,16K,64K,256K,1M,2M,4M,16M,64M,128M"
UNITS = {"K": 1 << 10, "M": 1 << 20}


def parse_size(text: str) -> int:
    return int(text[:-1]) * UNITS[text[-1]] if text[-1] in UNITS else int(text)


def reps_for(nbytes: int) -> int:
    """Timed repetitions per run: best of many (the tick stalls, docstring). From 2 MiB a
    repetition's time spreads over 2x (a 4 MiB allreduce: 0.66 to 2 ms, both sides), so the
    best of 30 moved by several percent between two all-real runs; a repetition costs little
    next to a launch, so take more."""
    return 300 if nbytes <= 1 << 20 else 100 if nbytes <= 16 << 20 else 20


def pinned(cpu: int, realtime: bool = False):
    def pin() -> None:
        os.sched_setaffinity(0, {cpu})

    return entering(pin) if realtime else pin  # as `neuronabox torchrun --realtime` runs its real ranks


def worker_args(nbytes: int) -> list[str]:
    return [WORKER, "--kinds", KINDS, "--bytes", str(nbytes), "--reps", str(reps_for(nbytes))]


def all_real_output(worker: list[str], realtime: bool = False) -> str:
    """Rank 0's stdout of `worker` (a script and its arguments) run all-real at W = 2: two
    stock torchrun agents on a static rendezvous, node i pinned to core i."""
    port = free_port()
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo")
    procs = []
    # the agents' logs go with this call (torchrun's default, a fresh /tmp/torchelastic_* a run, stays)
    logs = tempfile.TemporaryDirectory(prefix="torchelastic-")
    for node in (0, 1):
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={node}",
            "--nproc-per-node=1", "--rdzv-backend=static", "--master-addr=127.0.0.1",
            f"--master-port={port}", f"--log-dir={logs.name}/node{node}", *worker,
        ]  # fmt: skip
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env=env, preexec_fn=pinned(node, realtime)))  # fmt: skip
    try:
        outs = [p.communicate(timeout=900) for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
        logs.cleanup()
    if any(p.returncode for p in procs):
        raise RuntimeError("all-real run failed:\n" + "\n".join(err[-2000:] for _, err in outs))
    return outs[0][0]


def use_huge_pages(mode: str | None) -> None:
    """--huge-pages: every process this benchmark starts, both sides, on `mode`'s 2 MiB
    pages (they inherit the environment); exits with the cause where it cannot be had."""
    if mode is None:
        return
    if lacking := problem(mode):
        sys.exit(f"--huge-pages: {lacking}")
    os.environ.update(with_huge_pages(dict(os.environ), mode))


def all_real(nbytes: int, realtime: bool = False) -> dict:
    return result(all_real_output(worker_args(nbytes), realtime))


REFERENCES = {  # flag -> (column, the environment that turns its part off, or on)
    "python_starts": ("Python starts", {"NEURONABOX_NATIVE_START": "0"}),
    "sleeping_loop": ("sleeping loop", {"NEURONABOX_BUSY_POLL": "0"}),
    "recorder_sizes": ("sizes asked of the recorder", {"NEURONABOX_SIZE_NOTES": "0"}),
    "frame_starts": ("noted rings at their first frame", {"NEURONABOX_NOTE_START": "0"}),
    "python_notes": ("notes read by Python", {"NEURONABOX_NOTE_LINK": "0"}),
    "no_guesses": ("no receives on a guess", {"NEURONABOX_GUESS_AHEAD": "0"}),
}


def emulated_output(
    worker: list[str], placement: Path, off: dict[str, str] | None = None, realtime: bool = False
) -> str:
    """Rank 0's stdout of `worker` run emulated at W = 2 (zero-delay model, the real rank
    and the controller each on a core of `placement`'s); `off`: environment that turns a
    part of the emulator off (REFERENCES)."""
    env = dict(os.environ, **(off or {}))
    cmd = [
        sys.executable, "-m", "neuronabox.cli", "torchrun", "--nnodes", "2", "--delay-model", "zero",
        "--placement", str(placement), *(["--realtime"] if realtime else []), *worker,
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, preexec_fn=pinned(1), env=env)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return proc.stdout


def emulated(nbytes: int, placement: Path, off: dict[str, str] | None = None, realtime: bool = False) -> dict:
    return result(emulated_output(worker_args(nbytes), placement, off, realtime))


def label(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB" if nbytes >= 1 << 10 else f"{nbytes} B"


def rotated(order: list[tuple[str, Callable[[], dict]]], repeat: int) -> dict[str, list[dict]]:
    """Each run of `order` (mode, run) `repeat` times, the order rotated every repetition
    (two runs: flipped), so a drift of the machine weighs on every mode alike."""
    runs: dict[str, list[dict]] = {mode: [] for mode, _ in order}
    for rep in range(repeat):
        turn = rep % len(order)
        for mode, run in order[turn:] + order[:turn]:
            runs[mode].append(run())
    return runs


def per_kind(runs: dict[str, list[dict]]) -> dict[str, dict[str, list[dict]]]:
    """`rotated`'s results by collective: kind -> mode -> each run's result for it."""
    return {kind: {m: [r[kind] for r in rs] for m, rs in runs.items()} for kind in KINDS.split(",")}


def overhead(base: list[float], other: list[float]) -> str:
    """`other`'s median over `base`'s, in percent."""
    return f"{(statistics.median(other) / statistics.median(base) - 1) * 100:+.1f}%"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sizes", default=SIZES)
    ap.add_argument("--python-starts", action="store_true", help="also run with every book started from Python")
    ap.add_argument("--sleeping-loop", action="store_true", help="also run with the controller's loop sleeping")
    ap.add_argument(
        "--recorder-sizes", action="store_true", help="also run with open ring sizes asked of the flight recorder"
    )
    ap.add_argument(
        "--frame-starts", action="store_true", help="also run with noted rings started at their first frame"
    )
    ap.add_argument("--python-notes", action="store_true", help="also run with the notes read by Python")
    ap.add_argument("--no-guesses", action="store_true", help="also run with no receives posted on a guess")
    ap.add_argument("--realtime", action="store_true", help="every real rank, both sides, in the real-time class")
    ap.add_argument("--noise-floor", action="store_true", help="also a second all-real run, against the first")
    ap.add_argument("--huge-pages", choices=sorted(MODES), help="both sides on 2 MiB pages (validate's)")
    args = ap.parse_args()
    use_huge_pages(args.huge_pages)
    refs = [name for name in REFERENCES if getattr(args, name)]
    floor = args.noise_floor
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    rows, rt = [], args.realtime
    with tempfile.TemporaryDirectory() as d:
        placement = Path(d) / "placement.json"
        write_pinned_placement(placement)
        for n in sizes:
            order = [("real", lambda n=n: all_real(n, rt)), ("emu", lambda n=n: emulated(n, placement, realtime=rt))]
            order += [(r, lambda n=n, r=r: emulated(n, placement, REFERENCES[r][1], rt)) for r in refs]
            if floor:
                order.append(("floor", lambda n=n: all_real(n, rt)))
            rows += [(kind, n, got) for kind, got in per_kind(rotated(order, args.repeat)).items()]
            print(f"  done {label(n)}", file=sys.stderr, flush=True)

    def ms(xs: list[float]) -> str:
        return f"{statistics.median(xs) * 1e3:.3f} ({min(xs) * 1e3:.3f}-{max(xs) * 1e3:.3f})"

    head = "all-real ms (range) | emulated ms (range) | overhead | best rep all-real / emulated ms | overhead"
    extra = "".join(f" best rep, {REFERENCES[r][0]} ms | overhead |" for r in refs)
    extra += " all-real again ms (range) | noise floor | best rep | noise floor |" if floor else ""
    print(f"| collective | size | {head} |{extra}")
    print("|---|---:|---:|---:|---:|---:|---:|" + "---:|---:|" * len(refs) + "---:|---:|---:|---:|" * floor)
    for kind, nbytes, got in sorted(rows, key=lambda r: (r[0], r[1])):
        a, e = [r["median_s"] for r in got["real"]], [r["median_s"] for r in got["emu"]]
        ba, be = [r["min_s"] for r in got["real"]], [r["min_s"] for r in got["emu"]]
        best = f"{statistics.median(ba) * 1e3:.3f} / {statistics.median(be) * 1e3:.3f}"
        line = f"| {kind} | {label(nbytes)} | {ms(a)} | {ms(e)} | {overhead(a, e)} | {best} | {overhead(ba, be)} |"
        for r in refs:
            bp = [x["min_s"] for x in got[r]]
            line += f" {statistics.median(bp) * 1e3:.3f} | {overhead(ba, bp)} |"
        if floor:
            f, bf = [x["median_s"] for x in got["floor"]], [x["min_s"] for x in got["floor"]]
            line += f" {ms(f)} | {overhead(a, f)} | {statistics.median(bf) * 1e3:.3f} | {overhead(ba, bf)} |"
        print(line)


if __name__ == "__main__":
    main()
