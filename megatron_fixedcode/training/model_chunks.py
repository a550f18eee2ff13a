"""Build this rank's model chunks (pipeline stages), put them on the runtime device and wrap them
in megatron-core's DDP — the order of Megatron-LM's ``get_model``."""

from __future__ import annotations

import contextlib

import torch
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
from megatron.core.fp8_utils import get_fp8_context
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.transformer.module import Float16Module
from megatron.core.transformer.transformer_config import TransformerConfig

from megatron_fixedcode.compat import ParallelLayout, runtime_device
from megatron_fixedcode.models import ModelConfig, build_gpt_model


def build_model_chunks(
    cfg: ModelConfig,
    config: TransformerConfig,
    layout: ParallelLayout,
    pg_collection: ProcessGroupCollection,
    *,
    wrap_ddp: bool = True,
    use_distributed_optimizer: bool = False,
    overlap_grad_reduce: bool = False,
    overlap_param_gather: bool = False,
    check_for_nan_in_grad: bool = False,
    check_for_large_grads: bool = False,
    device: torch.device | str | None = None,
    te_wgrad_fusion: bool = False,
) -> list[torch.nn.Module]:
    """One chunk per virtual pipeline stage; the first stage embeds, the last has the head.

    Every parameter and buffer (the fixed code's tables too) goes to ``device`` (default: the
    runtime device, ``torch.cuda.current_device()`` on GPUs) before the FP16 and DDP wrappers,
    which allocate their buffers next to the parameters.

    With ``config.fp8_param`` the TE weights are created in FP8 (TE's ``fp8_model_init``, through
    megatron's ``get_fp8_context(is_init=True)``) and the distributed optimizer gathers them in FP8.
    """
    pp_rank, pp_size = pg_collection.pp.rank(), pg_collection.pp.size()
    num_vp = layout.virtual_pipeline_model_parallel_size or 1
    chunks = []
    for vp_stage in range(num_vp):
        with get_fp8_context(config, is_init=True) if config.fp8_param else contextlib.nullcontext():
            chunks.append(
                build_gpt_model(
                    cfg,
                    config,
                    pg_collection,
                    pre_process=pp_rank == 0 and vp_stage == 0,
                    post_process=pp_rank == pp_size - 1 and vp_stage == num_vp - 1,
                    vp_stage=vp_stage if layout.virtual_pipeline_model_parallel_size else None,
                    te_wgrad_fusion=te_wgrad_fusion,
                )
            )
    device = runtime_device() if device is None else torch.device(device)
    chunks = [chunk.to(device) for chunk in chunks]
    if config.bf16 or config.fp16:
        # BF16 compute on BF16 weights; the optimizer keeps FP32 master weights.
        chunks = [Float16Module(config, chunk) for chunk in chunks]
    if not wrap_ddp:
        return chunks
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        overlap_grad_reduce=overlap_grad_reduce,
        overlap_param_gather=overlap_param_gather,
        # interleaved pipelines: gather a chunk's parameters in step with the schedule (Megatron-LM's default)
        align_param_gather=overlap_param_gather and num_vp > 1,
        use_distributed_optimizer=use_distributed_optimizer,
        fp8_param_gather=config.fp8_param,
        # each rank checks its own gradients before the reduction: a NaN or Inf names the rank
        check_for_nan_in_grad=check_for_nan_in_grad,
        check_for_large_grads=check_for_large_grads,  # the rerun state machine's spike check of each bucket
    )
    wrapped = [
        DistributedDataParallel(
            config=config, ddp_config=ddp_config, module=chunk, disable_bucketing=i > 0, pg_collection=pg_collection
        )
        for i, chunk in enumerate(chunks)
    ]

    def per_chunk(funcs):
        return funcs if len(funcs) > 1 else funcs[0]

    config.finalize_model_grads_func = finalize_model_grads
    config.no_sync_func = per_chunk([c.no_sync for c in wrapped])
    if overlap_grad_reduce:  # the schedules start each chunk's reduction as its backward finishes
        config.grad_sync_func = per_chunk([c.start_grad_sync for c in wrapped])
    if ddp_config.align_param_gather:
        config.param_sync_func = per_chunk([c.start_param_sync for c in wrapped])
    return wrapped
