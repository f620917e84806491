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
  time between the real rank's entries into the same collective in successive iterations,
  less the time the draws themselves made it wait meanwhile (`waited`), is one sample of
  its iteration; a sample's excess over the least of that collective's recent samples is
  one draw. An instance's draws are shifted down by the real rank's own excess this time:
  the emulated ranks are late relative to it. Without optimizer steps (no observer) no
  collective recurs, and auto draws nothing.

Why `waited`: a real rank that waits for a late emulated peer has a longer iteration, and
sampled whole, that wait would come back as a larger draw, a larger wait, and so on: at
W = 2 the pool of an MLP grew from a median of 0.8 ms to 2.1 ms within a run, and its
emulated iteration came out 10% slow. Each instance's wait is the latest of its emulated
ranks' drawn entries after the real rank's own (`latest_entry`), which a ring's release
times follow.

The draws are seeded (`seed`, and the instance's key), so a run is repeatable.
"""

from __future__ import annotations

import zlib
from collections import deque
from pathlib import Path

from neuronabox.errors import NeuronaBoxError
from neuronabox.limits import read_bounded
from neuronabox.schedules.timing import Entry, drawn_skew

MAX_FILE_BYTES = 1 << 20
MAX_DRAWS = 4096  # a file's distribution is kept whole up to this many delays
WINDOW = 32  # auto: the samples kept per recurring collective
POOL = 256  # auto: the draws kept over all of them
MAX_DELAY_S = 60.0
EXACT_RANKS = 256  # `latest_entry` draws this many emulated ranks one by one; a larger world waits for the pool's max


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
        self._last: dict[tuple, tuple[float, float]] = {}  # auto: a collective of the iteration -> the real
        # rank's last entry, and `_waited` then
        self._waited = 0.0  # auto: how long the draws have made the real rank wait, all told
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

    def waited(self, entry: Entry, world: int, real: frozenset[int]) -> None:
        """An instance took `entry`'s drawn delays (a ring or a one-message collective; not
        broadcasts and barriers, which keep the undrawn entry): the real rank waits for the
        latest of the emulated ranks, which is not its own iteration's work (auto)."""
        if self.mode == "auto" and entry.draws:
            self._waited += latest_entry(entry, world, real)

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
        self._last[key] = (t, self._waited)
        if last is None or t <= last[0]:
            return 0.0
        samples = self._samples.setdefault(key, deque(maxlen=WINDOW))
        samples.append(max(0.0, t - last[0] - (self._waited - last[1])))
        excess = samples[-1] - min(samples)
        if len(samples) > 1:
            self._pool.append(min(excess, MAX_DELAY_S))
        return excess


def latest_entry(entry: Entry, world: int, real: frozenset[int]) -> float:
    """How long after the real rank the latest emulated rank of a `world` enters (drawn skew
    only): each emulated rank's draw up to EXACT_RANKS of them, else the pool's largest less
    the shift (with that many ranks drawing, some rank draws it)."""
    if world - len(real) > EXACT_RANKS:
        return max(0.0, max(entry.draws) - entry.shift)
    emulated = (r for r in range(world) if r not in real)
    return max((drawn_skew(entry.draws, entry.shift, entry.seed, r) for r in emulated), default=0.0)
