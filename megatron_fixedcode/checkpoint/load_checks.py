"""What a trainer's checkpoint load checks in the weights it loaded: they are finite
(else every rank stops, exit 2, rank 0 naming the tensor), and a change of precision since the
save is said in one line."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
import torch.distributed as dist

from megatron_fixedcode.checkpoint.paths import CorruptCheckpoint
from megatron_fixedcode.checkpoint.state import unwrap

logger = logging.getLogger(__name__)


def refuse_non_finite_weights(target: Path, chunks, action: str) -> None:
    """Every rank checks the weights it loaded; one with a NaN/Inf stops them all (exit 2, rank 0
    names the tensor): a checkpoint whose weights are not finite is not trained on."""
    from megatron_fixedcode.utils.finite import non_finite
    from megatron_fixedcode.utils.rank_agreement import raise_if_any_rank_failed

    bad = non_finite((n, p) for c in chunks for n, p in unwrap(c).named_parameters())
    error = (
        None
        if bad is None
        else (
            f"{target}: tensor {bad} is not finite; refusing to {action} it "
            "(an older checkpoint loads with --ckpt-step N)"
        )
    )
    raise_if_any_rank_failed(error, next(chunks[0].parameters()).device, CorruptCheckpoint)


def log_precision_change(trainer_state: dict, chunks) -> None:
    """One line when the checkpoint's weights were saved in another precision than this run's."""
    saved = (trainer_state.get("run_config") or {}).get("bf16", (trainer_state.get("model_config") or {}).get("bf16"))
    now = next(unwrap(chunks[0]).parameters()).dtype == torch.bfloat16
    if saved is not None and bool(saved) != now and dist.get_rank() == 0:
        name = {True: "BF16 weights (--bf16)", False: "FP32 weights (no --bf16)"}
        logger.warning(
            "precision changed: the checkpoint was saved with %s, this run trains with %s; its weights are cast%s",
            name[bool(saved)],
            name[now],
            " (rounded to BF16)" if now else "",
        )
