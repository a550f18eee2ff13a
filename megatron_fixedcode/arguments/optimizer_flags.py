"""Megatron-LM's optimizer and learning-rate schedule flags (core_v0.16.1's names, dests and defaults): AdamW,
clipping, the distributed optimizer, warm-up and decay by steps or samples, the decoupled LR of the input and output
layers. Read after parsing as :class:`OptimConfig` (training/run_parts.py, training/lr_schedule.py)."""

from __future__ import annotations

import argparse
import dataclasses

from megatron_fixedcode.arguments.config_fields import from_dests


def add_optimizer_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("optimizer and learning-rate schedule")
    g.add_argument("--lr", type=float, default=None, help="peak learning rate (required)")
    g.add_argument("--min-lr", type=float, default=0.0, help="learning rate at the end of the decay")
    g.add_argument(
        "--decoupled-lr",
        type=float,
        default=None,
        help="peak learning rate of the input table and the output layer (megatron-core's "
        "is_embedding_or_output_parameter; a fixed code has no table: the output layer)",
    )
    g.add_argument(
        "--decoupled-min-lr",
        type=float,
        default=None,
        help="their learning rate at the end of the decay (default --min-lr); only with --decoupled-lr",
    )
    g.add_argument("--lr-warmup-iters", type=int, default=0, help="linear warmup steps")
    g.add_argument(
        "--lr-decay-style",
        choices=["constant", "linear", "cosine", "inverse-square-root", "WSD"],
        default="linear",
        help="decay from --lr to --min-lr (WSD is not supported)",
    )
    g.add_argument("--lr-decay-iters", type=int, default=None, help="decay steps (default: the run's length)")
    g.add_argument(
        "--weight-decay", type=float, default=0.01, help="AdamW weight decay (matrices; 0 on 1-D parameters)"
    )
    g.add_argument("--adam-beta1", type=float, default=0.9, help="Adam beta1")
    g.add_argument("--adam-beta2", type=float, default=0.999, help="Adam beta2")
    g.add_argument("--adam-eps", type=float, default=1e-8, help="Adam epsilon")
    g.add_argument("--clip-grad", type=float, default=1.0, help="gradient-norm clip")
    g.add_argument(
        "--use-distributed-optimizer",
        action="store_true",
        help="megatron's distributed optimizer: Adam state and FP32 main weights sharded over DP ranks",
    )
    g.add_argument("--lr-warmup-samples", type=int, default=0, help="LR warmup in samples (with --train-samples)")
    g.add_argument(
        "--lr-decay-samples",
        type=int,
        default=None,
        help="LR decay in samples (with --train-samples; default: --train-samples)",
    )
    g.add_argument(
        "--lr-warmup-fraction",
        type=float,
        default=None,
        help="LR warmup as a fraction of the decay steps; excludes --lr-warmup-iters/-samples",
    )
    g.add_argument("--lr-warmup-init", type=float, default=0.0, help="LR at the start of warmup")


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimConfig:
    """AdamW with weight decay on matrices only (megatron's default no-decay rule: 1-D and bias)."""

    lr: float
    min_lr: float
    weight_decay: float
    adam_beta1: float
    adam_beta2: float
    adam_eps: float
    clip_grad: float
    use_distributed_optimizer: bool
    lr_warmup_iters: int
    lr_decay_iters: int | None
    lr_decay_style: str
    lr_warmup_samples: int = 0  # sample-based schedule (--train-samples): steps = samples // global batch
    lr_decay_samples: int | None = None
    lr_warmup_fraction: float | None = None
    lr_warmup_init: float = 0.0
    decoupled_lr: float | None = None  # the input table's and output layer's own peak and final LR
    decoupled_min_lr: float | None = None

    @classmethod
    def from_args(cls, a: argparse.Namespace) -> "OptimConfig":
        return from_dests(cls, a)
