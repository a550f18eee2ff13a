"""The run's one owner of saves: the persistent (synchronous) and ``--async-save`` checkpoints and their waits,
and what follows a complete checkpoint: Megatron-LM's progress.txt lines (``--log-progress``) and the downstream
evaluation jobs, whose pending checkpoints pruning keeps. The loop calls :meth:`save` at its save points,
:meth:`save_non_persistent` at the non-persistent ones (``--non-persistent-save-interval``), :meth:`poll` every
step and :meth:`close` before the process may exit; nothing else saves.
"""

from __future__ import annotations

import logging

from megatron_fixedcode.training.async_saves import AsyncSaves
from megatron_fixedcode.training.downstream_evals import DownstreamEvals
from megatron_fixedcode.training.progress_log import ProgressLog

logger = logging.getLogger(__name__)


class CheckpointManager:
    def __init__(self, trainer, flops_per_token: float):
        self.trainer = trainer
        seq_length = trainer.cfg.schedule.seq_length
        self.progress = ProgressLog(
            trainer.cfg.checkpoint.save,
            enabled=bool(trainer.cfg.logging and trainer.cfg.logging.log_progress),
            rank0=trainer.ranks["rank"] == 0,
            world_size=trainer.ranks["world_size"],
            flops_per_sample=flops_per_token * seq_length,
            seq_length=seq_length,
        )
        self.downstream = DownstreamEvals(trainer)  # --downstream-eval-*: a job per checkpoint (rank 0)
        self.async_saves = AsyncSaves(trainer)  # --async-save: finalized at the next step, waited for at the end
        self.async_saves.on_finalized = self._async_complete
        self.saved_at = trainer.step  # the step of the newest checkpoint this run has (or resumed from)
        self._non_persistent_in_flight = None  # the step of a non-persistent save written in the background
        if self.asynchronous and trainer.local_checkpoints is not None and trainer.ranks["rank"] == 0:
            logger.info(
                "--async-save: local non-persistent checkpoints are still written synchronously (nvidia-resiliency-"
                "ext's asynchronous local save needs CUDA streams; node-local writes are short)"
            )

    @property
    def asynchronous(self) -> bool:
        return self.async_saves.queue is not None

    def start(self) -> None:
        """The job's start: its progress line; the evaluation jobs of complete checkpoints that lack scores."""
        self.progress.start(self.trainer.step * self.trainer.global_batch)
        self.downstream.start(self.trainer.step)

    def save(self, final: bool) -> None:
        """A checkpoint of the trainer's step (``final``: the run's last, an export's too). Pruning keeps the
        checkpoints that await their evaluation."""
        step = self.trainer.step
        self.trainer.save(
            final=final,
            keep=self.downstream.keep if self.downstream.enabled else None,
            async_saves=self.async_saves if self.asynchronous else None,
        )
        self.saved_at = step
        self.progress.saved(step, step * self.trainer.global_batch, self.asynchronous)
        if not self.asynchronous:
            self.downstream.saved(step)

    def save_non_persistent(self) -> None:
        """``--non-persistent-save-interval``: a checkpoint of the trainer's step into the non-persistent directory,
        where only the newest stays, after the save in flight (if any) is finalized; ``global`` with --async-save
        is written in the background as the persistent ones, ``local`` synchronously (checkpoint/local.py). No
        export, evaluation or progress line: it is for restarts only (Megatron-LM's meaning)."""
        self.async_saves.finalize(blocking=True)
        background = self.asynchronous and self.trainer.local_checkpoints is None
        if background:
            self._non_persistent_in_flight = self.trainer.step
        self.trainer.save(non_persistent=True, async_saves=self.async_saves if background else None)

    def non_persistent_due(self) -> bool:
        interval = self.trainer.cfg.checkpoint.non_persistent_save_interval
        return bool(interval and self.trainer.step % interval == 0)

    def poll(self) -> None:
        """Every step: finalize a background save that is written (every rank agrees)."""
        self.async_saves.poll()

    def close(self) -> None:
        """Before the process may exit: the save in flight complete (a requeued job resumes from it)."""
        self.async_saves.close()

    def _async_complete(self, step: int) -> None:
        if step == self._non_persistent_in_flight:  # no progress line or evaluation for a non-persistent save
            self._non_persistent_in_flight = None
            return
        self.progress.async_saved(step)
        self.downstream.saved(step)
