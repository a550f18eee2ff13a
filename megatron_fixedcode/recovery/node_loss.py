"""Goodput when a fault can take a node away: requeue the job and wait, or cut the node out and continue on the
rest. Pure: no torch. It extends checkpoint/cadence.py's model (segments of ``interval_s`` of compute, each
followed by a blocking save of ``save_s``; Poisson failures; a failure loses the work since the last save).

Modelling choices:

* a fault is a node loss with probability ``hardware_share`` (the Llama 3 report attributes about 78% of its 419
  unexpected interruptions to hardware: GPUs, their memory, hosts); any other fault restarts inside the job
  (``restart_s``: detect, restart, load) and loses no node;
* **requeue and wait** (``shrink=False``): a node loss ends the allocation; the job waits ``queue_wait_s`` in
  the queue (no GPUs held, so no failures), then pays ``restart_s`` and resumes at full size;
* **shrink and continue** (``shrink=True``): the node is cut out and the run relaunches on the nodes left within
  ``restart_s`` (no queue wait), at ``(nodes - lost) / nodes`` of full throughput (the global batch is kept by
  more accumulation; a checkpoint interval is the same steps, so it takes longer). A lost node returns after
  ``repair_s``; the run grows back at the first save after that, at the cost of one planned restart
  (``grow_s``, no work lost), or for free at a fault's restart. A loss that would leave no node requeues as
  above;
* failures arrive at a rate proportional to the GPUs held (``mtbf_s`` is the full allocation's), none while
  queued; saves and loads take the same time on fewer nodes; a job time limit is not modelled (its requeues cost
  both strategies alike).

Goodput is the run's compute at full size divided by its wall-clock time.
"""

from __future__ import annotations

import dataclasses
import random

from megatron_fixedcode.checkpoint.cadence import summarize

LLAMA3_HARDWARE_SHARE = 0.78  # "approximately 78% of unexpected interruptions": hardware (Llama 3, sec. 3.3.4)


@dataclasses.dataclass(frozen=True)
class NodeLossOutcome:
    goodput: float  # full-size compute / wall-clock time
    failures: int
    node_losses: int
    requeues: int
    wall_s: float


def simulate_node_loss_run(
    compute_s: float,
    interval_s: float,
    save_s: float,
    restart_s: float,
    mtbf_s: float,
    rng: random.Random,
    *,
    nodes: int,
    hardware_share: float = LLAMA3_HARDWARE_SHARE,
    shrink: bool = False,
    queue_wait_s: float = 0.0,
    repair_s: float = 0.0,
    grow_s: float = 0.0,
) -> NodeLossOutcome:
    """One run of ``compute_s`` seconds of full-size training to its end (the last segment's save included).

    ``rng`` is read through ``expovariate`` (the time to the next failure, drawn afresh at each phase: the
    process is memoryless) and ``random`` (whether a fault is a node loss)."""
    if interval_s <= 0 or nodes < 1:
        raise ValueError(f"interval and nodes must be positive, got {interval_s} and {nodes}")
    done = wall = 0.0
    failures = node_losses = requeues = 0
    returns: list[float] = []  # when each lost node is back
    pending_restart = 0.0  # the restart to pay before training resumes

    def next_failure_in() -> float:
        return rng.expovariate((nodes - len(returns)) / (nodes * mtbf_s))

    while done < compute_s or pending_restart:
        if pending_restart:
            t = next_failure_in()
            if t >= pending_restart:
                wall += pending_restart
                pending_restart = 0.0
                continue
            wall += t
        else:
            speed = (nodes - len(returns)) / nodes
            work = min(interval_s, compute_s - done)
            segment = work / speed + save_s
            t = next_failure_in()
            if t >= segment:
                wall += segment
                done += work
                back = [r for r in returns if r <= wall]
                if back and done < compute_s:  # grow back at this save
                    returns = [r for r in returns if r > wall]
                    pending_restart = grow_s
                continue
            wall += t
        failures += 1  # the segment's (or the restart's) work is lost
        pending_restart = restart_s
        returns = [r for r in returns if r > wall]  # repaired nodes rejoin at this restart
        if rng.random() >= hardware_share:
            continue
        node_losses += 1
        if shrink and nodes - len(returns) > 1:
            returns.append(wall + repair_s)
            continue
        requeues += 1  # a new allocation, at full size, after the queue
        returns = []
        wall += queue_wait_s
    return NodeLossOutcome(compute_s / wall, failures, node_losses, requeues, wall)


def expected_node_loss_goodput(
    compute_s: float,
    interval_s: float,
    save_s: float,
    restart_s: float,
    mtbf_s: float,
    trials: int = 400,
    seed: int = 0,
    **policy,
) -> tuple[float, float, float]:
    """(mean goodput, its 10th percentile, mean failures) over ``trials`` runs; ``policy``: the keyword
    arguments of ``simulate_node_loss_run``."""
    rng = random.Random(seed)
    return summarize(
        [simulate_node_loss_run(compute_s, interval_s, save_s, restart_s, mtbf_s, rng, **policy) for _ in range(trials)]
    )
