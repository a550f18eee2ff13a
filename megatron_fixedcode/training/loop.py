"""The pretraining loop on megatron-core: DDP, pipeline schedules, optimizer, LR schedule,
token budget, evaluation, checkpoints, preemption.

A sample is a pure function of (seed, global sample index) and step ``n`` reads indices
``[n·G, (n+1)·G)`` (G = global batch), so the data position *is* the step counter: resuming
restores model, optimizer, scheduler, RNG and step, and continues the exact stream.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import torch
import torch.distributed as dist
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

from megatron_fixedcode.compat import (
    describe_runtime,
    destroy_distributed,
    initialize_distributed,
    parallel_ranks,
    runtime_device,
)
from megatron_fixedcode.compat.rng import PIPELINE_STAGE_SEED_STRIDE, seed_streams
from megatron_fixedcode.data import DataConfig, build_datasets
from megatron_fixedcode.locks import lock_save_dir
from megatron_fixedcode.data.sampler import fetch_microbatch, rank_microbatch_indices
from megatron_fixedcode.data.validate import TokenIdOutOfRange
from megatron_fixedcode.training.batches import pin
from megatron_fixedcode.models import build_transformer_config, format_parameter_report, parameter_report
from megatron_fixedcode.models.builder import use_transformer_engine
from megatron_fixedcode.models.config import BLOCKS
from megatron_fixedcode.models.report import model_flops_per_token
from megatron_fixedcode.tokenizers import build_tokenizer
from megatron_fixedcode.training import checkpointing
from megatron_fixedcode.training.arguments import PretrainConfig
from megatron_fixedcode.training.forward_backward import forward_backward
from megatron_fixedcode.training.gpu_features import (
    check_gpu_features,
    configure_tf32,
    fusion_settings,
    initialize_tp_comm_overlap,
    params_synced,
    use_fused_adamw,
)
from megatron_fixedcode.training.metrics import MetricsSink, require_logging_backends
from megatron_fixedcode.training.save_checks import (
    check_save_dir_writable,
    checkpoint_write_error,
    estimate_checkpoint_bytes,
    free_space_warning,
    is_write_failure,
)
from megatron_fixedcode.training.model_chunks import build_model_chunks

logger = logging.getLogger(__name__)


class _ExitRequest:
    """Set by SIGTERM/SIGUSR1 (Slurm's --signal); acted on at the next step boundary."""

    def __init__(self, enabled: bool):
        self.flag = False
        if enabled:
            for sig in (signal.SIGTERM, signal.SIGUSR1):
                signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        logger.warning("received signal %d: saving a checkpoint at the end of this step", signum)
        self.flag = True


def _any_rank(flag: bool, device: torch.device) -> bool:
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def _global_sum(values: list[float], device: torch.device) -> list[float]:
    """Sum over every rank; callers zero the entries a rank does not own (e.g. non-last stages).
    The tensor lives on ``device``: NCCL takes only GPU tensors."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


REQUIRE_CUDA_ENV = "MFC_REQUIRE_CUDA"
NO_GPU_UNDER_LAUNCHER = (f"{REQUIRE_CUDA_ENV}=1 (set by the Slurm launchers) but torch sees no CUDA GPU on this node "
                         "(check the allocation's --gpus and CUDA_VISIBLE_DEVICES, and that torch is a CUDA build); "
                         "refusing to train on the CPU")
CONTEXT_PARALLEL_UNPROVEN = ("--context-parallel-size > 1 is refused until its parity with CP 1 has been measured on a "
                             "GPU (the batch split is in place and tested; TE attention under CP is not yet)")


def _check_runtime(cfg: PretrainConfig) -> None:
    if os.environ.get(REQUIRE_CUDA_ENV) == "1" and not torch.cuda.is_available():
        raise ValueError(NO_GPU_UNDER_LAUNCHER)
    check_gpu_features(cfg.args)  # first: its message says what to install
    if cfg.layout.context_parallel_size > 1:
        raise ValueError(CONTEXT_PARALLEL_UNPROVEN)
    if not torch.cuda.is_available():
        if cfg.args.bf16:
            raise ValueError("--bf16 needs a GPU; on CPU training runs in FP32 (drop --bf16)")
        if cfg.optim.use_distributed_optimizer:
            raise ValueError("--use-distributed-optimizer is supported on GPUs only (megatron checks CUDA tensor types)")
    elif cfg.args.code_kernel == "fused":
        raise ValueError("--code-kernel fused is the CPU kernel; on GPUs use auto or torch (the ids are on the GPU)")
    require_logging_backends(cfg.logging)


class NonFiniteTraining(RuntimeError):
    """A non-finite loss or gradient norm (``--check-for-nan-in-loss-and-grad``)."""


class DataError(ValueError):
    """Data that cannot be trained on as given (a damaged shard, a ``.bin``/``.idx`` mismatch, a
    token id outside the vocabulary): a user error, one line on rank 0 and exit code 2."""


class SaveFailed(ValueError):
    """A checkpoint could not be written (no space left on device, an OS error); the last
    complete checkpoint is kept. One line on rank 0, exit code 2."""


def _raise_if_any_rank_failed(error: str | None, device: torch.device) -> None:
    """Ranks read different samples, so one may find bad data alone; the others would wait in the
    next collective. Every rank learns it here (one all-reduce per call) and raises
    :class:`DataError` with the lowest failing rank's message, which rank 0 reports."""
    if not _any_rank(error is not None, device):
        return
    messages: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(messages, error)
    raise DataError(next(m for m in messages if m))


def _resolve_data_paths(paths: list[str] | None) -> list[str] | None:
    """Prefixes as absolute, symlink-free paths (blend weights kept): the same files given as a
    relative or an absolute path compare equal."""
    if paths is None:
        return None
    out = []
    for p in paths:
        try:
            float(p)
            out.append(p)
        except ValueError:
            out.append(os.path.realpath(p))
    return out


def stream_identity(a, global_batch: int, max_steps: int) -> dict:
    """What fixes the sample stream; a resume must match it to continue exactly."""
    ident = {"global_batch_size": global_batch, "seq_length": a.seq_length, "seed": a.seed,
             "dataset_type": a.dataset_type, "data_path": _resolve_data_paths(a.data_path),
             "valid_data_path": _resolve_data_paths(a.valid_data_path)}
    if a.dataset_type == "document_windows":
        ident["samples_per_shard_visit"] = a.samples_per_shard_visit
    elif a.dataset_type == "sft":  # records are drawn per epoch: the stream does not depend on the run's length
        ident["sft_fields"] = [a.sft_prompt_key, a.sft_response_key, a.sft_messages_key]
    else:  # megatron's GPT shuffle is sized by the total number of samples
        ident["num_train_samples"] = max_steps * global_batch
    return ident


# Fields of the model a checkpoint's weights are shaped by: a resume (or --finetune) must match them.
ARCHITECTURE_FIELDS = ("vocab_size", "hidden_size", "num_layers", "num_attention_heads", "num_query_groups",
                       "ffn_hidden_size", "block")  # the input interface: its own check below
# The scheduler's state → the flags that set it.
SCHEDULE_FLAGS = {"max_lr": "--lr", "min_lr": "--min-lr", "lr_warmup_steps": "--lr-warmup-iters",
                  "lr_decay_steps": "--lr-decay-iters (default: the run's length from --train-iters/--train-tokens)",
                  "lr_decay_style": "--lr-decay-style", "start_wd": "--weight-decay", "end_wd": "--weight-decay"}


def scheduler_settings(o, max_steps: int) -> dict:
    return {"max_lr": o.lr, "min_lr": o.min_lr, "lr_warmup_steps": o.lr_warmup_iters,
            "lr_decay_steps": o.lr_decay_iters or max(max_steps, o.lr_warmup_iters + 1),
            "lr_decay_style": o.lr_decay_style, "start_wd": o.weight_decay, "end_wd": o.weight_decay}


def _data_parallel_size(layout) -> int:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    model_parallel = (layout.tensor_model_parallel_size * layout.pipeline_model_parallel_size
                      * layout.context_parallel_size)
    if world % model_parallel:
        raise ValueError(f"world size {world} is not divisible by tensor x pipeline x context parallel size "
                         f"= {model_parallel}")
    return world // model_parallel


@dataclasses.dataclass
class RunPlan:
    """Everything decided before the process group exists: a user error found here is one line
    on rank 0 and exit code 2 (no traceback per rank)."""

    tokenizer: object
    model_cfg: object
    identity: dict
    dp_size: int
    global_batch: int
    max_steps: int
    load_step: int | None       # the verified checkpoint to resume from (None: start fresh)
    schedule: dict              # the LR schedule in force
    schedule_source: str
    checkpoint_schedule: dict | None = None  # the scheduler state being resumed (not with --finetune)


def _sft_fields(a):
    from megatron_fixedcode.data.sft import SFTFields

    return SFTFields(prompt=a.sft_prompt_key, response=a.sft_response_key, messages=a.sft_messages_key)


def plan_run(cfg: PretrainConfig) -> RunPlan:
    a, ck = cfg.args, cfg.checkpoint
    _check_runtime(cfg)
    # Without a tokenizer (pre-tokenized data, --vocab-size): EOD is taken as id 0 (megatron's
    # GPT index reads it; our datasets never mask on it).
    tokenizer = (build_tokenizer(a.tokenizer_type, a.tokenizer_model) if a.tokenizer_model
                 else types.SimpleNamespace(vocab_size=a.vocab_size, eod=0, bos=None, pad=None,
                                            fingerprint=f"vocab{a.vocab_size}"))
    if a.dataset_type == "sft":  # a bad record is one line naming FILE:LINE, before any process group
        from megatron_fixedcode.data.sft import fit_to_window, load_sft_examples

        for flag, paths in (("--data-path", a.data_path), ("--valid-data-path", a.valid_data_path)):
            if paths:
                fit_to_window(load_sft_examples(paths, _sft_fields(a), tokenizer), a.seq_length, flag)
    model_cfg = cfg.model_config(tokenizer.vocab_size)
    code = model_cfg.code_spec()
    identity = {"input_embedding": model_cfg.input_embedding,
                "code_fingerprint": code.fingerprint if code else "learned",
                "tokenizer_fingerprint": tokenizer.fingerprint}
    dp_size = _data_parallel_size(cfg.layout)
    global_batch = cfg.schedule.resolve_global_batch(dp_size)
    max_steps = cfg.schedule.max_steps(global_batch)
    schedule = scheduler_settings(cfg.optim, max_steps)
    plan = RunPlan(tokenizer=tokenizer, model_cfg=model_cfg, identity=identity, dp_size=dp_size,
                   global_batch=global_batch, max_steps=max_steps, load_step=None, schedule=schedule,
                   schedule_source="command line")
    if ck.load:
        plan.load_step = _resolve_load(cfg)
    if plan.load_step is not None:
        _check_resume_compatible(cfg, plan)
    return plan


def _same_dir(x: str | None, y: str | None) -> bool:
    return x is not None and y is not None and os.path.realpath(x) == os.path.realpath(y)


def _resolve_load(cfg: PretrainConfig) -> int | None:
    """The verified checkpoint step to load; None only for Megatron-LM's auto-resume convention
    ``--load X --save X`` with nothing in X yet."""
    ck = cfg.checkpoint
    # Rank 0 hashes every file (and refuses, one line); the others check presence and sizes only.
    step = checkpointing.verified_step(ck.load, ck.load_step, hash_files=int(os.environ.get("RANK", "0")) == 0)
    if step is not None:
        return step
    if ck.finetune:
        raise ValueError(f"--finetune: no complete checkpoint in --load {ck.load}")
    if _same_dir(ck.load, ck.save):
        if int(os.environ.get("RANK", "0")) == 0:
            logger.info("--load %s holds no checkpoint yet: starting fresh (it is also --save)", ck.load)
        return None
    what = "does not exist" if not Path(ck.load).exists() else f"holds no checkpoint ({checkpointing.LATEST_MARKER} missing)"
    raise ValueError(f"--load {ck.load} {what}; to start fresh drop --load, or give the same directory as --save "
                     "(resume when a checkpoint is there, start fresh otherwise)")


def _check_resume_compatible(cfg: PretrainConfig, plan: RunPlan) -> None:
    """Refuse a resume that would not continue the checkpoint's run, naming what differs."""
    load, a = cfg.checkpoint.load, cfg.args
    saved = checkpointing.read_trainer_state(load, plan.load_step)
    where = f"--load {checkpointing.checkpoint_dir(load, plan.load_step)}"
    now_model = dataclasses.asdict(plan.model_cfg)
    for field in ARCHITECTURE_FIELDS:
        before = saved.get("model_config", {}).get(field, now_model[field])
        if before != now_model[field]:
            raise ValueError(f"{where}: checkpoint has {field}={before}, this run {field}={now_model[field]}; "
                             f"refusing to load weights of another shape (--{field.replace('_', '-')})")
    ident = saved["identity"]
    if (ident["input_embedding"], ident["code_fingerprint"]) != (plan.identity["input_embedding"], plan.identity["code_fingerprint"]):
        raise ValueError(
            f"{where}: checkpoint was trained with input {ident['input_embedding']} "
            f"(code {ident['code_fingerprint']}) but this run uses {plan.identity['input_embedding']} "
            f"(code {plan.identity['code_fingerprint']}); refusing to resume with a different input interface"
        )
    if cfg.checkpoint.finetune:
        return  # weights only: a new stream (and tokenizer, schedule) may start at step 0
    if "tokenizer_fingerprint" in ident and ident["tokenizer_fingerprint"] != plan.identity["tokenizer_fingerprint"]:
        rec = saved.get("tokenizer") or {}
        raise ValueError(
            f"{where}: checkpoint was trained with tokenizer {rec.get('model') or '(none, --vocab-size)'} "
            f"(fingerprint {ident['tokenizer_fingerprint']}), this run has {a.tokenizer_model or '(none, --vocab-size)'} "
            f"(fingerprint {plan.identity['tokenizer_fingerprint']}); refusing to resume with another tokenizer "
            "(to start from these weights with it, give --finetune)")
    for key, now in stream_identity(a, plan.global_batch, plan.max_steps).items():
        before = saved.get(key)
        if key in ("data_path", "valid_data_path"):
            before = _resolve_data_paths(before)  # checkpoints that recorded them as given
        if before != now:
            raise ValueError(f"{where}: checkpoint has {key}={before}, this run {key}={now}; "
                             "the data stream would not continue exactly")
    _resolve_schedule(cfg, plan, saved_schedule=checkpointing.read_common_state(load, plan.load_step).get("opt_param_scheduler"))


def _resolve_schedule(cfg: PretrainConfig, plan: RunPlan, saved_schedule: dict | None) -> None:
    """Megatron-LM's semantics: the checkpoint's schedule and this run's flags must agree, unless
    --override-opt-param-scheduler (the flags win) or --use-checkpoint-opt-param-scheduler (the checkpoint wins)."""
    if not saved_schedule:
        return
    plan.checkpoint_schedule = saved_schedule
    ck = cfg.checkpoint
    differ = {k: (saved_schedule[k], v) for k, v in plan.schedule.items() if k in saved_schedule and saved_schedule[k] != v}
    if not differ:
        plan.schedule_source = "checkpoint = command line"
    elif ck.override_opt_param_scheduler:
        plan.schedule_source = "command line (--override-opt-param-scheduler)"
    elif ck.use_checkpoint_opt_param_scheduler:
        plan.schedule.update({k: before for k, (before, _) in differ.items()})
        plan.schedule_source = "checkpoint (--use-checkpoint-opt-param-scheduler)"
    else:
        what = "; ".join(f"{k} {before} in the checkpoint, {now} in this run ({SCHEDULE_FLAGS[k]})"
                         for k, (before, now) in differ.items())
        raise ValueError(f"--load {cfg.checkpoint.load}: the LR schedule differs: {what}; give "
                         "--override-opt-param-scheduler to use this run's values or "
                         "--use-checkpoint-opt-param-scheduler to keep the checkpoint's")


def describe_schedule(schedule: dict, source: str) -> str:
    return (f"LR schedule in force (from {source}): lr {schedule['max_lr']:g}, min-lr {schedule['min_lr']:g}, "
            f"warmup {schedule['lr_warmup_steps']} steps, {schedule['lr_decay_style']} decay over "
            f"{schedule['lr_decay_steps']} steps, weight decay {schedule['start_wd']:g}")


class Trainer:
    def __init__(self, cfg: PretrainConfig, plan: RunPlan | None = None):
        a = cfg.args
        self.cfg = cfg
        self.plan = plan = plan or plan_run(cfg)
        self.pg = initialize_distributed(cfg.layout, seed=a.seed)
        self.ranks = parallel_ranks()
        self.device = runtime_device()
        self.tokenizer = plan.tokenizer
        self.model_cfg = plan.model_cfg
        self.identity = plan.identity
        assert plan.dp_size == self.ranks["dp_size"], (plan.dp_size, self.ranks["dp_size"])
        self.global_batch = plan.global_batch
        self.num_microbatches = self.global_batch // (a.micro_batch_size * self.ranks["dp_size"])
        self.max_steps = plan.max_steps
        seed_streams(a.seed)  # the model's init: each layer from (seed, its global number), whatever the layout
        initialize_tp_comm_overlap(a)
        self.fusions = fusion_settings(a, te_layers=use_transformer_engine(self.model_cfg),
                                       gated_linear_unit=BLOCKS[self.model_cfg.block]["gated_linear_unit"])
        self.tf32 = configure_tf32(a)
        config = build_transformer_config(self.model_cfg, cfg.layout, **self.fusions,
                                          **({"tp_comm_overlap": True} if a.tp_comm_overlap else {}))
        self.chunks = build_model_chunks(self.model_cfg, config, cfg.layout, self.pg,
                                         use_distributed_optimizer=cfg.optim.use_distributed_optimizer,
                                         overlap_grad_reduce=a.overlap_grad_reduce,
                                         overlap_param_gather=a.overlap_param_gather)
        # Runtime streams (dropout) differ per pipeline stage, as in Megatron-LM.
        seed_streams(a.seed + PIPELINE_STAGE_SEED_STRIDE * self.ranks["pp_rank"])
        self.report = parameter_report(self.model_cfg, [checkpointing._unwrap(c) for c in self.chunks], self.pg)
        o = cfg.optim
        # Resuming: the optimizer is built with the checkpoint's lr/min-lr (newer megatron-core keys
        # its param groups by them when loading); --override-opt-param-scheduler sets the new ones after.
        resumed = plan.checkpoint_schedule or {}
        self.optimizer = get_megatron_optimizer(
            OptimizerConfig(optimizer="adam", lr=resumed.get("max_lr", o.lr), min_lr=resumed.get("min_lr", o.min_lr), weight_decay=o.weight_decay,
                            adam_beta1=o.adam_beta1, adam_beta2=o.adam_beta2, adam_eps=o.adam_eps,
                            clip_grad=o.clip_grad, bf16=a.bf16, params_dtype=torch.float32,
                            use_distributed_optimizer=o.use_distributed_optimizer),
            self.chunks,
        )
        self.optimizer_kind = use_fused_adamw(self.optimizer)
        sched = scheduler_settings(o, self.max_steps)  # this run's flags; plan.schedule: what applies on resume
        self.scheduler = OptimizerParamScheduler(
            self.optimizer, init_lr=0.0 if o.lr_warmup_iters else o.lr, max_lr=sched["max_lr"], min_lr=sched["min_lr"],
            lr_warmup_steps=sched["lr_warmup_steps"], lr_decay_steps=sched["lr_decay_steps"],
            lr_decay_style=sched["lr_decay_style"], start_wd=sched["start_wd"], end_wd=sched["end_wd"],
            wd_incr_steps=self.max_steps, wd_incr_style="constant",
            # Mismatches were resolved (or refused) in plan_run: the checkpoint's values load unless overridden.
            use_checkpoint_opt_param_scheduler=not cfg.checkpoint.override_opt_param_scheduler,
            override_opt_param_scheduler=cfg.checkpoint.override_opt_param_scheduler,
        )
        try:  # the shard checks run alike on every rank, before megatron's rank-0-first build
            self.train_ds, self.valid_ds = build_datasets(
                DataConfig(data_path=a.data_path, valid_data_path=a.valid_data_path, dataset_type=a.dataset_type,
                           seq_length=a.seq_length, split=a.split, cache_path=a.data_cache_path,
                           samples_per_shard_visit=a.samples_per_shard_visit, sft_fields=_sft_fields(a)),
                self.tokenizer, num_train_samples=self.max_steps * self.global_batch,
                num_valid_samples=(a.eval_iters * self.global_batch) if (a.eval_interval or a.skip_train) else 0,
                seed=a.seed,
            )
        except ValueError as e:
            raise DataError(str(e)) from None
        self.step, self.tokens = 0, 0
        if plan.load_step is not None:
            state = checkpointing.load_checkpoint(cfg.checkpoint.load, self.chunks, self.optimizer, self.scheduler,
                                                  plan.load_step, weights_only=cfg.checkpoint.finetune)
            if not cfg.checkpoint.finetune:
                self.step, self.tokens = state["step"], state["tokens"]
            if cfg.checkpoint.override_opt_param_scheduler and not cfg.checkpoint.finetune:
                for group in self.optimizer.param_groups:  # megatron-core >= 0.17 reads them per group
                    group.update({k: v for k, v in (("max_lr", o.lr), ("min_lr", o.min_lr)) if k in group})
                self.scheduler.step(increment=0)  # the LR of the next step from the overridden schedule

    def _stream_identity(self) -> dict:
        return stream_identity(self.cfg.args, self.global_batch, self.max_steps)

    def trainer_state(self) -> dict:
        r = self.ranks
        code = self.model_cfg.code_spec()
        return {"step": self.step, "tokens": self.tokens, "identity": self.identity, **self._stream_identity(),
                "model_config": dataclasses.asdict(self.model_cfg), "code_spec": code.to_dict() if code else None,
                "tokenizer": {"type": self.cfg.args.tokenizer_type, "model": self.cfg.args.tokenizer_model},
                "run_config": self.cfg.as_dict(),
                "layout": {k: r[k] for k in ("world_size", "tp_size", "pp_size", "dp_size")}}

    def _microbatches(self, dataset, step: int) -> list[dict]:
        a = self.cfg.args
        error = None
        try:
            batches = [fetch_microbatch(dataset, rank_microbatch_indices(
                           step, m, global_batch_size=self.global_batch, micro_batch_size=a.micro_batch_size,
                           dp_rank=self.ranks["dp_rank"], dp_size=self.ranks["dp_size"]))
                       for m in range(self.num_microbatches)]
        except TokenIdOutOfRange as e:  # names shard, document and sample
            error = str(e)
        _raise_if_any_rank_failed(error, self.device)
        # The forward step moves each to the GPU with non_blocking=True: from pinned memory that overlaps.
        return [pin(b) for b in batches] if self.device.type == "cuda" else batches

    def _run(self, microbatches, forward_only: bool) -> tuple[float, float]:
        """(mean NLL over the global batch, prediction targets of the global batch)."""
        out = forward_backward(self.chunks, microbatches, num_microbatches=self.num_microbatches,
                               seq_length=self.cfg.args.seq_length, micro_batch_size=self.cfg.args.micro_batch_size,
                               forward_only=forward_only, pg_collection=self.pg, device=self.device)
        # The loss lives on the last pipeline stage, replicated over its TP ranks: count TP rank 0 only.
        owns = out is not None and self.ranks["tp_rank"] == 0
        total, count = _global_sum([out[0] if owns else 0.0, float(out[1]) if owns else 0.0], self.device)
        return total / count, count

    def train_step(self) -> dict:
        t0 = time.perf_counter()
        for chunk in self.chunks:
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        loss, targets = self._run(self._microbatches(self.train_ds, self.step), forward_only=False)
        check = self.cfg.args.check_for_nan_in_loss_and_grad
        if check and not math.isfinite(loss):  # the same all-reduced value on every rank
            raise NonFiniteTraining(f"step {self.step + 1}: the loss is {loss}; stopping before the optimizer step, "
                                    "nothing of this step is saved (--no-check-for-nan-in-loss-and-grad to train on)")
        _, grad_norm, _ = self.optimizer.step()
        if check and grad_norm is not None and not math.isfinite(float(grad_norm)):
            raise NonFiniteTraining(f"step {self.step + 1}: the gradient norm is {float(grad_norm)} (loss {loss}); "
                                    "stopping before any save (--no-check-for-nan-in-loss-and-grad to train on)")
        self.scheduler.step(increment=1)
        self.step += 1
        self.tokens += int(targets)
        return {"step": self.step, "loss": loss, "lr": self.optimizer.param_groups[0]["lr"],
                "grad_norm": float(grad_norm) if grad_norm is not None else float("nan"),
                "tokens": self.tokens, "step_tokens": int(targets), "step_time_s": time.perf_counter() - t0}

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Mean NLL on the first ``eval_iters`` global batches of the validation stream (always the same)."""
        for chunk in self.chunks:
            chunk.eval()
        with params_synced(self.chunks):
            totals = [self._run(self._microbatches(self.valid_ds, k), forward_only=True)
                      for k in range(self.cfg.args.eval_iters)]
        for chunk in self.chunks:
            chunk.train()
        nll = sum(loss * n for loss, n in totals) / sum(n for _, n in totals)
        return {"val_loss": nll, "val_ppl": math.exp(min(nll, 50.0))}

    def _wait_for_export(self) -> None:
        proc = getattr(self, "_export_proc", None)
        if proc is not None and proc.wait() != 0:
            logger.error("Hugging Face export failed (exit %d): see %s", proc.returncode, self._export_log)
        self._export_proc = None

    def _export_to_hf(self, final: bool) -> None:
        """On rank 0, convert the checkpoint just saved in a background process (training goes on;
        the next save waits for it, so pruning never removes a checkpoint being exported)."""
        a = self.cfg.args
        if not a.hf_export_interval or self.ranks["rank"] != 0 or not (final or self.step % a.hf_export_interval == 0):
            return
        out_root = Path(a.hf_export_dir or Path(a.save) / "hf")
        out_root.mkdir(parents=True, exist_ok=True)
        out = out_root / f"iter_{self.step:07d}"
        self._export_log = out_root / f"iter_{self.step:07d}.log"
        cmd = [sys.executable, "-m", "megatron_fixedcode.cli.convert_checkpoint_to_hf",
               "--load", a.save, "--ckpt-step", str(self.step), "--output", str(out), "--overwrite"]
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
        # The converter runs on the CPU: on a GPU node it must not allocate a model on the GPU rank 0 trains on.
        env["CUDA_VISIBLE_DEVICES"] = ""
        self._export_proc = subprocess.Popen(cmd, stdout=open(self._export_log, "w"), stderr=subprocess.STDOUT, env=env)
        logger.info("exporting step %d to Hugging Face format in %s", self.step, out)

    def save(self, final: bool = False) -> None:
        ck = self.cfg.checkpoint
        self._wait_for_export()
        t0 = time.perf_counter()
        target, error = checkpointing.checkpoint_dir(ck.save, self.step), None
        try:
            with params_synced(self.chunks):
                path = checkpointing.save_checkpoint(ck.save, self.step, self.chunks, self.optimizer, self.scheduler,
                                                     self.trainer_state(), ck.keep_last)
        except BaseException as e:  # torch's CheckpointException is a BaseException
            if not is_write_failure(e):
                raise
            error = checkpoint_write_error(target, e)  # before the partial directory frees its space
        if error is not None:  # raised outside the handler: nothing keeps the writer's failure alive
            # torch's checkpoint writer gathers every rank's failures, so every rank gets here;
            # `latest` has not moved, and the partial directory goes (it is not a checkpoint).
            if self.ranks["rank"] == 0:
                shutil.rmtree(target, ignore_errors=True)
            raise SaveFailed(str(error))
        logger.info("saved checkpoint %s in %.1f s", path, time.perf_counter() - t0)
        self._export_to_hf(final)

    def train(self) -> int:
        cfg, a, ck = self.cfg, self.cfg.args, self.cfg.checkpoint
        rank0 = self.ranks["rank"] == 0
        if rank0:
            logger.info(format_parameter_report(self.report))
            logger.info("layers: %s%s; optimizer: %s", self.chunks[0].config.transformer_impl,
                        f", FP8 {a.fp8_format}/{a.fp8_recipe}" if a.fp8_format else "", self.optimizer_kind)
            if self.device.type == "cuda":
                on = [k for k, v in self.fusions.items() if v]
                logger.info("GPU fusions: %s; TF32 %s", ", ".join(on) or "none", "on" if self.tf32 else "off")
            logger.info("global batch %d = %d micro x %d accumulation x %d data-parallel; %d steps; start at step %d",
                        self.global_batch, a.micro_batch_size, self.num_microbatches, self.ranks["dp_size"],
                        self.max_steps, self.step)
            sch = self.scheduler  # after loading: the values actually in force
            logger.info("%s", describe_schedule({k: getattr(sch, k) for k in self.plan.schedule}, self.plan.schedule_source))
            if ck.save and not a.skip_train:  # a warning, logged: room for fewer than two checkpoints
                free_space_warning(ck.save, estimate_checkpoint_bytes(self.report["total_params"], bf16=a.bf16))
        flops_per_token = model_flops_per_token(self.report, a.num_layers, a.hidden_size, a.seq_length)
        sink = MetricsSink(cfg.logging, enabled=rank0, max_steps=self.max_steps, flops_per_token=flops_per_token,
                           num_gpus=self.ranks["world_size"] if torch.cuda.is_available() else 1,
                           run_config=cfg.as_dict())
        if a.skip_train:
            record = {"step": self.step, "tokens": self.tokens, **self.evaluate()}
            if rank0:
                logger.info("evaluation at step %d: val loss %.6f ppl %.3f", self.step, record["val_loss"], record["val_ppl"])
            if sink.metrics_file:
                sink.metrics_file.write(json.dumps(record) + "\n")
            sink.close()
            return 0
        exit_request = _ExitRequest(ck.exit_signal_handler)
        started = time.time()
        saved_at = self.step
        while self.step < self.max_steps:
            record = self.train_step()
            if self.valid_ds is not None and a.eval_interval and (self.step % a.eval_interval == 0 or self.step == self.max_steps):
                record.update(self.evaluate())
            sink.record(record)
            timed_out = ck.exit_duration_in_mins is not None and (time.time() - started) / 60 >= ck.exit_duration_in_mins
            stop = _any_rank(exit_request.flag or timed_out, self.device) or (ck.exit_interval and self.step >= ck.exit_interval)
            if ck.save and ((ck.save_interval and self.step % ck.save_interval == 0) or stop or self.step == self.max_steps):
                self.save(final=stop or self.step == self.max_steps)
                saved_at = self.step
            if stop:
                if rank0:
                    logger.info("exiting at step %d (%s)", self.step, "signal/duration" if not ck.exit_interval else "exit interval")
                break
        if ck.save and saved_at != self.step:
            self.save(final=True)
        self._wait_for_export()
        sink.close()
        if rank0:
            logger.info("done: step %d, %d prediction targets (budget %s)", self.step, self.tokens, a.train_tokens)
        return 0


def run_pretraining(cfg: PretrainConfig) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("megatron").setLevel(logging.WARNING)  # its INFO lines drown ours
    if int(os.environ.get("RANK", "0")) == 0:
        logger.info("%s", describe_runtime())
    rank0 = int(os.environ.get("RANK", "0")) == 0
    save_lock = None
    try:
        plan = plan_run(cfg)  # every rank decides alike, before any process group: one line, on rank 0
        if cfg.checkpoint.save and not cfg.args.skip_train and os.environ.get("LOCAL_RANK", "0") == "0":
            _check_save_dir(cfg.checkpoint.save, rank0)  # a read-only filesystem or a path under a file: now, not at the first save
        if rank0 and cfg.checkpoint.save:
            # One job writes a --save directory at a time: a second one is refused naming the holder;
            # the kernel drops the lock of a killed run, so the next run takes it over.
            save_lock = lock_save_dir(cfg.checkpoint.save)
    except (ValueError, FileNotFoundError) as e:
        if rank0:
            logger.error("%s", e)
        return 2
    try:
        return _train(cfg, plan)
    finally:
        if save_lock is not None:
            save_lock.release()


def _check_save_dir(save: str, rank0: bool) -> None:
    """The first rank of every node proves it can write to ``--save`` (each node writes its
    ranks' shards there); rank 0 reports for its node, another node's first rank for its own."""
    try:
        check_save_dir_writable(save)
    except ValueError as e:
        if not rank0:
            logger.error("node %s: %s", os.environ.get("GROUP_RANK", "?"), e)
        raise


def _train(cfg: PretrainConfig, plan: RunPlan) -> int:
    rank0 = int(os.environ.get("RANK", "0")) == 0
    try:
        trainer = Trainer(cfg, plan)
        if not rank0:
            logging.getLogger().setLevel(logging.WARNING)
        return trainer.train()
    except (DataError, SaveFailed) as e:  # every rank raises them alike (see where they are raised)
        if rank0:
            logger.error("%s", e)
        return 2
    except NonFiniteTraining as e:
        if rank0:
            logger.error("%s", e)
        return 3
    finally:
        destroy_distributed()
