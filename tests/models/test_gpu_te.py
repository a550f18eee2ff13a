"""GPU-only checks of the input interface: CUDA codes equal the numpy reference, TE path trains."""

import importlib.util

import numpy as np
import pytest
import torch

from megatron_fixedcode.compat import ParallelLayout
from megatron_fixedcode.models import ModelConfig, build_gpt_model, build_transformer_config

pytestmark = pytest.mark.gpu


def tiny(variant, **kw):
    return ModelConfig(
        num_layers=2,
        hidden_size=256,
        num_attention_heads=4,
        ffn_hidden_size=512,
        seq_length=128,
        vocab_size=49152,
        input_embedding=variant,
        **kw,
    )


@pytest.mark.parametrize("impl", ["table_free", "lookup"])
@pytest.mark.parametrize("variant", ["binary", "gf2"])
def test_cuda_code_equals_numpy_reference(single_rank, variant, impl):
    cfg = tiny(variant, code_impl=impl, bf16=True, transformer_impl="local")
    model = build_gpt_model(cfg, build_transformer_config(cfg, ParallelLayout()), single_rank).cuda()
    x_SBH = model.embedding(torch.arange(49152, device="cuda").reshape(1, -1), None)
    assert x_SBH.dtype == torch.bfloat16
    assert np.array_equal(x_SBH[:, 0].float().cpu().numpy(), cfg.code_spec().vectors(np.arange(49152)))


@pytest.mark.parametrize("variant", ["learned", "binary", "gf2"])
def test_transformer_engine_spec_forward_backward(single_rank, variant):
    if importlib.util.find_spec("transformer_engine") is None:
        pytest.skip("Transformer Engine is not installed")
    cfg = tiny(variant, bf16=True, transformer_impl="transformer_engine")
    model = build_gpt_model(cfg, build_transformer_config(cfg, ParallelLayout()), single_rank).cuda().bfloat16()
    ids = torch.randint(0, 49152, (2, 129), device="cuda")
    loss = model(ids[:, :-1], torch.arange(128, device="cuda").expand(2, -1), None, labels=ids[:, 1:]).float().mean()
    loss.backward()
    assert torch.isfinite(loss) and abs(loss.item() - np.log(49152)) < 2.0
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
