"""`validate --huge-pages [transparent|reserved]`: every process of both runs allocates on
2 MiB pages.

A job's speed on a VM depends on where its heap's pages land, and a fresh launch keeps
its placement for its whole life: the same CNN launched twelve times ran its step in
26.9 to 31.6 ms (sd 4.6%), which is what keeps validate's error from resolving 2% at five
repetitions. glibc's `glibc.malloc.hugetlb` tunable (glibc 2.35 on) puts malloc's memory
on huge pages two ways:

- `transparent` (hugetlb=1) madvises it for transparent huge pages, which the kernel
  honours under THP `madvise` or `always`. Each launch gets fresh pages from the buddy
  allocator, wherever they are: the CNN's step 23% faster, its spread no narrower.
- `reserved` (hugetlb=2) maps it from the hugetlb pool (`vm.nr_hugepages`). The pool's
  pages are set aside once and handed out again launch after launch, so every launch
  runs on much the same physical memory: the CNN's step in 23.3 to 24.3 ms (sd 1.2%),
  the GPT's sd 3.2% to 1.4% (docs/fidelity.md, "Reserved huge pages").

Both runs alike, off by default: it changes the job's own speed. The pool is the
machine's (root sets it); validate checks it has pages free, watches the fewest free
while it runs, and says so if it ran dry (malloc then falls back to 4 KiB pages without
a word).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from neuronabox.limits import read_bounded

TUNABLE = "glibc.malloc.hugetlb"
MODES = {"transparent": "1", "reserved": "2"}  # --huge-pages MODE -> the tunable's value
THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")
MEMINFO = Path("/proc/meminfo")
GLIBC_WITH_TUNABLE = (2, 35)
MEMINFO_BYTES = 64 << 10


def problem(mode: str = "transparent", thp: Path = THP_ENABLED, meminfo: Path = MEMINFO) -> str | None:
    """Why `mode`'s huge pages cannot be had here (a line), or None."""
    if mode not in MODES:
        return f"huge pages are {' or '.join(MODES)}, got {mode!r}"
    if mode == "transparent":
        try:
            setting = read_bounded(thp, 4096, "THP setting").decode(errors="replace")
        except (OSError, ValueError):
            return f"this kernel has no transparent huge pages ({thp} unreadable)"
        if "[never]" in setting:
            return f"transparent huge pages are off ({thp}: never)"
    else:
        pool = Pool.read(meminfo)
        if pool is None:
            return f"this kernel has no hugetlb pool ({meminfo} names none)"
        if pool.available == 0:
            return (f"no reserved huge pages are free ({pool}); reserve a pool first, "
                    "e.g. `sysctl -w vm.nr_hugepages=1024` (2 GiB of 2 MiB pages)")  # fmt: skip
    libc, _, version = (os.confstr("CS_GNU_LIBC_VERSION") or "").partition(" ")
    parts = tuple(int(x) for x in version.split(".")[:2] if x.isdigit())
    if libc != "glibc" or parts < GLIBC_WITH_TUNABLE:
        return f"this C library ({libc or 'unknown'} {version}) has no {TUNABLE} tunable (glibc 2.35 or later has)"
    return None


def with_huge_pages(env: dict[str, str], mode: str = "transparent") -> dict[str, str]:
    """`env` whose processes' malloc asks for `mode`'s huge pages; a tunable list the
    user set is kept, and their own `glibc.malloc.hugetlb` wins."""
    given = env.get("GLIBC_TUNABLES", "")
    if any(item.split("=", 1)[0] == TUNABLE for item in given.split(":") if item):
        return env
    return dict(env, GLIBC_TUNABLES=":".join(filter(None, [given, f"{TUNABLE}={MODES[mode]}"])))


@dataclass(frozen=True)
class Pool:
    """The hugetlb pool of the default page size, as /proc/meminfo gives it (pages)."""

    total: int
    free: int
    reserved: int  # free pages a mapping has claimed but not touched yet

    @property
    def available(self) -> int:
        """Pages no mapping has claimed: free ones less those promised to a mapping already."""
        return max(0, self.free - self.reserved)

    def __str__(self) -> str:
        return f"{self.available} of {self.total} pages free"

    @classmethod
    def read(cls, meminfo: Path = MEMINFO) -> Pool | None:
        """None where the kernel has no hugetlb pool (or the file cannot be read)."""
        try:
            text = read_bounded(meminfo, MEMINFO_BYTES, "meminfo").decode(errors="replace")
        except (OSError, ValueError):
            return None
        fields = {}
        for line in text.splitlines():
            name, _, value = line.partition(":")
            if name.startswith("HugePages_") and value.split() and value.split()[0].isdigit():
                fields[name] = int(value.split()[0])
        if not {"HugePages_Total", "HugePages_Free", "HugePages_Rsvd"} <= fields.keys():
            return None
        return cls(fields["HugePages_Total"], fields["HugePages_Free"], fields["HugePages_Rsvd"])


class PoolWatch:
    """The fewest pool pages free while validate's runs ran: sampled as it polls them."""

    def __init__(self, meminfo: Path = MEMINFO) -> None:
        self.meminfo = meminfo
        self.fewest: int | None = None
        self.total = 0
        self.ran_dry: list[str] = []  # the runs during which no page was free

    def sample(self, run: str) -> None:
        pool = Pool.read(self.meminfo)
        if pool is None:
            return
        self.total = pool.total
        self.fewest = pool.available if self.fewest is None else min(self.fewest, pool.available)
        if pool.available == 0 and run not in self.ran_dry:
            self.ran_dry.append(run)

    def lines(self) -> list[str]:
        """The report's lines on the pool."""
        if self.fewest is None:
            return []
        out = [f"  the hugetlb pool: {self.fewest} of {self.total} pages free at the fewest"]
        if self.ran_dry:
            out.append(
                f"  the pool ran dry during {', '.join(self.ran_dry)}: some memory fell back to 4 KiB pages, "
                "so those runs' pages differ; reserve more (vm.nr_hugepages)"
            )
        return out
