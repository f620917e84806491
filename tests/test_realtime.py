"""`--realtime`: the real ranks in the real-time class, the controller not (launcher/realtime.py)."""

from __future__ import annotations

import os
import re
import sys

import pytest
from conftest import ROOT, nbx

SCRIPT = str(ROOT / "tests" / "scripts" / "sched_policy.py")


def policies(out: str) -> tuple[set[int], set[int]]:
    m = re.search(r"POLICY threads=\[([0-9, ]*)\] controller=\[([0-9, ]*)\]", out)
    assert m, out[-2000:]
    return tuple({int(x) for x in g.split(",") if x.strip()} for g in m.groups())  # type: ignore[return-value]


def test_realtime_puts_every_thread_of_the_real_ranks_in_the_class_and_never_the_controller():
    """Gloo's threads start after the rank does and inherit its class; the controller, which
    polls its core, stays in the normal class (on one core with a real-time rank it could
    not run). Without the flag nothing changes."""
    res = nbx("torchrun", "--nnodes", "4", "--realtime", SCRIPT)
    assert res.rc == 0, res.err[-2000:]
    assert "real ranks in the real-time class (the kernel" in res.out
    threads, controller = policies(res.out)
    assert threads == {os.SCHED_RR} and controller == {os.SCHED_OTHER}
    plain = nbx("torchrun", "--nnodes", "4", SCRIPT)
    assert plain.rc == 0, plain.err[-2000:]
    assert policies(plain.out) == ({os.SCHED_OTHER}, {os.SCHED_OTHER}) and "real-time" not in plain.out


@pytest.mark.parametrize(
    "argv",
    [
        ["torchrun", "--nnodes", "4", "--realtime", SCRIPT],
        ["validate", "--nnodes", "2", "--topology", "cpu-25gbe", "--realtime", "--", SCRIPT],
    ],
)
def test_realtime_without_the_right_is_refused_in_one_line(argv):
    """Before any process starts: torchrun's real ranks, and validate's ranks of both runs.
    The right is dropped with util-linux's setpriv (essential on Debian): root without
    CAP_SYS_NICE in its bounding set may not enter the class."""
    import subprocess

    drop = ["setpriv", "--bounding-set=-sys_nice", "--inh-caps=-sys_nice"]
    proc = subprocess.run([*drop, sys.executable, "-m", "neuronabox.cli", *argv],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--realtime: this process may not use the real-time class" in lines[0], lines
    assert "CAP_SYS_NICE" in lines[0]
