"""The converter proves its export: parity.json (fields, thresholds, the tokens and where they came
from), exit code 3 and the export kept when it fails, --no-parity-check, and tools/check_hf_export.py
failing on an export with one tensor changed after writing. Slow: checkpoints of each exported block
(Llama-like, GPT-NeoX-like, Megatron-LM's GPT-2) trained at TP=2 and PP=2."""

import json

import numpy as np
import pytest
import torch

from megatron_fixedcode.cli.check_hf_export import main as check_main
from megatron_fixedcode.cli.convert_checkpoint_to_hf import main as convert_main
from megatron_fixedcode.export import parity
from tests.helpers.data import write_indexed_dataset
from tests.helpers.export import random_checkpoint
from tests.helpers import SMOLLM2_TOKENIZER
from tests.helpers.pretrain import TINY, TINY_MEGATRON_BLOCK, data_args, pretrain, write_corpus

pytest.importorskip("transformers")
pytest.importorskip("safetensors")
FIELDS = {
    "passed",
    "max_abs_logit_diff",
    "max_abs_logit",
    "mean_nll_megatron",
    "mean_nll_hf",
    "abs_nll_diff",
    "next_token_agreement",
    "threshold",
    "tokens",
    "export_dtype",
    "compute_dtype",
    "architecture",
    "checkpoint",
    "step",
    "transformers_version",
}


def _report(hf_dir) -> dict:
    return json.loads((hf_dir / "parity.json").read_text())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_converter_writes_a_passing_report(tmp_path, capsys, dtype):
    src = random_checkpoint(tmp_path / "src")
    assert convert_main(["--load", str(src), "--output", str(tmp_path / "hf"), "--dtype", dtype]) == 0
    report = _report(tmp_path / "hf")
    assert FIELDS <= set(report) and report["passed"] and report["export_dtype"] == dtype
    assert report["threshold"]["logit_rel"] == parity.THRESHOLDS[dtype]["logit_rel"]
    assert report["tokens"]["shape"] == [2, 32] and "random ids" in report["tokens"]["source"]
    assert np.array(report["tokens"]["ids"]).shape == (2, 32)
    if dtype == "float32":
        assert report["max_abs_logit_diff"] < 1e-5 and report["next_token_agreement"] == 1.0
    assert "parity check passed" in capsys.readouterr().err


def test_failed_check_exits_3_and_keeps_the_export(tmp_path, capsys, monkeypatch):
    src = random_checkpoint(tmp_path / "src")
    monkeypatch.setitem(parity.THRESHOLDS, "float32", {"logit_rel": 0.0, "nll_rel": 0.0})  # nothing passes
    assert convert_main(["--load", str(src), "--output", str(tmp_path / "hf")]) == 3
    assert "parity check FAILED" in capsys.readouterr().err
    assert (tmp_path / "hf" / "model.safetensors").is_file() and _report(tmp_path / "hf")["passed"] is False
    assert convert_main(["--load", str(src), "--output", str(tmp_path / "skip"), "--no-parity-check"]) == 0
    assert not (tmp_path / "skip" / "parity.json").exists()


def test_a_corrupted_export_fails_the_check(tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    src = random_checkpoint(tmp_path / "src")
    hf = tmp_path / "hf"
    assert convert_main(["--load", str(src), "--output", str(hf)]) == 0
    assert check_main(["--load", str(src), "--hf-dir", str(hf), "--report", str(tmp_path / "ok.json")]) == 0
    assert json.loads((tmp_path / "ok.json").read_text())["passed"]
    tensors = load_file(str(hf / "model.safetensors"))
    name = "model.layers.1.mlp.down_proj.weight"
    tensors[name] = tensors[name] * 1.01  # one tensor, 1% off
    save_file(tensors, str(hf / "model.safetensors"), metadata={"format": "pt"})
    capsys.readouterr()
    assert check_main(["--load", str(src), "--hf-dir", str(hf)]) == 3
    assert "parity check FAILED" in capsys.readouterr().err


def test_token_sources(tmp_path):
    from megatron_fixedcode.tokenizers import build_tokenizer

    docs = [np.arange(1, 80) + i for i in range(10)]
    prefix = write_indexed_dataset(tmp_path / "valid", docs, dtype=np.uint16)
    ids, source = parity.parity_tokens({"valid_data_path": [prefix]}, None, 1000, 32)
    assert source.startswith("the validation data") and torch.equal(ids.reshape(-1), torch.arange(1, 65))
    # --data-path with --split 80,20,0: the validation part starts at document 8
    state = {"data_path": ["1.0", prefix], "run_config": {"split": "80,20,0"}}
    ids, source = parity.parity_tokens(state, None, 1000, 32)
    assert "document 8" in source and ids[0, 0].item() == 9
    tok = build_tokenizer("HuggingFaceTokenizer", str(SMOLLM2_TOKENIZER))
    ids, source = parity.parity_tokens({"data_path": [str(tmp_path / "gone")]}, tok, tok.vocab_size, 300)
    assert "built-in English text" in source and ids.shape == (2, 128)
    assert tok.detokenize(ids[0, :4].tolist()) == "The history of the"


LAYOUTS = {"tp2": ["--tensor-model-parallel-size", "2"], "pp2": ["--pipeline-model-parallel-size", "2"]}
BLOCKS = {  # block -> (base flags, extra flags, Hugging Face class)
    "llama": (TINY, ["--input-embedding", "learned", "--num-query-groups", "2"], "LlamaForCausalLM"),
    "gpt_gelu": (TINY, ["--block", "gpt_gelu"], "GPTNeoXForCausalLM"),
    "gpt2": (TINY_MEGATRON_BLOCK, [], "GPT2LMHeadModel"),
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One checkpoint per (block, layout), trained 2 steps on first use."""
    root = tmp_path_factory.mktemp("parity_report")
    corpus = write_corpus(root)
    done = {}

    def get(block: str, layout: str) -> str:
        if (block, layout) not in done:
            base, flags, _ = BLOCKS[block]
            out = str(root / f"{block}_{layout}")
            pretrain(
                "--train-iters",
                "2",
                "--save",
                out,
                *flags,
                *LAYOUTS[layout],
                *data_args(corpus, "gpt"),
                nproc=2,
                base=base,
            )
            done[block, layout] = out
        return done[block, layout]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("block", list(BLOCKS))
def test_parity_report_of_trained_checkpoints(tmp_path, trained, block, layout):
    ckpt = trained(block, layout)
    assert convert_main(["--load", ckpt, "--output", str(tmp_path / "hf")]) == 0
    report = _report(tmp_path / "hf")
    print(f"{block} {layout}: {parity.summary(report)}")
    assert report["passed"] and report["architecture"] == BLOCKS[block][2] and report["step"] == 2
    assert report["max_abs_logit_diff"] < 1e-4 and report["abs_nll_diff"] < 1e-5
    assert "validation part" in report["tokens"]["source"] and report["tokens"]["shape"] == [2, 32]
