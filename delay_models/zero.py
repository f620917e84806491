"""The zero-delay model: the emulated network is infinitely fast."""

from __future__ import annotations


class ZeroDelay:
    name = "zero"

    def message_time(self, src: int, dst: int, nbytes: int) -> float:
        return 0.0

    def collective_time(self, kind: str, nbytes: int, world: int) -> float:
        return 0.0
