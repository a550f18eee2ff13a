"""Megatron-LM's run-health flags (core_v0.16.1's names, dests and defaults): the rerun state machine, the
NaN/spike/large-gradient checks, skipped iterations, garbage collection and the collectives' timeout; their
refusals. Read after parsing as :class:`HealthConfig` (recovery/rerun.py)."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util

from megatron_fixedcode.arguments.config_fields import converted, from_dests


def refuse_fault_tolerance(a: argparse.Namespace, p: argparse.ArgumentParser) -> None:
    """The fault-tolerance flags together (before anything starts)."""
    if not a.enable_ft_package:
        if a.calc_ft_timeouts:
            p.error("--calc-ft-timeouts acts with --enable-ft-package")
        return
    if not a.save:
        p.error("--enable-ft-package keeps its timeouts beside the checkpoints: it needs --save (as Megatron-LM)")
    if a.ft_num_warmup_iters < 0:
        p.error(f"--ft-num-warmup-iters must be >= 0, got {a.ft_num_warmup_iters}")
    if importlib.util.find_spec("nvidia_resiliency_ext") is None:
        p.error("--enable-ft-package needs nvidia-resiliency-ext: pip install '.[ft]' (or nvidia-resiliency-ext)")


def add_health_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("run health: rerun state machine, checks, GC, timeouts, fault tolerance")
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
    g.add_argument(
        "--enable-ft-package",
        action="store_true",
        help="nvidia-resiliency-ext's fault tolerance: the ranks report sections (setup, step, checkpointing) to "
        "ft_launcher's rank monitors, which end a rank that overstays one (a hang) so the group restarts; needs "
        "ft_launcher (the Slurm launchers use it when the package is installed) and --save",
    )
    g.add_argument(
        "--calc-ft-timeouts",
        action="store_true",
        help="--enable-ft-package: compute the section timeouts from the times observed (kept in SAVE/ft_state.json)",
    )
    g.add_argument(
        "--ft-num-warmup-iters",
        type=int,
        default=5,
        help="--enable-ft-package: the first steps of each attempt, slower, are outside the 'step' section",
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class HealthConfig:
    """Megatron-LM's run-health flags: the rerun state machine (recovery/rerun.py), the NaN/spike/large-grad
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
    enable_ft_package: bool = False
    calc_ft_timeouts: bool = False
    ft_num_warmup_iters: int = 5

    @classmethod
    def from_args(cls, a: argparse.Namespace) -> "HealthConfig":
        return from_dests(cls, a)
