"""Megatron-LM's logging flags that act (core_v0.16.1's names, dests and defaults): the iteration line,
metrics, TensorBoard, W&B, timers and the run-health numbers. Read after parsing as :class:`LoggingConfig`."""

from __future__ import annotations

import argparse
import dataclasses

from megatron_fixedcode.arguments.config_fields import borrowed, from_dests


def add_logging_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("logging (Megatron-LM's log lines and TensorBoard tags; docs/training.md)")
    g.add_argument("--log-interval", type=int, default=100, help="steps between log lines")
    g.add_argument("--tensorboard-dir", default=None, help="TensorBoard event directory (Megatron-LM's tags)")
    g.add_argument("--metrics-file", default=None, help="JSON Lines file: one record per step")
    g.add_argument("--wandb-project", default=None, help="W&B project (needs wandb)")
    g.add_argument(
        "--log-params-norm",
        action="store_true",
        help="'params norm' in the iteration line, TensorBoard 'params-norm' (each weight counted once)",
    )
    g.add_argument(
        "--log-num-zeros-in-grad",
        action="store_true",
        help="'num zeros' (gradient entries equal to zero) in the iteration line, TensorBoard 'num-zeros'",
    )
    g.add_argument(
        "--log-memory-to-tensorboard",
        action="store_true",
        help="TensorBoard 'mem-reserved-bytes', 'mem-allocated-bytes', 'mem-max-allocated-bytes' (CUDA); "
        "'mem-rss-bytes' on the CPU",
    )
    g.add_argument(
        "--timing-log-level",
        type=int,
        choices=(0, 1, 2),
        default=0,
        help="megatron-core timers: 0 save/evaluate, 1 + the step's phases, 2 + compute and batches",
    )
    g.add_argument(
        "--timing-log-option",
        choices=("max", "minmax", "all"),
        default="minmax",
        help="the timers' lines: max over ranks, (min, max), or every rank",
    )
    g.add_argument(
        "--log-timers-to-tensorboard",
        action="store_true",
        help="each timer as TensorBoard '<name>-time' (max over ranks) every --log-interval",
    )
    g.add_argument(
        "--log-progress",
        action="store_true",
        help="append Megatron-LM's job and checkpoint lines (throughput, FLOPs, tokens) to SAVE/progress.txt",
    )
    g.add_argument("--tensorboard-log-interval", type=int, default=1, help="steps between TensorBoard scalars")
    g.add_argument("--wandb-exp-name", default=None, help="W&B run name (the run id is kept with the checkpoint)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoggingConfig:
    log_interval: int
    tensorboard_dir: str | None
    metrics_file: str | None
    wandb_project: str | None
    tensorboard_log_interval: int = 1
    wandb_exp_name: str | None = None
    log_params_norm: bool = False
    log_num_zeros_in_grad: bool = False
    log_memory_to_tensorboard: bool = False
    timing_log_level: int = 0
    timing_log_option: str = "minmax"
    log_timers_to_tensorboard: bool = False
    log_progress: bool = False
    log_throughput: bool = borrowed("inert_flags", default=False)  # accepted as Megatron-LM's; the table holds it

    @classmethod
    def from_args(cls, a: argparse.Namespace) -> "LoggingConfig":
        return from_dests(cls, a)
