"""What a checkpoint holds, built in one place for every store (persistent, global non-persistent, node-local),
save and load alike: the model chunks' sharded state, the optimizer's in its format, the RNG objects (per rank
and per model-parallel rank), the scheduler and the trainer state with the claims a resume reads."""

from __future__ import annotations

from typing import Any

import torch
from megatron.core.dist_checkpointing.mapping import ShardedObject

from megatron_fixedcode.checkpoint.resume_scope import DP_RESHARDABLE, FULLY_RESHARDABLE, PER_PARAMETER


def optimizer_format(optimizer, fully_reshardable: bool = True) -> str:
    """How ``optimizer`` stores its state in a checkpoint (:mod:`resume_scope`'s formats)."""
    parts = getattr(optimizer, "chained_optimizers", [optimizer])
    if not any(type(p).__name__ == "DistributedOptimizer" for p in parts):
        return PER_PARAMETER
    return FULLY_RESHARDABLE if fully_reshardable else DP_RESHARDABLE


def _optimizer_metadata(fmt: str) -> dict:
    """megatron's sharded_state_dict metadata for the format (the plain optimizers ignore it)."""
    return {"distrib_optim_sharding_type": fmt} if fmt != PER_PARAMETER else {}


def unwrap(chunk: torch.nn.Module) -> torch.nn.Module:
    while hasattr(chunk, "module"):
        chunk = chunk.module
    return chunk


def model_sharded_state(chunks: list[torch.nn.Module]) -> dict[str, Any]:
    if len(chunks) == 1:
        return {"model": unwrap(chunks[0]).sharded_state_dict()}
    return {f"model{i}": unwrap(c).sharded_state_dict() for i, c in enumerate(chunks)}


RNG_KINDS = ("per_rank", "per_model_parallel_rank")


def sharded_state(chunks, optimizer, optimizer_format: str | None, rng=RNG_KINDS, loading: bool = False) -> dict:
    """The sharded state of ``chunks``, of ``optimizer`` in ``optimizer_format`` (None: the optimizer left out) and
    of the RNG objects named in ``rng``: with this rank's states when saving, templates when ``loading``."""
    import torch.distributed as dist

    from megatron_fixedcode.compat.rng import capture_rng_state  # one snapshot for checkpoints and seeded_streams

    rng_data = None if loading else capture_rng_state()
    model_state = model_sharded_state(chunks)
    state: dict[str, Any] = dict(model_state)
    if optimizer_format is not None and optimizer is not None:
        state["optimizer"] = optimizer.sharded_state_dict(
            model_state, is_loading=loading, metadata=_optimizer_metadata(optimizer_format)
        )
    if "per_rank" in rng:
        state["rng"] = _rng_object(dist.get_world_size(), dist.get_rank(), rng_data)
    if "per_model_parallel_rank" in rng:
        state["rng_tp_pp"] = _model_parallel_rng_object(_ranks(), rng_data)
    return state


def state_to_save(chunks, optimizer, scheduler, trainer_state: dict, checksums: dict) -> dict:
    """Everything a bit-identical resume needs, for any store: the sharded state in the optimizer format the
    trainer state names, the scheduler, and the trainer state with its claims (RNG per model-parallel rank
    present; how the checksums were recorded: ``checksums``)."""
    state = sharded_state(chunks, optimizer, trainer_state.get("optimizer_format", PER_PARAMETER))
    state["opt_param_scheduler"] = scheduler.state_dict()
    state["trainer"] = {**trainer_state, RNG_BY_MODEL_PARALLEL_RANK: True, CHECKSUMS_CLAIM: checksums}
    return state


def _rng_object(world_size: int, rank: int, data: Any = None) -> ShardedObject:
    """Each rank's RNG states; keyed by world size since they only restore on the same layout."""
    return ShardedObject(f"rng_state_world{world_size}", data, (world_size,), (rank,), replica_id=0)


RNG_BY_MODEL_PARALLEL_RANK = "rng_by_model_parallel_rank"  # trainer-state flag: the checkpoint has it
CHECKSUMS_CLAIM = "checksums"  # trainer-state field: how the checkpoint's checksums were recorded


def _model_parallel_rng_object(ranks: dict, data: Any = None) -> ShardedObject:
    """The RNG states of data-parallel rank 0 per (pipeline, tensor) rank — Megatron-LM's
    ``rng_state`` object (``replica_id`` = DP rank): what a resume on another DP size restores."""
    return ShardedObject(
        "rng_state_tp_pp",
        data,
        (ranks["pp_size"], ranks["tp_size"]),
        (ranks["pp_rank"], ranks["tp_rank"]),
        replica_id=ranks["dp_rank"],
    )


LAYOUT_KEYS = ("world_size", "tp_size", "pp_size", "dp_size")  # a checkpoint's "layout": what a resume compares


def layout_of(ranks: dict) -> dict:
    return {k: ranks[k] for k in LAYOUT_KEYS}


def _data_parallel_group():
    from megatron.core import parallel_state

    return parallel_state.get_data_parallel_group(with_context_parallel=True)


def _ranks() -> dict:
    from megatron_fixedcode.compat import parallel_ranks

    return parallel_ranks()
