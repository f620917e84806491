"""Sweeps on a real Ray cluster: a head the test starts on this machine (`ray start
--head`, one CPU, so the points run one after another) and stops at the end. The sweep
is the stock `neuronabox whatif --executor ray --ray-address`, each point a Ray task.

Ray's own servers bind as Ray 2.60 binds them (its GCS on every interface, whatever
--node-ip-address says); the head lives only for this module."""

from __future__ import annotations

import csv
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import psutil
import pytest

from neuronabox.launcher.ports import free_port

RAY = str(Path(sys.executable).parent / "ray")
# Ray's token authentication, with a token of the test's own that the head and the sweep share.
ENV = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(16))


@pytest.fixture(scope="module")
def ray_head():
    temp = tempfile.mkdtemp(prefix="/tmp/nbx-ray-")  # short: Ray's socket paths live under it
    port = free_port()
    cmd = [RAY, "start", "--head", f"--port={port}", "--node-ip-address=127.0.0.1", "--num-cpus=1",
           "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp}"]  # fmt: skip
    subprocess.run(cmd, env=ENV, check=True, capture_output=True, timeout=120)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        stop_head(temp, port)
        shutil.rmtree(temp, ignore_errors=True)


def stop_head(temp: str, port: int) -> None:
    """This head's processes and their children, killed, and waited for: `ray stop` would
    stop every Ray on the machine (and takes seconds to)."""
    mine = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if temp in cmd or f":{port} " in f"{cmd} " or f"--port={port}" in cmd:
            mine.append(p)
    family = {p.pid: p for p in mine}
    for p in mine:
        try:
            family.update((c.pid, c) for c in p.children(recursive=True))
        except psutil.NoSuchProcess:
            pass
    family.pop(os.getpid(), None)
    for p in family.values():
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(list(family.values()), timeout=30)
    assert not alive, [p.pid for p in alive]


def ok_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return [r for r in csv.DictReader(f) if r.get("status") == "ok"]


def test_rows_come_as_points_finish_and_a_killed_sweep_resumes(ray_head, live_trace, tmp_path):
    """Three simulated world sizes on the head: the sweep is killed (SIGKILL, its whole
    process group) as soon as its table holds one row, so the rows are written as the
    points finish; run again, it completes the other two without redoing the first."""
    out = tmp_path / "scale"
    table = tmp_path / "scale.csv"
    argv = [sys.executable, "-m", "neuronabox.cli", "whatif", "--simulate", str(live_trace), "--sweep",
            "nnodes=8,1024,512", "--out", str(out), "--executor", "ray", "--ray-address", ray_head]  # fmt: skip
    proc = subprocess.Popen(argv, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # fmt: skip
    guard = threading.Timer(120, lambda: os.killpg(proc.pid, signal.SIGKILL))  # no row in 120 s: the loop ends
    guard.start()
    seen = []
    try:
        for line in proc.stdout:  # a row's line comes after its row is in the table, flushed
            seen.append(line)
            if line.startswith("  nnodes="):
                break
    finally:
        guard.cancel()
    assert proc.poll() is None, "".join(seen)[-3000:]  # the sweep was still running: two points to go
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdout.close()
    first = ok_rows(table)
    assert len(first) == 1, first  # the others were still running or waiting when it died
    kept = Path(first[0]["trace"]).stat().st_mtime_ns

    again = subprocess.run(argv, env=ENV, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "resuming: 1 of 3 points" in again.stdout, again.stdout
    rows = ok_rows(table)
    assert sorted(int(r["nnodes"]) for r in rows) == [8, 512, 1024]
    assert rows[0] == first[0] and Path(first[0]["trace"]).stat().st_mtime_ns == kept  # not redone
    for r in rows:
        assert Path(r["trace"]).exists() and float(r["iteration_s"]) > 0
    assert Path(f"{out}.png").read_bytes()[:4] == b"\x89PNG"


def test_a_simulated_ladder_spread_over_ray_gives_the_ladders_own_rows(ray_head, tmp_path):
    """`perf --simulate --executor ray`: each size a task on the head; the rows are the ones
    the whole ladder gives in this process, size for size (to float rounding: a size alone
    starts at virtual time 0, in the ladder after the sizes before it)."""
    ladder = ["perf", "all_gather", "--nnodes", "64", "--simulate", "-b", "64K", "-e", "4M", "-f", "8", "-n", "3",
              "-w", "1"]  # fmt: skip
    docs = {}
    for how, extra in (("local", []), ("ray", ["--executor", "ray", "--ray-address", ray_head])):
        out = tmp_path / f"{how}.json"
        res = subprocess.run([sys.executable, "-m", "neuronabox.cli", *ladder, *extra, "-J", str(out)], env=ENV,
                             capture_output=True, text=True, timeout=300)  # fmt: skip
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        docs[how] = json.loads(out.read_text())["rows"]
    assert [r["size"] for r in docs["ray"]] == [65536, 524288, 4194304]
    for ray_row, local_row in zip(docs["ray"], docs["local"], strict=True):
        assert ray_row.keys() == local_row.keys() and ray_row["wrong"] is local_row["wrong"] is None
        for key in ("size", "count", "time_us", "model_us"):
            assert ray_row[key] == pytest.approx(local_row[key], rel=1e-9), key

