"""Whose monotonic clock is whose: processes on one booted kernel share CLOCK_MONOTONIC
(`time.monotonic`), so a real rank's report of when something happened is on the
controller's clock exactly when both read the same boot id."""

from __future__ import annotations

BOOT_ID = "/proc/sys/kernel/random/boot_id"


def boot_id() -> str:
    """This host's boot id; empty where there is none to read (then no clock is shared)."""
    try:
        with open(BOOT_ID) as f:
            return f.read(64).strip()  # a UUID and its newline
    except OSError:
        return ""
