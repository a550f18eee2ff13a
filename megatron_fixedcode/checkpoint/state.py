"""What a checkpoint holds besides the files' layout: the model's sharded state, the optimizer's
format, the RNG objects (per rank and per model-parallel rank)."""

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


def _rng_object(world_size: int, rank: int, data: Any = None) -> ShardedObject:
    """Each rank's RNG states; keyed by world size since they only restore on the same layout."""
    return ShardedObject(f"rng_state_world{world_size}", data, (world_size,), (rank,), replica_id=0)


RNG_BY_MODEL_PARALLEL_RANK = "rng_by_model_parallel_rank"  # trainer-state flag: the checkpoint has it


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
