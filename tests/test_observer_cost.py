"""The observer's own cost on a real rank: its clock named so the controller places its
holds only on the same clock, and the summary's line that tells the user what it cost."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
from neuronabox.controller.main import CLOCK, Controller

from neuronabox.observer.clock import clock_id
from neuronabox.trace.summary import observer_line

# A child that makes a time namespace with CLONE_NEWTIME (Linux 5.6), moves its monotonic
# clock, and prints clock_id() from a process inside it: unshare(2) and the offsets file, as
# the kernel documents them (time_namespaces(7)), so no unshare(1) is needed.
IN_TIME_NAMESPACE = """
import ctypes, errno, os, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare(0x80) != 0:  # CLONE_NEWTIME: the children's namespace
    err = ctypes.get_errno()
    sys.exit({errno.EINVAL: "EINVAL", errno.EPERM: "EPERM"}.get(err, f"errno {err}"))
with open("/proc/self/timens_offsets", "w") as f:  # before the namespace's first process
    f.write("monotonic %s 0" % sys.argv[1])
pid = os.fork()
if pid == 0:
    from neuronabox.observer.clock import clock_id
    print(clock_id(), flush=True)
    os._exit(0)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def clock_in_time_namespace(monotonic_offset: int) -> str:
    """clock_id() as a process in a fresh time namespace reads it."""
    out = subprocess.run([sys.executable, "-c", IN_TIME_NAMESPACE, str(monotonic_offset)],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    why = out.stderr.strip().splitlines()[-1:] or [""]
    if out.returncode != 0 and why[0] == "EINVAL":
        pytest.skip("this kernel has no time namespaces (CONFIG_TIME_NS, Linux 5.6+): no rank can be on another clock")
    if out.returncode != 0 and why[0] == "EPERM":
        pytest.skip("making a time namespace needs CAP_SYS_ADMIN (the suite runs as root in CI)")
    assert out.returncode == 0, out.stderr[-500:]
    return out.stdout.strip()


def test_a_time_namespace_that_moves_the_monotonic_clock_names_another_clock():
    here = clock_id()
    assert here and here == CLOCK  # the controller's, read at its import
    assert clock_in_time_namespace(0) == here  # a namespace that moves nothing: the same clock
    moved = clock_in_time_namespace(100)
    assert moved != here and moved.startswith(here + "+100")


def test_a_missing_boot_id_names_no_clock_and_offsets_read_as_the_kernel_writes_them(tmp_path):
    assert clock_id(str(tmp_path / "none")) == ""
    boot = tmp_path / "boot_id"
    boot.write_text("1234-abcd\n")
    offsets = tmp_path / "timens_offsets"
    assert clock_id(str(boot), str(offsets)) == "1234-abcd"  # no time namespaces in this kernel
    offsets.write_text("monotonic           0         0\nboottime         7         0\n")
    assert clock_id(str(boot), str(offsets)) == "1234-abcd"  # only boottime moved: not our clock
    offsets.write_text("monotonic          -5       250\nboottime         0         0\n")
    assert clock_id(str(boot), str(offsets)) == "1234-abcd+-5.250"


def test_a_hold_on_another_clock_is_counted_but_never_placed():
    """Its duration is the rank's cost on any clock; its times mean nothing on this one, so
    neither the trace nor --skew auto's gaps take it."""
    seen = []
    ctl = SimpleNamespace(
        recorder=SimpleNamespace(on_held=lambda *a: seen.append(("recorder", *a))),
        cfg=SimpleNamespace(real_ranks=[0, 5]),
        timing=SimpleNamespace(skew=SimpleNamespace(held=lambda *a: seen.append(("skew", *a)))),
    )
    Controller._held(ctl, 0, 10.0, 10.5, 0.1, CLOCK + "+100.0")
    Controller._held(ctl, 0, 20.0, 20.25, 0.2, "")
    assert seen == [("recorder", 0, 10.0, 10.5, 0.1, False), ("recorder", 0, 20.0, 20.25, 0.2, False)]
    seen.clear()
    Controller._held(ctl, 0, 30.0, 30.5, 0.3, CLOCK)
    Controller._held(ctl, 5, 40.0, 40.5, 0.4, CLOCK)  # not the first real rank: no skew of its own
    assert seen == [
        ("recorder", 0, 30.0, 30.5, 0.3, True),
        ("skew", 30.0, 30.5, 0.3),
        ("recorder", 5, 40.0, 40.5, 0.4, True),
    ]


def test_the_summary_names_the_rank_the_observer_cost_most_and_its_share_of_a_step():
    held = {"0": {"times": 4, "seconds": 0.0012}, "3": {"times": 9, "seconds": 0.0002}}
    # rank 0: 1.2 ms over 40 steps is 0.030 ms a step, of a 5 ms iteration 0.6%
    assert observer_line(held, 40, 0.005) == (
        "held real rank 0's core 4 times, 1.2 ms in all (flight-recorder dumps): 0.030 ms a step, "
        "0.6% of the iteration time"
    )
    assert observer_line(held, 0, 0.0) == "held real rank 0's core 4 times, 1.2 ms in all (flight-recorder dumps)"
    assert observer_line({}, 40, 0.005) == ""
