"""Emulated ranks that vary as real ones do (`--skew none|auto|FILE`).

A real job waits for its slowest rank: every collective starts when the last rank
enters it, and ranks enter at different times because their compute varies. Emulated
ranks that always enter on time make an emulated run fast (an all-real Lightning job
at W = 2 here: steps of 7.7 to 18.5 ms, median 12.5; emulated, 8.3 ms with no spread).
Under skew each emulated rank enters each ring or one-message collective late by a
delay drawn, per rank and per instance, from a distribution (`schedules.timing.Entry`):

- `none`: no draws; today's timing exactly (the default);
- `FILE`: the distribution is the file's delays, in milliseconds (whitespace or commas
  between them, `#` comments), e.g. the variation of a real run's ranks;
- `auto`: the real rank's own variation, measured during the run (in `simulate`, in the
  recorded run: `Skew.recorded`). A collective of an iteration is named by its group,
  kind and bytes and by how many of that name came before it since the real rank's last
  optimizer step (DDP's buckets of one size, a scalar allreduce per logged metric). The
  time between the real rank's entries into the same collective in successive iterations
  is one sample of its iteration; a sample's excess over the least of that collective's
  recent samples is one draw. An instance's draws are shifted down by the real rank's own
  excess this time: the emulated ranks are late relative to it. Without optimizer steps
  (no observer) no collective recurs, and auto draws nothing.

The draws are seeded (`seed`, and the instance's key), so a run is repeatable.
"""

from __future__ import annotations

import zlib
from collections import deque
from pathlib import Path

from neuronabox.errors import NeuronaBoxError
from neuronabox.limits import read_bounded
from neuronabox.schedules.timing import Entry

MAX_FILE_BYTES = 1 << 20
MAX_DRAWS = 4096  # a file's distribution is kept whole up to this many delays
WINDOW = 32  # auto: the samples kept per recurring collective
POOL = 256  # auto: the draws kept over all of them
MAX_DELAY_S = 60.0


class SkewError(NeuronaBoxError, ValueError):
    """A --skew the run cannot use; the message says what."""


def read_delays(path: str) -> tuple[float, ...]:
    """A file's delays in seconds (written in ms)."""
    if not Path(path).is_file():
        raise SkewError(f"--skew {path}: no such file (give none, auto or a file of delays in ms)")
    try:
        text = read_bounded(path, MAX_FILE_BYTES, "--skew file").decode(errors="replace")
    except (OSError, ValueError) as exc:
        raise SkewError(f"--skew {path}: {exc}") from None
    values = []
    for line in text.splitlines():
        for word in line.split("#", 1)[0].replace(",", " ").split():
            try:
                values.append(float(word) / 1e3)
            except ValueError:
                raise SkewError(f"--skew {path}: {word!r} is not a delay in ms") from None
    if not values:
        raise SkewError(f"--skew {path}: no delays in it")
    if any(not 0 <= v <= MAX_DELAY_S for v in values):
        raise SkewError(f"--skew {path}: delays are 0 to {MAX_DELAY_S * 1e3:g} ms")
    return tuple(values[:MAX_DRAWS])


def checked_spec(spec: str | None) -> str:
    """--skew as a run passes it on: none, auto, or a file of delays checked now and named
    by its absolute path (the controller reads it from another folder)."""
    if spec is None or spec in ("none", "auto"):
        return spec or "none"
    read_delays(spec)
    return str(Path(spec).resolve())


class Skew:
    """Where the emulated ranks' drawn entry delays come from. `mode`: none; auto; or
    fixed: the draws given (a file's, or those a recorded run pooled: `recorded`)."""

    def __init__(self, mode: str = "none", draws: tuple[float, ...] = (), seed: int = 0) -> None:
        self.mode = mode
        self.draws = draws
        self.seed = seed
        self._stepped = False  # auto: an optimizer step came (before it, no collective has a place to recur in)
        self._last: dict[tuple, float] = {}  # auto: a collective of the iteration -> the real rank's last entry
        self._seen: dict[tuple, int] = {}  # auto: (group, kind, bytes) -> how many since the last step
        self._samples: dict[tuple, deque[float]] = {}
        self._pool: deque[float] = deque(maxlen=POOL)

    @classmethod
    def parse(cls, spec: str | None, seed: int = 0) -> Skew:
        spec = spec or "none"
        if spec in ("none", "auto"):
            return cls(spec, seed=seed)
        return cls("fixed", read_delays(spec), seed)

    def entry(self, t0: float, stragglers: dict[int, float], key: tuple, instance: str) -> Entry:
        """The entry of one instance that the real rank entered at `t0`: `key` names its
        recurring collective (group, kind, bytes), `instance` the instance itself (its seed)."""
        if self.mode == "none":
            return Entry(t0, stragglers)
        shift = 0.0
        draws = self.draws
        if self.mode == "auto" and self._stepped:  # keyed by place in the iteration: bounded by one iteration's
            k = self._seen.get(key, 0)
            self._seen[key] = k + 1
            shift = self._observe((*key, k), t0)
            draws = tuple(self._pool)
        if not draws:
            return Entry(t0, stragglers)
        return Entry(t0, stragglers, draws, shift, self.seed ^ zlib.crc32(instance.encode()))

    def on_step(self) -> None:
        """The real rank's optimizer stepped: an iteration begins (auto)."""
        self._stepped = True
        self._seen.clear()

    @classmethod
    def recorded(cls, entries: list[tuple[tuple, float]], steps: list[float], seed: int = 0) -> Skew:
        """`auto` for a replay: the draws a live run would have pooled from the real rank's
        recorded entries ((group, kind, bytes), entry time) and its optimizer steps, fixed."""
        skew = cls("auto", seed=seed)
        events = sorted([(t, 1, ()) for t in steps] + [(t, 0, key) for key, t in entries], key=lambda e: e[:2])
        for t, is_step, key in events:
            if is_step:
                skew.on_step()
            else:
                skew.entry(t, {}, key, "")
        return cls("fixed", tuple(skew._pool), seed)

    def _observe(self, key: tuple, t: float) -> float:
        """The real rank entered `key` at `t`: one more sample; its excess over the least
        recent sample of `key` is a draw, and the real rank's own lateness now."""
        last = self._last.get(key)
        self._last[key] = t
        if last is None or t <= last:
            return 0.0
        samples = self._samples.setdefault(key, deque(maxlen=WINDOW))
        samples.append(t - last)
        excess = samples[-1] - min(samples)
        if len(samples) > 1:
            self._pool.append(min(excess, MAX_DELAY_S))
        return excess
