"""The meter of the real rank's own work (controller/work_meter.py): samples in, the
HostWork charged to emulated ranks out."""

import math

import pytest
from neuronabox.controller.work_meter import (
    FIRST_FIT,
    REFIT_EVERY,
    REFIT_MOVES,
    SAMPLES_KEPT,
    Sample,
    WorkMeter,
    fit,
    moved,
    trimmed_mean,
)
from neuronabox.topology import HostWork

MSG, PER_BYTE = 80e-6, 1 / 2e9  # 80 us per message, reducing at 2 GB/s
SHAPES = ((2.0, 0.0), (2.0, 4096.0), (2.0, 65536.0))  # an allgather's edge, two allreduces'


def edge(messages: float, reduced: float, stall: float = 0.0) -> Sample:
    return Sample(messages, reduced, messages * MSG + reduced * PER_BYTE + stall)


def test_the_fit_recovers_both_terms_through_tick_stalls():
    """One instance in five waited a scheduler tick (4 ms): the medians per shape ignore it."""
    samples = [edge(m, r, 4e-3 if i % 5 == 0 else 0.0) for i in range(20) for m, r in SHAPES]
    work = fit(samples)
    assert work.message == pytest.approx(MSG, rel=1e-9)
    assert work.reduce_bandwidth == pytest.approx(1 / PER_BYTE, rel=1e-9)


def test_one_shape_is_charged_per_message():
    work = fit([edge(2.0, 65536.0) for _ in range(10)])
    assert work.reduce_bandwidth == math.inf
    assert work.message == pytest.approx((2 * MSG + 65536 * PER_BYTE) / 2)


def test_neither_term_goes_below_zero():
    # Bigger segments cost less per edge here (noise): no negative bandwidth, all per message.
    samples = [Sample(2.0, r, y) for r, y in ((0.0, 3e-4), (65536.0, 1e-4)) for _ in range(5)]
    work = fit(samples)
    assert work.message >= 0 and work.reduce_bandwidth > 0
    assert fit([Sample(2.0, 0.0, 0.0)] * 5).message == 0.0  # a rank faster than the model costs nothing


def test_fits_come_after_the_first_samples_and_then_every_few():
    meter = WorkMeter()
    fits = [i for i in range(1, FIRST_FIT + 2 * REFIT_EVERY + 1) if meter.add(edge(2.0, 4096.0)) is not None]
    assert fits == [FIRST_FIT, FIRST_FIT + REFIT_EVERY, FIRST_FIT + 2 * REFIT_EVERY]
    assert meter.work.message == pytest.approx(MSG + 2048 * PER_BYTE)


def test_the_meter_keeps_a_bounded_window_and_follows_a_drift():
    meter = WorkMeter()
    for _ in range(SAMPLES_KEPT):
        meter.add(Sample(2.0, 0.0, 2 * 50e-6))
    for _ in range(SAMPLES_KEPT):
        meter.add(Sample(2.0, 0.0, 2 * 90e-6))
    assert len(meter._samples) == SAMPLES_KEPT and meter.count == 2 * SAMPLES_KEPT
    assert meter.work.message == pytest.approx(90e-6)
    assert meter.add(Sample(0.0, 0.0, 1.0)) is None and meter.count == 2 * SAMPLES_KEPT  # no edges: no sample


def test_a_turnaround_that_waited_a_tick_is_left_out():
    """A wake-up left to the next scheduler tick (4 ms here) is the VM's, not the rank's work."""
    turns = [40e-6] * 18 + [4e-3, 4.4e-3]
    assert trimmed_mean(turns) == pytest.approx(40e-6)
    assert trimmed_mean([30e-6]) == pytest.approx(30e-6)


def test_a_large_world_fits_after_its_first_few_instances():
    """At 512 ranks one ring instance holds a thousand turnarounds: two of them are enough."""
    meter = WorkMeter()
    assert meter.add(Sample(1.0, 0.0, 40e-6, turns=1022)) is None  # one instance: never alone
    assert meter.add(Sample(1.0, 0.0, 40e-6, turns=1022)).message == pytest.approx(40e-6)


def test_a_refit_within_the_noise_keeps_the_charge():
    """A new charge reprices later instances and drops the native starters: only a refit
    that moves a term by more than REFIT_MOVES of the larger replaces it."""
    charged = HostWork(message=MSG, reduce_bandwidth=1 / PER_BYTE)
    assert moved(HostWork(), charged)  # the first fit is always taken
    assert not moved(HostWork(), HostWork())
    near = 1 + REFIT_MOVES / 2
    assert not moved(charged, HostWork(message=MSG * near, reduce_bandwidth=1 / (PER_BYTE * near)))
    far = 1 + REFIT_MOVES * 2
    assert moved(charged, HostWork(message=MSG * far, reduce_bandwidth=1 / PER_BYTE))
    assert moved(charged, HostWork(message=MSG, reduce_bandwidth=1 / (PER_BYTE * far)))
    assert moved(charged, HostWork(message=MSG))  # reducing became free
