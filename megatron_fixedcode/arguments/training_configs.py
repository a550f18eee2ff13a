"""Small typed configs of the training components (optimizer, schedule, checkpoints, logging, performance,
run health), built from parsed arguments (refused, if at all, at parse time: ``refusals.py``). Here, not in
``training/``, so that parsing does not import the trainer's room (training reads them; arguments does not
import training). Code after parsing reads these, never the Namespace (tests/repository checks it)."""

from __future__ import annotations

import argparse
import signal
import dataclasses
from typing import TypeVar

C = TypeVar("C")


def from_dests(cls: type[C], a: argparse.Namespace) -> C:
    """``cls`` with each field read from the parsed flag of the same dest (Megatron-LM's names)."""
    return cls(**{f.name: getattr(a, f.name) for f in dataclasses.fields(cls)})


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
        return cls(
            lr=a.lr,
            min_lr=a.min_lr,
            weight_decay=a.weight_decay,
            adam_beta1=a.adam_beta1,
            adam_beta2=a.adam_beta2,
            adam_eps=a.adam_eps,
            clip_grad=a.clip_grad,
            use_distributed_optimizer=a.use_distributed_optimizer,
            lr_warmup_iters=a.lr_warmup_iters,
            lr_decay_iters=a.lr_decay_iters,
            lr_decay_style=a.lr_decay_style,
            lr_warmup_samples=a.lr_warmup_samples,
            lr_decay_samples=a.lr_decay_samples,
            lr_warmup_fraction=a.lr_warmup_fraction,
            lr_warmup_init=a.lr_warmup_init,
            decoupled_lr=a.decoupled_lr,
            decoupled_min_lr=a.decoupled_min_lr,
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
        return cls(
            micro_batch_size=a.micro_batch_size,
            global_batch_size=a.global_batch_size,
            seq_length=a.seq_length,
            train_iters=a.train_iters,
            train_tokens=a.train_tokens,
            train_samples=a.train_samples,
            eval_interval=a.eval_interval,
            eval_iters=a.eval_iters,
            seed=a.seed,
            skip_train=a.skip_train,
        )

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


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    save: str | None
    load: str | None
    save_interval: int | None
    keep_last: int | None  # None: keep every checkpoint (Megatron-LM)
    load_step: int | None
    finetune: bool
    exit_duration_in_mins: float | None
    exit_signal_handler: bool
    exit_interval: int | None
    override_opt_param_scheduler: bool = False
    use_checkpoint_opt_param_scheduler: bool = False
    verify: bool = True  # --no-verify-checkpoint: load without checking the checksums
    exit_signal: str = "SIGTERM"
    retain_interval: int | None = None  # --save-retain-interval
    no_load_optim: bool = False
    no_load_rng: bool = False
    async_save: bool = False
    fully_reshardable: bool = True  # --dist-ckpt-optim-fully-reshardable
    hf_export_interval: int | None = None  # a Hugging Face export of every N-th checkpoint, in the background
    hf_export_dir: str | None = None

    @classmethod
    def from_args(cls, a: argparse.Namespace) -> "CheckpointConfig":
        return cls(
            save=a.save,
            load=a.load,
            save_interval=a.save_interval,
            keep_last=a.ckpt_keep_last,
            load_step=a.ckpt_step,
            finetune=a.finetune,
            exit_duration_in_mins=a.exit_duration_in_mins,
            exit_signal_handler=a.exit_signal_handler,
            exit_interval=a.exit_interval,
            override_opt_param_scheduler=getattr(a, "override_opt_param_scheduler", False),
            use_checkpoint_opt_param_scheduler=getattr(a, "use_checkpoint_opt_param_scheduler", False),
            verify=getattr(a, "verify_checkpoint", True),
            exit_signal=signal.Signals(a.exit_signal).name,
            retain_interval=a.save_retain_interval,
            no_load_optim=bool(a.no_load_optim),
            no_load_rng=bool(a.no_load_rng),
            async_save=a.async_save,
            fully_reshardable=a.dist_ckpt_optim_fully_reshardable,
            hf_export_interval=a.hf_export_interval,
            hf_export_dir=a.hf_export_dir,
        )


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
    log_throughput: bool = False

    @classmethod
    def from_args(cls, a: argparse.Namespace) -> "LoggingConfig":
        return cls(
            log_interval=a.log_interval,
            tensorboard_dir=a.tensorboard_dir,
            metrics_file=a.metrics_file,
            wandb_project=a.wandb_project,
            tensorboard_log_interval=a.tensorboard_log_interval,
            wandb_exp_name=a.wandb_exp_name,
            log_params_norm=a.log_params_norm,
            log_num_zeros_in_grad=a.log_num_zeros_in_grad,
            log_memory_to_tensorboard=a.log_memory_to_tensorboard,
            timing_log_level=a.timing_log_level,
            timing_log_option=a.timing_log_option,
            log_timers_to_tensorboard=a.log_timers_to_tensorboard,
            log_progress=a.log_progress,
            log_throughput=a.log_throughput,
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class PerformanceConfig:
    """How a step runs on the hardware: precision, Transformer Engine or local layers, fused kernels and
    communication overlap (checked against the machine at launch: training/gpu_features.py)."""

    precision: str
    bf16: bool
    fp8: str | None
    fp8_recipe: str
    tf32: bool
    transformer_impl: str
    tp_comm_overlap: bool
    gradient_accumulation_fusion: bool
    bias_gelu_fusion: bool
    bias_swiglu_fusion: bool
    bias_dropout_fusion: bool
    apply_rope_fusion: bool
    masked_softmax_fusion: bool
    overlap_grad_reduce: bool
    overlap_param_gather: bool
    transformer_impl_given: bool = True  # False: Megatron-LM's default, which may fall back to local layers

    @classmethod
    def from_args(cls, a: argparse.Namespace) -> "PerformanceConfig":
        return from_dests(cls, a)


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
    iterations_to_skip: tuple[int, ...]
    manual_gc: bool
    manual_gc_interval: int
    empty_unused_memory_level: int
    distributed_timeout_minutes: int

    @classmethod
    def from_args(cls, a: argparse.Namespace) -> "HealthConfig":
        return dataclasses.replace(from_dests(cls, a), iterations_to_skip=tuple(a.iterations_to_skip))
