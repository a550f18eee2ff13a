"""megatron-core GPT (``llama`` block) ⇄ Hugging Face ``LlamaForCausalLM``: weights and config.

Shape legend: V vocabulary (true), Vp padded vocabulary, H hidden, F FFN hidden, G query groups,
Q query heads per group, D head dim.

megatron's ``linear_qkv.weight`` is ``[G·(Q+2)·D, H]`` laid out per query group as
``[q_g (Q·D rows), k_g (D), v_g (D)]``; ``linear_fc1.weight`` is ``[gate; up]`` (``[2F, H]``).
Non-interleaved RoPE in megatron is HF's ``rotate_half``: no permutation of q/k rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from megatron_fixedcode.codes import CodeSpec
from megatron_fixedcode.models.config import ModelConfig

LAYER = "decoder.layers.{i}."
HF_LAYER = "model.layers.{i}."
# Norm weights: megatron's local spec names (TP=1 state dict of a local-spec model).
_NORMS = {
    "input_layernorm.weight": "input_layernorm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
}
# The same norms as the Transformer Engine spec names them (fused into the following linear).
TE_NORM_NAMES = {
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "self_attention.linear_qkv.layer_norm_bias": "input_layernorm.bias",
    "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
    "mlp.linear_fc1.layer_norm_bias": "pre_mlp_layernorm.bias",
}


def _heads(cfg: ModelConfig) -> tuple[int, int, int]:
    """(query groups G, query heads per group Q, head dim D)."""
    num_groups = cfg.num_query_groups or cfg.num_attention_heads
    return num_groups, cfg.num_attention_heads // num_groups, cfg.hidden_size // cfg.num_attention_heads


def canonical_megatron_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename TE-spec norm keys to the local-spec names; drop ``_extra_state`` entries."""
    out = {}
    for key, value in state.items():
        if key.endswith("_extra_state"):
            continue
        for te_name, local_name in TE_NORM_NAMES.items():
            if key.endswith(te_name):
                key = key[: -len(te_name)] + local_name
        out[key] = value
    return out


def input_table(state: dict[str, torch.Tensor], cfg: ModelConfig) -> torch.Tensor:
    """``[V, H]``: the learned table without padding, or the fixed code's frozen rows."""
    code = cfg.code_spec()
    if code is None:
        return state["embedding.word_embeddings.weight"][: cfg.vocab_size]
    return fixed_code_table(code)


def megatron_to_llama(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """HF Llama tensors from a TP=1/PP=1 megatron state dict. The learned table and the head lose
    their vocabulary padding; a fixed code gets ``embed_tokens.weight = scale·R·c~(t)``."""
    if cfg.block != "llama":
        raise ValueError(f"block={cfg.block!r} does not map to LlamaForCausalLM (only 'llama' does)")
    state = canonical_megatron_names(state)
    num_groups, q_per_group, head_dim = _heads(cfg)
    hidden, vocab = cfg.hidden_size, cfg.vocab_size
    out: dict[str, torch.Tensor] = {"model.embed_tokens.weight": input_table(state, cfg)}
    for i in range(cfg.num_layers):
        src, dst = LAYER.format(i=i), HF_LAYER.format(i=i)
        qkv_GRH = state[src + "self_attention.linear_qkv.weight"].reshape(
            num_groups, (q_per_group + 2) * head_dim, hidden
        )
        q, k, v = torch.split(qkv_GRH, [q_per_group * head_dim, head_dim, head_dim], dim=1)
        out[dst + "self_attn.q_proj.weight"] = q.reshape(-1, hidden)
        out[dst + "self_attn.k_proj.weight"] = k.reshape(-1, hidden)
        out[dst + "self_attn.v_proj.weight"] = v.reshape(-1, hidden)
        out[dst + "self_attn.o_proj.weight"] = state[src + "self_attention.linear_proj.weight"]
        gate, up = torch.chunk(state[src + "mlp.linear_fc1.weight"], 2, dim=0)
        out[dst + "mlp.gate_proj.weight"] = gate
        out[dst + "mlp.up_proj.weight"] = up
        out[dst + "mlp.down_proj.weight"] = state[src + "mlp.linear_fc2.weight"]
        for m_name, hf_name in _NORMS.items():
            out[dst + hf_name] = state[src + m_name]
    out["model.norm.weight"] = state["decoder.final_layernorm.weight"]
    out["lm_head.weight"] = state["output_layer.weight"][:vocab]
    return {k: v.detach().contiguous().clone() for k, v in out.items()}


def llama_to_megatron(hf: dict[str, torch.Tensor], cfg: ModelConfig, padded_vocab: int) -> dict[str, torch.Tensor]:
    """The inverse of :func:`megatron_to_llama` (padding rows of the head/table are zero)."""
    num_groups, q_per_group, head_dim = _heads(cfg)
    hidden, vocab = cfg.hidden_size, cfg.vocab_size

    def pad(t_VH: torch.Tensor) -> torch.Tensor:
        if t_VH.shape[0] != vocab:
            raise ValueError(f"expected {vocab} vocabulary rows, found {t_VH.shape[0]}")
        return torch.cat([t_VH, t_VH.new_zeros(padded_vocab - vocab, t_VH.shape[1])])

    out: dict[str, torch.Tensor] = {}
    if cfg.input_embedding == "learned":
        out["embedding.word_embeddings.weight"] = pad(hf["model.embed_tokens.weight"])
    for i in range(cfg.num_layers):
        src, dst = HF_LAYER.format(i=i), LAYER.format(i=i)
        q = hf[src + "self_attn.q_proj.weight"].reshape(num_groups, q_per_group * head_dim, hidden)
        k = hf[src + "self_attn.k_proj.weight"].reshape(num_groups, head_dim, hidden)
        v = hf[src + "self_attn.v_proj.weight"].reshape(num_groups, head_dim, hidden)
        out[dst + "self_attention.linear_qkv.weight"] = torch.cat([q, k, v], dim=1).reshape(-1, hidden)
        out[dst + "self_attention.linear_proj.weight"] = hf[src + "self_attn.o_proj.weight"]
        out[dst + "mlp.linear_fc1.weight"] = torch.cat(
            [hf[src + "mlp.gate_proj.weight"], hf[src + "mlp.up_proj.weight"]]
        )
        out[dst + "mlp.linear_fc2.weight"] = hf[src + "mlp.down_proj.weight"]
        for m_name, hf_name in _NORMS.items():
            out[dst + m_name] = hf[src + hf_name]
    out["decoder.final_layernorm.weight"] = hf["model.norm.weight"]
    out["output_layer.weight"] = pad(hf["lm_head.weight"])
    return {k: v.to(torch.float32).contiguous() for k, v in out.items()}


def llama_tensor_shapes(cfg: ModelConfig) -> dict[str, list[int]]:
    """Every tensor a Hugging Face Llama of ``cfg`` holds, with its shape (what
    :func:`llama_to_megatron` reads)."""
    num_groups, q_per_group, head_dim = _heads(cfg)
    hidden, ffn, vocab = cfg.hidden_size, cfg.ffn_hidden_size, cfg.vocab_size
    shapes = {"model.embed_tokens.weight": [vocab, hidden]}
    for i in range(cfg.num_layers):
        layer = HF_LAYER.format(i=i)
        shapes.update(
            {
                layer + "self_attn.q_proj.weight": [num_groups * q_per_group * head_dim, hidden],
                layer + "self_attn.k_proj.weight": [num_groups * head_dim, hidden],
                layer + "self_attn.v_proj.weight": [num_groups * head_dim, hidden],
                layer + "self_attn.o_proj.weight": [hidden, num_groups * q_per_group * head_dim],
                layer + "mlp.gate_proj.weight": [ffn, hidden],
                layer + "mlp.up_proj.weight": [ffn, hidden],
                layer + "mlp.down_proj.weight": [hidden, ffn],
                **{layer + hf_name: [hidden] for hf_name in _NORMS.values()},
            }
        )
    shapes["model.norm.weight"] = [hidden]
    shapes["lm_head.weight"] = [vocab, hidden]
    return shapes


def fixed_code_table(code: CodeSpec) -> torch.Tensor:
    """``[V, H]`` float32 rows scale·R·c~(t): the frozen lookup that equals the table-free code."""
    return torch.from_numpy(code.vectors(np.arange(code.vocab_size)).astype(np.float32))


def llama_config(
    cfg: ModelConfig, *, bos_token_id: int | None, eos_token_id: int | None, dtype: str = "float32"
) -> dict[str, Any]:
    """config.json of the export. Both ``rope_theta`` (transformers 4.x) and ``rope_parameters``
    (5.x) are written so neither version silently falls back to its default base."""
    num_groups, _, head_dim = _heads(cfg)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.ffn_hidden_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": num_groups,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.seq_length,
        "rms_norm_eps": cfg.norm_epsilon,
        "rope_theta": float(cfg.rotary_base),
        "rope_scaling": None,
        "rope_parameters": {"rope_type": "default", "rope_theta": float(cfg.rotary_base)},
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "initializer_range": cfg.init_method_std,
        "pretraining_tp": 1,
        "use_cache": True,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "torch_dtype": dtype,
        "dtype": dtype,
    }
    config.update(fixed_code_entry(cfg))
    return config


def fixed_code_entry(cfg: ModelConfig) -> dict[str, Any]:
    """``{"fixed_code": spec + fingerprint}`` for config.json, or nothing for a learned table."""
    code = cfg.code_spec()
    if code is None:
        return {}
    return {
        "fixed_code": {
            **code.to_dict(),
            "input_embedding": cfg.input_embedding,
            "note": "the input table holds scale*R*code(t), frozen; it is not a learned embedding",
        }
    }


def code_fields_from(config: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig's input-interface fields for a config.json (``fixed_code`` or the learned table)."""
    fixed = config.get("fixed_code")
    if fixed is None:
        return {"input_embedding": "learned"}
    fields = {
        "input_embedding": fixed["kind"],
        "code_seed": fixed["seed"] if fixed["seed"] is not None else 0,
        "code_offset": sum(b << j for j, b in enumerate(fixed["offset"])),
        "code_impl": fixed.get("implementation", "table_free"),
        "code_scale": fixed["scale"],
        "code_bits": fixed["num_bits"],
        "code_min_weight": fixed["min_weight"],
    }
    if fixed["kind"] == "gf2" and fixed["seed"] is None:  # a matrix given as data (--code-matrix)
        fields["code_matrix"] = fixed["matrix"]
    return fields


def model_config_from_llama(
    config: dict[str, Any], *, seq_length: int | None = None, make_vocab_size_divisible_by: int = 128
) -> ModelConfig:
    """A ModelConfig for a Llama config.json; refuses what our llama block cannot express (the
    messages name the key; the caller names the file)."""
    for key in ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size"):
        value = config.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{key}={value!r}: expected a positive integer" if key in config else f"no {key}")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    unsupported = {
        "attention_bias": config.get("attention_bias", False),
        "mlp_bias": config.get("mlp_bias", False),
        "hidden_act != silu": config.get("hidden_act", "silu") != "silu",
        "rope scaling": rope.get("rope_type", rope.get("type", "default")) not in ("default", None),
    }
    if any(unsupported.values()):
        raise ValueError(f"unsupported Llama features {[k for k, v in unsupported.items() if v]}")
    heads, hidden = config["num_attention_heads"], config["hidden_size"]
    groups = config.get("num_key_value_heads", heads)
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1 or heads % groups:
        raise ValueError(f"num_key_value_heads={groups!r} does not divide num_attention_heads={heads}")
    if config.get("head_dim", hidden // heads) != hidden // heads:
        raise ValueError(f"head_dim={config['head_dim']} != hidden_size/num_attention_heads")
    theta = rope.get("rope_theta", config.get("rope_theta", 10000.0))
    if float(theta) != int(theta):
        raise ValueError(f"rope_theta={theta} is not an integer (megatron's rotary_base is)")
    code_fields = code_fields_from(config)
    return ModelConfig(
        num_layers=config["num_hidden_layers"],
        hidden_size=hidden,
        num_attention_heads=heads,
        num_query_groups=groups,
        ffn_hidden_size=config["intermediate_size"],
        seq_length=seq_length or config.get("max_position_embeddings", 2048),
        vocab_size=config["vocab_size"],
        block="llama",
        norm_epsilon=config.get("rms_norm_eps", 1e-6),
        rotary_base=int(theta),
        init_method_std=config.get("initializer_range", 0.02),
        make_vocab_size_divisible_by=make_vocab_size_divisible_by,
        transformer_impl="local",
        **code_fields,
    )
