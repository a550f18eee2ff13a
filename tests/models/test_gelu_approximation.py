"""GELU as computed: megatron's fused bias-GELU kernel (on by default on GPUs) computes the tanh approximation,
its unfused MLP erf. A run records which (ModelConfig.gelu_approximation); a CPU rebuild computes the same."""

import torch
from megatron.core.fusions.fused_bias_gelu import bias_gelu

from megatron_fixedcode.models import ModelConfig
from megatron_fixedcode.models.builder import gelu_tanh, mlp_activation
from megatron_fixedcode.training.gpu_features import settle_gelu_approximation

GPT2 = dict(
    num_layers=1,
    hidden_size=8,
    num_attention_heads=2,
    ffn_hidden_size=16,
    seq_length=8,
    vocab_size=32,
    block="gpt_gelu",
    add_bias_linear=True,
    input_embedding="learned",
)


def test_unfused_tanh_gelu_is_the_fused_kernels_function():
    x, b = torch.randn(4096, dtype=torch.float64) * 4, torch.zeros(4096, dtype=torch.float64)
    assert torch.allclose(gelu_tanh(x), bias_gelu(b, x), rtol=0, atol=1e-8)
    assert (gelu_tanh(x) - torch.nn.functional.gelu(x)).abs().max() > 1e-4  # erf is another function


def test_fresh_run_records_what_it_computes_and_a_resume_keeps_the_checkpoints():
    fresh = ModelConfig(**GPT2)
    fused = {"bias_activation_fusion": True}
    settle_gelu_approximation(fresh, fused, resumed=False)
    assert fresh.gelu_approximation == "tanh" and fused["bias_activation_fusion"]
    assert mlp_activation(fresh, fused=True) is torch.nn.functional.gelu  # the fused kernel is chosen by identity
    assert mlp_activation(fresh, fused=False) is gelu_tanh  # the same function on a CPU
    cpu = ModelConfig(**GPT2)
    settle_gelu_approximation(cpu, {}, resumed=False)
    assert cpu.gelu_approximation == "none" and mlp_activation(cpu, fused=False) is torch.nn.functional.gelu
    erf_checkpoint = ModelConfig(**GPT2)  # resumed on a GPU: keeps erf, the fusion goes off
    fused = {"bias_activation_fusion": True}
    settle_gelu_approximation(erf_checkpoint, fused, resumed=True)
    assert erf_checkpoint.gelu_approximation == "none" and fused == {"bias_activation_fusion": False}
    swiglu = ModelConfig(**{**GPT2, "block": "llama"})
    fused = {"bias_activation_fusion": True}
    settle_gelu_approximation(swiglu, fused, resumed=False)
    assert swiglu.gelu_approximation == "none" and fused["bias_activation_fusion"]
