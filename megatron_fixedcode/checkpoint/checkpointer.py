"""The run's one owner of saves, in the spirit of torchtitan's checkpointer: the loop calls :meth:`after_step`
after every step and :meth:`finish` at the end; nothing else saves.

It decides what is due (the persistent ``--save-interval`` or the run's last step; otherwise the
``--non-persistent-save-interval``: Megatron-LM's rule, a persistent save at the same step takes its place),
writes it into its store (``--save``, the global non-persistent directory, or each rank's node-local one:
checkpoint/local.py) inside the fault-tolerance ``checkpointing`` section (``saving``, recovery's), finalizes
``--async-save`` writes every step and waits for the last, prunes and retains (checkpoint/save.py), and hands a
complete persistent checkpoint on: Megatron-LM's progress.txt lines (``--log-progress``), the downstream
evaluation jobs (whose pending checkpoints pruning keeps) and the Hugging Face export (``--hf-export-interval``).
A non-persistent checkpoint is for restarts only: no export, evaluation or progress line.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import time

from megatron_fixedcode import checkpoint
from megatron_fixedcode.checkpoint.async_save import AsyncSaves
from megatron_fixedcode.checkpoint.save_checks import checkpoint_write_error, is_write_failure
from megatron_fixedcode.checkpoint.stores import NON_PERSISTENT, PERSISTENT, DirectoryStore, Parts
from megatron_fixedcode.errors import SaveFailed, is_collective_failure
from megatron_fixedcode.tokenizers import write_carried_copy

TIMERS = {False: "save-checkpoint", True: "save-checkpoint-non-persistent"}  # Megatron-LM's timer names

logger = logging.getLogger(__name__)


class Checkpointer:
    """``trainer``: the parts and their state (``trainer_state()``, ``writing_checkpoint(timer)`` around a write);
    ``saving``: the fault-tolerance section around every save; the hand-offs of a complete persistent checkpoint:
    ``progress`` (progress.txt), ``downstream`` (evaluation jobs; its ``keep`` holds back pruning), ``export``
    (``after_save(step, final)``, ``wait()`` before the next save and at the end)."""

    def __init__(self, trainer, saving=contextlib.nullcontext, *, progress, downstream, export):
        self.trainer, self.saving = trainer, saving
        self.progress, self.downstream, self.export = progress, downstream, export
        self.ck = trainer.cfg.checkpoint
        self.rank0 = trainer.ranks["rank"] == 0
        self.async_saves = AsyncSaves(trainer)  # --async-save: finalized at the next step, waited for at the end
        self.async_saves.on_finalized = self._async_complete
        self.saved_at = trainer.step  # the step of the newest checkpoint this run has (or resumed from)
        ck = self.ck
        self.persistent = DirectoryStore(PERSISTENT, ck.save, ck.keep_last, ck.retain_interval) if ck.save else None
        # the non-persistent store: each rank's node-local one (checkpoint/local.py), else the global directory
        self.non_persistent = None
        if ck.non_persistent_save_interval:
            self.non_persistent = trainer.local_checkpoints or DirectoryStore(
                NON_PERSISTENT, ck.non_persistent_dir(), keep_last=1
            )
        self._non_persistent_in_flight = None  # the step of a non-persistent save written in the background
        if self.asynchronous and trainer.local_checkpoints is not None and self.rank0:
            logger.info(
                "--async-save: local non-persistent checkpoints are still written synchronously (nvidia-resiliency-"
                "ext's asynchronous local save needs CUDA streams; node-local writes are short)"
            )

    @property
    def asynchronous(self) -> bool:
        return self.async_saves.queue is not None

    # -- what the loop calls ---------------------------------------------------------------------------------
    def start(self) -> None:
        """The job's start: its progress line; the evaluation jobs of complete checkpoints that lack scores."""
        self.progress.start(self.trainer.step * self.trainer.global_batch)
        self.downstream.start(self.trainer.step)

    def poll(self) -> None:
        """Before every step: finalize a background save that is written (every rank agrees)."""
        self.async_saves.poll()

    def after_step(self, last: bool) -> bool:
        """The save due after this step, if any; True when it was a persistent one (``last``: the run's last step,
        always saved)."""
        step, interval = self.trainer.step, self.ck.non_persistent_save_interval
        if self.ck.save and ((self.ck.save_interval and step % self.ck.save_interval == 0) or last):
            self.save(final=last)
            return True
        if interval and step % interval == 0:
            self.save_non_persistent()
        return False

    def finish(self) -> None:
        """The run's end: its step saved if it is not yet, the save in flight complete (a requeued job resumes
        from it), the final export done (a failed one raises :class:`ExportFailed`, rank 0)."""
        if self.ck.save and self.saved_at != self.trainer.step:
            self.save(final=True)
        self.close()
        self.export.wait()

    def close(self) -> None:
        """Before the process may exit: the save in flight complete."""
        self.async_saves.close()

    # -- the saves ---------------------------------------------------------------------------------------------
    def save(self, final: bool) -> None:
        """A persistent checkpoint of the trainer's step (``final``: the run's last, an export's too)."""
        step = self.trainer.step
        with self.saving():
            self._write(self.persistent, keep=self.downstream.keep if self.downstream.enabled else None)
        self.saved_at = step
        self.progress.saved(step, step * self.trainer.global_batch, self.asynchronous)
        if self.asynchronous:
            self.async_saves.before_export(final)  # an export converts a complete checkpoint
        else:
            self.downstream.saved(step)
        self.export.after_save(step, final)

    def save_non_persistent(self) -> None:
        """A checkpoint of the trainer's step into the non-persistent store, where only the newest stays, after
        the save in flight (if any) is finalized; ``global`` with --async-save is written in the background as the
        persistent ones, ``local`` synchronously (checkpoint/local.py)."""
        self.async_saves.finalize(blocking=True)
        with self.saving():
            if self.non_persistent.kind != NON_PERSISTENT:
                return self._write_local()
            if self.asynchronous:
                self._non_persistent_in_flight = self.trainer.step
            self._write(self.non_persistent)

    def _write(self, store: DirectoryStore, keep=None) -> None:
        """A sharded save into a directory ``store`` (checkpoint/save.py), in the background under --async-save; a
        write failure is one line (:class:`SaveFailed`), its partial directory removed."""
        t, async_saves = self.trainer, (self.async_saves if self.asynchronous else None)
        root, non_persistent = store.root, store.kind == NON_PERSISTENT
        self.export.wait()  # pruning must not remove a checkpoint being exported
        t0 = time.perf_counter()
        target, error = checkpoint.checkpoint_dir(root, t.step), None
        try:
            if self.rank0:
                write_carried_copy(root, t.tokenizer_record)
            with t.writing_checkpoint(TIMERS[non_persistent]):
                path = store.save(t.step, self._parts(), t.trainer_state(), async_saves, keep)
        except BaseException as e:  # torch's CheckpointException is a BaseException
            if not is_write_failure(e) or is_collective_failure(e):  # a lost peer: the group restarts
                raise
            error = checkpoint_write_error(target, e)  # before the partial directory frees its space
        if error is not None:  # raised outside the handler: nothing keeps the writer's failure alive
            # torch's checkpoint writer gathers every rank's failures, so every rank gets here;
            # `latest` has not moved, and the partial directory goes (it is not a checkpoint).
            if self.rank0:
                shutil.rmtree(target, ignore_errors=True)
            raise SaveFailed(str(error))
        logger.info(
            "%s %scheckpoint %s in %.1f s",
            "started" if async_saves else "saved",
            "non-persistent " if non_persistent else "",
            path,
            time.perf_counter() - t0,
        )

    def _write_local(self) -> None:
        """--non-persistent-ckpt-type local: every rank its file in node-local storage (checkpoint/local.py)."""
        t, t0 = self.trainer, time.perf_counter()
        with t.writing_checkpoint(TIMERS[True]):
            where = self.non_persistent.save(t.step, self._parts(), t.trainer_state())
        if self.rank0:
            logger.info(
                "saved non-persistent local checkpoint of step %d in %s in %.1f s",
                t.step,
                where.parent,
                time.perf_counter() - t0,
            )

    def _parts(self) -> Parts:
        return Parts(self.trainer.chunks, self.trainer.optimizer, self.trainer.scheduler)

    def _async_complete(self, step: int) -> None:
        if step == self._non_persistent_in_flight:  # no progress line or evaluation for a non-persistent save
            self._non_persistent_in_flight = None
            return
        self.progress.async_saved(step)
        self.downstream.saved(step)
