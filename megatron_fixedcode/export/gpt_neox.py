"""Paper-1 ``gpt_gelu`` block → Hugging Face ``GPTNeoXForCausalLM`` (the closest exact architecture).

Our block: pre-LayerNorm (with weight and bias), bias-free QKV/out/FFN linears, GELU (erf) MLP,
full-width non-interleaved RoPE, sequential residual, untied head. GPT-NeoX with
``use_parallel_residual=False``, ``attention_bias=False``, ``hidden_act="gelu"`` (erf; see gpt2.HF_GELU) and
``rotary_pct=1`` computes the same function; its MLP linears always carry a bias, which is
exported as exact zeros (adding 0.0 changes no float). Multi-query/grouped attention is refused
(GPT-NeoX has none). With one head per query group megatron's ``linear_qkv`` rows are already
GPT-NeoX's per-head ``[q_h, k_h, v_h]`` layout.
"""

from __future__ import annotations

from typing import Any

import torch

from megatron_fixedcode.export.gpt2 import HF_GELU
from megatron_fixedcode.export.llama import LAYER, canonical_megatron_names, fixed_code_entry, input_table
from megatron_fixedcode.models.config import ModelConfig

NEOX_LAYER = "gpt_neox.layers.{i}."


def check_neox_exact(cfg: ModelConfig) -> None:
    if cfg.block != "gpt_gelu":
        raise ValueError(f"block={cfg.block!r}: GPT-NeoX export is for the gpt_gelu block only")
    if cfg.num_query_groups not in (None, cfg.num_attention_heads):
        raise ValueError(
            f"num_query_groups={cfg.num_query_groups}: GPT-NeoX has no grouped-query attention, so no "
            "exact Hugging Face architecture holds a gpt_gelu block with GQA; refusing to export"
        )


def megatron_to_neox(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    check_neox_exact(cfg)
    state = canonical_megatron_names(state)
    out: dict[str, torch.Tensor] = {"gpt_neox.embed_in.weight": input_table(state, cfg)}
    for i in range(cfg.num_layers):
        src, dst = LAYER.format(i=i), NEOX_LAYER.format(i=i)
        for m_norm, hf_norm in (
            ("input_layernorm", "input_layernorm"),
            ("pre_mlp_layernorm", "post_attention_layernorm"),
        ):
            out[dst + hf_norm + ".weight"] = state[src + m_norm + ".weight"]
            out[dst + hf_norm + ".bias"] = state[src + m_norm + ".bias"]
        out[dst + "attention.query_key_value.weight"] = state[src + "self_attention.linear_qkv.weight"]
        out[dst + "attention.dense.weight"] = state[src + "self_attention.linear_proj.weight"]
        out[dst + "mlp.dense_h_to_4h.weight"] = state[src + "mlp.linear_fc1.weight"]
        out[dst + "mlp.dense_h_to_4h.bias"] = torch.zeros(cfg.ffn_hidden_size)
        out[dst + "mlp.dense_4h_to_h.weight"] = state[src + "mlp.linear_fc2.weight"]
        out[dst + "mlp.dense_4h_to_h.bias"] = torch.zeros(cfg.hidden_size)
    out["gpt_neox.final_layer_norm.weight"] = state["decoder.final_layernorm.weight"]
    out["gpt_neox.final_layer_norm.bias"] = state["decoder.final_layernorm.bias"]
    # transformers 4.x names the head embed_out; 5.x renames it to lm_head on load.
    out["embed_out.weight"] = state["output_layer.weight"][: cfg.vocab_size]
    return {k: v.detach().to(torch.float32).contiguous().clone() for k, v in out.items()}


def neox_config(
    cfg: ModelConfig, *, bos_token_id: int | None, eos_token_id: int | None, dtype: str = "float32"
) -> dict[str, Any]:
    check_neox_exact(cfg)
    theta = float(cfg.rotary_base)
    config = {
        "architectures": ["GPTNeoXForCausalLM"],
        "model_type": "gpt_neox",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.ffn_hidden_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "hidden_act": HF_GELU[cfg.gelu_approximation],
        "rotary_pct": 1.0,
        "rotary_emb_base": theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": 1.0},
        "max_position_embeddings": cfg.seq_length,
        "layer_norm_eps": cfg.norm_epsilon,
        "use_parallel_residual": False,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "hidden_dropout": 0.0,
        "classifier_dropout": 0.0,
        "tie_word_embeddings": False,
        "initializer_range": cfg.init_method_std,
        "use_cache": True,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "torch_dtype": dtype,
        "dtype": dtype,
    }
    config.update(fixed_code_entry(cfg))
    return config
