"""This rank's training microbatches of a step, read in the training process (``--num-workers 0``) or ahead of
it by ``--num-workers`` DataLoader worker processes, as Megatron-LM's ``build_pretraining_data_loader`` does
(its batch sampler's order: :class:`~megatron_fixedcode.data.sampler.RankMicrobatchSampler`).

Either way step ``n`` reads the same samples (a pure function of the global sample index), so the losses
and an exact resume do not depend on N: a resumed run starts the workers at its step's first sample. A step
asked for out of order (a step run again) restarts the workers there.
"""

from __future__ import annotations

import atexit
import os
import weakref

import torch

from megatron_fixedcode.data.sample_digest import with_digest
from megatron_fixedcode.data.sampler import RankMicrobatchSampler, fetch_microbatch, rank_microbatch_indices
from megatron_fixedcode.data.validate import TokenIdOutOfRange
from megatron_fixedcode.utils.exit_signals import ignore_launcher_signals
from megatron_fixedcode.utils.locks import SAVE_DIR_LOCK_NAME


class _Microbatches(torch.utils.data.Dataset):
    """Indexed by a microbatch's list of sample indices; a bad token id comes back as its message (one line).
    ``digest_batch``: the global batch size when each microbatch carries its samples' digest (data/sample_digest.py)."""

    def __init__(self, dataset, digest_batch: int | None = None):
        self.dataset, self.digest_batch = dataset, digest_batch

    def __getitem__(self, indices: list[int]) -> dict:
        try:
            batch = fetch_microbatch(self.dataset, indices)
        except TokenIdOutOfRange as e:  # names shard, document and sample
            return {"error": str(e)}
        return batch if self.digest_batch is None else with_digest(batch, indices, self.digest_batch)


def _worker_init(exit_signal: str):
    """The trainer alone acts on signals (Megatron-LM's workers install its handler too), and a forked worker
    must not keep --save's flock alive after a ``kill -9`` of the trainer (utils/locks.py)."""

    def init(_worker_id: int) -> None:
        ignore_launcher_signals(exit_signal)
        for fd in os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else ():
            try:
                if os.readlink(f"/proc/self/fd/{fd}").endswith(SAVE_DIR_LOCK_NAME):
                    os.close(int(fd))
            except OSError:
                pass

    return init


class MicrobatchReader:
    """``read(step)``: (this rank's microbatches of ``step``, the error message of a bad sample or None).
    ``digest``: each microbatch carries its samples' digest (the training data: metrics.jsonl's ``samples``)."""

    def __init__(
        self,
        dataset,
        *,
        global_batch: int,
        micro_batch_size: int,
        dp_rank: int,
        dp_size: int,
        num_microbatches: int,
        total_samples: int,
        num_workers: int = 0,
        exit_signal: str = "SIGTERM",
        digest: bool = False,
    ):
        self.dataset, self.global_batch, self.micro_batch_size = dataset, global_batch, micro_batch_size
        self.dp_rank, self.dp_size, self.num_microbatches = dp_rank, dp_size, num_microbatches
        self.total_samples, self.num_workers, self.exit_signal = total_samples, num_workers, exit_signal
        self._batches, self._next_step, self._closes_at_exit = None, None, False
        self._read = _Microbatches(dataset, global_batch if digest else None)  # in a worker too, with --num-workers

    def read(self, step: int) -> tuple[list[dict], str | None]:
        if self.num_workers == 0:
            batches = [
                self._read[
                    rank_microbatch_indices(
                        step,
                        m,
                        global_batch_size=self.global_batch,
                        micro_batch_size=self.micro_batch_size,
                        dp_rank=self.dp_rank,
                        dp_size=self.dp_size,
                    )
                ]
                for m in range(self.num_microbatches)
            ]
        else:
            if step != self._next_step:
                self._start(step)
            batches = [next(self._batches) for _ in range(self.num_microbatches)]
            self._next_step = step + 1
        error = next((b["error"] for b in batches if "error" in b), None)
        return ([], error) if error else (batches, None)

    def close(self) -> None:
        """Stop the workers through DataLoader's own shutdown (their queues): they ignore SIGTERM, so the
        ``terminate()`` of multiprocessing's exit handler would not end them and its ``join()`` would wait forever."""
        shutdown = getattr(self._batches, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        self._batches, self._next_step = None, None

    def _start(self, step: int) -> None:
        self.close()  # a restart: the previous workers end first
        sampler = RankMicrobatchSampler(
            total_samples=self.total_samples,
            consumed_samples=step * self.global_batch,
            micro_batch_size=self.micro_batch_size,
            dp_rank=self.dp_rank,
            dp_size=self.dp_size,
        )
        if not self._closes_at_exit:  # before multiprocessing's exit handler (atexit runs the latest first)
            atexit.register(_close_at_exit, weakref.ref(self))
            self._closes_at_exit = True
        self._batches = iter(
            torch.utils.data.DataLoader(
                self._read,
                sampler=sampler,
                batch_size=None,
                num_workers=self.num_workers,
                worker_init_fn=_worker_init(self.exit_signal),
                multiprocessing_context="fork",
            )
        )


def reader_of(trainer, dataset) -> MicrobatchReader:
    """The trainer's reader of ``dataset``, kept across steps (its workers read ahead); the training data with
    ``--num-workers`` workers, the validation batches (a few, the same each time) in the training process."""
    readers = trainer.__dict__.setdefault("_readers", {})
    if id(dataset) not in readers:
        readers[id(dataset)] = MicrobatchReader(
            dataset,
            global_batch=trainer.global_batch,
            micro_batch_size=trainer.cfg.schedule.micro_batch_size,
            dp_rank=trainer.ranks["dp_rank"],
            dp_size=trainer.ranks["dp_size"],
            num_microbatches=trainer.num_microbatches,
            total_samples=trainer.max_steps * trainer.global_batch,
            num_workers=trainer.cfg.data.num_workers if dataset is trainer.train_ds else 0,
            exit_signal=trainer.cfg.checkpoint.exit_signal,
            digest=dataset is trainer.train_ds,
        )
    return readers[id(dataset)]


def _close_at_exit(ref: weakref.ref) -> None:
    reader = ref()
    if reader is not None:
        reader.close()
