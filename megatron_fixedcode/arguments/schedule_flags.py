"""Megatron-LM's batch, budget and evaluation flags (core_v0.16.1's names, dests and defaults): micro and global
batch, sequence length, the training budget in steps, samples or tokens, the evaluation interval and the seed. Read
after parsing as :class:`ScheduleConfig`."""

from __future__ import annotations

import argparse
import dataclasses

from megatron_fixedcode.arguments.config_fields import from_dests


def add_schedule_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("batch, budget, evaluation, seed")
    g.add_argument("--seq-length", type=int, help="tokens per sample (required)")
    g.add_argument("--micro-batch-size", type=int, default=1, help="samples per microbatch per data-parallel rank")
    g.add_argument(
        "--global-batch-size",
        type=int,
        default=None,
        help="samples per optimizer step (default: micro batch x data-parallel size)",
    )
    g.add_argument("--train-iters", type=int, default=None, help="optimizer steps to train")
    g.add_argument(
        "--train-tokens",
        type=int,
        default=None,
        help="stop at the first step boundary past this many prediction targets",
    )
    g.add_argument("--seed", type=int, default=1234, help="seed of the init, the data order and dropout")
    g.add_argument("--eval-interval", type=int, default=None, help="steps between evaluations (default: none)")
    g.add_argument("--eval-iters", type=int, default=100, help="global batches per evaluation")
    g.add_argument("--skip-train", action="store_true", help="load, evaluate once, exit")
    g.add_argument(
        "--train-samples",
        type=int,
        default=None,
        help="train for this many samples (steps = samples // global batch); excludes --train-iters",
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScheduleConfig:
    """Batch geometry and when to stop. ``global_batch_size`` defaults to micro × data-parallel."""

    micro_batch_size: int
    global_batch_size: int | None
    seq_length: int
    train_iters: int | None
    train_tokens: int | None
    train_samples: int | None
    eval_interval: int | None
    eval_iters: int
    seed: int
    skip_train: bool = False

    @classmethod
    def from_args(cls, a: argparse.Namespace) -> "ScheduleConfig":
        return from_dests(cls, a)

    def resolve_global_batch(self, data_parallel_size: int) -> int:
        gbs = self.global_batch_size or self.micro_batch_size * data_parallel_size
        if gbs % (self.micro_batch_size * data_parallel_size):
            raise ValueError(
                f"--global-batch-size {gbs} is not divisible by --micro-batch-size {self.micro_batch_size} "
                f"x data-parallel size {data_parallel_size}"
            )
        return gbs

    def max_steps(self, global_batch_size: int) -> int:
        """Steps until the first budget is reached (tokens: the first step boundary at or past it)."""
        by_tokens = None
        if self.train_tokens is not None:
            per_step = global_batch_size * self.seq_length
            by_tokens = -(-self.train_tokens // per_step)
        by_samples = None if self.train_samples is None else max(1, self.train_samples // global_batch_size)
        candidates = [s for s in (self.train_iters, by_samples, by_tokens) if s is not None]
        return min(candidates)
