"""A plain `neuronabox torchrun` places each real rank and the controller on a core of its
own when the machine has them, says where, and says when it cannot; `--placement off`
leaves them where the OS puts them. Checked on the processes themselves: the real rank
prints its own CPU affinity, and the controller's is read from /proc while it runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from neuronabox.fidelity.testbed import Host, Loopback, Placement
from neuronabox.launcher.controller_proc import BUSY_POLL_S, SPIN_POLL_S, busy_poll_s
from neuronabox.launcher.cores import CorePlan, plan_cores

ROOT = Path(__file__).resolve().parents[1]

# The run's own controller is its launcher's child, as the rank's agent is: other runs'
# controllers may be live beside it.
AFFINITY = """
import json, os, pathlib, torch, torch.distributed as dist
dist.init_process_group("gloo")
mine = sorted(os.sched_getaffinity(0))
def parent(pid):
    return int(pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
launcher = parent(os.getppid())
ctl, polls = [], []
for proc in pathlib.Path("/proc").iterdir():
    try:
        cmd = (proc / "cmdline").read_bytes()
        if proc.name.isdigit() and b"neuronabox.controller.main" in cmd and parent(int(proc.name)) == launcher:
            ctl.append(sorted(os.sched_getaffinity(int(proc.name))))
            cfg = json.loads(pathlib.Path(cmd.split(b"\\0")[-2].decode()).read_text())
            polls.append((cfg["busy_poll_s"], cfg["spin_poll_s"]))
    except OSError:
        pass
dist.all_reduce(torch.ones(4))
print(f"rank {dist.get_rank()} affinity {mine} controllers {ctl} polls {polls}", flush=True)
os._exit(0)
"""


def launch(tmp_path: Path, cores: list[int], *flags: str) -> subprocess.CompletedProcess:
    script = tmp_path / "affinity.py"
    script.write_text(AFFINITY)
    cmd = [sys.executable, "-m", "neuronabox.cli", "torchrun", "--nnodes", "2", *flags, str(script)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT,
                         preexec_fn=lambda: os.sched_setaffinity(0, cores))  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    return out


def reported(out: subprocess.CompletedProcess) -> tuple[list[int], list[list[int]], list[tuple[float, float]]]:
    """The real rank's cores, its controller's, and how long that controller polls after a
    pair event (its busy window, then its spin)."""
    m = re.search(r"rank 0 affinity \[([0-9, ]*)\] controllers \[(.*)\] polls \[(.*)\]", out.stdout)
    assert m, out.stdout
    mine = [int(c) for c in m.group(1).split(",")]
    ctls = [[int(c) for c in g.split(",")] for g in re.findall(r"\[([0-9, ]+)\]", m.group(2))]
    polls = [(float(a), float(b)) for a, b in re.findall(r"\(([0-9.e-]+), ([0-9.e-]+)\)", m.group(3))]
    return mine, ctls, polls


def test_a_plain_run_puts_the_real_rank_and_the_controller_on_cores_of_their_own(tmp_path):
    cores = sorted(os.sched_getaffinity(0))[:2]
    if len(cores) < 2:
        pytest.skip("needs two cores")
    out = launch(tmp_path, cores)
    assert f"placed: real node 0 on core {cores[0]}, the controller on core {cores[1]}" in out.stdout
    mine, ctls, polls = reported(out)
    assert mine == [cores[0]] and ctls == [[cores[1]]], out.stdout
    assert polls == [(BUSY_POLL_S, SPIN_POLL_S)], out.stdout  # a core of its own: the loop polls


def test_placement_off_pins_nothing(tmp_path):
    cores = sorted(os.sched_getaffinity(0))[:2]
    out = launch(tmp_path, cores, "--placement", "off")
    assert "placed" not in out.stdout
    mine, ctls, polls = reported(out)
    assert mine == cores and ctls == [cores]
    assert polls == [(0.0, 0.0)]  # it may share the real rank's core: it sleeps


def test_the_plan_gives_each_real_rank_a_core_in_order_and_the_controller_the_next():
    plan, note = plan_cores({0: 2, 5: 1}, [3, 1, 2, 7, 9])
    assert plan == CorePlan({0: (1, 2), 5: (3,)}, (7,))
    assert note == ("placed: real node 0 on cores 1,2, real node 5 on core 3, the controller on core 7 "
                    "(--placement off to not pin)")  # fmt: skip
    assert plan_cores({0: 2}, [0, 1]) == (None, "not placed: 2 real ranks and the controller need 3 cores, "
                                          "this machine gives 2: the timings include their sharing")  # fmt: skip


def test_a_placement_file_gives_a_polling_controller_only_a_core_no_real_node_may_use():
    def polls(nodes: dict[int, Host], controller: Host) -> float:
        return busy_poll_s(None, Placement(nodes, controller))

    assert busy_poll_s(CorePlan({0: (0,)}, (1,)), None) == BUSY_POLL_S  # the launcher's own plan
    assert busy_poll_s(None, None) == 0.0  # --placement off, or too few cores
    loopback = Loopback(2, 1, [0], cores=2).emulated([0])  # validate's: every host on a core of its own
    assert polls(loopback.nodes, loopback.controller) == BUSY_POLL_S
    node = Host("node0", "127.0.0.1", cpus=[0])
    assert polls({0: node}, Host("ctl", "127.0.0.2", cpus=[0])) == 0.0  # the real node's core
    assert polls({0: node}, Host("ctl", "127.0.0.2")) == 0.0  # anywhere
    assert polls({0: Host("node0", "127.0.0.1")}, Host("ctl", "127.0.0.2", cpus=[1])) == 0.0  # the node may go there
    assert polls({0: node}, Host("ctl", "127.0.0.2", cpus=[1], cgroup="/q")) == 0.0  # a CPU share (netns)
