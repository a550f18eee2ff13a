"""``--async-save`` on megatron-core's async checkpoint machinery: :func:`~.save.save_checkpoint` asks
``dist_checkpointing.save(..., async_sharded_save=True)`` for an ``AsyncRequest`` (the shard files are
written in the background); megatron's ``AsyncCallsQueue`` runs it in one persistent worker process per
rank (``PersistentAsyncCaller.async_loop``, as ``--use-persistent-ckpt-worker``) and, once every rank's
worker is done, runs its finalize functions on all ranks: megatron's (``.metadata``, ``metadata.json``),
then this project's (checksums recorded, then the ``latest`` marker moved, then pruning). Until then the
previous checkpoint is the one that loads: a crash or ``kill -9`` during the write leaves it so.

What is this project's, around megatron's parts: the worker is started so that it dies with its rank
(``compat.process``: a SIGKILLed rank leaves no writer behind) and runs on a machine without CUDA
(megatron's loop selects a CUDA device first); on the CPU the request's tensors are copied before the
step goes on (megatron's staging copy, ``.to("cpu")``, is the live tensor itself there); at most one
request is in flight (:meth:`AsyncSaveQueue.schedule` waits for the previous one). :class:`AsyncSaves` is the
run's side: finalized at each step, waited for at the end, a failed write one line.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import signal
import time
from pathlib import Path
from queue import Empty

import torch
import torch.distributed as dist
from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCaller, AsyncCallsQueue, PersistentAsyncCaller
from torch import multiprocessing as mp

from megatron_fixedcode.checkpoint.save_checks import checkpoint_write_error, is_write_failure
from megatron_fixedcode.errors import is_collective_failure
from megatron_fixedcode.errors import SaveFailed

logger = logging.getLogger(__name__)


def _worker_main(parent: int, rank: int, queue, preload_q, comp_q, log_level: int) -> None:
    """The persistent worker: megatron-core's loop, in a process that dies with its rank (and whose
    writer processes die with it)."""
    from megatron_fixedcode.compat.process import die_with_parent, install_die_with_parent_for_forks
    from megatron_fixedcode.utils.exit_signals import ignore_launcher_signals, launcher_signals

    ignore_launcher_signals()  # scancel's TERM reaches every process of the step: the rank's save needs this one
    signal.pthread_sigmask(signal.SIG_UNBLOCK, launcher_signals())  # blocked by the rank from fork to here
    die_with_parent(expected_parent=parent)
    install_die_with_parent_for_forks()
    if not torch.cuda.is_available():  # the loop's torch.cuda.set_device(rank % device_count())
        torch.cuda.device_count = lambda: 1
        torch.cuda.set_device = lambda device: None
    PersistentAsyncCaller.async_loop(rank, queue, preload_q, comp_q, log_level)


class PersistentWorker(AsyncCaller):
    """megatron-core's ``PersistentAsyncCaller`` protocol (one spawned worker, a request queue, a staging
    queue, a completion queue), with :func:`_worker_main` as the process."""

    def __init__(self):
        ctx = mp.get_context("spawn")
        self.queue, self.preload_q, self.comp_q = ctx.JoinableQueue(), ctx.JoinableQueue(), ctx.Queue()
        self.process = None
        self.done_item = None

    def start(self) -> None:
        """Start the worker (its imports take seconds: at the run's start, as Megatron-LM's warm-up)."""
        if self.process is None:
            from multiprocessing import resource_tracker

            from megatron_fixedcode.utils.exit_signals import launcher_signals

            resource_tracker.ensure_running()  # its start unblocks TERM and INT: before the block below
            # blocked from the fork until the worker ignores them: a signal in that window waits (in the rank,
            # it is delivered once unblocked below) instead of killing the worker with its default action
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, launcher_signals())
            self.process = mp.get_context("spawn").Process(
                target=_worker_main,
                name="mfc-ckpt-worker",
                args=(
                    os.getpid(),
                    dist.get_rank(),
                    self.queue,
                    self.preload_q,
                    self.comp_q,
                    logger.getEffectiveLevel(),
                ),
            )
            try:
                self.process.start()
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def schedule_async_call(self, async_req) -> None:
        if async_req.async_fn is None:
            return
        self.start()
        if async_req.preload_fn is not None:
            self.preload_q.put(async_req.call_idx)
        self.queue.put(async_req)
        if async_req.preload_fn is not None:
            self.preload_q.join()  # the worker staged the tensors: the step may change them now

    def is_current_async_call_done(self, blocking: bool = False, no_dist: bool = False) -> bool:
        alive = False
        while self.process is not None and self.done_item is None:
            try:
                self.done_item = self.comp_q.get(timeout=0.1) if blocking else self.comp_q.get_nowait()
            except Empty:
                if not self.process.is_alive():  # its write left no result: the finalize fails on every rank
                    logger.error(
                        "the checkpoint worker of rank %d died (exit code %s)", dist.get_rank(), self.process.exitcode
                    )
                    self.process = None
                    self._drop_queues()
                    break
                if not blocking:
                    alive = True
                    break
        done = (not alive) if no_dist else self.sync_all_async_calls(int(alive))
        if done:
            self.done_item = None
        return done

    def _drop_queues(self) -> None:
        """Nobody reads the queues any more: their feeder threads must not block the exit (multiprocessing's
        exit handler joins them, forever when the reader is dead and a pipe is full)."""
        for q in (self.queue, self.preload_q, self.comp_q):
            q.cancel_join_thread()

    def close(self, abort: bool = False) -> None:
        if self.process is None:
            return
        if abort:
            self._drop_queues()
            self.process.kill()
        else:
            self.queue.put("DONE")
            self.queue.join()
        self.process.join()
        self.process = None

    def __del__(self):
        pass


def _copied(buckets):
    """The write buckets with their tensors copied (megatron's staging copy on a CPU-only machine)."""
    return [
        (name, key, (data, [(item, t.detach().clone()) for item, t in tensors]))
        for name, key, (data, tensors) in buckets
    ]


class AsyncSaveQueue(AsyncCallsQueue):
    """megatron-core's ``AsyncCallsQueue`` on one :class:`PersistentWorker`, at most one save in flight.
    Every method is a collective: every rank calls it alike."""

    def __init__(self):
        super().__init__(persistent=True)
        self.worker = PersistentWorker()
        self.worker.start()
        self.in_flight: tuple[int, Path, float] | None = None  # step, directory, when scheduled

    def _get_async_caller(self):
        return self.worker

    def schedule(self, request, target: Path, step: int) -> None:
        if self.in_flight is not None:
            self.finalize(blocking=True)
        if not torch.cuda.is_available() and request.preload_fn is not None:
            args = list(request.async_fn_args)
            args[1] = _copied(args[1])
            request = request._replace(async_fn_args=tuple(args), preload_fn=None)
        self.schedule_async_request(request)
        self.in_flight = (step, Path(target), time.perf_counter())

    def finalize(self, blocking: bool = False) -> tuple[int, Path, float] | None:
        """Finalize the save in flight if every rank's worker is done (``blocking``: wait for them);
        its (step, directory, seconds since scheduled), or None. A failed write raises here, on every
        rank (torch's ``CheckpointException``), and the save is no longer in flight."""
        if self.in_flight is None:
            return None
        done, self.in_flight = self.in_flight, None
        try:
            finished = self.maybe_finalize_async_calls(blocking=blocking)
        except BaseException:
            self.async_calls.clear()
            raise
        if not finished:
            self.in_flight = done
            return None
        return done[0], done[1], time.perf_counter() - done[2]

    def close(self, abort: bool = False) -> None:
        if not abort:
            self.finalize(blocking=True)
        self.worker.close(abort=abort)


class AsyncSaves:
    """The loop's side of ``--async-save`` with ``--use-persistent-ckpt-worker`` (Megatron-LM's pair; without the
    worker Megatron-LM turns ``--async-save`` off, and so does this trainer, saying so), built by the run's
    :class:`~.checkpointer.Checkpointer`; does nothing unless ``--async-save`` acts.

    As Megatron-LM's ``maybe_finalize_async_save``: every step first finalizes a finished save (checksums, then
    the ``latest`` marker, on every rank's agreement); a save while one is in flight waits for it; the end of the
    run, a signal, ``--exit-duration-in-mins`` or ``--exit-interval`` wait for the last one before the process
    exits (a requeued job resumes from a complete checkpoint). A failed background write ends the run as a failed
    save does: one line, exit code 2, the previous checkpoint kept."""

    def __init__(self, trainer):
        self.trainer, self.queue = trainer, None
        self.on_finalized = lambda step: None  # the manager's: progress.txt, downstream evaluations
        self.rank0 = trainer.ranks["rank"] == 0
        if trainer.cfg.checkpoint.async_save and trainer.cfg.checkpoint.save:
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
