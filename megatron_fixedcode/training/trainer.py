"""The Trainer: one optimizer step, one evaluation, one save — built from small functions that
tests, export and evaluation can use alone.

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
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

from megatron_fixedcode import checkpoint
from megatron_fixedcode.arguments.parse import PretrainConfig
from megatron_fixedcode.checkpoint.save_checks import checkpoint_write_error, is_write_failure
from megatron_fixedcode.compat import initialize_distributed, parallel_ranks, runtime_device
from megatron_fixedcode.compat.rng import PIPELINE_STAGE_SEED_STRIDE, seed_host_streams, seed_streams
from megatron_fixedcode.models import parameter_report
from megatron_fixedcode.tokenizers import carried_record, tokenizer_record, write_carried_copy
from megatron_fixedcode.utils.job_env import standalone_env
from megatron_fixedcode.training.batch_reader import reader_of
from megatron_fixedcode.training.batches import pin
from megatron_fixedcode.training.errors import DataError, ExportFailed, NonFiniteTraining, SaveFailed
from megatron_fixedcode.training.forward_backward import forward_backward
from megatron_fixedcode.training.in_job_restarts import is_collective_failure
from megatron_fixedcode.training.gpu_features import (
    configure_tf32,
    describe_optimizer,
    initialize_tp_comm_overlap,
    params_synced,
    use_fused_adamw,
)
from megatron_fixedcode.training.rerun import as_non_finite, checkpoint_state, forward_backward_step
from megatron_fixedcode.training.rerun import restore_from, start_rerun
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
    """The parts of one run on this rank, and what they do together: a step, an evaluation, a save.
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

    def _run(self, microbatches, forward_only: bool) -> tuple[float, float]:
        """(mean NLL over the global batch, prediction targets of the global batch)."""
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
        total, count = global_sum([out[0] if owns else 0.0, float(out[1]) if owns else 0.0], self.device)
        return total / count, count

    def train_step(self) -> dict:
        t0 = time.perf_counter()
        loss, targets, (save, stop, code) = forward_backward_step(self)  # re-runs it as the rerun state machine says
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
                        totals.append(self._run(self._microbatches(self.valid_ds, k), forward_only=True))
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

    def wait_for_export(self) -> None:
        """Wait for the background export. A failed one leaves no directory under its name (the
        converter writes ``OUT.partial`` and renames it when complete; a killed converter's
        leftover is removed here). A failed intermediate export is logged and training goes on;
        a failed final export fails the run (:class:`ExportFailed`), as it is what the run was
        asked to deliver. No retry: a full disk or a bad tokenizer path would fail again."""
        proc, self._export_proc = getattr(self, "_export_proc", None), None
        if proc is None or proc.wait() == 0:
            return
        from megatron_fixedcode.export import hf_io

        step, out = self._export_step, self._export_out
        shutil.rmtree(hf_io.partial_dir(out), ignore_errors=True)  # nothing holds them: the child has exited
        hf_io.lock_file(out).unlink(missing_ok=True)
        how = f"killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exit code {proc.returncode}"
        message = (
            f"the Hugging Face export of step {step} failed ({how}; see {self._export_log}): {out} was not "
            f"written; checkpoint step {step} is saved, export it again with tools/convert_checkpoint_to_hf.py "
            f"--load {self.cfg.checkpoint.save} --ckpt-step {step} --output {out}"
        )
        if self._export_final:
            raise ExportFailed(message)
        logger.error("%s (training goes on)", message)

    def _export_to_hf(self, final: bool) -> None:
        """On rank 0, convert the checkpoint just saved in a background process (training goes on;
        the next save waits for it, so pruning never removes a checkpoint being exported)."""
        ck = self.cfg.checkpoint
        if (
            not ck.hf_export_interval
            or self.ranks["rank"] != 0
            or not (final or self.step % ck.hf_export_interval == 0)
        ):
            return
        out_root = Path(ck.hf_export_dir or Path(ck.save) / "hf")
        out_root.mkdir(parents=True, exist_ok=True)
        out = out_root / f"iter_{self.step:07d}"
        self._export_log = out_root / f"iter_{self.step:07d}.log"
        self._export_step, self._export_out, self._export_final = self.step, out, final
        cmd = [
            sys.executable,
            "-m",
            "megatron_fixedcode.cli.convert_checkpoint_to_hf",
            "--load",
            ck.save,
            "--ckpt-step",
            str(self.step),
            "--output",
            str(out),
            "--overwrite",
        ]
        env = standalone_env()  # one process of its own, not a rank of this launch
        # The converter runs on the CPU: on a GPU node it must not allocate a model on the GPU rank 0 trains on.
        env["CUDA_VISIBLE_DEVICES"] = ""
        self._export_proc = subprocess.Popen(cmd, stdout=open(self._export_log, "w"), stderr=subprocess.STDOUT, env=env)
        logger.info("exporting step %d to Hugging Face format in %s", self.step, out)

    def _save_local(self, timer: str) -> None:
        """--non-persistent-ckpt-type local: every rank its file in node-local storage (checkpoint/local.py)."""
        t0 = time.perf_counter()
        with params_synced(self.chunks), timed(self.timers, timer, 0, barrier=True):
            where = self.local_checkpoints.save(
                self.step, self.chunks, self.optimizer, self.scheduler, self.trainer_state()
            )
        if self.ranks["rank"] == 0:
            logger.info(
                "saved non-persistent local checkpoint of step %d in %s in %.1f s",
                self.step,
                where.parent,
                time.perf_counter() - t0,
            )
        log_timers(self.timers, [timer], rank0=self.ranks["rank"] == 0)

    def save(self, final: bool = False, keep=None, async_saves=None, non_persistent: bool = False) -> None:
        """``keep(step)``: an older checkpoint that --ckpt-keep-last / --save-retain-interval must not prune yet;
        ``async_saves``: the run's --async-save queue (None: a synchronous save); ``non_persistent``: into the
        non-persistent directory, keeping only the newest there (no export). Called by the run's
        :class:`~.checkpoint_manager.CheckpointManager`."""
        ck = self.cfg.checkpoint
        root = ck.non_persistent_dir() if non_persistent else ck.save
        timer = "save-checkpoint-non-persistent" if non_persistent else "save-checkpoint"  # Megatron-LM's names
        self.wait_for_export()
        if non_persistent and self.local_checkpoints is not None:
            return self._save_local(timer)
        t0 = time.perf_counter()
        target, error = checkpoint.checkpoint_dir(root, self.step), None
        try:
            if self.ranks["rank"] == 0:
                write_carried_copy(root, self.tokenizer_record)
            with params_synced(self.chunks), timed(self.timers, timer, 0, barrier=True):
                path = checkpoint.save_checkpoint(
                    root,
                    self.step,
                    self.chunks,
                    self.optimizer,
                    self.scheduler,
                    self.trainer_state(),
                    1 if non_persistent else ck.keep_last,
                    None if non_persistent else ck.retain_interval,
                    async_saves,
                    None if non_persistent else keep,
                )
        except BaseException as e:  # torch's CheckpointException is a BaseException
            if not is_write_failure(e) or is_collective_failure(e):  # a lost peer: the group restarts
                raise
            error = checkpoint_write_error(target, e)  # before the partial directory frees its space
        if error is not None:  # raised outside the handler: nothing keeps the writer's failure alive
            # torch's checkpoint writer gathers every rank's failures, so every rank gets here;
            # `latest` has not moved, and the partial directory goes (it is not a checkpoint).
            if self.ranks["rank"] == 0:
                shutil.rmtree(target, ignore_errors=True)
            raise SaveFailed(str(error))
        logger.info(
            "%s %scheckpoint %s in %.1f s",
            "started" if async_saves else "saved",
            "non-persistent " if non_persistent else "",
            path,
            time.perf_counter() - t0,
        )
        log_timers(self.timers, [timer], rank0=self.ranks["rank"] == 0)  # as Megatron-LM, after each save
        if non_persistent:
            return
        if async_saves:  # --async-save: an export needs the checkpoint complete
            async_saves.before_export(final)
        self._export_to_hf(final)
