"""Transformer Engine layers vs megatron-core local layers, same weights, BF16 (GPU + TE only).

The local-spec model is built, its weights are copied into the TE-spec model by name — TE fuses
each block's pre-norm into the following linear (``input_layernorm.weight`` becomes
``self_attention.linear_qkv.layer_norm_weight``, ``pre_mlp_layernorm.weight`` becomes
``mlp.linear_fc1.layer_norm_weight``) — and the logits are compared.

Tolerance (BF16, 2 blocks, hidden 256): relative L2 error of the logits ||te - local|| / ||local||
<= 2e-2 (BF16 has an 8-bit mantissa, 2^-8 = 3.9e-3 per rounding; fused vs unfused kernels round at
different places), mean NLL within 1e-2 nats, and >= 95% of argmax predictions equal.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from megatron_fixedcode.compat import ParallelLayout
from megatron_fixedcode.models import ModelConfig, build_gpt_model, build_transformer_config
from tests.helpers.te import copy_local_into_te

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        importlib.util.find_spec("transformer_engine") is None, reason="Transformer Engine is not installed"
    ),
]

REL_L2, NLL_ATOL, ARGMAX_AGREE = 2e-2, 1e-2, 0.95


def model(cfg: ModelConfig, pg):
    return build_gpt_model(cfg, build_transformer_config(cfg, ParallelLayout()), pg).cuda().bfloat16().eval()


@pytest.mark.parametrize("variant", ["learned", "binary", "gf2"])
def test_te_and_local_layers_give_the_same_logits_in_bf16(single_rank, variant):
    kw = dict(
        num_layers=2,
        hidden_size=256,
        num_attention_heads=4,
        ffn_hidden_size=512,
        seq_length=128,
        vocab_size=49152,
        input_embedding=variant,
        bf16=True,
    )
    torch.manual_seed(0)
    local = model(ModelConfig(transformer_impl="local", **kw), single_rank)
    te = model(ModelConfig(transformer_impl="transformer_engine", **kw), single_rank)
    copy_local_into_te(local, te)
    ids = torch.randint(0, 49152, (4, 129), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    position_ids = torch.arange(128, device="cuda").expand(4, -1)
    with torch.no_grad():
        logits = [m(ids[:, :-1], position_ids, None).float() for m in (local, te)]  # [b, s, V]
        nll = [m(ids[:, :-1], position_ids, None, labels=ids[:, 1:]).float().mean() for m in (local, te)]
    rel = ((logits[1] - logits[0]).norm() / logits[0].norm()).item()
    agree = (logits[1].argmax(-1) == logits[0].argmax(-1)).float().mean().item()
    assert rel <= REL_L2, f"relative L2 {rel:.2e}"
    assert abs(nll[1] - nll[0]).item() <= NLL_ATOL, (nll[0].item(), nll[1].item())
    assert agree >= ARGMAX_AGREE, agree
