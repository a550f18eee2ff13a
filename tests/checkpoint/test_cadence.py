"""checkpoint/cadence.py: goodput under failures, simulated, against the cases that have a closed form."""

from __future__ import annotations

import math
import random

import pytest

from megatron_fixedcode.checkpoint import cadence


def test_the_llama3_rate_and_a_jobs_mtbf():
    assert cadence.LLAMA3_FAILURES_PER_GPU_HOUR == pytest.approx(419 / (54 * 24 * 16384))
    # 16,384 GPUs: 419 interruptions in 54 days, one every ~3.1 hours
    assert cadence.mtbf_seconds(16384) / 3600 == pytest.approx(54 * 24 / 419)
    assert cadence.mtbf_seconds(16) == pytest.approx(1024 * cadence.mtbf_seconds(16384))


def test_young_daly_interval():
    assert cadence.young_daly_interval(10.0, 5000.0) == pytest.approx(math.sqrt(2 * 10 * 5000))
    with pytest.raises(ValueError):
        cadence.young_daly_interval(0.0, 5000.0)


def test_without_failures_the_saves_are_the_only_cost():
    out = cadence.simulate_run(100.0, 10.0, 1.0, 60.0, 1e18, random.Random(0))
    assert out.failures == 0 and out.wall_s == pytest.approx(110.0) and out.goodput == pytest.approx(100 / 110)
    out = cadence.simulate_run(95.0, 10.0, 1.0, 60.0, 1e18, random.Random(0))  # a short last segment, saved too
    assert out.wall_s == pytest.approx(105.0)


def test_rare_failures_match_the_first_order_formula():
    """Goodput ~ 1/(1 + C/tau) * (1 - (R + (tau + C)/2) / M) when failures are rare."""
    compute, tau, save, restart, mtbf = 50_000.0, 500.0, 5.0, 100.0, 20_000.0
    mean, p10, failures = cadence.expected_goodput(compute, tau, save, restart, mtbf, trials=2000, seed=1)
    first_order = (1 / (1 + save / tau)) * (1 - (restart + (tau + save) / 2) / mtbf)
    assert mean == pytest.approx(first_order, abs=0.005)
    assert p10 < mean and failures == pytest.approx(compute / mtbf, rel=0.1)


def test_the_young_daly_interval_beats_a_quarter_and_four_times_it():
    save, restart, mtbf, compute = 20.0, 60.0, 10_000.0, 100_000.0
    best = cadence.young_daly_interval(save, mtbf)
    goodput = {k: cadence.expected_goodput(compute, best * k, save, restart, mtbf, trials=600)[0] for k in (0.25, 1, 4)}
    assert goodput[1] > goodput[0.25] and goodput[1] > goodput[4], goodput
