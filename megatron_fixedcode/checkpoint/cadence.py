"""How often to checkpoint a run that fails: the share of wall-clock time that produces kept steps (goodput)
under a failure rate, a save cost and a restart cost, simulated, and Young/Daly's interval. Pure: no torch.

The model (the one Young 1974 and Daly 2006 analyse): training runs in segments of ``interval_s`` of compute,
each followed by a save that blocks training for ``save_s``; failures arrive as a Poisson process of rate
``1 / mtbf_s`` over wall-clock time (saves and restarts included); a failure loses the work since the last
completed save and costs ``restart_s`` (detect, restart, load) before training resumes. Young/Daly's optimum
for ``save_s << mtbf_s`` is ``sqrt(2 * save_s * mtbf_s)``.

Failure rate: the Llama 3 report (Llama Team, "The Llama 3 Herd of Models", arXiv:2407.21783, section 3.3.4)
counts 419 unexpected interruptions in 54 days of pre-training on 16,384 H100 GPUs.
"""

from __future__ import annotations

import dataclasses
import math
import random

LLAMA3_INTERRUPTIONS, LLAMA3_DAYS, LLAMA3_GPUS = 419, 54, 16_384
LLAMA3_FAILURES_PER_GPU_HOUR = LLAMA3_INTERRUPTIONS / (LLAMA3_DAYS * 24 * LLAMA3_GPUS)


def mtbf_seconds(gpus: int, failures_per_gpu_hour: float = LLAMA3_FAILURES_PER_GPU_HOUR) -> float:
    """The job's mean time between failures: any of its GPUs failing stops it."""
    return 3600.0 / (gpus * failures_per_gpu_hour)


def young_daly_interval(save_s: float, mtbf_s: float) -> float:
    """Seconds of compute between checkpoints that maximise goodput to first order (Daly's correction omitted:
    it matters only when ``save_s`` is a sizeable share of ``mtbf_s``)."""
    if save_s <= 0 or mtbf_s <= 0:
        raise ValueError(f"save and MTBF must be positive, got {save_s} and {mtbf_s}")
    return math.sqrt(2.0 * save_s * mtbf_s)


@dataclasses.dataclass(frozen=True)
class Outcome:
    goodput: float  # compute kept / wall-clock time
    failures: int
    wall_s: float


def simulate_run(
    compute_s: float, interval_s: float, save_s: float, restart_s: float, mtbf_s: float, rng: random.Random
) -> Outcome:
    """One run of ``compute_s`` seconds of training to its end (the last segment's save included)."""
    if interval_s <= 0:
        raise ValueError(f"interval must be positive, got {interval_s}")
    done = wall = 0.0
    failures = 0
    next_failure = rng.expovariate(1.0 / mtbf_s)
    while done < compute_s:
        segment = min(interval_s, compute_s - done) + save_s  # compute, then the save that keeps it
        if wall + segment <= next_failure:
            wall += segment
            done += segment - save_s
            continue
        failures += 1  # the segment's work is lost; the restart itself may be interrupted too
        wall = next_failure + restart_s
        next_failure = next_failure + rng.expovariate(1.0 / mtbf_s)
        while next_failure < wall:
            failures += 1
            wall = next_failure + restart_s
            next_failure = next_failure + rng.expovariate(1.0 / mtbf_s)
    return Outcome(goodput=compute_s / wall, failures=failures, wall_s=wall)


def expected_goodput(
    compute_s: float,
    interval_s: float,
    save_s: float,
    restart_s: float,
    mtbf_s: float,
    trials: int = 400,
    seed: int = 0,
) -> tuple[float, float, float]:
    """(mean goodput, its 10th percentile, mean failures) over ``trials`` simulated runs."""
    rng = random.Random(seed)
    return summarize([simulate_run(compute_s, interval_s, save_s, restart_s, mtbf_s, rng) for _ in range(trials)])


def summarize(outcomes: list) -> tuple[float, float, float]:
    """(mean goodput, its 10th percentile, mean failures) of simulated runs (each with ``goodput``, ``failures``)."""
    goodputs = sorted(o.goodput for o in outcomes)
    return (
        sum(goodputs) / len(goodputs),
        goodputs[int(0.1 * (len(goodputs) - 1))],
        sum(o.failures for o in outcomes) / len(outcomes),
    )
