"""A microbatch on its way into the model: pinned, moved to the runtime device once, and cut to
this rank's share of the sequence under context parallelism.

A microbatch is a dict of ``[b, s]`` tensors (``tokens``, ``labels``, ``loss_mask``, optionally
``position_ids``), as the datasets collate it on the CPU.
"""

from __future__ import annotations

import torch

SEQUENCE_KEYS = ("tokens", "labels", "loss_mask", "position_ids")


def pin(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Page-locked copies, so the host-to-GPU copies can run asynchronously (CUDA only)."""
    return {k: v.pin_memory() for k, v in batch.items()}


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """Every tensor on ``device`` (Megatron-LM's ``get_batch``: ``non_blocking`` from pinned memory)."""
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def context_parallel_positions(seq_length: int, cp_size: int, cp_rank: int) -> torch.Tensor:
    """The positions CP rank ``cp_rank`` owns under megatron's load-balanced split: the sequence
    is cut into ``2·cp_size`` equal chunks and rank r takes chunks r and ``2·cp_size - 1 - r``,
    so every rank gets the same share of causal-attention work."""
    if cp_size < 1 or not 0 <= cp_rank < cp_size:
        raise ValueError(f"context-parallel rank {cp_rank} outside [0, {cp_size})")
    if seq_length % (2 * cp_size):
        raise ValueError(f"sequence length {seq_length} is not divisible by 2 x context-parallel size {cp_size}")
    chunk = seq_length // (2 * cp_size)
    first, second = cp_rank, 2 * cp_size - 1 - cp_rank
    return torch.cat(
        [torch.arange(first * chunk, (first + 1) * chunk), torch.arange(second * chunk, (second + 1) * chunk)]
    )


def split_for_context_parallel(batch: dict[str, torch.Tensor], cp_size: int, cp_rank: int) -> dict[str, torch.Tensor]:
    """This CP rank's positions of every sequence tensor (dimension 1); other entries unchanged.
    Equal to megatron-core's ``get_batch_on_this_cp_rank`` (tests check it), without its global state."""
    if cp_size == 1:
        return batch
    out = dict(batch)
    for key in SEQUENCE_KEYS:
        if batch.get(key) is not None:
            value = batch[key]
            out[key] = value.index_select(
                1, context_parallel_positions(value.shape[1], cp_size, cp_rank).to(value.device)
            )
    return out
