"""Save a checkpoint on every rank (megatron's fully parallel strategy), record its checksums, then
move the ``latest`` marker; prune the old ones as told."""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import torch.distributed as dist
from megatron.core import dist_checkpointing

from megatron_fixedcode.checkpoint.paths import CHECKSUMS, LATEST_MARKER, RUN_CONFIG, _fsync_write, checkpoint_dir
from megatron_fixedcode.checkpoint.state import _data_parallel_group, state_to_save
from megatron_fixedcode.checkpoint.verify import record_checksums

CHECKSUMS_RECORDED = {"algorithm": "sha256", "record": CHECKSUMS, "covers": "every file"}  # the trainer state's claim


def _save_strategy():
    """Megatron-LM's default: the fully parallel wrapper spreads the writes of replicated tensors
    over the data-parallel ranks (without it DP rank 0 writes every one of them)."""
    from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy
    from megatron.core.dist_checkpointing.strategies.fully_parallel import FullyParallelSaveStrategyWrapper

    return FullyParallelSaveStrategyWrapper(get_default_save_sharded_strategy(), _data_parallel_group())


def _fork_results_queue() -> None:
    """megatron's async writer collects results through a Manager started with *spawn*, which
    re-imports ``__main__`` (seconds per process, and it needs a main guard); a forked Manager
    serves the same queue without re-importing anything. Its server process dies with this rank,
    even when the rank is SIGKILLed (``compat.process.helper_queue``), instead of living on with
    the rank's files and log open."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    from megatron_fixedcode.compat.process import helper_queue

    if filesystem_async._results_queue is None:
        filesystem_async._results_queue = helper_queue("fork")


def save_checkpoint(
    root: str,
    step: int,
    chunks,
    optimizer,
    scheduler,
    trainer_state: dict,
    keep_last: int | None = None,
    retain_interval: int | None = None,
    async_queue=None,
    keep=None,
) -> Path:
    """Save everything needed for a bit-identical resume, then move the ``latest`` marker. With
    ``async_queue`` (``--async-save``: an :class:`~.async_save.AsyncSaveQueue`, or what wraps one) the
    shard files are written in the background and the rest (:func:`_finish`) runs when the queue
    finalizes the save; a save still in flight is finalized first. ``keep(step)``: whether an older
    checkpoint that pruning would drop must stay (one that awaits its downstream evaluation)."""
    if async_queue is not None:
        async_queue.finalize(blocking=True)  # at most one save in flight
    rank = dist.get_rank()
    target = checkpoint_dir(root, step)
    if rank == 0:
        shutil.rmtree(target, ignore_errors=True)  # a partial save of this step from a crashed run
        target.mkdir(parents=True)
    dist.barrier()
    state = state_to_save(chunks, optimizer, scheduler, trainer_state, CHECKSUMS_RECORDED)
    _fork_results_queue()
    finish = functools.partial(_finish, root, step, trainer_state, keep_last, retain_interval, keep)
    if async_queue is None:
        dist_checkpointing.save(state, str(target), sharded_strategy=_save_strategy())
        finish()
    else:  # megatron's own finalize functions (.metadata, metadata.json) run first, then this project's
        request = dist_checkpointing.save(
            state, str(target), sharded_strategy=_save_strategy(), async_sharded_save=True
        )
        request.add_finalize_fn(finish)
        async_queue.schedule(request, target, step)
    return target


def _finish(
    root: str, step: int, trainer_state: dict, keep_last: int | None, retain_interval: int | None, keep=None
) -> None:
    """Once every rank's files are written: the run's flags, the checksums, then the ``latest`` marker."""
    rank, target = dist.get_rank(), checkpoint_dir(root, step)
    if rank == 0 and trainer_state.get("run_config") is not None:  # the resolved flags, readable without this code
        _fsync_write(target / RUN_CONFIG, json.dumps(trainer_state["run_config"], sort_keys=True, indent=1))
    dist.barrier()
    # last into the checkpoint, before the marker that makes it the latest; the run's carried tokenizer too
    record_checksums(target, shared=((trainer_state.get("tokenizer") or {}).get("copy") or {}).get("files", ()))
    if rank == 0:
        _fsync_write(Path(root) / LATEST_MARKER, str(step))
        _prune(Path(root), keep_last, step, retain_interval, keep)
    dist.barrier()


def _prune(root: Path, keep_last: int | None, newest: int, retain_interval: int | None = None, keep=None) -> None:
    """Keep every checkpoint (Megatron-LM) unless told: --save-retain-interval N keeps the steps
    that are multiples of N and the newest; --ckpt-keep-last K keeps the newest K; a step that
    ``keep`` names stays whatever they say (it is dropped by a later save once ``keep`` lets it go)."""
    steps = sorted(int(p.name[5:]) for p in root.glob("iter_*") if p.name[5:].isdigit())
    older = [s for s in steps if s < newest]
    drop = set()
    if retain_interval:
        drop |= {s for s in older if s % retain_interval}
    if keep_last:
        drop |= set([s for s in steps if s <= newest][:-keep_last])
    for old in sorted(drop):
        if keep is None or not keep(old):
            shutil.rmtree(checkpoint_dir(root, old), ignore_errors=True)
