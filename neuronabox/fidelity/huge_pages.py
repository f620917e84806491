"""`validate --huge-pages`: every process of both runs allocates on transparent huge pages.

A job's speed on a VM depends on where its heap's 4 KiB pages land: a CNN's step ran 23%
faster with its tensors on 2 MiB pages (13.4 against 17.4 ms, 12 launches a side), and a
fresh launch keeps its placement for its whole life. glibc's `glibc.malloc.hugetlb=1`
tunable (glibc 2.35 on) madvises malloc's memory for transparent huge pages, which the
kernel honours under THP `madvise` or `always`: it lets a validation run the job as a host
with THP `always` would, both runs alike. Off by default: it changes the job's own speed,
and on this machine it did not narrow the comparison (docs/fidelity.md, "Huge pages").
"""

from __future__ import annotations

import os
from pathlib import Path

from neuronabox.limits import read_bounded

TUNABLE = "glibc.malloc.hugetlb"
SETTING = f"{TUNABLE}=1"
THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")
GLIBC_WITH_TUNABLE = (2, 35)


def problem(thp: Path = THP_ENABLED) -> str | None:
    """Why huge pages cannot be had here (a line), or None."""
    try:
        mode = read_bounded(thp, 4096, "THP setting").decode(errors="replace")
    except (OSError, ValueError):
        return f"this kernel has no transparent huge pages ({thp} unreadable)"
    if "[never]" in mode:
        return f"transparent huge pages are off ({thp}: never)"
    libc, _, version = (os.confstr("CS_GNU_LIBC_VERSION") or "").partition(" ")
    parts = tuple(int(x) for x in version.split(".")[:2] if x.isdigit())
    if libc != "glibc" or parts < GLIBC_WITH_TUNABLE:
        return f"this C library ({libc or 'unknown'} {version}) has no {TUNABLE} tunable (glibc 2.35 or later has)"
    return None


def with_huge_pages(env: dict[str, str]) -> dict[str, str]:
    """`env` whose processes' malloc asks for huge pages; a tunable list the user set is
    kept, and their own `glibc.malloc.hugetlb` wins."""
    given = env.get("GLIBC_TUNABLES", "")
    if any(item.split("=", 1)[0] == TUNABLE for item in given.split(":") if item):
        return env
    return dict(env, GLIBC_TUNABLES=":".join(filter(None, [given, SETTING])))
