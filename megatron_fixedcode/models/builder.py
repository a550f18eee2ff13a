"""Build a megatron-core GPT model from a `ModelConfig`: TransformerConfig, layer spec, model."""

from __future__ import annotations

import functools
import importlib.util
import logging

import torch
from megatron.core.activations import squared_relu
from megatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_layer_local_spec,
    get_gpt_layer_with_transformer_engine_spec,
)
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_config import TransformerConfig

from megatron_fixedcode.compat import ParallelLayout, cpu_transformer_config_overrides
from megatron_fixedcode.compat.autocast import keep_residual_stream_fp32
from megatron_fixedcode.models.code_embeddings import embedding_class
from megatron_fixedcode.models.config import BLOCKS, ModelConfig
from megatron_fixedcode.models.gpt import InputInterfaceGPTModel, learned_embedding
from megatron_fixedcode.utils.te_install import TE_INSTALL_HINT

logger = logging.getLogger(__name__)


def transformer_engine_available() -> bool:
    return importlib.util.find_spec("transformer_engine") is not None and torch.cuda.is_available()


def use_transformer_engine(cfg: ModelConfig) -> bool:
    """TE layers when asked for (also implied by FP8), or by default when TE is importable on CUDA."""
    te_available = transformer_engine_available()
    wants_te = cfg.transformer_impl == "transformer_engine" or cfg.fp8 is not None
    if wants_te and not te_available:
        what = f"fp8={cfg.fp8!r}" if cfg.fp8 else "transformer_impl='transformer_engine'"
        where = "a CUDA GPU and Transformer Engine" if not torch.cuda.is_available() else "Transformer Engine"
        raise ValueError(f"{what} needs {where}: {TE_INSTALL_HINT}; use transformer_impl='local' without FP8 otherwise")
    if cfg.transformer_impl == "auto" and torch.cuda.is_available() and not te_available:
        _warn_once(
            "transformer_impl=auto on a GPU without Transformer Engine: building megatron-core's local "
            "layers (no FP8, no fused attention). Name transformer_engine to require TE, or local to "
            f"choose these layers; {TE_INSTALL_HINT}"
        )
    return wants_te or (cfg.transformer_impl == "auto" and te_available)


@functools.cache
def _warn_once(message: str) -> None:
    logger.warning("%s", message)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU's tanh approximation: what megatron's fused bias-GELU kernel computes, unfused."""
    return torch.nn.functional.gelu(x, approximate="tanh")


def mlp_activation(cfg: ModelConfig, *, fused: bool):
    """The MLP's activation function. megatron's fused kernels are chosen by identity (``F.gelu``, ``F.silu``)
    and the bias-GELU one computes the tanh approximation; unfused, a model recorded with it gets
    :func:`gelu_tanh`, so that a GPU-trained model computes the same function on a CPU."""
    if cfg.squared_relu:
        return squared_relu
    if BLOCKS[cfg.block]["activation"] == "silu":
        return torch.nn.functional.silu
    return gelu_tanh if cfg.gelu_approximation == "tanh" and not fused else torch.nn.functional.gelu


def build_transformer_config(
    cfg: ModelConfig, layout: ParallelLayout, *, te_layers: bool | None = None, **overrides
) -> TransformerConfig:
    """Megatron TransformerConfig for the block of ``cfg`` (init std 0.02, out-projections
    0.02/sqrt(2L) — megatron's default output_layer_init_method). ``te_layers``: the trainer's
    decision (:func:`use_transformer_engine`, taken once); None decides it here."""
    block = BLOCKS[cfg.block]
    if te_layers is None:
        te_layers = use_transformer_engine(cfg)
    fields = dict(
        num_layers=cfg.num_layers,
        hidden_size=cfg.hidden_size,
        num_attention_heads=cfg.num_attention_heads,
        num_query_groups=cfg.num_query_groups,
        kv_channels=cfg.kv_channels,
        rotary_interleaved=cfg.rotary_interleaved,
        ffn_hidden_size=cfg.ffn_hidden_size,
        normalization=block["normalization"],
        gated_linear_unit=block["gated_linear_unit"],
        activation_func=mlp_activation(cfg, fused=overrides.get("bias_activation_fusion", False)),
        layernorm_epsilon=cfg.norm_epsilon,
        add_bias_linear=cfg.add_bias_linear,
        add_qkv_bias=cfg.add_qkv_bias or cfg.add_bias_linear,
        qk_layernorm=cfg.qk_layernorm,
        hidden_dropout=cfg.hidden_dropout,
        attention_dropout=cfg.attention_dropout,
        init_method_std=cfg.init_method_std,
        bf16=cfg.bf16,
        params_dtype=torch.bfloat16 if cfg.bf16 else torch.float32,
        tensor_model_parallel_size=layout.tensor_model_parallel_size,
        pipeline_model_parallel_size=layout.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=layout.virtual_pipeline_model_parallel_size,
        context_parallel_size=layout.context_parallel_size,
        sequence_parallel=layout.sequence_parallel,
        recompute_granularity=cfg.recompute_granularity,
        # the command line requires both with full (Megatron-LM); a ModelConfig built in code may leave them: uniform, 1
        recompute_method=cfg.recompute_method or ("uniform" if cfg.recompute_granularity == "full" else None),
        recompute_num_layers=cfg.recompute_num_layers or (1 if cfg.recompute_granularity == "full" else None),
        layernorm_zero_centered_gamma=cfg.layernorm_zero_centered_gamma,
        pipeline_dtype=torch.bfloat16 if cfg.bf16 else torch.float32,
        # PP > 1: free each stage's output activations once sent (Megatron-LM sets it); only the
        # grad_fn is needed for the backward
        deallocate_pipeline_outputs=layout.pipeline_model_parallel_size > 1,
        transformer_impl="transformer_engine" if te_layers else "local",
    )
    if cfg.fp8:
        fields.update(
            fp8=cfg.fp8,
            fp8_recipe=cfg.fp8_recipe,
            fp8_amax_history_len=cfg.fp8_amax_history_len,
            fp8_amax_compute_algo=cfg.fp8_amax_compute_algo,
            fp8_param=cfg.fp8_param,
        )
    if cfg.autocast_bf16:
        # FP32 parameters, the forward step under torch.autocast(bf16) (megatron's schedules and
        # training/forward_backward.py read these two fields).
        fields.update(enable_autocast=True, autocast_dtype=torch.bfloat16)
    if not torch.cuda.is_available():
        fields.update(cpu_transformer_config_overrides())
    fields.update(overrides)
    if cfg.autocast_bf16 and fields.get("gradient_accumulation_fusion"):
        # apex's fused weight-gradient GEMM takes input and output gradient of one dtype; under
        # autocast megatron's linear layers save the FP32 input and get a BF16 gradient.
        _warn_once(
            "gradient_accumulation_fusion off under fp32-autocast-bf16 (the fused wgrad GEMM needs one input dtype)"
        )
        fields["gradient_accumulation_fusion"] = False
    return TransformerConfig(**fields)


def build_layer_spec(cfg: ModelConfig, config: TransformerConfig) -> ModuleSpec:
    if config.transformer_impl == "transformer_engine":
        return get_gpt_layer_with_transformer_engine_spec(qk_layernorm=cfg.qk_layernorm)
    return get_gpt_layer_local_spec(normalization=BLOCKS[cfg.block]["normalization"], qk_layernorm=cfg.qk_layernorm)


def build_embedding_factory(cfg: ModelConfig):
    code_spec = cfg.code_spec()
    if code_spec is None:
        return learned_embedding
    return functools.partial(embedding_class(code_spec), code_spec=code_spec, kernel=cfg.code_kernel)


def fuse_te_wgrad_accumulation(model: torch.nn.Module) -> int:
    """Turn on TE's ``fuse_wgrad_accumulation`` in every TE linear of ``model`` (read by TE at each
    forward; megatron's DDP gives the weights their ``main_grad``). Megatron passes
    ``config.gradient_accumulation_fusion`` to TE at construction, but that field also reaches the
    output layer, a megatron ColumnParallelLinear that refuses it without apex. Returns the count."""
    modules = [m for m in model.modules() if getattr(m, "fuse_wgrad_accumulation", None) is False]
    for module in modules:
        module.fuse_wgrad_accumulation = True
    return len(modules)


def build_gpt_model(
    cfg: ModelConfig,
    config: TransformerConfig,
    pg_collection: ProcessGroupCollection,
    *,
    pre_process: bool = True,
    post_process: bool = True,
    vp_stage: int | None = None,
    te_wgrad_fusion: bool = False,
) -> InputInterfaceGPTModel:
    """One model chunk (a pipeline stage) on this rank. ``te_wgrad_fusion``: TE's weight-gradient
    accumulation into ``main_grad`` (:func:`fuse_te_wgrad_accumulation`; TE layers only)."""
    model = InputInterfaceGPTModel(
        embedding_factory=build_embedding_factory(cfg),
        config=config,
        transformer_layer_spec=build_layer_spec(cfg, config),
        vocab_size=cfg.padded_vocab_size(config.tensor_model_parallel_size),
        # the learned position table's rows (Megatron-LM's --max-position-embeddings); unused by RoPE
        max_sequence_length=cfg.max_position_embeddings or cfg.seq_length,
        pre_process=pre_process,
        post_process=post_process,
        share_embeddings_and_output_weights=cfg.share_embeddings_and_output_weights,
        position_embedding_type=cfg.position_embedding_type,
        rotary_base=cfg.rotary_base,
        rotary_percent=cfg.rotary_percent,
        rope_scaling=cfg.rope_scaling,
        rope_scaling_factor=cfg.rope_scaling_factor,
        pg_collection=pg_collection,
        vp_stage=vp_stage,
    )
    if config.enable_autocast:
        keep_residual_stream_fp32(model)  # paper 2's mode: the residual stream stays FP32 under autocast
    if te_wgrad_fusion:
        if config.transformer_impl != "transformer_engine":
            raise ValueError("te_wgrad_fusion needs Transformer Engine layers")
        fuse_te_wgrad_accumulation(model)
    return model
