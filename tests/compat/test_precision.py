"""``--precision``: fp32, megatron's bf16 mode, and paper 2's FP32 parameters under BF16 autocast.

The autocast mode is checked where it differs from the others: parameters and the residual
stream (each layer's output) stay FP32 while every linear layer of a block returns BF16; activation
recompute replays the autocast (same gradients as without recompute); a tiny run learns."""

import json

import pytest
import torch
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.transformer_layer import TransformerLayer

from megatron_fixedcode.compat import ParallelLayout
from megatron_fixedcode.models import ModelConfig, build_gpt_model, build_transformer_config
from megatron_fixedcode.pretrain import main
from megatron_fixedcode.training.forward_backward import gpt_forward_step
from tests.helpers.pretrain import TINY, data_args, pretrain, read_metrics, write_corpus

PAPER2 = "examples/recipes/paper2_1p7b_gf2.yaml"


def tiny(**kw) -> ModelConfig:
    fields = dict(
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        ffn_hidden_size=128,
        seq_length=16,
        vocab_size=256,
        make_vocab_size_divisible_by=8,
        input_embedding="gf2",
        transformer_impl="local",
    )
    return ModelConfig(**{**fields, **kw})


def build(single_rank, cfg, **overrides):
    torch.manual_seed(3)
    return build_gpt_model(cfg, build_transformer_config(cfg, ParallelLayout(), **overrides), single_rank)


def batch(seed=0):
    ids = torch.randint(0, 256, (2, 17), generator=torch.Generator().manual_seed(seed))
    return {"tokens": ids[:, :-1], "labels": ids[:, 1:], "loss_mask": torch.ones(2, 16)}


def forward_loss(model) -> torch.Tensor:
    output, loss_func = gpt_forward_step(iter([batch()]), model, device=torch.device("cpu"))
    return loss_func(output)[0]


def test_autocast_keeps_parameters_and_residual_stream_fp32_and_runs_matmuls_in_bf16(single_rank):
    model = build(single_rank, tiny(autocast_bf16=True))
    config = model.config
    assert (config.enable_autocast, config.autocast_dtype, config.bf16, config.params_dtype) == (
        True,
        torch.bfloat16,
        False,
        torch.float32,
    )
    seen: dict[str, torch.dtype] = {}

    def record(name):
        def hook(module, inputs, output):
            out = output[0] if isinstance(output, tuple) else output
            seen[name] = out.dtype

        return hook

    for name, module in model.named_modules():
        if isinstance(module, (ColumnParallelLinear, RowParallelLinear, TransformerLayer)) or name.endswith(
            "layernorm"
        ):
            module.register_forward_hook(record(name))
    loss = forward_loss(model)
    linears = {n: d for n, d in seen.items() if n.endswith(("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"))}
    layers = {n: d for n, d in seen.items() if n.startswith("decoder.layers.") and n.count(".") == 2}
    norms = {n: d for n, d in seen.items() if n.endswith(("input_layernorm", "pre_mlp_layernorm", "final_layernorm"))}
    assert len(linears) == 8 and set(linears.values()) == {torch.bfloat16}, linears
    assert len(layers) == 2 and set(layers.values()) == {torch.float32}, layers  # the residual stream
    assert len(norms) == 5 and set(norms.values()) == {torch.float32}, norms
    assert seen["output_layer"] == torch.bfloat16 and loss.dtype == torch.float32
    loss.backward()
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert {p.grad.dtype for p in model.parameters() if p.requires_grad} == {torch.float32}

    plain = build(single_rank, tiny())  # the same weights in FP32: same loss up to BF16 rounding, not equal
    fp32_loss = forward_loss(plain)
    assert fp32_loss.item() != loss.item() and abs(fp32_loss.item() - loss.item()) < 0.05


def test_recompute_replays_the_autocast(single_rank):
    """Full recompute re-runs each layer in backward; it must be under the forward's autocast."""
    grads = []
    for recompute in (None, "full"):
        model = build(single_rank, tiny(autocast_bf16=True, recompute_granularity=recompute))
        forward_loss(model).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        assert torch.equal(grads[0][name], grads[1][name]), name


def test_bf16_and_autocast_modes_exclude_each_other():
    with pytest.raises(ValueError, match="exclude each other"):
        tiny(bf16=True, autocast_bf16=True)
    assert tiny(autocast_bf16=True).code_spec().dtype == "bfloat16"  # the code's injectivity is checked at BF16


def _dry_run(capsys, *argv) -> dict:
    assert main([*argv, "--dry-run"]) == 0
    return json.loads(capsys.readouterr().out)


def test_paper2_recipe_is_the_papers_mode_and_megatron_bf16_is_one_flag_away(capsys, tmp_path):
    out = _dry_run(capsys, "--config", PAPER2)
    assert (out["precision"], out["bf16"]) == ("fp32-autocast-bf16", False)
    out = _dry_run(capsys, "--config", PAPER2, "--bf16")
    assert (out["precision"], out["bf16"]) == ("bf16", True)
    out = _dry_run(capsys, *TINY, "--train-iters", "1", "--bf16", "--precision", "fp32")  # the last one wins
    assert (out["precision"], out["bf16"]) == ("fp32", False)
    recipe = tmp_path / "old.yaml"
    recipe.write_text("bf16: true\n")  # a recipe written for Megatron-LM's flag
    out = _dry_run(capsys, "--config", str(recipe), *TINY, "--train-iters", "1")
    assert (out["precision"], out["bf16"]) == ("bf16", True)
    with pytest.raises(SystemExit) as exit_info:
        main([*TINY, "--train-iters", "1", "--fp16", "--dry-run"])
    assert exit_info.value.code == 2 and "--fp16: FP16 training with loss scaling" in capsys.readouterr().err


@pytest.mark.slow
def test_a_tiny_autocast_run_learns(tmp_path):
    corpus = write_corpus(tmp_path)
    pretrain(
        "--input-embedding",
        "gf2",
        "--precision",
        "fp32-autocast-bf16",
        "--code-kernel",
        "torch",
        "--train-iters",
        "30",
        "--lr",
        "1e-2",
        "--eval-interval",
        "30",
        "--metrics-file",
        str(tmp_path / "m.jsonl"),
        *data_args(corpus, "document_windows"),
    )
    metrics = read_metrics(tmp_path / "m.jsonl")
    assert metrics[-1]["val_loss"] < 4.5, [round(m["loss"], 3) for m in metrics]  # below ln(128): the bigram
