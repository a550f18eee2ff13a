"""Local-spec weights into a Transformer Engine-spec model of the same config: TE fuses each block's
pre-norm into the following linear, so two names differ."""

from __future__ import annotations

import torch

TE_NAMES = {
    "input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
    "input_layernorm.bias": "self_attention.linear_qkv.layer_norm_bias",
    "pre_mlp_layernorm.weight": "mlp.linear_fc1.layer_norm_weight",
    "pre_mlp_layernorm.bias": "mlp.linear_fc1.layer_norm_bias",
}


def te_name(local_name: str) -> str:
    for local, te in TE_NAMES.items():
        if local_name.endswith(local):
            return local_name[: -len(local)] + te
    return local_name


def copy_local_into_te(local: torch.nn.Module, te: torch.nn.Module) -> None:
    """Every TE parameter gets exactly one local tensor (buffers: the fixed code's, identical)."""
    te_params = dict(te.named_parameters())
    filled = set()
    with torch.no_grad():
        for name, tensor in local.named_parameters():
            target = te_name(name)
            assert target in te_params, f"{name} -> {target}: no such TE parameter"
            assert te_params[target].shape == tensor.shape, (name, te_params[target].shape, tensor.shape)
            te_params[target].copy_(tensor)
            filled.add(target)
    assert filled == set(te_params), f"TE parameters without a local source: {sorted(set(te_params) - filled)}"
