"""One pass of megatron-core's pipeline schedule over a list of microbatches.

A microbatch is a dict with ``tokens``, ``labels``, ``loss_mask`` ``[b, s]`` and optionally
``position_ids``, as collated (on the CPU, pinned on GPU runs); the forward step moves it to the
model's device and, under context parallelism, keeps this rank's positions. The loss is the mean
next-token NLL over all loss-mask positions of the batch.

Each microbatch's loss function returns (NLL sum, token count). Megatron's schedule then either
divides each microbatch by its own count and by the number of microbatches (the default: a mean of
per-microbatch means, which equals the token mean only when every microbatch counts the same number
of tokens, as packed pretraining does), or, with ``calculate_per_token_loss``, back-propagates the
sums and ``finalize_model_grads`` divides the data-parallel-summed gradient by the global token
count: the gradient of the mean over all loss positions, whatever the microbatch split.
"""

from __future__ import annotations

import functools
from typing import Iterable

import torch
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.utils import get_model_config

from megatron_fixedcode.compat import runtime_device
from megatron_fixedcode.compat.autocast import forward_autocast
from megatron_fixedcode.recovery.rerun import validate_loss
from megatron_fixedcode.training.batches import split_for_context_parallel, to_device
from megatron_fixedcode.recovery.straggler import stimer
from megatron_fixedcode.training.timers import timed


def loss_config_fields(dataset_type: str) -> dict[str, bool]:
    """TransformerConfig fields for the loss: each token weighted equally (megatron's
    ``calculate_per_token_loss``) where loss masks differ between samples (SFT: response tokens
    only). Packed pretraining counts every position, so there both ways are the same mean and the
    default is kept (its losses stay bit-identical)."""
    return {"calculate_per_token_loss": dataset_type == "sft"}


def _loss_func(loss_mask_BS: torch.Tensor, output_BS: torch.Tensor):
    """Sum of masked token losses and their count: megatron averages over all microbatches."""
    losses = output_BS.float() * loss_mask_BS
    num_tokens = loss_mask_BS.sum().to(torch.int)
    total = losses.sum()
    # Megatron-LM's checks of the local loss: NaN, Inf, spikes (recovery/rerun.py). A copy: the schedule
    # divides the returned tensor in place, which would change the result a re-run is compared with.
    validate_loss(total.detach().clone())
    return total, num_tokens, {"lm loss": torch.stack([total.detach(), num_tokens.float()])}


def gpt_forward_step(data_iterator, model, *, device: torch.device | None = None, cp_size: int = 1, cp_rank: int = 0):
    config = get_model_config(model) if isinstance(model, torch.nn.Module) else None  # a bare callable: no autocast
    with timed(getattr(config, "timers", None), "batch-generator", 2), stimer(bdata=True):  # pretrain_gpt's
        batch = to_device(next(data_iterator), runtime_device() if device is None else device)
        if batch.get("position_ids") is None:
            tokens_BS = batch["tokens"]
            batch["position_ids"] = torch.arange(tokens_BS.shape[1], device=tokens_BS.device).expand_as(tokens_BS)
        batch = split_for_context_parallel(batch, cp_size, cp_rank)
    # --precision fp32-autocast-bf16: FP32 parameters, matmuls in BF16 (the loss is FP32 either way)
    with forward_autocast(config, batch["tokens"].device), stimer:  # --log-straggler times the forward (straggler.py)
        output_BS = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
    return output_BS, functools.partial(_loss_func, batch["loss_mask"].float())


def forward_backward(
    model_chunks: list[torch.nn.Module],
    microbatches: Iterable[dict],
    *,
    num_microbatches: int,
    seq_length: int,
    micro_batch_size: int,
    forward_only: bool = False,
    pg_collection=None,
    device: torch.device | None = None,
) -> tuple[float, int] | None:
    """Run the schedule; on the last pipeline stage return (summed NLL, token count), else None.
    ``seq_length`` is the full sequence; under context parallelism each rank runs its share."""
    microbatches = list(microbatches)
    num_chunks = len(model_chunks)
    # Every virtual stage reads the same microbatch stream.
    iterators = [iter(microbatches) for _ in range(num_chunks)] if num_chunks > 1 else iter(microbatches)
    schedule = get_forward_backward_func()
    cp = pg_collection.cp if pg_collection is not None else None
    cp_size, cp_rank = (cp.size(), cp.rank()) if cp is not None else (1, 0)
    losses = schedule(
        forward_step_func=functools.partial(gpt_forward_step, device=device, cp_size=cp_size, cp_rank=cp_rank),
        data_iterator=iterators,
        model=model_chunks if num_chunks > 1 else model_chunks[0],
        num_microbatches=num_microbatches,
        seq_length=seq_length,  # full length: megatron divides by the CP size for its p2p shapes
        micro_batch_size=micro_batch_size,
        forward_only=forward_only,
    )
    if not losses:
        return None
    total = torch.stack([d["lm loss"] for d in losses]).sum(dim=0)
    return float(total[0]), int(total[1])
