"""Megatron-LM's run-health flags (core_v0.16.1's names, dests and defaults): the rerun state machine, the
NaN/spike/large-gradient checks, skipped iterations, garbage collection and the collectives' timeout; their
refusals. Read after parsing as :class:`HealthConfig` (training/rerun.py)."""

from __future__ import annotations

import argparse
import dataclasses

from megatron_fixedcode.arguments.config_fields import converted, from_dests


def add_health_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("run health: rerun state machine, checks, GC, timeouts")
    g.add_argument(
        "--check-for-nan-in-loss-and-grad",
        dest="check_for_nan_in_loss_and_grad",
        action="store_true",
        default=True,
        help="validate each rank's loss and gradient buckets for NaN/Inf (--rerun-mode "
        "disabled: stop, exit code 3) and the global loss and gradient norm (stop, exit 3)",
    )
    g.add_argument(
        "--no-check-for-nan-in-loss-and-grad",
        dest="check_for_nan_in_loss_and_grad",
        action="store_false",
        help="train on through a non-finite loss or gradient norm",
    )
    g.add_argument(
        "--rerun-mode",
        choices=["disabled", "validate_results", "report_stats"],
        default="validate_results",
        help="validate_results: a rejected result (NaN/Inf, spike) re-runs the step in place; not reproduced: "
        "a transient fault, exit 17 with a checkpoint; reproduced: checkpoint and exit 16, resume "
        "on another GPU to decide; report_stats: re-run every step and log the results' variability; "
        "disabled: a rejected NaN/Inf stops the run",
    )
    g.add_argument(
        "--check-for-spiky-loss",
        action="store_true",
        help="reject a local loss 10x the largest of the first 100 (kept in the checkpoint); not fatal",
    )
    g.add_argument(
        "--check-for-large-grads",
        action="store_true",
        help="reject a local gradient bucket norm 10x the largest of the first 100 (megatron DDP); not fatal",
    )
    g.add_argument(
        "--result-rejected-tracker-filename",
        default=None,
        help="append each rejected result to this file; its reproduced iterations are added to --iterations-to-skip",
    )
    g.add_argument(
        "--error-injection-rate",
        type=int,
        default=0,
        help="inject a rejected result about once in this many validations (0: never)",
    )
    g.add_argument(
        "--error-injection-type",
        choices=["correct_result", "transient_error", "persistent_error"],
        default="transient_error",
        help="what the injected fault looks like on re-run",
    )
    g.add_argument(
        "--iterations-to-skip",
        type=int,
        nargs="+",
        default=[],
        help="these steps (1-based) read their batch but do not update the model or the LR schedule",
    )
    g.add_argument(
        "--distributed-timeout-minutes",
        type=int,
        default=10,
        help="timeout of the process groups' collectives (torch's and megatron-core's groups)",
    )
    g.add_argument(
        "--manual-gc",
        action="store_true",
        help="disable Python's automatic GC; collect every --manual-gc-interval steps",
    )
    g.add_argument(
        "--manual-gc-interval", type=int, default=0, help="steps between collections under --manual-gc (0: never)"
    )
    g.add_argument(
        "--empty-unused-memory-level",
        type=int,
        choices=[0, 1, 2],
        default=0,
        help="CUDA: release cached memory after each step (1, 2); no effect on CPU",
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class HealthConfig:
    """Megatron-LM's run-health flags: the rerun state machine (training/rerun.py), the NaN/spike/large-grad
    checks, skipped iterations, garbage collection and the collectives' timeout."""

    rerun_mode: str
    error_injection_rate: int
    error_injection_type: str
    result_rejected_tracker_filename: str | None
    check_for_nan_in_loss_and_grad: bool
    check_for_spiky_loss: bool
    check_for_large_grads: bool
    iterations_to_skip: tuple[int, ...] = converted(tuple)
    manual_gc: bool
    manual_gc_interval: int
    empty_unused_memory_level: int
    distributed_timeout_minutes: int

    @classmethod
    def from_args(cls, a: argparse.Namespace) -> "HealthConfig":
        return from_dests(cls, a)
