"""Megatron-LM's default GPT block (LayerNorm, GELU, linear biases, learned positions, tied head) →
``GPT2LMHeadModel`` and back: logits within 1e-5 of megatron's in FP32, the GELU as computed (erf, or the
tanh approximation of GPUs' fused bias-GELU, recorded in the checkpoint), the norm epsilon
and position table as trained, identical weights after the import; a fixed code exports with a zero
position table and its own head; what GPT-2 cannot hold is refused."""

import json

import pytest
import torch

from megatron_fixedcode.checkpoint import load_megatron_checkpoint, megatron_logits
from megatron_fixedcode.export import convert_checkpoint_to_hf, convert_hf_to_megatron
from tests.helpers.export import hf_logits, random_checkpoint

pytest.importorskip("transformers")
pytest.importorskip("safetensors")
GPT2_BLOCK = dict(
    input_embedding="learned",
    block="gpt_gelu",
    add_bias_linear=True,
    position_embedding_type="learned_absolute",
    share_embeddings_and_output_weights=True,
)
CASES = {
    "tied": dict(GPT2_BLOCK, max_position_embeddings=48, norm_epsilon=1e-6),
    "untied": dict(GPT2_BLOCK, share_embeddings_and_output_weights=False),
    "binary": dict(
        GPT2_BLOCK, input_embedding="binary", position_embedding_type="none", share_embeddings_and_output_weights=False
    ),
    "tanh": dict(GPT2_BLOCK, gelu_approximation="tanh"),  # as trained on a GPU with the fused bias-GELU kernel
}


@pytest.mark.parametrize("case", list(CASES))
def test_gpt2_block_exports_and_imports_back(tmp_path, case):
    src = random_checkpoint(tmp_path / "src", **CASES[case])
    ckpt = load_megatron_checkpoint(src)
    cfg = ckpt.model_cfg
    hf_dir = convert_checkpoint_to_hf(src, tmp_path / "hf", parity=True)
    config = json.loads((hf_dir / "config.json").read_text())
    gelu = "gelu_pytorch_tanh" if case == "tanh" else "gelu"
    assert config["architectures"] == ["GPT2LMHeadModel"] and config["activation_function"] == gelu
    assert config["layer_norm_epsilon"] == cfg.norm_epsilon
    assert config["n_positions"] == (cfg.max_position_embeddings or cfg.seq_length)
    assert config["tie_word_embeddings"] == CASES[case]["share_embeddings_and_output_weights"]
    report = json.loads((hf_dir / "parity.json").read_text())
    assert report["passed"] and report["architecture"] == "GPT2LMHeadModel"
    torch.manual_seed(1)
    ids = torch.randint(0, cfg.vocab_size, (2, 32))
    ref = megatron_logits(ckpt.model, ids, cfg.vocab_size)
    diff = (hf_logits(hf_dir, ids) - ref).abs().max().item()
    print(f"GPT-2 {case}: max |logit diff| {diff:.3g} (max |logit| {ref.abs().max().item():.3g})")
    assert diff < 1e-5
    convert_hf_to_megatron(hf_dir, tmp_path / "back", make_vocab_size_divisible_by=8)
    back = load_megatron_checkpoint(tmp_path / "back")
    assert back.model_cfg.input_embedding == cfg.input_embedding
    assert back.model_cfg.gelu_approximation == cfg.gelu_approximation
    assert back.model_cfg.share_embeddings_and_output_weights == cfg.share_embeddings_and_output_weights
    want = {k: v for k, v in ckpt.model.state_dict().items() if isinstance(v, torch.Tensor)}
    got = {k: v for k, v in back.model.state_dict().items() if isinstance(v, torch.Tensor)}
    assert set(got) == set(want)
    assert [k for k in want if not torch.equal(want[k], got[k])] == []


def test_gpt2_export_refuses_what_gpt2_cannot_hold(tmp_path):
    from megatron_fixedcode.export.to_hf import hf_tensors_and_config

    gqa = load_megatron_checkpoint(random_checkpoint(tmp_path / "gqa", **GPT2_BLOCK, num_query_groups=2))
    with pytest.raises(ValueError, match="num_query_groups=2 .*GPT-2 has no grouped-query attention"):
        hf_tensors_and_config(gqa.model.state_dict(), gqa.model_cfg, bos_token_id=None, eos_token_id=None)
    rope = load_megatron_checkpoint(
        random_checkpoint(
            tmp_path / "rope",
            **dict(GPT2_BLOCK, position_embedding_type="rope", share_embeddings_and_output_weights=False),
        )
    )
    with pytest.raises(ValueError, match="add_bias_linear=True.*GPT2LMHeadModel"):
        hf_tensors_and_config(rope.model.state_dict(), rope.model_cfg, bos_token_id=None, eos_token_id=None)


def test_gpt2_import_takes_tanh_gelu_and_refuses_other_activations(tmp_path):
    hf_dir = convert_checkpoint_to_hf(random_checkpoint(tmp_path / "src", **GPT2_BLOCK), tmp_path / "hf")
    config = json.loads((hf_dir / "config.json").read_text())
    (hf_dir / "config.json").write_text(json.dumps({**config, "activation_function": "gelu_new"}))  # GPT-2's own
    convert_hf_to_megatron(hf_dir, tmp_path / "tanh")
    assert load_megatron_checkpoint(tmp_path / "tanh").model_cfg.gelu_approximation == "tanh"
    (hf_dir / "config.json").write_text(json.dumps({**config, "activation_function": "relu"}))
    with pytest.raises(ValueError, match="activation_function='relu'"):
        convert_hf_to_megatron(hf_dir, tmp_path / "back")
    assert not (tmp_path / "back").exists()


def test_a_tanh_gelu_checkpoint_computes_another_function_than_erf(tmp_path):
    """The recorded approximation reaches the CPU model: the same weights give other logits with it."""
    erf = load_megatron_checkpoint(random_checkpoint(tmp_path / "erf", **GPT2_BLOCK))
    tanh = load_megatron_checkpoint(random_checkpoint(tmp_path / "tanh", **GPT2_BLOCK, gelu_approximation="tanh"))
    tanh.model.load_state_dict(erf.model.state_dict())
    ids = torch.randint(0, erf.model_cfg.vocab_size, (1, 16))
    diff = (
        (
            megatron_logits(erf.model, ids, erf.model_cfg.vocab_size)
            - megatron_logits(tanh.model, ids, erf.model_cfg.vocab_size)
        )
        .abs()
        .max()
        .item()
    )
    assert 0 < diff < 1e-2
