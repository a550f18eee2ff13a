"""Small collectives that make every rank decide alike (stop, fail, sum a metric)."""

from __future__ import annotations

import torch
import torch.distributed as dist


def any_rank(flag: bool, device: torch.device) -> bool:
    """True on every rank when ``flag`` is true on one (a signal, a time limit)."""
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def global_sum(values: list[float], device: torch.device) -> list[float]:
    """Sum over every rank; callers zero the entries a rank does not own (e.g. non-last stages).
    The tensor lives on ``device``: NCCL takes only GPU tensors."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def raise_if_any_rank_failed(error: str | None, device: torch.device, exc_type: type[Exception]) -> None:
    """Ranks read different samples, so one may find bad data alone; the others would wait in the
    next collective. Every rank learns it here (one all-reduce per call) and raises ``exc_type``
    with the lowest failing rank's message, which rank 0 reports."""
    agreed = first_rank_error(error, device)
    if agreed is not None:
        raise exc_type(agreed)


def first_rank_error(error: str | None, device: torch.device) -> str | None:
    """The lowest failing rank's message on every rank, or None when no rank failed (one all-reduce)."""
    if not any_rank(error is not None, device):
        return None
    messages: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(messages, error)
    return next(m for m in messages if m)
