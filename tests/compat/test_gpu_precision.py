"""GPU-only (Transformer Engine) checks of the precision paths the recipes use:

* TF32: a TE FP32 GEMM vs a float64 reference. TE picks CUBLAS_COMPUTE_32F_FAST_TF32 for every FP32
  GEMM whatever torch's flag; only NVIDIA_TF32_OVERRIDE=0 (cuBLAS's own switch, read from the
  environment the process starts with: a fresh process here) makes it FP32-accurate. The same GEMM
  through torch with allow_tf32=False is the local layers' path (paper 1's recipes).
* The recipe's exact path, TE layers under fp32-autocast-bf16: TE and local layers under autocast
  give the same logits (BF16 tolerances), the forward/backward runs with selective recompute
  (autocast replayed) and with TE's fuse_wgrad_accumulation into megatron's main_grad, equal to the
  unfused gradients.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from megatron_fixedcode.compat import ParallelLayout
from megatron_fixedcode.compat.autocast import forward_autocast
from megatron_fixedcode.models import ModelConfig, build_gpt_model, build_transformer_config
from tests.helpers.te import copy_local_into_te

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        importlib.util.find_spec("transformer_engine") is None, reason="Transformer Engine is not installed"
    ),
]

GEMM = """
import json, sys, torch, transformer_engine.pytorch as te
torch.backends.cuda.matmul.allow_tf32 = False
g = torch.Generator("cuda").manual_seed(0)
x = torch.randn(256, 4096, device="cuda", generator=g)
layer = te.Linear(4096, 1024, bias=False, params_dtype=torch.float32).cuda()
with torch.no_grad():
    ref = x.double() @ layer.weight.double().t()
    rel = lambda y: ((y.double() - ref).norm() / ref.norm()).item()
    print(json.dumps({"te": rel(layer(x)), "torch": rel(x @ layer.weight.t())}))
"""


def gemm_errors(**env) -> dict:
    clean = {
        k: v for k, v in os.environ.items() if k not in ("NVIDIA_TF32_OVERRIDE", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE")
    }
    proc = subprocess.run(
        [sys.executable, "-c", GEMM], env={**clean, **env}, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json

    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_te_fp32_gemm_is_tf32_unless_cublas_override_is_set():
    # FP32 accumulation of 4096 products: ~1e-7 relative; TF32 inputs (10-bit mantissa): ~1e-4 to 1e-3
    default = gemm_errors()
    assert default["torch"] < 1e-5, default  # torch honours allow_tf32=False (the local layers)
    assert default["te"] > 1e-5, default  # TE does not: the refusal in training/gpu_features.py stands
    off = gemm_errors(NVIDIA_TF32_OVERRIDE="0")
    assert off["te"] < 1e-5 and off["torch"] < 1e-5, off  # the switch the refusal names


def tiny(impl: str, **kw) -> ModelConfig:
    return ModelConfig(
        num_layers=2,
        hidden_size=256,
        num_attention_heads=4,
        ffn_hidden_size=512,
        seq_length=128,
        vocab_size=49152,
        input_embedding="binary",
        autocast_bf16=True,
        transformer_impl=impl,
        **kw,
    )


def batch():
    ids = torch.randint(0, 49152, (4, 129), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    return ids[:, :-1], torch.arange(128, device="cuda").expand(4, -1), ids[:, 1:]


def test_te_layers_under_fp32_autocast_bf16_match_the_local_layers(single_rank):
    torch.manual_seed(0)
    models = {}
    for impl in ("local", "transformer_engine"):
        cfg = tiny(impl)
        config = build_transformer_config(cfg, ParallelLayout())
        assert config.enable_autocast and config.params_dtype == torch.float32
        models[impl] = build_gpt_model(cfg, config, single_rank).cuda().eval()
    copy_local_into_te(models["local"], models["transformer_engine"])
    tokens, pos, labels = batch()
    with torch.no_grad():
        logits = {}
        for impl, m in models.items():
            with forward_autocast(m.config, tokens.device):
                logits[impl] = m(tokens, pos, None).float()
    rel = ((logits["transformer_engine"] - logits["local"]).norm() / logits["local"].norm()).item()
    assert rel <= 2e-2, rel
    assert all(p.dtype == torch.float32 for p in models["transformer_engine"].parameters())


@pytest.mark.parametrize("recompute", [None, "selective"])
def test_te_autocast_backward_with_fused_wgrad_equals_unfused(single_rank, recompute):
    """TE's fuse_wgrad_accumulation (on by the trainer where TE is used) writes the same FP32
    gradient into main_grad as TE's unfused wgrad, under autocast, with and without recompute."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    from megatron_fixedcode.models.builder import fuse_te_wgrad_accumulation

    grads = []
    for fused in (False, True):
        torch.manual_seed(0)
        cfg = tiny("transformer_engine", recompute_granularity=recompute)
        config = build_transformer_config(cfg, ParallelLayout())
        model = build_gpt_model(cfg, config, single_rank).cuda()
        if fused:
            assert fuse_te_wgrad_accumulation(model) > 0
        ddp = DistributedDataParallel(
            config=config,
            ddp_config=DistributedDataParallelConfig(grad_reduce_in_fp32=True),
            module=model,
            pg_collection=single_rank,
        )
        ddp.zero_grad_buffer()
        tokens, pos, labels = batch()
        with forward_autocast(config, tokens.device):
            loss = ddp(tokens, pos, None, labels=labels).float().mean()
        loss.backward()
        ddp.finish_grad_sync()
        grads.append({n: p.main_grad.clone() for n, p in model.named_parameters()})
    for name, unfused in grads[0].items():
        assert torch.isfinite(grads[1][name]).all(), name
        torch.testing.assert_close(grads[1][name], unfused, rtol=2e-2, atol=1e-5, msg=name)
