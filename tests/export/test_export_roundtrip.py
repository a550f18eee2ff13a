"""In-process export/import: megatron → HF → megatron round trip, GPT-NeoX for gpt_gelu, sharding,
tokenizer files, and the refusals."""

import json

import pytest
import torch

from megatron_fixedcode.checkpoint import load_megatron_checkpoint, megatron_logits
from megatron_fixedcode.export import convert_checkpoint_to_hf, convert_hf_to_megatron
from tests.helpers import SMOLLM2_TOKENIZER
from tests.helpers.errors import one_line_error
from tests.helpers.export import hf_logits, random_checkpoint

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


def test_tokenizer_files_load_with_auto_tokenizer(tmp_path):
    from transformers import AutoTokenizer

    src = random_checkpoint(
        tmp_path / "src",
        vocab_size=49152,
        hidden_size=32,
        num_attention_heads=2,
        ffn_hidden_size=64,
        num_layers=1,
        tokenizer_model=str(SMOLLM2_TOKENIZER),
    )
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


def _drop_tensor(hf_dir, name):
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(hf_dir / "model.safetensors"))
    del tensors[name]
    save_file(tensors, str(hf_dir / "model.safetensors"))


def _edit_config(hf_dir, **changes):
    config = json.loads((hf_dir / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            del config[key]
        else:
            config[key] = value
    (hf_dir / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    "damage, needles",
    [
        # config.json says 1 layer, the safetensors hold 2: layer 1 was dropped silently (rc 0)
        (
            lambda d: _edit_config(d, num_hidden_layers=1),
            [
                "num_hidden_layers=1, the safetensors hold 2 layers",
                "9 tensors not used by the model",
                "model.layers.1.self_attn.q_proj.weight",
            ],
        ),
        (
            lambda d: _drop_tensor(d, "model.layers.0.mlp.up_proj.weight"),  # was a KeyError traceback
            ["1 tensors missing: model.layers.0.mlp.up_proj.weight"],
        ),
        (
            lambda d: _edit_config(d, intermediate_size=96),  # was a shape traceback
            ["of another shape", "model.layers.0.mlp.gate_proj.weight [128, 64] (expected [96, 64])"],
        ),
        (lambda d: _edit_config(d, hidden_size=None), ["config.json: no hidden_size"]),  # was a KeyError
        (lambda d: _edit_config(d, num_key_value_heads=3), ["num_key_value_heads=3 does not divide"]),
        (lambda d: (d / "config.json").write_text('{"vocab_size": 1000,'), ["config.json: not valid JSON"]),
        (
            lambda d: (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:-100]),
            ["model.safetensors", "truncated"],
        ),
    ],
    ids=["fewer-layers", "missing-tensor", "wrong-shape", "missing-key", "bad-groups", "bad-json", "truncated"],
)
@pytest.mark.slow
def test_import_refuses_weights_that_do_not_fit_the_config_in_one_line(tmp_path, capsys, damage, needles):
    """Every tensor in the safetensors is used and every tensor the model needs is
    there with its shape, or the import is refused naming them (exit 2, nothing written)."""
    from megatron_fixedcode.cli.convert_hf_to_megatron import main

    hf_dir = convert_checkpoint_to_hf(random_checkpoint(tmp_path / "src"), tmp_path / "hf")
    damage(hf_dir)
    assert main(["--hf-dir", str(hf_dir), "--save", str(tmp_path / "back"), "--make-vocab-size-divisible-by", "8"]) == 2
    one_line_error(capsys, str(hf_dir), *needles)
    assert not (tmp_path / "back").exists()


KILL_AT_CONFIG = """
import os, signal, sys
from megatron_fixedcode.export import hf_io
write_json = hf_io.write_json
def killed_at_config(path, data):
    if path.name == "config.json":  # the weights are written, the config not yet: kill -9 here
        os.kill(os.getpid(), signal.SIGKILL)
    write_json(path, data)
hf_io.write_json = killed_at_config
from megatron_fixedcode.cli.convert_checkpoint_to_hf import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_a_killed_export_leaves_nothing_that_looks_complete_and_is_refused(tmp_path, capsys):
    """A converter killed midway left OUT with only model.safetensors (or a 0-byte
    config.json), unmarked, and evaluate.py --hf-model on it died with a traceback. The export is
    written to OUT.partial (marked incomplete) and renamed to OUT when complete."""
    import os
    import subprocess
    import sys

    from megatron_fixedcode.cli.convert_hf_to_megatron import main as import_main
    from megatron_fixedcode.cli.evaluate import main as evaluate
    from megatron_fixedcode.export import hf_io
    from tests.helpers import REPO

    src, out = random_checkpoint(tmp_path / "src"), tmp_path / "hf"
    proc = subprocess.run(
        [sys.executable, "-c", KILL_AT_CONFIG, "--load", str(src), "--output", str(out)],
        cwd=REPO,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -9, proc.stderr[-3000:]
    partial = hf_io.partial_dir(out)
    assert not out.exists() and (partial / hf_io.INCOMPLETE_MARKER).exists()
    assert (partial / "model.safetensors").exists() and not (partial / "config.json").exists()
    text = tmp_path / "doc.txt"
    text.write_text("some text " * 20)
    assert evaluate(["--hf-model", str(out), "--text-files", str(text)]) == 2
    one_line_error(capsys, f"{out}: no such directory", f"{partial} is an export that did not finish")
    assert evaluate(["--hf-model", str(partial), "--text-files", str(text)]) == 2
    one_line_error(capsys, f"{partial}: an incomplete export")
    assert import_main(["--hf-dir", str(partial), "--save", str(tmp_path / "back")]) == 2
    one_line_error(capsys, "an incomplete export")
    # what the old writer left in place: the weights and a 0-byte config.json under the final name
    old = tmp_path / "old_partial"
    old.mkdir()
    os.replace(partial / "model.safetensors", old / "model.safetensors")
    (old / "config.json").write_text("")
    assert evaluate(["--hf-model", str(old), "--text-files", str(text)]) == 2
    one_line_error(capsys, f"{old / 'config.json'}: empty")
    # the next export replaces the leftover and leaves only the complete directory
    assert convert_checkpoint_to_hf(src, out) == out
    assert not partial.exists() and not (out / hf_io.INCOMPLETE_MARKER).exists()
    assert hf_io.read_config(out)["num_hidden_layers"] == 2


def test_a_failed_export_keeps_the_previous_one_and_leaves_no_partial_directory(tmp_path, monkeypatch):
    from megatron_fixedcode.export import hf_io

    src = random_checkpoint(tmp_path / "src")
    out = convert_checkpoint_to_hf(src, tmp_path / "hf")
    before = (out / "model.safetensors").read_bytes()

    def disk_full(path, data):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(hf_io, "write_json", disk_full)
    from megatron_fixedcode.utils.files import DiskFull

    with pytest.raises(DiskFull, match="No space left"):
        convert_checkpoint_to_hf(src, out, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "src"]  # no hf.partial, no lock file
    assert (out / "model.safetensors").read_bytes() == before and (out / "config.json").exists()
