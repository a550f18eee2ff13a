"""In-process export/import: megatron → HF → megatron round trip, GPT-NeoX for gpt_gelu, sharding,
tokenizer files, and the refusals."""
import json

import pytest
import torch

from megatron_fixedcode.export import (
    convert_checkpoint_to_hf,
    convert_hf_to_megatron,
    load_megatron_checkpoint,
    megatron_logits,
)
from tests.export_helpers import SMOLLM2_TOKENIZER, hf_logits, random_checkpoint

pytest.importorskip("transformers")
pytest.importorskip("safetensors")


def _weights(model):
    return {k: v for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}


@pytest.mark.parametrize("variant", ["learned", "gf2"])
def test_megatron_hf_megatron_round_trip_is_exact(tmp_path, variant):
    src = random_checkpoint(tmp_path / "src", input_embedding=variant, num_query_groups=2)
    hf_dir = convert_checkpoint_to_hf(src, tmp_path / "hf", max_shard_size="60KB")
    assert (hf_dir / "model.safetensors.index.json").exists()  # sharded
    convert_hf_to_megatron(hf_dir, tmp_path / "back", make_vocab_size_divisible_by=8)
    a, b = load_megatron_checkpoint(src), None
    wa = {k: v.clone() for k, v in _weights(a.model).items()}
    ids = torch.randint(0, 1000, (2, 32))
    la = megatron_logits(a.model, ids, 1000)
    b = load_megatron_checkpoint(tmp_path / "back")
    wb = _weights(b.model)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert torch.equal(megatron_logits(b.model, ids, 1000), la)
    assert b.trainer_state["identity"] == a.trainer_state["identity"]


def test_gpt_gelu_exports_to_gpt_neox_exactly(tmp_path):
    src = random_checkpoint(tmp_path / "src", block="gpt_gelu", input_embedding="binary")
    ckpt = load_megatron_checkpoint(src)
    ids = torch.randint(0, 1000, (2, 32))
    hf_dir = convert_checkpoint_to_hf(src, tmp_path / "hf")
    assert json.loads((hf_dir / "config.json").read_text())["architectures"] == ["GPTNeoXForCausalLM"]
    assert (hf_logits(hf_dir, ids) - megatron_logits(ckpt.model, ids, 1000)).abs().max() < 1e-4


def test_gpt_gelu_with_grouped_query_attention_is_refused(tmp_path):
    src = random_checkpoint(tmp_path / "src", block="gpt_gelu", num_query_groups=2)
    with pytest.raises(ValueError, match="no exact Hugging Face architecture"):
        convert_checkpoint_to_hf(src, tmp_path / "hf")


@pytest.mark.skipif(not SMOLLM2_TOKENIZER.exists(), reason="shared SmolLM2 tokenizer absent")
def test_tokenizer_files_load_with_auto_tokenizer(tmp_path):
    from transformers import AutoTokenizer

    src = random_checkpoint(tmp_path / "src", vocab_size=49152, hidden_size=32, num_attention_heads=2,
                            ffn_hidden_size=64, num_layers=1, tokenizer_model=str(SMOLLM2_TOKENIZER))
    hf_dir = convert_checkpoint_to_hf(src, tmp_path / "hf", dtype="bfloat16")
    tok = AutoTokenizer.from_pretrained(hf_dir)
    assert tok("Hello world!")["input_ids"] == [19556, 905, 17]
    assert tok.eos_token == "<|endoftext|>" and tok.eos_token_id == 0
    config = json.loads((hf_dir / "config.json").read_text())
    assert config["eos_token_id"] == 0 and config["torch_dtype"] == "bfloat16"


def test_import_refuses_a_table_that_is_not_the_code(tmp_path):
    from safetensors.torch import load_file, save_file

    hf_dir = convert_checkpoint_to_hf(random_checkpoint(tmp_path / "src", input_embedding="binary"), tmp_path / "hf")
    tensors = load_file(str(hf_dir / "model.safetensors"))
    tensors["model.embed_tokens.weight"][5, 0] += 0.5
    save_file(tensors, str(hf_dir / "model.safetensors"))
    with pytest.raises(ValueError, match="differs from the fixed code .* in 1 rows"):
        convert_hf_to_megatron(hf_dir, tmp_path / "back")
    config = json.loads((hf_dir / "config.json").read_text())
    config["fixed_code"]["fingerprint"] = "0" * 16
    (hf_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="fingerprint mismatch"):
        convert_hf_to_megatron(hf_dir, tmp_path / "back2")


def test_output_and_load_errors_name_the_path(tmp_path):
    with pytest.raises(ValueError, match="no such directory"):
        load_megatron_checkpoint(tmp_path / "nope")
    src = random_checkpoint(tmp_path / "src")
    convert_checkpoint_to_hf(src, tmp_path / "hf")
    with pytest.raises(ValueError, match="--output .* not empty"):
        convert_checkpoint_to_hf(src, tmp_path / "hf")
