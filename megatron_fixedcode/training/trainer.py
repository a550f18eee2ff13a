"""The Trainer: one optimizer step, one evaluation, and the state a checkpoint holds — built from small functions
that tests, export and evaluation can use alone (saving is checkpoint/checkpointer.py's).

A sample is a pure function of (seed, global sample index) and step ``n`` reads indices
``[n·G, (n+1)·G)`` (G = global batch), so the data position *is* the step counter: resuming
restores model, optimizer, scheduler, RNG and step, and continues the exact stream.

The parts, in the order :class:`Trainer` builds them (each decided once, in ``run_parts.py`` or the run plan):

* :func:`build_chunks` — megatron's TransformerConfig (TE or local layers, decided once by
  ``use_transformer_engine``), the model chunks wrapped in megatron's DDP;
* :func:`build_optimizer` / :func:`build_scheduler` — megatron's optimizer (plain or distributed,
  FP32 or BF16 main weights) and ``OptimizerParamScheduler``;
* :func:`build_run_datasets` — the train and validation datasets;
* :func:`resume` — loads what :func:`~megatron_fixedcode.training.run_plan.resume_scope` allows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time

import torch

from megatron_fixedcode import checkpoint
from megatron_fixedcode.arguments.parse import PretrainConfig
from megatron_fixedcode.compat import initialize_distributed, parallel_ranks, runtime_device
from megatron_fixedcode.compat.rng import PIPELINE_STAGE_SEED_STRIDE, seed_host_streams, seed_streams
from megatron_fixedcode.models import parameter_report
from megatron_fixedcode.tokenizers import carried_record, tokenizer_record
from megatron_fixedcode.data.sample_digest import as_hex, from_lanes, split_digests, to_lanes
from megatron_fixedcode.training.batch_reader import reader_of
from megatron_fixedcode.training.batches import pin
from megatron_fixedcode.errors import DataError, NonFiniteTraining
from megatron_fixedcode.training.forward_backward import forward_backward
from megatron_fixedcode.training.gpu_features import (
    configure_tf32,
    describe_optimizer,
    initialize_tp_comm_overlap,
    params_synced,
    use_fused_adamw,
)
from megatron_fixedcode.recovery.rerun import as_non_finite, checkpoint_state, forward_backward_step
from megatron_fixedcode.recovery.rerun import restore_from, start_rerun
from megatron_fixedcode.training.run_parts import (
    build_chunks,
    build_optimizer,
    build_run_datasets,
    build_scheduler,
    canonical_lr,
    decoupled_lr,
    local_checkpoints,
    resume,
    wandb_run_id,
)
from megatron_fixedcode.training.run_plan import RunPlan, plan_run, stream_identity
from megatron_fixedcode.training.timers import build_timers, log_timers, timed
from megatron_fixedcode.utils.rank_agreement import global_sum, raise_if_any_rank_failed

logger = logging.getLogger(__name__)


class Trainer:
    """The parts of one run on this rank, and what they do together: a step, an evaluation; its state.
    The loop that decides when to do each is :func:`megatron_fixedcode.training.loop.train`."""

    def __init__(self, cfg: PretrainConfig, plan: RunPlan | None = None, on_process_group=None):
        """``on_process_group``: called on every rank once the process group exists (the in-job restarts
        record the attempt there, so that one failing while it loads counts)."""
        self.cfg = cfg
        self.plan = plan = plan or plan_run(cfg)
        self.pg = initialize_distributed(
            cfg.layout, seed=cfg.schedule.seed, timeout_s=60 * cfg.health.distributed_timeout_minutes
        )
        if on_process_group is not None:
            on_process_group()
        self.iterations_to_skip = start_rerun(cfg.health)  # megatron-core's rerun state machine (rerun.py)
        self.timers = build_timers(cfg.logging)  # megatron-core's Timers, at --timing-log-level (training/timers.py)
        self.ranks = parallel_ranks()
        self.device = runtime_device()
        self.tokenizer = plan.tokenizer
        # what the checkpoints record of it, and where its one copy goes under --save (rank 0, first save)
        self.tokenizer_record = carried_record(
            tokenizer_record(cfg.tokenizer), getattr(self.tokenizer, "fingerprint", None)
        )
        self.model_cfg = plan.model_cfg
        self.identity = plan.identity
        assert plan.dp_size == self.ranks["dp_size"], (plan.dp_size, self.ranks["dp_size"])
        self.global_batch = plan.global_batch
        self.num_microbatches = self.global_batch // (cfg.schedule.micro_batch_size * self.ranks["dp_size"])
        self.max_steps = plan.max_steps
        seed_streams(
            cfg.schedule.seed
        )  # the model's init: each layer from (seed, its global number), whatever the layout
        initialize_tp_comm_overlap(cfg, self.model_cfg.hidden_size)
        self.tf32 = configure_tf32(cfg.performance)
        self.chunks, self.fusions = build_chunks(cfg, plan, self.pg)
        self.chunks[0].config.timers = self.timers  # megatron-core's schedule and grad sync time themselves
        # Runtime streams (dropout) differ per pipeline stage, as in Megatron-LM.
        seed_streams(cfg.schedule.seed + PIPELINE_STAGE_SEED_STRIDE * self.ranks["pp_rank"])
        seed_host_streams(cfg.schedule.seed + PIPELINE_STAGE_SEED_STRIDE * self.ranks["pp_rank"])
        self.report = parameter_report(self.model_cfg, [checkpoint.unwrap(c) for c in self.chunks], self.pg)
        self.optimizer = build_optimizer(cfg, self.chunks, plan.checkpoint_schedule, self.timers)
        self.optimizer_kind = describe_optimizer(self.optimizer, use_fused_adamw(self.optimizer))
        self.scheduler = build_scheduler(cfg, self.optimizer, self.max_steps, self.global_batch)
        self.train_ds, self.valid_ds = build_run_datasets(cfg, self.tokenizer, self.max_steps, self.global_batch)
        self.local_checkpoints = local_checkpoints(cfg.checkpoint)  # --non-persistent-ckpt-type local, else None
        self.step, self.tokens, resumed = resume(
            cfg, plan, self.chunks, self.optimizer, self.scheduler, self.local_checkpoints
        )
        # what the resume loaded and from which store, what it passed over and why (the attempts' record keeps them)
        source = plan.source if resumed is not None and plan.load_step == self.step else None
        self.loaded_from = None if source is None else {"store": source.store, "checkpoint": str(source.target)}
        if self.local_checkpoints is not None and self.local_checkpoints.loaded_step:
            self.loaded_from = {"store": "local", "checkpoint": str(self.local_checkpoints.directory)}
        self.passed_over = list(plan.source.passed_over) if plan.source else []
        self.wandb_run_id = wandb_run_id(cfg, resumed)
        self.train_iter = restore_from(self, resumed)  # the rerun data iterator; the spike statistics saved

    def _stream_identity(self) -> dict:
        return stream_identity(self.cfg, self.global_batch, self.max_steps)

    @contextlib.contextmanager
    def writing_checkpoint(self, timer: str):
        """Around a checkpoint write (checkpoint/checkpointer.py): the parameters gathered (--overlap-param-gather),
        Megatron-LM's timer, logged after the write as Megatron-LM does."""
        with params_synced(self.chunks), timed(self.timers, timer, 0, barrier=True):
            yield
        log_timers(self.timers, [timer], rank0=self.ranks["rank"] == 0)

    def trainer_state(self) -> dict:
        r = self.ranks
        code = self.model_cfg.code_spec()
        return {
            "step": self.step,
            "tokens": self.tokens,
            "identity": self.identity,
            **self._stream_identity(),
            "model_config": dataclasses.asdict(self.model_cfg),
            "code_spec": code.to_dict() if code else None,
            "tokenizer": self.tokenizer_record,
            "run_config": self.cfg.as_dict(),
            "wandb_run_id": self.wandb_run_id,
            "rerun": checkpoint_state(),
            "optimizer_format": checkpoint.optimizer_format(self.optimizer, self.cfg.checkpoint.fully_reshardable),
            "layout": checkpoint.layout_of(r),
        }

    def _microbatches(self, dataset, step: int) -> list[dict]:
        batches, error = reader_of(self, dataset).read(step)  # --num-workers: batch_reader.py
        raise_if_any_rank_failed(error, self.device, DataError)
        # The forward step moves each to the GPU with non_blocking=True: from pinned memory that overlaps.
        return [pin(b) for b in batches] if self.device.type == "cuda" else batches

    def _run(self, microbatches, forward_only: bool) -> tuple[float, float, str | None]:
        """(mean NLL over the global batch, prediction targets of the global batch, the digest of its samples:
        None for batches read without one, the validation's)."""
        microbatches, digest = split_digests(microbatches)
        out = forward_backward(
            self.chunks,
            microbatches,
            num_microbatches=self.num_microbatches,
            seq_length=self.cfg.schedule.seq_length,
            micro_batch_size=self.cfg.schedule.micro_batch_size,
            forward_only=forward_only,
            pg_collection=self.pg,
            device=self.device,
        )
        # The loss lives on the last pipeline stage, replicated over its TP ranks: count TP rank 0 only.
        owns = out is not None and self.ranks["tp_rank"] == 0
        # The sample digest rides along: one rank per data-parallel rank adds its share (its CP and TP peers,
        # its other stages read the same samples), so the sum over all ranks is the data-parallel group's.
        adds_digest = owns and self.ranks["cp_rank"] == 0 and digest is not None
        lanes = to_lanes(digest if adds_digest else 0)
        total, count, *lanes = global_sum(
            [out[0] if owns else 0.0, float(out[1]) if owns else 0.0, *lanes], self.device
        )
        return total / count, count, None if digest is None else as_hex(from_lanes(lanes))

    def train_step(self) -> dict:
        t0 = time.perf_counter()
        # re-runs it as the rerun state machine says
        loss, targets, samples, (save, stop, code) = forward_backward_step(self)
        if stop:
            return {"step": self.step, "rerun_exit": code, "rerun_save": save}
        check = self.cfg.health.check_for_nan_in_loss_and_grad
        if check and not math.isfinite(loss):  # the same all-reduced value on every rank
            raise NonFiniteTraining(
                f"step {self.step + 1}: the loss is {loss}; stopping before the optimizer step, "
                "nothing of this step is saved (--no-check-for-nan-in-loss-and-grad to train on)"
            )
        with timed(self.timers, "optimizer", 1, barrier=True):
            _, grad_norm, num_zeros = self.optimizer.step()
        if check and grad_norm is not None and not math.isfinite(float(grad_norm)):
            raise NonFiniteTraining(
                f"step {self.step + 1}: the gradient norm is {float(grad_norm)} (loss {loss}); "
                "stopping before any save (--no-check-for-nan-in-loss-and-grad to train on)"
            )
        self.scheduler.step(increment=1)
        self.step += 1
        self.tokens += int(targets)
        decoupled = decoupled_lr(self.optimizer)
        return {
            **({"decoupled_lr": decoupled} if decoupled is not None else {}),
            **({"num_zeros": num_zeros} if self.cfg.logging.log_num_zeros_in_grad else {}),
            "step": self.step,
            "loss": loss,
            "lr": canonical_lr(self.optimizer),
            "grad_norm": float(grad_norm) if grad_norm is not None else float("nan"),
            "tokens": self.tokens,
            "step_tokens": int(targets),
            "step_time_s": time.perf_counter() - t0,
            **({"samples": samples} if samples is not None else {}),  # equal at any DP size (data/sample_digest.py)
        }

    @torch.no_grad()
    def evaluate(self, stop=None, around_batch=contextlib.nullcontext) -> dict:
        """Mean NLL on the first ``eval_iters`` global batches of the validation stream (always the same).
        ``stop`` (asked before each batch, alike on every rank) abandons it: a signal's checkpoint must not
        wait for a long evaluation inside the time limit's warning; nothing is recorded then. ``around_batch``:
        a context around each batch (the resiliency package's "step" section)."""
        for chunk in self.chunks:
            chunk.eval()
        totals = []
        with params_synced(self.chunks):
            for k in range(self.cfg.schedule.eval_iters):
                if stop is not None and stop():
                    break
                try:
                    with around_batch():
                        totals.append(self._run(self._microbatches(self.valid_ds, k), forward_only=True)[:2])
                except RuntimeError as e:
                    raise as_non_finite(
                        e,
                        f"evaluation at step {self.step}: rank {self.ranks['rank']}",
                        "stopping; the last checkpoint is unchanged",
                    ) from None
        for chunk in self.chunks:
            chunk.train()
        if len(totals) < self.cfg.schedule.eval_iters:
            if self.ranks["rank"] == 0:
                logger.warning(
                    "evaluation at step %d stopped by a signal after %d of %d batches: not recorded",
                    self.step,
                    len(totals),
                    self.cfg.schedule.eval_iters,
                )
            return {}
        nll = sum(loss * n for loss, n in totals) / sum(n for _, n in totals)
        return {"val_loss": nll, "val_ppl": math.exp(min(nll, 50.0))}
