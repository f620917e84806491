"""Whose monotonic clock is whose: processes on one booted kernel share CLOCK_MONOTONIC
(`time.monotonic`), unless a time namespace offsets it, so a real rank's report of when
something happened is on the controller's clock exactly when both read the same id:
the boot id and the namespace's monotonic offset."""

from __future__ import annotations

BOOT_ID = "/proc/sys/kernel/random/boot_id"
TIMENS_OFFSETS = "/proc/self/timens_offsets"


def clock_id(boot_path: str = BOOT_ID, offsets_path: str = TIMENS_OFFSETS) -> str:
    """This process's monotonic clock, named: `<boot id>` or `<boot id>+<s>.<ns>` in a time
    namespace that offsets it; empty where there is no boot id to read (then no clock is
    shared). A kernel without time namespaces has no offsets file: no offset."""
    try:
        with open(boot_path) as f:
            boot = f.read(64).strip()  # a UUID and its newline
    except OSError:
        return ""
    return boot + monotonic_offset(offsets_path) if boot else ""


def monotonic_offset(path: str = TIMENS_OFFSETS) -> str:
    """`+<s>.<ns>` when this process's time namespace moves CLOCK_MONOTONIC, else ''."""
    try:
        with open(path) as f:
            text = f.read(256)  # two short lines: monotonic and boottime
    except OSError:
        return ""
    for line in text.splitlines():
        fields = line.split()
        if fields[:1] == ["monotonic"] and any(v.strip("0") for v in fields[1:]):  # the kernel names the clocks
            return "+" + ".".join(fields[1:])
    return ""
