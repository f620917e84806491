"""Helpers for the end-to-end tests: run `neuronabox` for real and check nothing is left behind."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
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


def spawn(*argv: str) -> tuple[subprocess.Popen, str]:
    """Start `neuronabox ARGV...` in the background; returns the process and its tag."""
    tag = uuid.uuid4().hex
    env = dict(os.environ, NEURONABOX_TEST_TAG=tag, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "neuronabox.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    return proc, tag


@pytest.fixture
def run():
    return nbx
