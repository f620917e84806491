"""Helpers for the end-to-end tests: run `neuronabox` for real and check nothing is left behind."""

from __future__ import annotations

import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent

# Every process a test starts keeps its temporary files under one folder of this test
# process, removed when the session ends: a failed run keeps its folder for its logs (the
# launcher's, validate's), stock torchrun leaves a torchelastic_* folder per agent, and a
# suite that fails runs on purpose would otherwise leave hundreds of them in /tmp each
# time. Short (Ray's socket paths live under it).
SESSION_TMP = tempfile.mkdtemp(prefix="nbx-t")
os.environ["TMPDIR"] = SESSION_TMP
tempfile.tempdir = None  # this process's own temporary files go there too


def pytest_unconfigure(config) -> None:
    shutil.rmtree(SESSION_TMP, ignore_errors=True)


def left_in(tmp: Path) -> list[str]:
    """What runs left in a temporary folder, less the folders shared by every run (the runs
    registry, torch's compile cache): one a run is a leak."""
    shared = lambda name: name == "neuronabox-runs" or name.startswith("torchinductor_")  # noqa: E731
    return sorted(p.name for p in tmp.iterdir() if not shared(p.name))


EXAMPLE = str(ROOT / "examples" / "train_ddp.py")
SCRIPTS = ROOT / "tests" / "scripts"


@dataclass
class Result:
    rc: int
    out: str
    err: str
    seconds: float

    @property
    def last_error(self) -> str:
        lines = [ln for ln in self.err.splitlines() if ln.startswith("neuronabox: error:")]
        return lines[-1] if lines else ""


def tagged_processes(tag: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get("NEURONABOX_TEST_TAG") == tag:
                found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


def control_address(launcher_pid: int, timeout: float = 60) -> str:
    """The control address of the run `launcher_pid` launched, from the runs registry: a
    test names its own run, since other runs may be live beside it (`status` lists all).
    Waits for the entry: the launcher registers once its controller is up."""
    import json

    from neuronabox.launcher.registry import RUNS_DIR

    entry = RUNS_DIR / f"{launcher_pid}.json"
    deadline = time.monotonic() + timeout
    while not entry.exists():
        assert time.monotonic() < deadline, f"run {launcher_pid} never registered in {RUNS_DIR}"
        time.sleep(0.05)
    return json.loads(entry.read_text())["control"]


def nbx(*argv: str, timeout: float = 240, env: dict | None = None, check_clean: bool = True) -> Result:
    """Run `neuronabox ARGV...` to completion; fail the test if it leaves a process behind."""
    tag = uuid.uuid4().hex
    full_env = dict(os.environ, NEURONABOX_TEST_TAG=tag, PYTHONUNBUFFERED="1", **(env or {}))
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "neuronabox.cli", *argv],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        cwd=ROOT,
    )
    res = Result(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - t0)
    if check_clean:
        left = tagged_processes(tag)
        _, left = psutil.wait_procs(left, timeout=10)
        assert not left, f"processes left behind: {[p.cmdline() for p in left]}"
    return res


class Live:
    """`neuronabox ARGV...` running in the background; its stdout lines arrive on a queue,
    so a test waits on the line that says what it needs instead of sleeping."""

    def __init__(self, *argv: str) -> None:
        self.tag = uuid.uuid4().hex
        env = dict(os.environ, NEURONABOX_TEST_TAG=self.tag, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "neuronabox.cli", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.out: list[str] = []
        self._errs: list[str] = []
        self._readers = [
            threading.Thread(target=self._read, daemon=True),
            threading.Thread(target=lambda: self._errs.extend(self.proc.stderr), daemon=True),  # never lets it fill
        ]
        for t in self._readers:
            t.start()

    @property
    def err(self) -> str:
        return "".join(self._errs)

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.out.append(line)
            self.lines.put(line)
        self.lines.put(None)

    def wait_line(self, pattern: str, timeout: float = 120) -> re.Match:
        """The next stdout line matching `pattern`; fails the test at EOF or after `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"no line matching {pattern!r} within {timeout} s")
            if line is None:
                self.finish(timeout=30)
                pytest.fail(f"the run ended without a line matching {pattern!r}: {self.err[-2000:]}")
            m = re.search(pattern, line)
            if m:
                return m

    def drain(self) -> None:
        """Drop the lines not read yet: what comes next was written after this call."""
        try:
            while True:
                if self.lines.get_nowait() is None:
                    self.lines.put(None)
                    return
        except queue.Empty:
            pass

    def finish(self, timeout: float = 180) -> int:
        """Wait for the run to end; returns its exit status (stdout is in `out`, stderr in `err`)."""
        self.proc.wait(timeout=timeout)
        for t in self._readers:
            t.join(timeout=10)
        return self.proc.returncode

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.finish(timeout=30)
        _, left = psutil.wait_procs(tagged_processes(self.tag), timeout=10)
        assert not left, f"processes left behind: {[p.cmdline() for p in left]}"


@pytest.fixture
def run():
    return nbx


@pytest.fixture(scope="session")
def live_trace(tmp_path_factory):
    """One live run's trace for the replays (simulate, the sweeps): the example at 8 nodes,
    14 steps, past the local-work meter's first fit, so later instances charge measured work."""
    trace = tmp_path_factory.mktemp("simulate") / "live.jsonl"
    res = nbx("torchrun", "--nnodes", "8", "--trace", str(trace), EXAMPLE, "--steps", "14")
    assert res.rc == 0, res.err[-2000:]
    trace.with_suffix(".out").write_text(res.out)  # its summary, beside it
    return trace
