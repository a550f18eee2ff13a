"""recovery/node_loss.py: requeue and wait, or shrink and continue, on exact scripted cases and against cadence."""

from __future__ import annotations

import random

import pytest

from megatron_fixedcode.checkpoint import cadence
from megatron_fixedcode.recovery import node_loss

NEVER = 1e12


class Scripted:
    """An rng whose failure times and hardware draws are given; it records the failure rates asked for."""

    def __init__(self, times, draws=()):
        self.times, self.draws, self.rates = list(times), list(draws), []

    def expovariate(self, rate):
        self.rates.append(rate)
        return self.times.pop(0)

    def random(self):
        return self.draws.pop(0)


def run(times, draws=(), **policy):
    rng = Scripted(times, draws)
    # 100 s of compute in two segments of 50 s, saves free, a restart 10 s, 4 nodes, MTBF 1,000 s
    out = node_loss.simulate_node_loss_run(100.0, 50.0, 0.0, 10.0, 1000.0, rng, nodes=4, hardware_share=0.5, **policy)
    assert not rng.times and not rng.draws  # every scripted draw was used, no more
    return out, rng.rates


def test_without_failures_only_the_saves_cost():
    out = node_loss.simulate_node_loss_run(100.0, 10.0, 1.0, 60.0, NEVER, random.Random(0), nodes=2, shrink=True)
    assert (out.failures, out.node_losses, out.requeues) == (0, 0, 0) and out.wall_s == pytest.approx(110.0)


def test_a_fault_that_is_not_hardware_restarts_in_the_job():
    # fails at 30 s, restart to 40, two full segments: 90, 140
    out, _ = run([30.0, NEVER, NEVER, NEVER], [0.9], shrink=True, queue_wait_s=100.0)
    assert out.wall_s == pytest.approx(140.0) and (out.failures, out.node_losses, out.requeues) == (1, 0, 0)


def test_requeue_and_wait_pays_the_queue_then_the_restart_at_full_size():
    out, rates = run([30.0, NEVER, NEVER, NEVER], [0.1], queue_wait_s=100.0)
    assert out.wall_s == pytest.approx(30 + 100 + 10 + 50 + 50) and out.goodput == pytest.approx(100 / 240)
    assert (out.failures, out.node_losses, out.requeues) == (1, 1, 1)
    assert rates == [pytest.approx(1 / 1000)] * 4  # full size throughout


def test_shrink_and_continue_runs_on_three_nodes_of_four():
    out, rates = run([30.0, NEVER, NEVER, NEVER], [0.1], shrink=True, queue_wait_s=100.0, repair_s=1000.0, grow_s=5.0)
    assert out.wall_s == pytest.approx(30 + 10 + 2 * 50 / 0.75) and (out.node_losses, out.requeues) == (1, 0)
    assert rates == [pytest.approx(1 / 1000)] + [pytest.approx(0.75 / 1000)] * 3  # fewer GPUs, fewer failures


def test_a_repaired_node_rejoins_at_the_next_save_for_one_planned_restart():
    # node back at 80 s; the first segment's save ends at 40 + 66.7 s; grow 5 s; the second segment at full size
    out, rates = run([30.0, NEVER, NEVER, NEVER, NEVER], [0.1], shrink=True, repair_s=50.0, grow_s=5.0)
    assert out.wall_s == pytest.approx(30 + 10 + 50 / 0.75 + 5 + 50) and out.failures == 1
    assert rates[-1] == pytest.approx(1 / 1000)


def test_losing_the_last_node_requeues_even_when_shrinking():
    rng = Scripted([30.0, NEVER, NEVER], [0.1])
    out = node_loss.simulate_node_loss_run(
        100.0, 100.0, 0.0, 10.0, 1000.0, rng, nodes=1, hardware_share=1.0, shrink=True, queue_wait_s=100.0
    )
    assert out.wall_s == pytest.approx(30 + 100 + 10 + 100) and out.requeues == 1


def test_without_hardware_faults_it_is_cadences_in_job_restart():
    args = (50_000.0, 500.0, 5.0, 100.0, 5_000.0)
    ours = node_loss.expected_node_loss_goodput(*args, trials=1500, seed=3, nodes=8, hardware_share=0.0)
    theirs = cadence.expected_goodput(*args, trials=1500, seed=3)
    assert ours[0] == pytest.approx(theirs[0], abs=0.005) and ours[2] == pytest.approx(theirs[2], rel=0.1)


def test_with_many_nodes_shrinking_beats_a_long_queue():
    args = (200_000.0, 600.0, 2.0, 60.0, 20_000.0)
    policy = dict(nodes=512, queue_wait_s=7200.0, repair_s=86_400.0, grow_s=40.0, trials=200)
    wait = node_loss.expected_node_loss_goodput(*args, **policy)[0]
    shrink = node_loss.expected_node_loss_goodput(*args, shrink=True, **policy)[0]
    assert 0 < wait < shrink - 0.2 < 1
