"""`neuronabox report`: a live run's trace and a sweep's CSV as one self-contained HTML page,
opened in headless Chromium (Debian's package, which .ci/run installs): it renders, with
no script error and nothing in the console, and it says what the trace holds."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from neuronabox.trace.records import load
from neuronabox.trace.report import iterations, kind_rows

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Chromium on a machine without a network or a display bus (the flags the environment's probe uses)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--enable-logging=stderr", "--v=0"]  # fmt: skip


def in_process(*argv: str) -> int:
    from neuronabox.cli import main

    return main(list(argv))


def chromium(page: Path, tmp: Path, *what: str) -> subprocess.CompletedProcess:
    if CHROMIUM is None:
        if os.environ.get("NEURONABOX_REQUIRE_BROWSER"):
            pytest.fail("NEURONABOX_REQUIRE_BROWSER is set and no chromium is on PATH")
        pytest.skip("no chromium on PATH (apt-get install chromium; .ci/run installs it)")
    profile = tmp / f"chromium-{len(list(tmp.glob('chromium-*')))}"
    cmd = [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *what, page.resolve().as_uri()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90)


def rendered_cleanly(page: Path, tmp: Path) -> list[str]:
    """What is wrong with the page in Chromium: script errors, console lines, no render mark."""
    res = chromium(page, tmp, "--dump-dom")
    problems = [ln for ln in res.stderr.splitlines() if ":CONSOLE" in ln]
    if m := re.search(r'data-errors="([^"]*)"', res.stdout):
        problems.append(f"script error: {m[1]}")
    if 'data-rendered="ok"' not in res.stdout:
        problems.append(f"never rendered (exit {res.returncode})")
    return problems


def screenshot_is_drawn(page: Path, tmp: Path) -> float:
    """The share of the screenshot's pixels that are not white."""
    import matplotlib.image

    png = tmp / f"{page.stem}.png"
    res = chromium(page, tmp, "--window-size=1200,1600", f"--screenshot={png}")
    assert png.exists(), res.stderr[-2000:]
    img = matplotlib.image.imread(str(png))[..., :3]
    return float((img < 0.97).any(axis=-1).mean())


def test_a_runs_report_renders_in_chromium_and_says_what_the_trace_holds(live_trace, tmp_path, capsys):
    page = tmp_path / "live.html"
    assert in_process("report", str(live_trace), "--out", str(page)) == 0
    assert f"wrote {page}" in capsys.readouterr().out
    html = page.read_text()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)  # nothing fetched: it opens offline
    doc = load(live_trace)
    for row in kind_rows(doc):  # the per-kind table, row for row
        assert f"<td>{row.kind}</td><td>{row.count}</td>" in html
    it = iterations(doc)
    assert len(it.seconds) == 13 and 0 < it.communication_share < 1  # 14 optimizer steps
    assert f"{sorted(it.seconds)[6] * 1e3:.2f} ms</span> per iteration (median of 13" in html
    assert "rank 0</text>" in html and "<polyline" in html  # the timeline and the busbw curve
    assert rendered_cleanly(page, tmp_path) == []
    assert screenshot_is_drawn(page, tmp_path) > 0.02


def test_a_sweeps_report_draws_its_curve_and_lists_a_failed_point(live_trace, tmp_path):
    out = tmp_path / "sweep"
    rc = in_process("whatif", "--simulate", str(live_trace), "--sweep", "latency=0,1ms,2ms", "--out", str(out))
    assert rc == 0
    table = Path(f"{out}.csv")
    rows = table.read_text().splitlines()
    rows.append("3ms,0.003,,,failed,the point's cause,,")  # a failed point is a row with its cause
    table.write_text("\n".join(rows) + "\n")
    page = tmp_path / "sweep.html"
    assert in_process("report", str(table), "--out", str(page)) == 0
    html = page.read_text()
    assert "4 (1 failed)" in html and "the point&#x27;s cause" in html
    assert html.count("<circle") == 3  # the three points that ran, on the curve
    assert rendered_cleanly(page, tmp_path) == []


def test_the_render_check_sees_a_script_error(tmp_path):
    """The check above can fail: a page whose script throws and logs is caught both ways."""
    page = tmp_path / "bad.html"
    page.write_text("<!DOCTYPE html><html><body><p>x</p><script>window.addEventListener('error', function (e) "
                    "{ document.body.dataset.errors = e.message; }); console.error('logged'); missing();"
                    "</script></body></html>")  # fmt: skip
    problems = rendered_cleanly(page, tmp_path)
    assert any("logged" in p for p in problems) and any("missing is not defined" in p for p in problems)
    assert any("never rendered" in p for p in problems)


@pytest.mark.parametrize(
    "name,content,cause",
    [
        ("in.csv", "a,b\n1,2\n", "is not a whatif sweep's table"),
        ("in.jsonl", '{"not": "a trace"}\n', "not a NeuronaBox trace"),
    ],
    ids=["csv-not-a-sweep", "not-a-trace"],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, name, content, cause):
    src = tmp_path / name
    src.write_text(content)
    assert in_process("report", str(src)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("neuronabox: error: ") and cause in err[0]
    assert not src.with_suffix(".html").exists()
