"""Which global samples each data-parallel rank reads, and how a microbatch is collated.

Layout (Megatron's MegatronPretrainingSampler order): the global stream is cut into
global batches of `global_batch_size` samples; a global batch into microbatch slots of
`micro_batch_size * dp_size` consecutive samples; rank r takes the r-th
`micro_batch_size` run of each slot:

    index = step * global_batch_size + microbatch * micro_batch_size * dp_size
            + dp_rank * micro_batch_size + i

So the union of all ranks' microbatches of a step is exactly that step's global batch,
at any data-parallel size, and a resumed run restarts at `consumed_samples`.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch

SAMPLE_KEYS = ("tokens", "labels", "loss_mask", "position_ids")


def _check_layout(global_batch_size: int, micro_batch_size: int, dp_size: int) -> int:
    if min(global_batch_size, micro_batch_size, dp_size) <= 0:
        raise ValueError(
            "global_batch_size, micro_batch_size, dp_size: must be positive, got "
            f"{global_batch_size}, {micro_batch_size}, {dp_size}"
        )
    if global_batch_size % (micro_batch_size * dp_size):
        raise ValueError(
            f"global_batch_size: {global_batch_size} is not a multiple of "
            f"micro_batch_size * dp_size = {micro_batch_size * dp_size}"
        )
    return global_batch_size // (micro_batch_size * dp_size)


def num_microbatches(global_batch_size: int, micro_batch_size: int, dp_size: int) -> int:
    """Gradient-accumulation steps per global batch on each rank."""
    return _check_layout(global_batch_size, micro_batch_size, dp_size)


def global_batch_indices(step: int, global_batch_size: int) -> list[int]:
    """Global sample indices of optimizer step `step` (0-based)."""
    if step < 0 or global_batch_size <= 0:
        raise ValueError(f"step, global_batch_size: got {step}, {global_batch_size}")
    return list(range(step * global_batch_size, (step + 1) * global_batch_size))


def rank_microbatch_indices(
    step: int,
    microbatch: int,
    *,
    global_batch_size: int,
    micro_batch_size: int,
    dp_rank: int,
    dp_size: int,
) -> list[int]:
    """Global sample indices of one rank's microbatch `microbatch` of step `step`."""
    count = _check_layout(global_batch_size, micro_batch_size, dp_size)
    if not 0 <= microbatch < count:
        raise ValueError(f"microbatch: {microbatch} outside [0, {count})")
    if not 0 <= dp_rank < dp_size:
        raise ValueError(f"dp_rank: {dp_rank} outside [0, {dp_size})")
    first = step * global_batch_size + microbatch * micro_batch_size * dp_size + dp_rank * micro_batch_size
    return list(range(first, first + micro_batch_size))


class RankMicrobatchSampler(torch.utils.data.Sampler):
    """Batch sampler: this rank's microbatch indices from `consumed_samples` on.

    Use as `DataLoader(dataset, batch_sampler=..., collate_fn=collate_samples)`; resume
    by constructing it with the checkpoint's consumed_samples (a multiple of the global
    batch size at step boundaries). Stops when the dataset's samples are used up.
    """

    def __init__(
        self,
        *,
        total_samples: int,
        consumed_samples: int,
        micro_batch_size: int,
        dp_rank: int,
        dp_size: int,
    ) -> None:
        _check_layout(micro_batch_size * dp_size, micro_batch_size, dp_size)
        if not 0 <= dp_rank < dp_size:
            raise ValueError(f"dp_rank: {dp_rank} outside [0, {dp_size})")
        if consumed_samples % (micro_batch_size * dp_size):
            raise ValueError(
                f"consumed_samples: {consumed_samples} is not a multiple of "
                f"micro_batch_size * dp_size = {micro_batch_size * dp_size}"
            )
        self.total_samples = total_samples
        self.consumed_samples = consumed_samples
        self.micro_batch_size = micro_batch_size
        self.dp_rank = dp_rank
        self.dp_size = dp_size

    def __len__(self) -> int:
        slot = self.micro_batch_size * self.dp_size
        return max(0, (self.total_samples - self.consumed_samples) // slot)

    def __iter__(self) -> Iterator[list[int]]:
        slot = self.micro_batch_size * self.dp_size
        for first in range(self.consumed_samples, self.total_samples - slot + 1, slot):
            start = first + self.dp_rank * self.micro_batch_size
            yield list(range(start, start + self.micro_batch_size))


def collate_samples(samples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Stack the sample keys both dataset types share into [micro_batch, seq_length] tensors."""
    return {key: torch.stack([s[key] for s in samples]) for key in SAMPLE_KEYS}


def fetch_microbatch(dataset: Any, indices: list[int]) -> dict[str, torch.Tensor]:
    """Read and collate the samples at `indices` (global stream indices)."""
    return collate_samples([dataset[i] for i in indices])


def count_prediction_targets(batch: dict[str, torch.Tensor]) -> int:
    """Prediction targets a batch contributes to the budget: positions with loss_mask > 0."""
    return int((batch["loss_mask"] > 0).sum().item())
