"""What a model costs: parameter counts and the bytes the fixed code saves against the table."""

from __future__ import annotations

import torch
import torch.distributed as dist
from megatron.core.process_groups_config import ProcessGroupCollection

from megatron_fixedcode.compat import runtime_device
from megatron_fixedcode.models.config import ModelConfig


def _local_counts(chunks: list[torch.nn.Module], tp_rank: int) -> torch.Tensor:
    """[total, trainable, input-interface] on this rank; TP-replicated tensors count on TP rank 0."""
    counts = torch.zeros(3, dtype=torch.float64)
    for chunk in chunks:
        for name, param in chunk.named_parameters():
            if not getattr(param, "tensor_model_parallel", False) and tp_rank != 0:
                continue
            n = param.numel()
            counts[0] += n
            counts[1] += n if param.requires_grad else 0
            counts[2] += n if ".embedding." in f".{name}" else 0
    return counts


def parameter_report(
    cfg: ModelConfig, chunks: list[torch.nn.Module], pg_collection: ProcessGroupCollection
) -> dict[str, int | float | str]:
    """Whole-model counts (summed over the model-parallel group) and the table's per-rank bytes."""
    counts = _local_counts(chunks, pg_collection.tp.rank())
    if dist.is_initialized() and pg_collection.mp.size() > 1:
        counts = counts.to(runtime_device())  # NCCL reduces GPU tensors only
        dist.all_reduce(counts, group=pg_collection.mp)
        counts = counts.cpu()
    tp = pg_collection.tp.size()
    table_params = cfg.padded_vocab_size(tp) * cfg.hidden_size
    # fp32 AdamW: weight 4 + grad 4 + exp_avg 4 + exp_avg_sq 4 bytes; bf16 adds an fp32 master copy.
    bytes_per_param = (2 + 2 + 4 + 8) if cfg.bf16 else (4 + 4 + 8)
    learned = cfg.input_embedding == "learned"
    return {
        "input_embedding": cfg.input_embedding,
        "total_params": int(counts[0]),
        "trainable_params": int(counts[1]),
        "input_interface_params": int(counts[2]),
        "learned_table_params": table_params,
        # lowdim keeps a V×K trainable table (replicated over TP ranks): it saves only the rest.
        "optimizer_state_bytes_saved": 0 if learned else (table_params - int(counts[2])) * 8,
        "table_bytes_saved_per_tp_rank": 0
        if learned
        else table_params * bytes_per_param // tp - int(counts[2]) * bytes_per_param,
    }


def model_flops_per_token(report: dict, num_layers: int, hidden_size: int, seq_length: int) -> float:
    """6·N + 12·L·h·s model FLOPs per token; N leaves out the input interface (a lookup, not a
    matmul: a learned table or lowdim's V×K′ coordinates add no FLOPs)."""
    matmul_params = report["trainable_params"] - report["input_interface_params"]
    return 6 * matmul_params + 12 * num_layers * hidden_size * seq_length


def format_parameter_report(report: dict) -> str:
    gib = 1024**3
    return (
        f"model [{report['input_embedding']}]: {report['total_params']:,} parameters, "
        f"{report['trainable_params']:,} trainable, {report['input_interface_params']:,} in the input interface; "
        f"vs a learned table: {report['optimizer_state_bytes_saved'] / gib:.3f} GiB Adam state and "
        f"{report['table_bytes_saved_per_tp_rank'] / gib:.3f} GiB weight+grad+state per TP rank saved"
    )
