"""`neuronabox calibrate [--testbed loopback|netns] [--rate RATE] --out FILE.yaml`

Measures, between two real ranks on the testbed's actual link, what the timing model
needs (DESIGN.md, "Fidelity"): the link's latency (a raw TCP ping-pong), Gloo's
bandwidth and per-message latency (a send/recv ping-pong over sizes, fitted to
a + n/B), the cost of one PyTorch/Gloo call, Gloo's per-message software cost (what
is left of a once the call and the link are taken out) and the real rank's reduction
cost per byte. It prints the fit with its residuals and writes a topology file for
`--topology`, whose `local_work` charges emulated ranks the same work.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from neuronabox.fidelity.testbed import (
    Host,
    Loopback,
    Netns,
    TestbedError,
    TestbedUnavailable,
    parse_rate,
)

PROBE_TIMEOUT_S = 180
MARK = "neuronabox-calibration "


@dataclass(frozen=True)
class Fit:
    """t(n) = intercept + n * slope: the slope from the largest sizes (where the bytes
    dominate), the intercept from the smallest (where the fixed cost does), so neither
    end bends the other; `points`: (n, measured, fitted) at every size."""

    intercept: float
    slope: float
    points: tuple[tuple[int, float, float], ...]

    @classmethod
    def of(cls, samples: dict[int, float], ends: int = 3) -> Fit:
        n = np.array(sorted(samples), dtype=float)
        t = np.array([samples[k] for k in sorted(samples)], dtype=float)
        big, small = slice(max(0, len(n) - ends), None), slice(0, min(ends, len(n)))
        # With two sizes or more, `big` holds at least two: a line through them.
        slope = float(np.polyfit(n[big], t[big], 1)[0]) if len(n) >= 2 else float(t[0] / n[0])
        slope = max(slope, 1e-15)
        icpt = max(0.0, float(np.median(t[small] - slope * n[small])))
        return cls(icpt, slope, tuple((int(k), float(v), icpt + k * slope) for k, v in zip(n, t, strict=True)))

    def residuals(self) -> list[float]:
        return [(m - f) / f for _, m, f in self.points]


@dataclass(frozen=True)
class Calibration:
    testbed: str
    rate_bps: float | None
    link_latency: float  # one way, seconds
    gloo: Fit  # one-way Gloo message time against bytes
    call: float  # seconds per PyTorch/Gloo call without a message
    reduce: Fit  # float32 add against bytes

    @classmethod
    def from_probe(cls, raw: dict, testbed: str, rate_bps: float | None) -> Calibration:
        as_sizes = lambda d: {int(k): float(v) for k, v in d.items()}  # noqa: E731
        return cls(
            testbed,
            rate_bps,
            float(raw["tcp_oneway_s"]),
            Fit.of(as_sizes(raw["gloo_oneway_s"])),
            float(raw["call_s"]),
            Fit.of(as_sizes(raw["reduce_s"])),
        )

    @property
    def bandwidth(self) -> float:
        """Bytes per second a Gloo message moves at."""
        return 1.0 / self.gloo.slope

    @property
    def message_cost(self) -> float:
        """Gloo's software cost per message: the one-way intercept less the call and the link."""
        return max(0.0, self.gloo.intercept - self.call - self.link_latency)

    @property
    def reduce_bandwidth(self) -> float:
        return 1.0 / self.reduce.slope

    def topology(self) -> dict:
        """Two inter links per path (a node's link to the switch and the peer's from it):
        each carries half the one-way latency at the fitted bandwidth."""
        link = {"bandwidth": f"{self.bandwidth / 1e6:.6g}MB/s", "latency": f"{self.link_latency / 2 * 1e6:.4g}us"}
        rate = f"-{self.rate_bps / 1e6:g}mbit" if self.rate_bps else ""
        return {
            "name": f"calibrated-{self.testbed}{rate}",
            "nodes": 2,
            "ranks_per_node": 1,
            "links": {"intra": dict(link), "inter": dict(link)},
            "switches": {"tiers": 1, "nodes_per_switch": 1 << 20},
            "local_work": {
                "message": f"{self.message_cost * 1e6:.4g}us",
                "reduce": f"{self.reduce_bandwidth / 1e9:.6g}GB/s",
            },
        }

    def report(self) -> str:
        def us(s: float) -> str:
            return f"{s * 1e6:9.1f} us"

        where = self.testbed + (f" at {self.rate_bps / 1e6:g} Mbit/s" if self.rate_bps else "")
        lines = [
            f"calibration on {where}",
            f"  link latency     {us(self.link_latency)}   (raw TCP, one way)",
            f"  Gloo message     a = {self.gloo.intercept * 1e6:.1f} us + n / B, B = {self.bandwidth / 1e6:.2f} MB/s",
            "        bytes     measured          fit   residual",
        ]
        for (n, m, f), r in zip(self.gloo.points, self.gloo.residuals(), strict=True):
            lines.append(f"  {n:>11}  {us(m)}  {us(f)}   {r * 100:+6.1f}%")
        lines += [
            f"  per call         {us(self.call)}   (a PyTorch/Gloo call that sends nothing)",
            f"  per message      {us(self.message_cost)}   (Gloo's software: a - call - link)",
            f"  reduction        {self.reduce_bandwidth / 1e9:.2f} GB/s (float32 add)",
            "        bytes     measured          fit   residual",
        ]
        for (n, m, f), r in zip(self.reduce.points, self.reduce.residuals(), strict=True):
            lines.append(f"  {n:>11}  {us(m)}  {us(f)}   {r * 100:+6.1f}%")
        return "\n".join(lines)


def write_topology(cal: Calibration, path: Path) -> None:
    import yaml

    head = (
        f"# neuronabox calibrate, {time.strftime('%Y-%m-%d %H:%M')}, on {cal.testbed}"
        + (f" at {cal.rate_bps / 1e6:g} Mbit/s" if cal.rate_bps else "")
        + f"; residuals of the Gloo fit: {', '.join(f'{r * 100:+.1f}%' for r in cal.gloo.residuals())}\n"
    )
    path.write_text(head + yaml.safe_dump(cal.topology(), sort_keys=False, default_flow_style=None))


def probe(hosts: tuple[Host, Host], max_bytes: int, seconds: float) -> dict:
    """Run the probe's two ranks on the two hosts; rank 0's measurements."""
    from neuronabox.launcher.ports import free_port
    from neuronabox.launcher.reaping import Family

    port = free_port(hosts[0].address) if not hosts[0].netns else 29500 + os.getpid() % 1000
    family = Family()
    try:
        for rank, host in enumerate(hosts):
            env = dict(
                os.environ,
                RANK=str(rank),
                WORLD_SIZE="2",
                LOCAL_RANK="0",
                MASTER_ADDR=hosts[0].address,
                MASTER_PORT=str(port),
                GLOO_SOCKET_IFNAME=host.ifname,
                NEURONABOX_PROBE_ADDRESS=hosts[0].address,
                NEURONABOX_PROBE_MAX_BYTES=str(max_bytes),
                NEURONABOX_PROBE_SECONDS=str(seconds),
                OMP_NUM_THREADS="1",
            )
            family.add(
                subprocess.Popen(
                    [sys.executable, "-m", "neuronabox.fidelity.calibrate_probe"],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    preexec_fn=host.preexec(),
                    start_new_session=True,
                )
            )
        try:
            out, err = family.children[0].communicate(timeout=PROBE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise TestbedError(f"the calibration probe did not finish within {PROBE_TIMEOUT_S} s") from None
        for line in out.splitlines():
            if line.startswith(MARK):
                return json.loads(line[len(MARK) :])
        cause = (err.strip().splitlines() or ["no output"])[-1]
        raise TestbedError(f"the calibration probe failed (status {family.children[0].returncode}): {cause}")
    finally:
        family.stop(grace=2)


def default_max_bytes(rate_bps: float | None) -> int:
    """The largest message: 16 MiB on loopback, about 80 ms of the shaped rate otherwise."""
    if not rate_bps:
        return 16 << 20
    return 1 << max(16, min(24, int(math.log2(rate_bps / 8 * 0.08))))


def calibrate(testbed: str, rate_bps: float | None, max_bytes: int | None = None, seconds: float = 0.6) -> Calibration:
    max_bytes = max_bytes or default_max_bytes(rate_bps)
    if testbed == "loopback":
        with Loopback(2, 1, [0]) as tb:
            raw = probe((tb.node(0), tb.node(1)), max_bytes, seconds)
    else:
        with Netns(2, rate_bps, cpu_share=None) as tb:
            raw = probe((tb.node(0), tb.node(1)), max_bytes, seconds)
    return Calibration.from_probe(raw, testbed, rate_bps)


def testbed_rate(ns: argparse.Namespace) -> float | None:
    if ns.testbed == "loopback":
        if ns.rate:
            raise TestbedUnavailable("--rate shapes the netns testbed's links; loopback has no link to shape")
        return None
    return parse_rate(ns.rate or "1gbit")
