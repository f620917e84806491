"""The test suite, several times in a row, from a clean clone, while a second process
keeps one core busy: a suite that flakes under load is a defect, and this is how the
project shows it does not.

    python scripts/suite_under_load.py [--runs 3] [--repo .] [--keep]

Clones the repository's HEAD into a fresh folder, starts `yes > /dev/null` (one core
spinning), runs the README's test command (`make test`) there `--runs` times, stops
the load on every path, and prints one row per run: its exit status, its wall time, and
pytest's own summary line. Exit 0 only when every run passed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUN_LIMIT_S = 90 * 60  # CI's limit for one run


def summary_line(output: str) -> str:
    """pytest's last line ("680 passed, 1 skipped in 510.41s"), or the last line there is."""
    found = re.findall(r"^=*\s*(\d+ (?:passed|failed).*?)\s*=*$", output, re.M)
    lines = output.strip().splitlines()
    return found[-1] if found else (lines[-1] if lines else "(no output)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--repo", default=str(Path(__file__).resolve().parents[1]))
    p.add_argument("--keep", action="store_true", help="keep the clone and each run's log")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs is at least 1")
    work = Path(tempfile.mkdtemp(prefix="nbx-load-"))
    work.chmod(0o755)  # as a checkout is: the suite runs one check as an ordinary user
    clone = work / "clone"
    subprocess.run(["git", "clone", "-q", args.repo, str(clone)], check=True, timeout=300)
    head = subprocess.run(["git", "-C", str(clone), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    load = subprocess.Popen(["yes"], stdout=subprocess.DEVNULL, start_new_session=True)
    rows, failed = [], 0
    try:
        for i in range(1, args.runs + 1):
            t0 = time.monotonic()
            log = work / f"run{i}.log"
            with open(log, "w") as out:
                proc = subprocess.run(["make", "test"], cwd=clone, stdout=out, stderr=subprocess.STDOUT,
                                      timeout=RUN_LIMIT_S, env=dict(os.environ))  # fmt: skip
            wall = time.monotonic() - t0
            with open(log, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - (1 << 16)))
                tail = f.read().decode(errors="replace")
            rows.append((i, proc.returncode, wall, summary_line(tail)))
            failed += proc.returncode != 0
            print(f"run {i}: exit {proc.returncode}, {wall:.0f} s: {rows[-1][3]}", flush=True)
    finally:
        os.killpg(load.pid, signal.SIGKILL)
        load.wait()
    print(f"\n`make test` from a clean clone of {head.stdout.strip()}, one core kept busy by `yes`")
    print("| run | exit | wall (s) | pytest |")
    print("| --- | --- | --- | --- |")
    for i, rc, wall, line in rows:
        print(f"| {i} | {rc} | {wall:.0f} | {line} |")
    if args.keep or failed:
        print(f"logs: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
