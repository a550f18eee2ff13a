"""Load a checkpoint on every rank, resharded to this run's layout, keeping what
:func:`~megatron_fixedcode.checkpoint.resume_scope.resume_scope` allows."""

from __future__ import annotations

import logging
from pathlib import Path

import torch.distributed as dist
from megatron.core import dist_checkpointing

from megatron_fixedcode.checkpoint.load_checks import log_precision_change, refuse_non_finite_weights
from megatron_fixedcode.checkpoint.paths import checkpoint_dir, read_trainer_state, resolve_step
from megatron_fixedcode.checkpoint.resume_scope import EVERYTHING, PER_PARAMETER, ResumeScope
from megatron_fixedcode.checkpoint.state import _data_parallel_group, _ranks, sharded_state, unwrap

logger = logging.getLogger(__name__)


def _load_strategy(target: Path) -> dict:
    """Each data-parallel rank reads a share of the replicated tensors and they exchange them."""
    from megatron.core.dist_checkpointing.serialization import get_default_load_sharded_strategy
    from megatron.core.dist_checkpointing.strategies.fully_parallel import FullyParallelLoadStrategyWrapper

    return {
        "sharded_strategy": FullyParallelLoadStrategyWrapper(
            get_default_load_sharded_strategy(str(target)), _data_parallel_group()
        )
    }


def load_checkpoint(
    root: str,
    chunks,
    optimizer,
    scheduler,
    step: int | None = None,
    scope: ResumeScope | None = None,
) -> dict | None:
    """Restore the model (resharded to this layout) and what ``scope`` keeps (decided once by the run plan:
    :func:`~.resume_scope.resume_scope`): Adam's state and the scheduler, the RNG per rank or per
    model-parallel rank. ``None``: everything, on the checkpoint's own layout. A load without the optimizer
    state (--finetune, --no-load-optim) copies the loaded weights into the optimizer's main weights, so its first
    step updates them and not the initial ones.

    Returns the trainer state, or None when ``root`` has no complete checkpoint."""
    step = resolve_step(root, step)
    if step is None:
        return None
    target = checkpoint_dir(root, step)
    trainer_state = read_trainer_state(root, step)
    saved, now = trainer_state["layout"], _current_layout(trainer_state)
    saved_format = trainer_state.get("optimizer_format", PER_PARAMETER)  # earlier versions: plain optimizers only
    if scope is None:
        if saved != now:
            raise ValueError(f"{target}: saved on layout {saved}, loaded on {now}: give the run plan's resume scope")
        scope = EVERYTHING
    # the RNG per model-parallel rank: every DP rank reads the object DP rank 0 saved
    template = sharded_state(chunks, optimizer, saved_format if scope.optimizer else None, (scope.rng,), loading=True)
    loaded = dist_checkpointing.load(template, str(target), **_load_strategy(target))
    restore(loaded, target, trainer_state, chunks, optimizer, scheduler, scope)
    rank0 = dist.get_rank() == 0
    if saved != now and rank0:  # Megatron-LM's line (checkpointing.py), which its log checks grep for
        logger.info("Job sharding has changed: Rerun state will be ignored")
    if saved != now and not scope.finetune:
        logger.warning("checkpoint layout %s differs from this run's %s: %s", saved, now, scope.note)
    logger.info("resumed from %s (step %d)", target, trainer_state["step"])
    if rank0:
        log_loaded(root, trainer_state["step"])
    return trainer_state


def restore(loaded: dict, target, trainer_state: dict, chunks, optimizer, scheduler, scope: ResumeScope) -> None:
    """Put a loaded state (any store's, :func:`~.state.sharded_state`'s keys) into the parts, with the checks every
    resume runs: weights that are not finite refused, a precision change said; then what ``scope`` keeps."""
    from megatron_fixedcode.compat.rng import restore_rng_state

    for i, chunk in enumerate(chunks):
        unwrap(chunk).load_state_dict(loaded["model" if len(chunks) == 1 else f"model{i}"])
    refuse_non_finite_weights(target, chunks, "fine-tune from" if scope.finetune else "resume from")
    log_precision_change(trainer_state, chunks)
    if scope.optimizer:
        optimizer.load_state_dict(loaded["optimizer"])
    elif optimizer is not None and scope.reload_main_weights:
        optimizer.reload_model_params()
    if scope.rng == "per_rank":
        restore_rng_state(loaded["rng"])
    elif scope.rng == "per_model_parallel_rank":
        restore_rng_state(loaded["rng_tp_pp"])
    if scope.scheduler:
        scheduler.load_state_dict(loaded["opt_param_scheduler"])


def log_loaded(root, step: int) -> None:
    """Megatron-LM's line, word for word: users' scripts wait for it."""
    r = _ranks()
    logger.info(
        "  successfully loaded checkpoint from %s [ t %d/%d, p %d/%d ] at iteration %d",
        root,
        r["tp_rank"] + 1,
        r["tp_size"],
        r["pp_rank"] + 1,
        r["pp_size"],
        step,
    )


def _current_layout(saved: dict) -> dict:
    ranks = _ranks()
    return {k: ranks[k] for k in saved["layout"]}
