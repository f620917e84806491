"""The real ranks' own work per message, measured during the run (issue 25, 6a).

A preset topology charges emulated ranks nothing for the software a rank runs per
message (Gloo's calls, the copy, the reduction), so on it the model is faster than
any real rank and every small collective "misses" it; worse, a what-if that delays
the emulated ranks is hidden behind the real rank's own slower pace. The meter
closes that gap from the run itself: in each finished ring instance the native book
times the real ranks' turnarounds (a send notice after the controller's latest write
to that rank), and the schedule says how many bytes a message of it reduces. The
fit is the `HostWork` that explains those times, and the run charges it to the
emulated ranks from then on: they keep the real rank's pace, and the model column
carries the same software cost the real rank pays.

A turnaround, not the instance's span less the model: the span of a rank that waits
for emulated ranks charged the work includes that wait, and a meter reading it would
feed its own charge back into the next fit.

Pure and time-free: samples in, a `HostWork` out.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

from neuronabox.topology import HostWork

SAMPLES_KEPT = 512  # the most recent samples the fit reads (a run's work drifts; memory stays bounded)
FIRST_FIT = 8  # samples before the first charge
REFIT_EVERY = 16  # new samples between fits
TURNS_FOR_A_FIT = 256  # ...or this many turnarounds in at least 2 new samples (a large world's few instances)
MIN_PER_SHAPE = 3  # a shape's median needs this many samples to count in the fit
REFIT_MOVES = 0.02  # a refit that moves neither term by more than this keeps the charge (`moved`)


@dataclass(frozen=True)
class Sample:
    """One instance: `per_edge` seconds of the real ranks' own per unit of `messages`
    messages and `reduced` reduced bytes (a turnaround: one message, the bytes it reduces)."""

    messages: float
    reduced: float
    per_edge: float
    turns: int = 1  # the turnarounds it averages


class WorkMeter:
    def __init__(self) -> None:
        self._samples: deque[Sample] = deque(maxlen=SAMPLES_KEPT)
        self._since_fit = 0
        self._turns_since_fit = 0
        self.work: HostWork | None = None  # the latest fit; None until FIRST_FIT samples came
        self.count = 0  # samples taken in the run

    def add(self, sample: Sample) -> HostWork | None:
        """Takes one sample; returns a new fit when one is due (else None)."""
        if not (sample.messages > 0 and math.isfinite(sample.per_edge)):
            return None
        self._samples.append(sample)
        self.count += 1
        self._since_fit += 1
        self._turns_since_fit += sample.turns
        due = REFIT_EVERY if self.work is not None else FIRST_FIT
        many_turns = self._since_fit >= 2 and self._turns_since_fit >= TURNS_FOR_A_FIT
        if self._since_fit < due and not many_turns:
            return None
        self._since_fit = self._turns_since_fit = 0
        self.work = fit(self._samples)
        return self.work


def moved(charged: HostWork, fitted: HostWork) -> bool:
    """Whether a refit changes the charge: either term by more than REFIT_MOVES of the
    larger. A new charge reprices every later instance and drops the native starters
    (docs/architecture.md, "Native starts"), so a refit within the fit's own noise keeps
    the old one: a steady job keeps one charge, and its what-if windows compare alike."""
    pairs = ((charged.message, fitted.message), (charged.reduce_per_byte, fitted.reduce_per_byte))
    return any(abs(a - b) > REFIT_MOVES * max(a, b) for a, b in pairs)


def fit(samples) -> HostWork:
    """The HostWork whose per-edge cost (`messages * message + reduced * seconds per byte`)
    best explains each shape's median per-edge time, least squares over the shapes, both
    terms at least 0. The median per shape: a wake-up that waited a scheduler tick (4 ms
    on this VM) is one instance's outlier, not the rank's pace. One shape, or shapes that
    cannot tell the two terms apart, charge it all per message."""
    by_shape: dict[tuple[float, float], list[float]] = {}
    for s in samples:
        by_shape.setdefault((s.messages, s.reduced), []).append(s.per_edge)
    points = [(m, r, statistics.median(xs)) for (m, r), xs in by_shape.items() if len(xs) >= MIN_PER_SHAPE]
    if not points:  # every shape seen fewer times: one median over all of them, per message
        points = [(s.messages, s.reduced, s.per_edge) for s in samples]
    msg, per_byte = _least_squares(points)
    return HostWork(message=msg, reduce_bandwidth=1.0 / per_byte if per_byte > 0 else math.inf)


def _least_squares(points: list[tuple[float, float, float]]) -> tuple[float, float]:
    """(seconds per message, seconds per reduced byte), each at least 0."""
    smm = sum(m * m for m, _, _ in points)
    srr = sum(r * r for _, r, _ in points)
    smr = sum(m * r for m, r, _ in points)
    smy = sum(m * y for m, _, y in points)
    sry = sum(r * y for _, r, y in points)
    det = smm * srr - smr * smr
    if srr > 0 and det > 1e-12 * smm * srr:
        msg = (smy * srr - sry * smr) / det
        per_byte = (sry * smm - smy * smr) / det
        if msg >= 0 and per_byte >= 0:
            return msg, per_byte
        if msg < 0:  # all of it is the reduction
            return 0.0, max(0.0, sry / srr)
    per_msg = statistics.median(y / m for m, _, y in points)  # per message only
    return max(0.0, per_msg), 0.0


def trimmed_mean(xs: list[float], cut: float = 0.1) -> float:
    """The mean without the top `cut` of the values: a turnaround that waited a scheduler
    tick is a wake-up's outlier, not the rank's work; reducing and copying steps both count."""
    xs = sorted(xs)
    keep = xs[: max(1, len(xs) - int(len(xs) * cut))]
    return sum(keep) / len(keep)
