"""``--async-save`` with ``--use-persistent-ckpt-worker`` (Megatron-LM's pair; without the worker Megatron-LM
turns ``--async-save`` off, and so does this trainer, saying so): the loop's side of
:mod:`megatron_fixedcode.checkpoint.async_save`. A save returns once the files are planned and the tensors
staged; the write goes on in the background while the steps go on. As Megatron-LM's
``maybe_finalize_async_save``: every step first finalizes a finished save (checksums, then the ``latest``
marker, on every rank's agreement); a save while one is in flight waits for it; the end of the run, a
signal, ``--exit-duration-in-mins`` or ``--exit-interval`` wait for the last one before the process exits
(a requeued job resumes from a complete checkpoint). A failed background write ends the run as a failed
save does: one line, exit code 2, the previous checkpoint kept.
"""

from __future__ import annotations

import atexit
import logging
import shutil

from megatron_fixedcode.checkpoint.save_checks import checkpoint_write_error, is_write_failure
from megatron_fixedcode.training.in_job_restarts import is_collective_failure
from megatron_fixedcode.training.errors import SaveFailed

logger = logging.getLogger(__name__)


class AsyncSaves:
    """Built by the run's :class:`~.checkpoint_manager.CheckpointManager`; does nothing unless ``--async-save``
    acts. The manager hands it to :meth:`Trainer.save`, which hands it to ``save_checkpoint``."""

    def __init__(self, trainer):
        self.trainer, self.queue = trainer, None
        self.on_finalized = lambda step: None  # the manager's: progress.txt, downstream evaluations
        self.rank0 = trainer.ranks["rank"] == 0
        if trainer.cfg.checkpoint.async_save and trainer.cfg.checkpoint.save:
            from megatron_fixedcode.checkpoint.async_save import AsyncSaveQueue

            self.queue = AsyncSaveQueue()
            atexit.register(self._abort)  # an exception ends the run: the write in flight is dropped, not waited for
            if self.rank0:
                logger.info(
                    "--async-save: checkpoints are written in the background by a persistent worker per rank; "
                    "the 'latest' marker moves when every rank's files and checksums are complete"
                )

    def schedule(self, request, target, step: int) -> None:
        self.queue.schedule(request, target, step)
        if self.rank0:
            logger.info("writing checkpoint %s in the background (--async-save)", target)

    def finalize(self, blocking: bool = False) -> None:
        """Finalize the save in flight if it is written (``blocking``: wait for it); a failed write raises
        :class:`SaveFailed` on every rank, its partial directory removed."""
        if self.queue is None or self.queue.in_flight is None:
            return
        step, target = self.queue.in_flight[:2]
        try:
            done = self.queue.finalize(blocking=blocking)
        except BaseException as e:  # torch's CheckpointException is a BaseException
            if not is_write_failure(e) or is_collective_failure(e):  # a lost peer: the group restarts
                raise
            error = checkpoint_write_error(target, e)
        else:
            if done is not None and self.rank0:
                logger.info(
                    "saved checkpoint %s (written in the background; finalized %.1f s after it was started)",
                    target,
                    done[2],
                )
            if done is not None:
                self.on_finalized(step)
            return
        if self.rank0:
            shutil.rmtree(target, ignore_errors=True)
        raise SaveFailed(f"--async-save of step {step}: {error}")

    poll = finalize

    def before_export(self, final: bool) -> None:
        """A Hugging Face export converts a complete checkpoint: finalize this one first."""
        interval = self.trainer.cfg.checkpoint.hf_export_interval
        if interval and (final or self.trainer.step % interval == 0):
            self.finalize(blocking=True)

    def close(self) -> None:
        """The run's end: the last save finalized, the workers stopped."""
        if self.queue is not None:
            if self.queue.in_flight is not None and self.rank0:
                logger.info("waiting for the checkpoint written in the background")
            self.finalize(blocking=True)
            self.queue.close()
            self.queue = None

    def _abort(self) -> None:
        if self.queue is not None:
            self.queue.close(abort=True)
            self.queue = None
