"""Megatron-LM's default GPT block ⇄ Hugging Face ``GPT2LMHeadModel``: weights and config.

The block (``block=gpt_gelu`` with ``add_bias_linear``, ``position_embedding_type=learned_absolute``,
usually the output layer tied to the input table): pre-LayerNorm (weight and bias), linear biases,
GELU MLP, learned absolute positions. GPT-2 holds exactly that: ``wte``, ``wpe``, per layer ``ln_1``,
``attn.c_attn``, ``attn.c_proj``, ``ln_2``, ``mlp.c_fc``, ``mlp.c_proj``, and ``ln_f``. Its linears
are ``Conv1D`` (weight ``[in, out]``: megatron's ``[out, in]`` transposed). ``c_attn``'s output is
``[q (all heads); k; v]``; megatron's ``linear_qkv`` holds per head ``[q_h, k_h, v_h]`` (one query
per group: GPT-2 has no grouped-query attention, so GQA is refused). megatron-core's MLP without
``bias_activation_fusion`` computes ``F.gelu`` (erf): ``activation_function="gelu"``; with it (GPUs' default)
the tanh approximation, recorded as ``gelu_approximation="tanh"``: ``"gelu_pytorch_tanh"`` (see :data:`HF_GELU`).

A fixed code has no position table (``position_embedding_type=none``, untied head): it exports
with ``wpe`` all zeros (adding 0.0 changes no float), the code's frozen rows as ``wte`` and
``tie_word_embeddings=False``. RoPE has no place in GPT-2 and is refused.
"""

from __future__ import annotations

from typing import Any

import torch

from megatron_fixedcode.export.llama import LAYER, canonical_megatron_names, fixed_code_entry, input_table
from megatron_fixedcode.models.config import ModelConfig

# ModelConfig.gelu_approximation -> the Hugging Face activation that computes the same function, and back
# (GPT-2's own "gelu_new" is the same tanh formula as "gelu_pytorch_tanh", written out)
HF_GELU = {"none": "gelu", "tanh": "gelu_pytorch_tanh"}
GELU_FROM_HF = {"gelu": "none", "gelu_pytorch_tanh": "tanh", "gelu_new": "tanh"}

GPT2_LAYER = "transformer.h.{i}."
GPT2_ARCHITECTURES = ("GPT2LMHeadModel",)


def is_gpt2_block(cfg: ModelConfig) -> bool:
    """Megatron-LM's GPT-2 block: LayerNorm + GELU with linear biases and no RoPE."""
    return cfg.block == "gpt_gelu" and cfg.add_bias_linear and cfg.position_embedding_type != "rope"


def check_gpt2_exact(cfg: ModelConfig) -> None:
    why = []
    if not is_gpt2_block(cfg):
        why.append(
            f"block={cfg.block}, add_bias_linear={cfg.add_bias_linear}, position_embedding_type="
            f"{cfg.position_embedding_type} (GPT-2 is gpt_gelu with linear biases and learned positions)"
        )
    if cfg.num_query_groups not in (None, cfg.num_attention_heads):
        why.append(f"num_query_groups={cfg.num_query_groups} (GPT-2 has no grouped-query attention)")
    for name in ("qk_layernorm", "squared_relu", "layernorm_zero_centered_gamma"):
        if getattr(cfg, name):
            why.append(f"{name}=True")
    if cfg.kv_channels not in (None, cfg.hidden_size // cfg.num_attention_heads):
        why.append(f"kv_channels={cfg.kv_channels} (GPT-2's heads are hidden/heads wide)")
    if why:
        raise ValueError(f"{'; '.join(why)}: no exact GPT2LMHeadModel holds this model; refusing to export")


def _positions(cfg: ModelConfig) -> int:
    return cfg.max_position_embeddings or cfg.seq_length


def _qkv_rows(cfg: ModelConfig) -> tuple[int, int]:
    heads = cfg.num_attention_heads
    return heads, cfg.hidden_size // heads


def megatron_to_gpt2(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """GPT-2 tensors from a TP=1/PP=1 megatron state dict (vocabulary padding removed; no
    ``lm_head.weight`` when tied: transformers ties it to ``wte``)."""
    check_gpt2_exact(cfg)
    state = canonical_megatron_names(state)
    heads, head_dim = _qkv_rows(cfg)
    hidden = cfg.hidden_size
    out: dict[str, torch.Tensor] = {"transformer.wte.weight": input_table(state, cfg)}
    if cfg.position_embedding_type == "learned_absolute":
        out["transformer.wpe.weight"] = state["embedding.position_embeddings.weight"]
    else:  # none: a zero table adds nothing
        out["transformer.wpe.weight"] = torch.zeros(_positions(cfg), hidden)
    for i in range(cfg.num_layers):
        src, dst = LAYER.format(i=i), GPT2_LAYER.format(i=i)
        for m_norm, hf_norm in (("input_layernorm", "ln_1"), ("pre_mlp_layernorm", "ln_2")):
            out[dst + hf_norm + ".weight"] = state[src + m_norm + ".weight"]
            out[dst + hf_norm + ".bias"] = state[src + m_norm + ".bias"]
        qkv_W = state[src + "self_attention.linear_qkv.weight"].reshape(heads, 3, head_dim, hidden)
        qkv_b = state[src + "self_attention.linear_qkv.bias"].reshape(heads, 3, head_dim)
        # per head [q_h, k_h, v_h] -> [q; k; v] (each all heads), Conv1D's [in, out]
        out[dst + "attn.c_attn.weight"] = qkv_W.transpose(0, 1).reshape(3 * hidden, hidden).t()
        out[dst + "attn.c_attn.bias"] = qkv_b.transpose(0, 1).reshape(3 * hidden)
        out[dst + "attn.c_proj.weight"] = state[src + "self_attention.linear_proj.weight"].t()
        out[dst + "attn.c_proj.bias"] = state[src + "self_attention.linear_proj.bias"]
        out[dst + "mlp.c_fc.weight"] = state[src + "mlp.linear_fc1.weight"].t()
        out[dst + "mlp.c_fc.bias"] = state[src + "mlp.linear_fc1.bias"]
        out[dst + "mlp.c_proj.weight"] = state[src + "mlp.linear_fc2.weight"].t()
        out[dst + "mlp.c_proj.bias"] = state[src + "mlp.linear_fc2.bias"]
    out["transformer.ln_f.weight"] = state["decoder.final_layernorm.weight"]
    out["transformer.ln_f.bias"] = state["decoder.final_layernorm.bias"]
    if not cfg.share_embeddings_and_output_weights:
        out["lm_head.weight"] = state["output_layer.weight"][: cfg.vocab_size]
    return {k: v.detach().to(torch.float32).contiguous().clone() for k, v in out.items()}


def gpt2_to_megatron(hf: dict[str, torch.Tensor], cfg: ModelConfig, padded_vocab: int) -> dict[str, torch.Tensor]:
    """The inverse of :func:`megatron_to_gpt2` (padding rows of the table and head are zero)."""
    heads, head_dim = _qkv_rows(cfg)
    hidden, vocab = cfg.hidden_size, cfg.vocab_size

    def pad(t_VH: torch.Tensor) -> torch.Tensor:
        return torch.cat([t_VH, t_VH.new_zeros(padded_vocab - vocab, t_VH.shape[1])])

    out: dict[str, torch.Tensor] = {}
    if cfg.input_embedding == "learned":
        out["embedding.word_embeddings.weight"] = pad(hf["transformer.wte.weight"])
    if cfg.position_embedding_type == "learned_absolute":
        out["embedding.position_embeddings.weight"] = hf["transformer.wpe.weight"]
    for i in range(cfg.num_layers):
        src, dst = GPT2_LAYER.format(i=i), LAYER.format(i=i)
        for m_norm, hf_norm in (("input_layernorm", "ln_1"), ("pre_mlp_layernorm", "ln_2")):
            out[dst + m_norm + ".weight"] = hf[src + hf_norm + ".weight"]
            out[dst + m_norm + ".bias"] = hf[src + hf_norm + ".bias"]
        qkv_W = hf[src + "attn.c_attn.weight"].t().reshape(3, heads, head_dim, hidden)
        qkv_b = hf[src + "attn.c_attn.bias"].reshape(3, heads, head_dim)
        out[dst + "self_attention.linear_qkv.weight"] = qkv_W.transpose(0, 1).reshape(3 * hidden, hidden)
        out[dst + "self_attention.linear_qkv.bias"] = qkv_b.transpose(0, 1).reshape(3 * hidden)
        out[dst + "self_attention.linear_proj.weight"] = hf[src + "attn.c_proj.weight"].t()
        out[dst + "self_attention.linear_proj.bias"] = hf[src + "attn.c_proj.bias"]
        out[dst + "mlp.linear_fc1.weight"] = hf[src + "mlp.c_fc.weight"].t()
        out[dst + "mlp.linear_fc1.bias"] = hf[src + "mlp.c_fc.bias"]
        out[dst + "mlp.linear_fc2.weight"] = hf[src + "mlp.c_proj.weight"].t()
        out[dst + "mlp.linear_fc2.bias"] = hf[src + "mlp.c_proj.bias"]
    out["decoder.final_layernorm.weight"] = hf["transformer.ln_f.weight"]
    out["decoder.final_layernorm.bias"] = hf["transformer.ln_f.bias"]
    if not cfg.share_embeddings_and_output_weights:
        out["output_layer.weight"] = pad(hf["lm_head.weight"])
    return {k: v.to(torch.float32).contiguous() for k, v in out.items()}


def gpt2_tensor_shapes(cfg: ModelConfig) -> dict[str, list[int]]:
    """Every tensor a GPT-2 of ``cfg`` holds, with its shape (what :func:`gpt2_to_megatron` reads)."""
    hidden, ffn, vocab = cfg.hidden_size, cfg.ffn_hidden_size, cfg.vocab_size
    shapes = {"transformer.wte.weight": [vocab, hidden], "transformer.wpe.weight": [_positions(cfg), hidden]}
    for i in range(cfg.num_layers):
        layer = GPT2_LAYER.format(i=i)
        for name in ("ln_1", "ln_2"):
            shapes.update({layer + name + ".weight": [hidden], layer + name + ".bias": [hidden]})
        shapes.update(
            {
                layer + "attn.c_attn.weight": [hidden, 3 * hidden],
                layer + "attn.c_attn.bias": [3 * hidden],
                layer + "attn.c_proj.weight": [hidden, hidden],
                layer + "attn.c_proj.bias": [hidden],
                layer + "mlp.c_fc.weight": [hidden, ffn],
                layer + "mlp.c_fc.bias": [ffn],
                layer + "mlp.c_proj.weight": [ffn, hidden],
                layer + "mlp.c_proj.bias": [hidden],
            }
        )
    shapes.update(
        {"transformer.ln_f.weight": [hidden], "transformer.ln_f.bias": [hidden], "lm_head.weight": [vocab, hidden]}
    )
    return shapes


def canonical_gpt2_names(tensors: dict[str, Any]) -> dict[str, Any]:
    """OpenAI-style files name the body without ``transformer.`` and keep the causal-mask buffers
    ``attn.bias`` (4-D) / ``attn.masked_bias``: prefix the one, drop the others. Values are tensors
    or shapes (lists)."""
    out = {}
    for key, value in tensors.items():
        ndim = len(value) if isinstance(value, list) else value.dim()
        if key.endswith(".attn.masked_bias") or (key.endswith(".attn.bias") and ndim == 4):
            continue
        out[key if key.startswith(("transformer.", "lm_head.")) else "transformer." + key] = value
    return out


def gpt2_config(
    cfg: ModelConfig, *, bos_token_id: int | None, eos_token_id: int | None, dtype: str = "float32"
) -> dict[str, Any]:
    check_gpt2_exact(cfg)
    config = {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": cfg.vocab_size,
        "n_positions": _positions(cfg),
        "n_embd": cfg.hidden_size,
        "n_layer": cfg.num_layers,
        "n_head": cfg.num_attention_heads,
        "n_inner": cfg.ffn_hidden_size,
        "activation_function": HF_GELU[cfg.gelu_approximation],
        "layer_norm_epsilon": cfg.norm_epsilon,
        "resid_pdrop": cfg.hidden_dropout,
        "embd_pdrop": cfg.hidden_dropout,
        "attn_pdrop": cfg.attention_dropout,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "tie_word_embeddings": cfg.share_embeddings_and_output_weights,
        "initializer_range": cfg.init_method_std,
        "use_cache": True,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "torch_dtype": dtype,
        "dtype": dtype,
    }
    config.update(fixed_code_entry(cfg))
    return config


def model_config_from_gpt2(
    config: dict[str, Any], *, seq_length: int | None = None, make_vocab_size_divisible_by: int = 128
) -> dict[str, Any]:
    """ModelConfig fields for a GPT-2 config.json (the code fields are added by the caller)."""
    for key in ("n_layer", "n_embd", "n_head", "vocab_size", "n_positions"):
        value = config.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{key}={value!r}: expected a positive integer" if key in config else f"no {key}")
    act = config.get("activation_function", "gelu_new")
    if act not in GELU_FROM_HF:
        raise ValueError(
            f"activation_function={act!r}: megatron-core's MLP computes erf GELU ('gelu') or its tanh "
            f"approximation ({', '.join(k for k in GELU_FROM_HF if k != 'gelu')}); importing another "
            "activation would change the model's function"
        )
    unsupported = [k for k in ("scale_attn_by_inverse_layer_idx", "add_cross_attention") if config.get(k)]
    if not config.get("scale_attn_weights", True):
        unsupported.append("scale_attn_weights=False")
    if unsupported:
        raise ValueError(f"unsupported GPT-2 features {unsupported}")
    hidden = config["n_embd"]
    return dict(
        num_layers=config["n_layer"],
        hidden_size=hidden,
        num_attention_heads=config["n_head"],
        ffn_hidden_size=config.get("n_inner") or 4 * hidden,
        seq_length=seq_length or config["n_positions"],
        max_position_embeddings=config["n_positions"],
        vocab_size=config["vocab_size"],
        block="gpt_gelu",
        gelu_approximation=GELU_FROM_HF[act],
        add_bias_linear=True,
        add_qkv_bias=True,
        norm_epsilon=config.get("layer_norm_epsilon", 1e-5),
        init_method_std=config.get("initializer_range", 0.02),
        position_embedding_type="learned_absolute",
        share_embeddings_and_output_weights=config.get("tie_word_embeddings", True),
        make_vocab_size_divisible_by=make_vocab_size_divisible_by,
        transformer_impl="local",
        hidden_dropout=config.get("resid_pdrop", 0.1),
        attention_dropout=config.get("attn_pdrop", 0.1),
    )
