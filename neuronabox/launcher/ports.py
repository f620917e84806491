"""The store's port: picked by the launcher seconds before a process binds it, so it is
chosen outside the kernel's ephemeral range, where no outgoing connection can take it
in between. Its own module because the launcher, validate, calibrate and the benchmark
scripts all pick ports this way."""

from __future__ import annotations

import random
import socket

from neuronabox.limits import read_bounded

STORE_PORTS = (20000, 32768)  # below Linux's default ephemeral range


def ephemeral_range() -> tuple[int, int]:
    """The ports the kernel hands out to outgoing connections (Linux's, else its default)."""
    try:
        low, high = read_bounded("/proc/sys/net/ipv4/ip_local_port_range", 64).split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port(host: str = "127.0.0.1", rng: random.Random | None = None) -> int:
    """A port that nothing listens on now and that the kernel will not hand out to an
    outgoing connection before the store binds it: the store binds seconds later (after
    its process imports torch), and a port from the ephemeral range can be taken in
    between by any connect() on the machine (CI saw EADDRINUSE)."""
    rng = rng or random.Random()
    low, high = ephemeral_range()
    candidates = [p for p in range(*STORE_PORTS) if not low <= p <= high]
    for port in rng.sample(candidates, min(64, len(candidates))):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # every candidate taken: fall back to the kernel's choice
        s.bind((host, 0))
        return s.getsockname()[1]
