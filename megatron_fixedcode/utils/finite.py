"""Non-finite weights are refused where they enter: a Hugging Face import, a checkpoint load
(``--load``/``--finetune``, ``tools/evaluate.py --load``, the HF converter) and an export; an
evaluation whose loss is not finite is an error, not a ``NaN`` result with exit code 0.

A safetensors file holding a NaN tensor was imported without a word and evaluated
to ``"loss": NaN`` with exit 0; only a training step caught it."""

from __future__ import annotations

import math
from typing import Iterable

import torch


def non_finite(named: Iterable[tuple[str, torch.Tensor]]) -> str | None:
    """``"NAME (k of n values are NaN/Inf)"`` for the first tensor holding a NaN or an Inf, else None."""
    for name, tensor in named:
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
            continue
        bad = int((~torch.isfinite(tensor.detach())).sum())
        if bad:
            return f"{name} ({bad} of {tensor.numel()} values are NaN/Inf)"
    return None


def refuse_non_finite(named: Iterable[tuple[str, torch.Tensor]], where: str, action: str) -> None:
    """``ValueError("WHERE: tensor NAME (k of n values are NaN/Inf) is not finite; refusing to ACTION")``."""
    found = non_finite(named)
    if found is not None:
        raise ValueError(f"{where}: tensor {found} is not finite; refusing to {action}")


def check_finite_loss(loss: float, what: str) -> None:
    """An evaluation never reports a NaN or infinite loss as a result."""
    if not math.isfinite(loss):
        raise ValueError(
            f"{what}: the loss is {loss} (the model's outputs are not finite: its weights or "
            "activations overflow); no result is reported"
        )
