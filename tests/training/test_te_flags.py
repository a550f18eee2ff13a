"""Transformer Engine / FP8 / overlap flags: refusals on CPU and without TE, what the dry run and
TransformerConfig receive, the fixed code's dtype under FP8, the fused optimizer switch; and, on a
CUDA machine with TE, the TE spec choice and real FP8 / overlapped training steps."""

from __future__ import annotations

import importlib.util
import json
import types

import pytest
import torch

from megatron_fixedcode.compat import ParallelLayout
from megatron_fixedcode.models import ModelConfig, build_transformer_config
from megatron_fixedcode.models import builder
from megatron_fixedcode.pretrain import main
from megatron_fixedcode.training import gpu_features
from megatron_fixedcode.arguments.parse import parse_pretrain_args
from megatron_fixedcode.arguments.performance_flags import PerformanceConfig
from tests.helpers.pretrain import TINY

HAS_TE = importlib.util.find_spec("transformer_engine") is not None
NO_DATA = ["--data-path", "/nonexistent/prefix", "--train-iters", "1"]


def tiny_model(**kw) -> ModelConfig:
    return ModelConfig(
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        ffn_hidden_size=128,
        seq_length=32,
        vocab_size=1024,
        input_embedding="binary",
        **kw,
    )


def _exit_message(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as e:
        parse_pretrain_args(argv)
    assert e.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--fp8-format", "hybrid", "--transformer-impl", "auto"], "needs --bf16"),
        (["--fp8-format", "e4m3", "--bf16", "--transformer-impl", "local"], "needs Transformer Engine layers"),
        (["--fp8-param-gather"], "needs --fp8-format"),
        (
            ["--fp8-format", "hybrid", "--bf16", "--transformer-impl", "auto", "--fp8-param-gather"],
            "--use-distributed-optimizer",
        ),
        (["--overlap-param-gather", "--use-distributed-optimizer"], "--overlap-grad-reduce"),
        (["--tp-comm-overlap", "--transformer-impl", "auto"], "--sequence-parallel"),
        (["--fp8-recipe", "nvfp4"], "invalid choice"),
    ],
)
def test_flag_combinations_refused_before_anything_starts(capsys, flags, message):
    assert message in _exit_message(capsys, [*TINY, *NO_DATA, *flags])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
@pytest.mark.parametrize(
    "flags",
    [
        ["--transformer-impl", "transformer_engine"],
        ["--fp8-format", "hybrid", "--bf16", "--transformer-impl", "auto"],
    ],
)
def test_cpu_refuses_gpu_features_at_launch_with_what_to_install(caplog, flags):
    from megatron_fixedcode.training.loop import run_pretraining

    cfg = parse_pretrain_args([*TINY, *NO_DATA, *flags])
    assert run_pretraining(cfg) == 2  # before any process group, model or data
    text = caplog.text
    assert "needs a CUDA GPU" in text and flags[0] in text
    assert "pip install" in text and "transformer_engine[pytorch]" in text


def _args(**kw) -> PerformanceConfig:
    base = dict(
        transformer_impl="auto",
        fp8=None,
        fp8_recipe="delayed",
        tp_comm_overlap=False,
        overlap_grad_reduce=False,
        overlap_param_gather=False,
        tf32=True,
        precision="fp32",
        bf16=False,
        gradient_accumulation_fusion=True,
        bias_gelu_fusion=True,
        bias_swiglu_fusion=True,
        bias_dropout_fusion=True,
        apply_rope_fusion=True,
        masked_softmax_fusion=True,
    )
    return PerformanceConfig(**{**base, **kw})


def test_gpu_without_te_refuses_with_install_hint(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu_features.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match=r"--fp8-format hybrid needs Transformer Engine.*pip install"):
        gpu_features.check_gpu_features(_args(fp8="hybrid"))
    gpu_features.check_gpu_features(_args(overlap_grad_reduce=True))  # overlap needs no TE


def test_gpu_without_fp8_support_refuses_with_the_reason(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA A100-SXM4-80GB")
    monkeypatch.setattr(gpu_features.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(
        gpu_features, "_fp8_support", lambda recipe: (False, "Device compute capability 8.9 or higher required")
    )
    with pytest.raises(ValueError, match=r"not supported on NVIDIA A100.*8\.9 or higher"):
        gpu_features.check_gpu_features(_args(fp8="e4m3"))


@pytest.mark.parametrize(
    "tf32,precision,te_layers,environ,refused",
    [
        (False, "fp32", True, {}, "--transformer-impl local"),  # TE's FP32 GEMMs run in TF32 regardless
        (False, "fp32", True, {"NVIDIA_TF32_OVERRIDE": "0"}, None),  # cuBLAS's own off switch covers TE
        (False, "fp32", True, {"NVIDIA_TF32_OVERRIDE": "1"}, "NVIDIA_TF32_OVERRIDE=0"),
        (True, "fp32", True, {}, None),  # TF32 wanted: nothing to refuse
        (False, "fp32-autocast-bf16", True, {}, None),  # TE's GEMMs are BF16 under autocast
        (False, "bf16", True, {}, None),
        (False, "fp32", False, {}, None),  # local layers honour torch's flag
        (False, "fp32", False, {"TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1"}, "unset it"),  # NGC containers
        (False, "fp32", False, {"TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1", "NVIDIA_TF32_OVERRIDE": "0"}, None),
    ],
)
def test_tf32_off_is_refused_where_it_would_not_hold(tf32, precision, te_layers, environ, refused):
    message = gpu_features.tf32_refusal(tf32=tf32, fp32_gemms=precision == "fp32", te_layers=te_layers, environ=environ)
    assert (message is None) if refused is None else (refused in message and "\n" not in message), message


def test_gpu_launch_refuses_no_tf32_with_te_layers_in_one_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu_features.importlib.util, "find_spec", lambda name: object())
    monkeypatch.delenv("NVIDIA_TF32_OVERRIDE", raising=False)
    for impl in ("transformer_engine", "auto"):  # auto picks TE where it is importable
        with pytest.raises(ValueError, match=r"^--no-tf32 with Transformer Engine layers.*--transformer-impl local"):
            gpu_features.check_gpu_features(_args(transformer_impl=impl, tf32=False))
    gpu_features.check_gpu_features(_args(transformer_impl="local", tf32=False))
    gpu_features.check_gpu_features(
        _args(transformer_impl="transformer_engine", tf32=False, precision="fp32-autocast-bf16")
    )
    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "0")
    gpu_features.check_gpu_features(_args(transformer_impl="transformer_engine", tf32=False))


def test_every_recipe_that_turns_tf32_off_gets_it(capsys):
    """Paper 1's recipes ask for FP32 without TF32: they use the local layers, which honour it."""
    import pathlib

    names = sorted(p.name for p in pathlib.Path("examples/recipes").glob("*.yaml"))
    checked = 0
    for name in names:
        try:
            if main(["--config", f"examples/recipes/{name}", "--dry-run"]) != 0:
                continue
        except SystemExit:  # a partial recipe (the study's), completed by its launcher
            capsys.readouterr()
            continue
        config = json.loads(capsys.readouterr().out)
        te_layers = config["transformer_impl"] == "transformer_engine" or config.get("fp8") is not None
        assert (
            gpu_features.tf32_refusal(
                tf32=config["tf32"], fp32_gemms=config["precision"] == "fp32", te_layers=te_layers, environ={}
            )
            is None
        ), name
        checked += not config["tf32"]
    assert checked >= 8  # the seven paper-1 pretraining recipes and paper 1's SFT


def test_wgrad_fusion_is_tes_own_where_te_is_used_and_apexs_for_local_layers(monkeypatch):
    """Without apex, megatron's linear layers cannot fuse the weight-gradient accumulation (its
    ColumnParallelLinear refuses); TE's layers can, in any precision mode."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu_features, "_importable", lambda module: module == "transformer_engine")  # no apex
    a = _args(
        gradient_accumulation_fusion=True,
        bias_swiglu_fusion=True,
        bias_dropout_fusion=True,
        apply_rope_fusion=True,
        masked_softmax_fusion=True,
    )
    for te_layers in (True, False):
        assert (
            gpu_features.fusion_settings(a, te_layers=te_layers, gated_linear_unit=True, squared_relu=False)[
                "gradient_accumulation_fusion"
            ]
            is False
        )
    assert gpu_features.te_wgrad_fusion(a, te_layers=True) is True
    assert gpu_features.te_wgrad_fusion(a, te_layers=False) is False
    assert gpu_features.te_wgrad_fusion(_args(gradient_accumulation_fusion=False), te_layers=True) is False
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_features.te_wgrad_fusion(a, te_layers=True) is False  # CPU: no TE at all


def test_te_wgrad_fusion_reaches_every_te_linear_and_only_them(single_rank):
    class FakeTELinear(torch.nn.Linear):  # what TE's Linear / LayerNormLinear keep: read at each forward
        fuse_wgrad_accumulation = False

    model = torch.nn.Sequential(FakeTELinear(4, 4), torch.nn.Linear(4, 4), torch.nn.Sequential(FakeTELinear(4, 4)))
    assert builder.fuse_te_wgrad_accumulation(model) == 2
    assert [getattr(m, "fuse_wgrad_accumulation", None) for m in model.modules()] == [None, True, None, None, True]
    cfg = tiny_model(transformer_impl="local")
    with pytest.raises(ValueError, match="needs Transformer Engine layers"):
        builder.build_gpt_model(cfg, build_transformer_config(cfg, ParallelLayout()), single_rank, te_wgrad_fusion=True)


def test_model_without_te_refuses_te_and_fp8():
    for cfg in (tiny_model(transformer_impl="transformer_engine"), tiny_model(bf16=True, fp8="hybrid")):
        with pytest.raises(ValueError, match="needs .*Transformer Engine.*pip install"):
            build_transformer_config(cfg, ParallelLayout())
    with pytest.raises(ValueError, match="fp8 needs bf16"):
        tiny_model(fp8="hybrid")


def test_dry_run_shows_the_te_fields(capsys):
    argv = [
        "--config",
        "examples/recipes/paper2_1p7b_binary.yaml",
        "--bf16",
        "--fp8-format",
        "hybrid",
        "--fp8-recipe",
        "tensorwise",
        "--fp8-amax-history-len",
        "1024",
        "--fp8-amax-compute-algo",
        "max",
        "--fp8-param-gather",
        "--overlap-grad-reduce",
        "--overlap-param-gather",
        "--dry-run",
    ]
    assert main(argv) == 0
    resolved = json.loads(capsys.readouterr().out)
    assert {
        k: resolved[k]
        for k in (
            "fp8",
            "fp8_recipe",
            "fp8_amax_history_len",
            "fp8_amax_compute_algo",
            "fp8_param_gather",
            "overlap_grad_reduce",
            "overlap_param_gather",
            "tp_comm_overlap",
            "transformer_impl",
        )
    } == {
        "fp8": "hybrid",
        "fp8_recipe": "tensorwise",
        "fp8_amax_history_len": 1024,
        "fp8_amax_compute_algo": "max",
        "fp8_param_gather": True,
        "overlap_grad_reduce": True,
        "overlap_param_gather": True,
        "tp_comm_overlap": False,
        "transformer_impl": "transformer_engine",
    }


def test_transformer_config_gets_the_fp8_fields_and_the_code_stays_bf16(monkeypatch):
    """Where TE is available (simulated): TE layers, the FP8 fields in TransformerConfig, and the
    fixed-code input still emitted in the activation dtype (TE quantizes inside its GEMMs)."""
    from megatron_fixedcode.models.fixed_code_embedding import FixedCodeEmbedding

    monkeypatch.setattr(builder, "transformer_engine_available", lambda: True)
    cfg = tiny_model(
        bf16=True,
        fp8="e4m3",
        fp8_recipe="tensorwise",
        fp8_amax_history_len=16,
        fp8_amax_compute_algo="max",
        fp8_param=True,
    )
    config = build_transformer_config(cfg, ParallelLayout())
    assert config.transformer_impl == "transformer_engine"
    assert (
        config.fp8,
        config.fp8_recipe,
        config.fp8_amax_history_len,
        config.fp8_amax_compute_algo,
        config.fp8_param,
    ) == ("e4m3", "tensorwise", 16, "max", True)
    embedding = FixedCodeEmbedding(config=config, code_spec=cfg.code_spec())
    x_SBH = embedding(torch.arange(64).reshape(2, 32), None)
    assert x_SBH.dtype == torch.bfloat16 and x_SBH.shape == (32, 2, 64)
    monkeypatch.setattr(builder, "transformer_engine_available", lambda: False)
    assert build_transformer_config(tiny_model(), ParallelLayout()).transformer_impl == "local"


def test_fused_adamw_only_for_torch_adamw_on_cuda(monkeypatch):
    param = torch.nn.Parameter(torch.ones(4))
    wrapped = types.SimpleNamespace(optimizer=torch.optim.AdamW([param], lr=0.1))
    assert gpu_features.use_fused_adamw(wrapped) == "torch AdamW"  # CPU: megatron's default kept
    assert not wrapped.optimizer.param_groups[0]["fused"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    chained = types.SimpleNamespace(chained_optimizers=[wrapped])
    assert gpu_features.use_fused_adamw(chained) == "torch fused AdamW"
    assert wrapped.optimizer.param_groups[0]["fused"] is True
    param.grad = torch.ones(4)
    monkeypatch.undo()  # a CUDA build of torch would otherwise look for the (faked) GPU in step()
    wrapped.optimizer.step()  # torch's fused kernel also runs on CPU tensors
    assert torch.all(param < 1)


def test_params_synced_gathers_only_overlapped_chunks_and_restores_their_hooks():
    """Chunks without --overlap-param-gather (and modules without a DDP config) are left alone; an
    overlapped chunk's pre-hooks are disabled (its parameters gathered) before the body and enabled
    after it, also when the body raises."""
    calls = []

    def chunk(name: str, overlap: bool):
        return types.SimpleNamespace(
            ddp_config=types.SimpleNamespace(overlap_param_gather=overlap),
            disable_forward_pre_hook=lambda: calls.append(f"disable {name}"),
            enable_forward_pre_hook=lambda: calls.append(f"enable {name}"),
        )

    chunks = [chunk("plain", False), torch.nn.Linear(1, 1), chunk("overlapped", True)]
    with gpu_features.params_synced(chunks):
        assert calls == ["disable overlapped"]
    assert calls == ["disable overlapped", "enable overlapped"]
    calls.clear()
    with pytest.raises(RuntimeError, match="evaluation failed"), gpu_features.params_synced(chunks):
        raise RuntimeError("evaluation failed")
    assert calls == ["disable overlapped", "enable overlapped"]


# --- on a CUDA machine with Transformer Engine (scripts/gpu_check.sh runs these) -----------------

needs_te = pytest.mark.skipif(not HAS_TE, reason="Transformer Engine is not installed")


@pytest.mark.gpu
@needs_te
def test_auto_picks_the_te_spec_on_cuda():
    from megatron.core.extensions.transformer_engine import TELayerNormColumnParallelLinear

    cfg = tiny_model(bf16=True)
    config = build_transformer_config(cfg, ParallelLayout())
    assert config.transformer_impl == "transformer_engine"
    spec = builder.build_layer_spec(cfg, config)
    assert spec.submodules.self_attention.submodules.linear_qkv is TELayerNormColumnParallelLinear


def _fp8_or_skip(recipe: str) -> None:
    ok, reason = gpu_features._fp8_support(recipe)
    if not ok:
        pytest.skip(f"FP8 ({recipe}) not supported on {torch.cuda.get_device_name()}: {reason}")


@pytest.mark.gpu
@needs_te
@pytest.mark.parametrize("recipe", ["delayed", "tensorwise"])
def test_one_fp8_training_step_with_the_real_trainer(tmp_path, recipe):
    from tests.helpers.pretrain import data_args, pretrain, read_metrics, write_corpus

    _fp8_or_skip(recipe)
    corpus = write_corpus(tmp_path)
    pretrain(
        *data_args(corpus, "gpt"),
        "--train-iters",
        "2",
        "--bf16",
        "--transformer-impl",
        "transformer_engine",
        "--fp8-format",
        "hybrid",
        "--fp8-recipe",
        recipe,
        "--fp8-amax-history-len",
        "16",
        "--metrics-file",
        str(tmp_path / "m.jsonl"),
    )
    losses = [r["loss"] for r in read_metrics(tmp_path / "m.jsonl")]
    assert len(losses) == 2 and all(abs(ln - 6.93) < 1.5 for ln in losses), losses  # ln(1024) = 6.93 at init


@pytest.mark.gpu
def test_overlap_flags_train_like_the_plain_run(tmp_path):
    """DP=1, so the overlapped reduction/gather must give the plain run's losses (bit-identical)."""
    from tests.helpers.pretrain import data_args, pretrain, read_metrics, write_corpus

    corpus = write_corpus(tmp_path)
    common = [*data_args(corpus, "gpt"), "--train-iters", "3", "--bf16", "--use-distributed-optimizer"]
    pretrain(*common, "--metrics-file", str(tmp_path / "plain.jsonl"))
    pretrain(
        *common,
        "--overlap-grad-reduce",
        "--overlap-param-gather",
        "--metrics-file",
        str(tmp_path / "ov.jsonl"),
        "--save",
        str(tmp_path / "ckpt"),
        "--eval-interval",
        "3",
    )
    plain, overlapped = (read_metrics(tmp_path / f) for f in ("plain.jsonl", "ov.jsonl"))
    assert [r["loss"] for r in plain] == [r["loss"] for r in overlapped]
