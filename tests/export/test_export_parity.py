"""Checkpoints from the real trainer (TP=2 with GQA, PP=2, one rank) → HF: logits within 1e-4 of
the megatron model, identical greedy generation, and the table-free remote-code export agrees."""

import json

import numpy as np
import pytest
import torch

from megatron_fixedcode.checkpoint import load_megatron_checkpoint, megatron_logits
from megatron_fixedcode.export import convert_checkpoint_to_hf
from tests.helpers.export import hf_greedy, hf_logits, megatron_greedy
from tests.helpers.pretrain import data_args, pretrain, write_corpus

pytest.importorskip("transformers")
pytest.importorskip("safetensors")
pytestmark = pytest.mark.slow
LAYOUTS = {  # variant -> (trainer flags, ranks)
    "learned": (["--tensor-model-parallel-size", "2", "--num-query-groups", "2"], 2),
    "binary": (["--pipeline-model-parallel-size", "2"], 2),
    "gf2": (["--num-query-groups", "1", "--code-impl", "lookup"], 1),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("parity")
    corpus = write_corpus(root)
    out = {}
    for variant, (flags, nproc) in LAYOUTS.items():
        out[variant] = str(root / variant)
        pretrain(
            "--input-embedding",
            variant,
            "--train-iters",
            "2",
            "--save",
            out[variant],
            *flags,
            *data_args(corpus, "gpt"),
            nproc=nproc,
        )
    return out


@pytest.mark.parametrize("variant", list(LAYOUTS))
def test_exported_logits_and_generation_match(tmp_path, checkpoints, variant):
    ckpt = load_megatron_checkpoint(checkpoints[variant])
    vocab = ckpt.model_cfg.vocab_size
    torch.manual_seed(1)
    ids = torch.randint(0, vocab, (2, 32))
    ids[1, :4] = 0  # token 0: the zero vector of the fixed codes
    ref = megatron_logits(ckpt.model, ids, vocab)
    hf_dir = convert_checkpoint_to_hf(checkpoints[variant], tmp_path / "hf")
    got = hf_logits(hf_dir, ids)
    diff = (got - ref).abs().max().item()
    print(f"{variant}: max |logit diff| = {diff:.3g} (max |logit| {ref.abs().max().item():.3g})")
    assert got.shape == ref.shape and diff < 1e-4
    prompt = ids[:1, :8]
    assert hf_greedy(hf_dir, prompt, 32) == megatron_greedy(ckpt.model, prompt, vocab, 32)
    config = json.loads((hf_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["vocab_size"] == vocab
    assert config["megatron_fixedcode"]["step"] == 2
    code = ckpt.model_cfg.code_spec()
    if code is None:
        assert "fixed_code" not in config
        return
    assert config["fixed_code"]["fingerprint"] == code.fingerprint
    from safetensors.torch import load_file

    table = load_file(str(hf_dir / "model.safetensors"))["model.embed_tokens.weight"]
    assert torch.equal(table, torch.from_numpy(code.vectors(np.arange(vocab)).astype(np.float32)))
    free_dir = convert_checkpoint_to_hf(checkpoints[variant], tmp_path / "hf_free", table_free=True)
    from safetensors.torch import load_file as load

    assert "model.embed_tokens.weight" not in load(str(free_dir / "model.safetensors"))
    assert torch.equal(hf_logits(free_dir, ids, trust_remote_code=True), got)


def test_table_free_export_needs_remote_code(tmp_path, checkpoints):
    free_dir = convert_checkpoint_to_hf(checkpoints["binary"], tmp_path / "hf_free", table_free=True)
    with pytest.raises(ValueError, match="trust_remote_code"):
        hf_logits(free_dir, torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="learned baseline"):
        convert_checkpoint_to_hf(checkpoints["learned"], tmp_path / "x", table_free=True)
