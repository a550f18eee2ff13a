"""The new input interfaces inside the model, on one rank: exactly the spec's inputs, no trainable
parameter except lowdim's V×K coordinates, backbone init unchanged, checkpoint identity."""

import numpy as np
import pytest
import torch

from megatron_fixedcode.codes import quantize
from megatron_fixedcode.models import ModelConfig, build_gpt_model, build_transformer_config, parameter_report
from megatron_fixedcode.compat import ParallelLayout

VOCAB = 49152
NEW = {  # name -> ModelConfig fields
    "binary_centered": dict(input_embedding="binary", code_centered=True),
    "gf2_centered_normmatch": dict(input_embedding="gf2", code_centered=True, code_norm_match=True, code_seed=7),
    "binary_normmatch": dict(input_embedding="binary", code_norm_match=True),
    "random": dict(input_embedding="random", code_width=20, code_scale=0.5),
    "sinusoidal": dict(input_embedding="sinusoidal"),
    "lowdim": dict(input_embedding="lowdim", code_width=10),
}


def tiny(**kw) -> ModelConfig:
    fields = dict(
        num_layers=2, hidden_size=40, num_attention_heads=4, ffn_hidden_size=64, seq_length=16, vocab_size=VOCAB
    )
    fields.update(kw)
    return ModelConfig(**fields)


def build(pg, cfg):
    torch.manual_seed(7)
    return build_gpt_model(cfg, build_transformer_config(cfg, ParallelLayout()), pg)


@pytest.mark.parametrize("name", sorted(NEW))
def test_inputs_are_the_specs_vectors_for_every_id(single_rank, name):
    cfg = tiny(**NEW[name])
    with torch.no_grad():
        x_SBH = build(single_rank, cfg).embedding(torch.arange(VOCAB).reshape(1, -1), None)
    assert x_SBH.shape == (VOCAB, 1, 40) and x_SBH.dtype == torch.float32
    # float32 inputs: the spec's values rounded once (bit codes: ±fl32(scale); float codes: the table)
    assert np.array_equal(x_SBH[:, 0].numpy(), cfg.code_spec().vectors(np.arange(VOCAB)).astype(np.float32))


@pytest.mark.parametrize("name", sorted(NEW))
def test_trainable_parameters_only_in_lowdim(single_rank, name):
    cfg = tiny(**NEW[name])
    model = build(single_rank, cfg)
    params = dict(model.embedding.named_parameters())
    report = parameter_report(cfg, [model], single_rank)
    if name == "lowdim":
        assert list(params) == ["table_VK"] and params["table_VK"].shape == (VOCAB, 10)
        assert params["table_VK"].requires_grad and params["table_VK"].tensor_model_parallel is False
        assert report["input_interface_params"] == VOCAB * 10
    else:
        assert params == {} and report["input_interface_params"] == 0


def test_norm_match_gives_the_learned_tables_rms(single_rank):
    for name in ("binary_normmatch", "gf2_centered_normmatch"):
        spec = tiny(**NEW[name]).code_spec()
        assert spec.input_rms() == pytest.approx(0.02, rel=1e-12)
    assert tiny(**NEW["gf2_centered_normmatch"]).code_spec().scale == pytest.approx(0.02)  # ±1: scale = RMS
    lowdim = build(single_rank, tiny(**NEW["lowdim"])).embedding.table_VK
    assert float(lowdim.std()) == pytest.approx(0.02, rel=0.02)  # the learned table's init std


def test_centered_table_free_equals_lookup(single_rank):
    ids = torch.arange(VOCAB).reshape(1, -1)
    outs = [
        build(single_rank, tiny(input_embedding="gf2", code_centered=True, code_impl=impl)).embedding(ids, None)
        for impl in ("table_free", "lookup")
    ]
    assert torch.equal(*outs)


@pytest.mark.parametrize("kind", ["random", "sinusoidal"])
def test_bf16_inputs_are_the_checked_rows(single_rank, kind):
    cfg = tiny(input_embedding=kind, bf16=True)
    x_SBH = build(single_rank, cfg).embedding(torch.arange(VOCAB).reshape(1, -1), None)
    assert x_SBH.dtype == torch.bfloat16
    expected = quantize(cfg.code_spec().input_table(), "bfloat16")
    assert np.array_equal(x_SBH[:, 0, :16].float().numpy(), expected)


def test_backbone_init_does_not_depend_on_the_input_interface(single_rank):
    reference = build(single_rank, tiny(input_embedding="binary")).state_dict()
    for name in sorted(NEW):
        state = build(single_rank, tiny(**NEW[name])).state_dict()
        for key, value in reference.items():
            if key.startswith(("decoder.", "output_layer.")) and torch.is_tensor(value):
                assert torch.equal(state[key], value), (name, key)


def test_lowdim_learns_through_the_lift(single_rank):
    model = build(single_rank, tiny(**NEW["lowdim"], vocab_size=1024))
    ids = torch.randint(1, 1024, (2, 17), generator=torch.Generator().manual_seed(0))
    model(ids[:, :-1], torch.arange(16).expand(2, -1), None, labels=ids[:, 1:]).mean().backward()
    grad = model.embedding.table_VK.grad
    used = torch.unique(ids[:, :-1])
    assert grad[used].abs().sum(dim=1).min() > 0  # every used token's coordinates get a gradient
    unused = torch.ones(1024, dtype=torch.bool)
    unused[used] = False
    assert grad[unused].abs().max() == 0


@pytest.mark.parametrize("name", ["random", "lowdim", "binary_centered"])
def test_state_dict_round_trip_and_another_code_refused(single_rank, name):
    cfg = tiny(**NEW[name])
    sd = build(single_rank, cfg).state_dict()
    build(single_rank, cfg).load_state_dict(sd)
    other = (
        dict(NEW[name], code_seed=99)
        if name != "binary_centered"
        else dict(input_embedding="binary", code_centered=True, code_scale=2.0)
    )
    with pytest.raises(ValueError, match="refusing to load a different token"):
        build(single_rank, tiny(**other)).load_state_dict(sd)


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="code_width"):
        tiny(input_embedding="binary", code_width=20)
    with pytest.raises(ValueError, match="code_bits"):
        tiny(input_embedding="random", code_bits=20)
    with pytest.raises(ValueError, match="code_scale"):
        tiny(input_embedding="binary", code_norm_match=True, code_scale=2.0)
    with pytest.raises(ValueError, match="not injective at bfloat16"):
        tiny(input_embedding="random", code_width=2, bf16=True)
