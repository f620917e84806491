"""Emulated ranks that vary as real ones do (`--skew none|auto|FILE`).

A real job waits for its slowest rank: every collective starts when the last rank
enters it, and ranks enter at different times because their compute varies. Emulated
ranks that always enter on time make an emulated run fast (an all-real Lightning job
at W = 2 here: steps of 7.7 to 18.5 ms, median 12.5; emulated, 8.3 ms with no spread).
Under skew each emulated rank enters each collective late by a delay drawn, per rank and
per instance, from a distribution (`schedules.timing.Entry`):

- `none`: no draws; the emulated ranks enter with the real rank (the NCCL relay's only
  mode: it does not draw yet);
- `FILE`: the distribution is the file's delays, in milliseconds (whitespace or commas
  between them, `#` comments), e.g. the variation of a real run's ranks;
- `auto` (the default of a Gloo run): the real rank's own variation, measured during the
  run (in `simulate`, in the recorded run: `Skew.recorded`). A collective of an iteration (a place) is named by its
  group, kind and bytes and by how many of that name came before it since the real
  rank's last optimizer step (DDP's buckets of one size, a scalar allreduce per logged
  metric). Every rank is held up by each collective until the last one is in, so what
  makes a rank late at a place is what it did since the real rank's last collective
  ended: its **gap** (the time from that end to its entry) and, as the collective runs,
  its stalls inside it. At each place, the real rank's gap in excess of the least of its
  recent gaps there, plus its stall there the iteration before (the collective's span,
  less the wait its draws made, in excess of the place's usual span, the median of its
  recent ones, when past their ordinary spread), is one draw; the time the emulator's own work held the real rank (its
  observer's flight-recorder dumps) is left out of the gaps. An instance
  draws from its place's own recent draws (from the pool of every place's until it has
  PLACE_DRAWS): a collective entered right after a blocking one finds its ranks in step,
  another after a variable stretch of compute does not. The draws are shifted down by
  the real rank's own gap excess this time: the emulated ranks are late relative to it,
  and its own stall comes by itself. Without optimizer steps (no observer) no
  collective recurs, and auto draws nothing.

A collective entered while the real rank's previous one is still in flight (DDP's second
bucket, launched as the first is reduced) has no gap of its own: each emulated rank enters
it as late as it entered the one in flight, the same draw carried over (the rank goes on
with the same backward pass), where a fresh draw per instance made the step wait for the
largest of several independent draws (a model of a DDP step, tests/test_skew.py: 3.9%
slow against two real ranks, 0.3% fast with the entry carried). A live run learns of a
natively started book's end only when Python adopts it, so the core tells each native
start whether a book it started is still running, and when the latest of them ended
(`entry`'s `started`).

Why a span's excess over the usual, not over the least: a span's ordinary spread is what
both ranks see alike, not a stall of one. A DDP bucket's transfer shares the rank's core
with the rest of the backward pass, on every rank at once; drawn again as the emulated
rank's lateness it was counted twice. Measured on all-real runs at W = 2
(`scripts/bench_skew_lateness.py`: the second rank's entry lateness from PyTorch's flight
recorder), draws with the excess over the least summed to 1.2x to 3.9x the real lateness
on the six workloads of docs/fidelity.md, with the median 1.0x to 3.2x; interleaved
against all-real, the six's errors averaged +5.6% with the least and +1.7% with the median
(noisy: docs/fidelity.md, "A stall is a span past the usual"). So only a span past the
usual by more than SPREADS robust deviations is a stall (`stall_of`): a rare one (a
wake-up left to the next tick) is, and drawn (tests/test_skew.py).

Why some gaps are not drawn: a gap far past its place's usual (`event_cut`: by SPREADS
robust deviations and EVENT_MIN_S) is an event every rank has at that step, an epoch's
end, a logger's flush, the real-time class's throttling. Drawn, the emulated ranks were
late by it at other steps (Lightning's one 40 ms gap drew 38 ms three times in a run,
1.3 ms a broadcast against 0.005 ms between two real ranks; docs/fidelity.md, "Shared
events"); such a gap draws the place's usual excess, and shifts by it.

Why gaps: an earlier version sampled the real rank's whole period from entry to entry.
Its waits for late emulated peers then came back as larger draws (at W = 2 the MLP came
out 10% slow), and with several collectives an iteration each place drew a whole
iteration's variation (a model of 4 collectives an iteration came out 5% to 13% slow
against two ranks of its kind; `tests/test_timing.py` plays both). Why places draw their
own: with one pool, a collective entered in step (an iteration's first allgather, right
after the last one's reduce) drew the others' variation, 1.5% to 8% slow in the models.

The draws are seeded (`seed`, and the instance's key), so a run is repeatable.
"""

from __future__ import annotations

import math
import zlib
from collections import deque
from collections.abc import Iterator
from pathlib import Path

from neuronabox.errors import NeuronaBoxError
from neuronabox.limits import read_bounded
from neuronabox.schedules.timing import Entry, drawn_skew

MAX_FILE_BYTES = 1 << 20
MAX_DRAWS = 4096  # a file's distribution is kept whole up to this many delays
WINDOW = 32  # auto: the samples kept per recurring collective
POOL = 256  # auto: the draws kept over all of them
PLACE_DRAWS = 4  # auto: a place draws from its own samples once it has this many, before from the pool
MAX_DELAY_S = 60.0
MAX_OPEN = 4096  # auto: instances entered and not yet ended, kept for their spans
MAX_PLACES = 4096  # auto: places observed (an iteration longer than this draws its later ones from the pool)
MAX_HELD = 64  # auto: the emulator's holds on the real rank kept until the gap they fell in is taken
DEFAULT = "auto"  # closer to all-real than none: 6 of 6 workloads at W = 2, 4 of 6 at W = 4 (docs/fidelity.md)
STALL_SPANS = 8  # auto: a place's spans before one can be told a stall (its usual and spread known)
SPREADS = 3.0  # auto: a stall, or a shared event, is past the usual by more than this many robust deviations
EVENT_GAPS = 5  # auto: a place's gaps before one can be told a shared event
EVENT_MIN_S = 10e-3  # auto: ...and by this much at least: longer than a tick or a timeslice holds one pinned rank
EXACT_RANKS = 16  # `latest_entry` draws this many emulated ranks one by one (189 us at 256: on the loop)


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
    """--skew as a run passes it on: none, auto (also when not given: DEFAULT), or a file of
    delays checked now and named by its absolute path (the controller reads it from another
    folder)."""
    if spec is None or spec in ("none", "auto"):
        return spec or DEFAULT
    read_delays(spec)
    return str(Path(spec).resolve())


class Skew:
    """Where the emulated ranks' drawn entry delays come from. `mode`: none; auto; or
    fixed: the draws given (a file's, or those a recorded run pooled: `recorded`)."""

    def __init__(
        self,
        mode: str = "none",
        draws: tuple[float, ...] = (),
        seed: int = 0,
        replay: dict[tuple, deque[tuple[float, ...]]] | None = None,
    ) -> None:
        self.mode = mode
        self.draws = draws
        self.seed = seed
        self._stepped = False  # auto: an optimizer step came (before it, no collective has a place to recur in)
        self._seen: dict[tuple, int] = {}  # auto: (group, kind, bytes) -> how many since the last step
        self._end: float | None = None  # auto: when the real rank's latest collective ended
        self._gaps: dict[tuple, deque[float]] = {}  # auto: place -> the real rank's recent gaps there
        self._spans: dict[tuple, deque[float]] = {}  # auto: place -> its recent spans there, less drawn waits
        self._stalls: dict[tuple, float] = {}  # auto: place -> its last span's excess over the usual there
        # auto: place -> its gaps' usual excess over their least, and the excess past which a gap is an
        # event every rank shares (`event_cut`, worked out off the start's path)
        self._cuts: dict[tuple, tuple[float, float]] = {}
        # auto: instance -> (place, its entry, the group's world and real ranks): its drawn wait is
        # reckoned when it ends, off the start's path (a native start waits for `entry`)
        self._open: dict[str, tuple[tuple, Entry, int, frozenset[int]]] = {}
        self._pool: deque[float] = deque(maxlen=POOL)
        self._drawn: dict[tuple, deque[float]] = {}  # auto: place -> its own recent draws
        self._replay = replay or {}  # recorded: key -> each instance's draws, in order
        self._last: tuple[str, Entry] | None = None  # the latest instance entered, and its entry
        self._last_end: float | None = None  # when it ended (None: not yet, as far as told)
        self._held: deque[tuple[float, float, float]] = deque(maxlen=MAX_HELD)  # auto: the emulator's work, its share

    @classmethod
    def parse(cls, spec: str | None, seed: int = 0) -> Skew:
        spec = spec or "none"
        if spec in ("none", "auto"):
            return cls(spec, seed=seed)
        return cls("fixed", read_delays(spec), seed)

    def entry(
        self,
        t0: float,
        stragglers: dict[int, float],
        key: tuple,
        instance: str,
        world: int = 0,
        real: frozenset[int] = frozenset(),
        hold_real: bool = False,
        started: float | None = None,
    ) -> Entry:
        """The entry of one instance that the real rank entered at `t0`: `key` names its
        recurring collective (group, kind, bytes), `instance` the instance itself (its seed).
        `world` and `real`: the group's (0: no emulated rank's entry is waited for).
        `hold_real`: the collective starts at `t0` for the real ranks too (Entry.hold_real).
        `started`: a native start's word on the books the core started that Python has not
        adopted (their ends not told yet): inf while one runs, else the latest end among
        them; None or negative, none such."""
        if self.mode == "none":
            return Entry(t0, stragglers, hold_real=hold_real)
        carried = self._in_flight(t0, started)
        shift, draws, place = 0.0, self.draws, None
        if self.mode == "auto" and self._stepped:  # keyed by place in the iteration: bounded by one iteration's
            k = self._seen.get(key, 0)
            self._seen[key] = k + 1
            place = (*key, k)
            if place in self._spans or max(len(self._spans), len(self._gaps)) < MAX_PLACES:
                shift = 0.0 if carried is not None else self._observe(place, t0)
            else:  # a step that never comes again (an endless evaluation loop): not observed
                place = None
            own = self._drawn.get(place, ())
            draws = tuple(own if len(own) >= PLACE_DRAWS else self._pool)
        elif self._replay.get(key):
            draws = self._replay[key].popleft()
        if carried is not None:  # the emulated ranks enter as late as they entered the one in flight
            entry = Entry(t0, stragglers, carried.draws, carried.shift, carried.seed, hold_real)
        else:
            seed = self.seed ^ zlib.crc32(instance.encode()) if draws else 0
            entry = Entry(t0, stragglers, draws, shift if draws else 0.0, seed, hold_real)
        self._last, self._last_end = (instance, entry), None
        if place is not None:
            self._open[instance] = (place, entry, world, real)
            if len(self._open) > MAX_OPEN:  # an instance that never ended
                del self._open[next(iter(self._open))]
        return entry

    def _in_flight(self, t0: float, started: float | None) -> Entry | None:
        """The entry of the collective the real rank still had in flight as it entered at
        `t0` (the latest one entered, not ended by then), or None."""
        if self._last is None:
            return None
        if started is not None and started >= 0:  # the latest entered is a book Python has not adopted
            if math.isinf(started):
                return self._last[1]
            self._end = started if self._end is None else max(self._end, started)
            return None
        end = self._last_end
        return self._last[1] if end is None or end > t0 else None

    def ended(self, instance: str, t: float, lag: float = 0.0) -> None:
        """The real rank's last message of `instance` crossed at `t`: whether a collective
        entered later found it in flight; under auto the next gap starts here, and the
        instance's span, less the wait its draws made and the emulator's own `lag` (its
        latest send's, past release and inputs), is a sample of the real rank's stalls at
        its place, and its excess over the place's usual span (their median), when past
        their ordinary spread, is the stall the place's next draw adds. A span with the lag
        in it would draw the emulator's lateness again, as the emulated ranks' the next
        iteration. The place's gaps so far give the cut past which its next gap is an event
        every rank shares (`event_cut`)."""
        if self._last is not None and self._last[0] == instance:
            self._last_end = t
        if self.mode != "auto":
            return
        self._end = t if self._end is None else max(self._end, t)
        opened = self._open.pop(instance, None)
        if opened is None:
            return
        place, entry, world, real = opened
        waited = latest_entry(entry, world, real) if entry.draws and world else 0.0
        spans = self._spans.setdefault(place, deque(maxlen=WINDOW))
        spans.append(max(0.0, t - entry.t0 - waited - lag))
        self._stalls[place] = stall_of(spans)  # off the start's path
        cut = event_cut(self._gaps.get(place, ()))
        if cut is not None:
            self._cuts[place] = cut

    def held(self, start: float, end: float, cpu: float) -> None:
        """The emulator's own work used `cpu` seconds of the real rank's core between `start`
        and `end` (its observer's flight-recorder dump, told by the observer): auto leaves
        that out of the gap it fell in, spread evenly over the window (in
        it the rank's threads ran whenever the observer's waited for the GIL). It is not the
        rank's variation: an all-real rank never does it, and drawn as the emulated ranks'
        lateness it was paid twice (docs/fidelity.md, "The observer's dumps")."""
        if self.mode == "auto" and end > start:
            share = min(max(cpu / (end - start), 0.0), 1.0)
            self._held.append((start, end, share))

    def _held_within(self, since: float, t: float) -> float:
        """The emulator's hold on the real rank between `since` and `t`; holds that ended
        before `since` are let go (gaps start at ever later ends)."""
        held = self._held
        while held and held[0][1] <= since:
            held.popleft()
        return sum(max(0.0, min(end, t) - max(start, since)) * share for start, end, share in held)

    def on_step(self) -> None:
        """The real rank's optimizer stepped: an iteration begins (auto)."""
        self._stepped = True
        self._seen.clear()

    @classmethod
    def recorded(
        cls,
        entries: list[tuple[tuple, float, float, float]],
        steps: list[float],
        seed: int = 0,
        held: list[tuple[float, float, float]] = (),
    ) -> Skew:
        """`auto` for a replay: the draws a live run would have made from the real rank's
        recorded collectives ((group, kind, bytes), entry, end, the emulator's lag), its
        optimizer steps and the emulator's holds on it, fixed:
        each instance of a key, in order, draws from what its place had then; past them (a
        replay of another program), from the pool."""
        skew = cls("auto", seed=seed)
        replay: dict[tuple, deque[tuple[float, ...]]] = {}
        for i, entry in skew.replayed(entries, steps, held):
            replay.setdefault(entries[i][0], deque()).append(entry.draws)
        return cls("fixed", tuple(skew._pool), seed, replay)

    def replayed(
        self,
        entries: list[tuple[tuple, float, float, float]],
        steps: list[float],
        held: list[tuple[float, float, float]] = (),
    ) -> Iterator[tuple[int, Entry]]:
        """Feed this skew a recorded real rank's collectives (as `recorded` takes them),
        optimizer steps and the emulator's holds on it ((start, end, cpu), told as each ends) in
        time order, as a live run would, and yield each collective's index with the entry
        it drew. No group's world is given: a recording's spans hold the waits its own run
        made, none of these draws'."""
        events = [(t, 1, -1) for t in steps] + [(h[1], 1, j) for j, h in enumerate(held)]
        for i, (_, start, end, _) in enumerate(entries):
            events += [(start, 2, i), (end, 0, i)]  # at one time: an end, a step or hold, then an entry
        for t, what, i in sorted(events):
            if what == 1 and i >= 0:
                self.held(*held[i])
            elif what == 1:
                self.on_step()
            elif what == 2:
                yield i, self.entry(t, {}, entries[i][0], str(i))
            else:
                self.ended(str(i), t, entries[i][3])

    def _observe(self, place: tuple, t: float) -> float:
        """The real rank entered `place` at `t`: its gap since its last collective ended is
        one more sample; the gap's excess over the least recent one, plus the place's last
        stall (`ended`), is a draw; the excess alone is the real rank's own lateness now."""
        if self._end is None or t <= self._end:
            return 0.0  # entered while one was in flight (DDP's buckets): no gap of its own
        gaps = self._gaps.setdefault(place, deque(maxlen=WINDOW))
        gaps.append(t - self._end - (self._held_within(self._end, t) if self._held else 0.0))
        excess = gaps[-1] - min(gaps)
        cut = self._cuts.get(place)
        if cut is not None and excess > cut[1]:  # an event every rank has (an epoch's end): no rank late for it
            excess = cut[0]
        if len(gaps) > 1:
            draw = min(excess + self._stalls.get(place, 0.0), MAX_DELAY_S)
            self._pool.append(draw)
            self._drawn.setdefault(place, deque(maxlen=WINDOW)).append(draw)
        return excess


def sorted_median(xs: list[float]) -> float:
    """The median of `xs`, already sorted (the ends' statistics sort once, off the start's path)."""
    half = len(xs) // 2
    return xs[half] if len(xs) % 2 else (xs[half - 1] + xs[half]) / 2


def robust_spread(xs: deque[float] | list[float], usual: float) -> float:
    """The spread of `xs` around `usual` as a standard deviation would read it, from their
    median absolute deviation: one outlier does not move it."""
    return 1.4826 * sorted_median(sorted([abs(x - usual) for x in xs]))


def event_cut(gaps: deque[float] | list[float]) -> tuple[float, float] | None:
    """(The place's usual gap excess over the least, the excess past which a gap is an event
    every rank shares), or None before EVENT_GAPS gaps. A gap past its place's usual by more
    than SPREADS robust deviations and EVENT_MIN_S is the program's doing, not one rank's
    variation: an epoch's end, a logger's flush, a collection at the same allocation count
    come at the same step on every rank, and the real-time class's throttling in the same
    second (docs/fidelity.md, "Shared events"). A scheduler holds one pinned rank for a tick
    or a timeslice at most: less than EVENT_MIN_S, still drawn. Drawn, such a gap made the
    emulated ranks late by it at other steps; taken as the real rank's own lateness, it
    made them early by it at this one. So it counts as a usual gap. About 3 us, on `ended`."""
    if len(gaps) < EVENT_GAPS:
        return None
    ordered = sorted(gaps)
    usual, least = sorted_median(ordered), ordered[0]
    return usual - least, usual - least + max(SPREADS * robust_spread(gaps, usual), EVENT_MIN_S)


def stall_of(spans: deque[float] | list[float]) -> float:
    """The stall in a place's latest span: its excess over the place's usual span (the
    median of its recent ones) when that excess is past their ordinary spread (SPREADS
    robust deviations), else none. The ordinary spread is both ranks' alike; an outlier (a
    wake-up left to the next scheduler tick) is one rank's. Needs STALL_SPANS spans."""
    if len(spans) < STALL_SPANS:
        return 0.0
    usual = sorted_median(sorted(spans))
    excess = spans[-1] - usual
    if excess <= 0.0:
        return 0.0
    return excess if excess > SPREADS * robust_spread(spans, usual) else 0.0


def latest_entry(entry: Entry, world: int, real: frozenset[int]) -> float:
    """How long after the real rank the latest emulated rank of a `world` enters (drawn skew
    only): each emulated rank's draw up to EXACT_RANKS of them (1.6 us at one, 12 us at 16 on
    this VM, on the loop as each instance ends; a native start waits for `entry` and not for
    this: 8.2 us to 6.6 us a drawn start, warm); beyond, the expected largest of that many picks
    from the pool, its m/(m+1) quantile (the pool's largest as the world grows)."""
    m = world - len(real)
    if m > EXACT_RANKS:
        ranked = sorted(entry.draws)
        return max(0.0, ranked[min(len(ranked) - 1, len(ranked) * m // (m + 1))] - entry.shift)
    emulated = (r for r in range(world) if r not in real)
    return max((drawn_skew(entry.draws, entry.shift, entry.seed, r) for r in emulated), default=0.0)
