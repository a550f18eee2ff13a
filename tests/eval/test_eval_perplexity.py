"""tools/evaluate.py: loss/ppl/tokens of a checkpoint equal plain transformers on its export, on
text files and on an indexed split; the windowing protocol by hand."""

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from megatron_fixedcode.eval.perplexity import document_nll, windows
from tests.helpers.data import write_indexed_dataset
from tests.helpers.export import random_checkpoint
from tests.helpers import ASSETS, SMOLLM2_TOKENIZER
from tests.helpers import REPO

pytest.importorskip("transformers")


def test_windows_cover_every_token_once_with_eod_context():
    got = list(windows([[5, 6, 7, 8, 9], [3]], seq_length=2, eod=0))
    assert got == [([0, 5], [5, 6]), ([6, 7], [7, 8]), ([8], [9]), ([0], [3])]


def test_uniform_logits_give_log_vocab():
    out = document_nll(lambda ids: torch.zeros(*ids.shape, 10), [[1, 2, 3], [4] * 7], seq_length=4, eod=0, batch_size=2)
    assert out["tokens"] == 10 and out["windows"] == 3
    assert out["loss"] == pytest.approx(math.log(10)) and out["ppl"] == pytest.approx(10)


def _evaluate(*args):
    proc = subprocess.run(
        [sys.executable, "tools/evaluate.py", *args, "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={"HF_HUB_OFFLINE": "1", "PATH": "", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)},
        timeout=300,
    )  # the code under test, not an installed copy
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_checkpoint_and_export_report_the_same_loss(tmp_path):
    from megatron_fixedcode.export import convert_checkpoint_to_hf

    src = random_checkpoint(
        tmp_path / "ckpt",
        input_embedding="gf2",
        vocab_size=49152,
        hidden_size=32,
        num_attention_heads=2,
        ffn_hidden_size=64,
        num_layers=1,
        seq_length=128,
        tokenizer_model=str(SMOLLM2_TOKENIZER),
    )
    hf_dir = convert_checkpoint_to_hf(src, tmp_path / "hf")
    text = ASSETS / "corpus" / "state_union" / "1945-Truman.txt"
    a = _evaluate("--load", str(src), "--text-files", str(text), "--max-tokens", "600")
    b = _evaluate("--hf-model", str(hf_dir), "--text-files", str(text), "--max-tokens", "600")
    assert a["tokens"] == b["tokens"] >= 600 and a["windows"] == b["windows"]
    assert a["loss"] == pytest.approx(b["loss"], abs=1e-5) and a["ppl"] > 1
    assert a["code_fingerprint"] == b["code_fingerprint"] and "zero input vector" in a["bos"]


def test_indexed_validation_split(tmp_path):
    from megatron_fixedcode.eval.run import checkpoint_perplexity

    src = random_checkpoint(tmp_path / "ckpt", input_embedding="binary")
    rng = np.random.default_rng(0)
    prefix = write_indexed_dataset(tmp_path / "valid", [rng.integers(1, 1000, n) for n in (40, 70)], dtype=np.uint16)
    out = checkpoint_perplexity(str(src), data_path=[prefix])
    assert out["tokens"] == 110 and out["documents"] == 2 and out["windows"] == 2 + 3
    with pytest.raises(ValueError, match="--data-path: no"):
        checkpoint_perplexity(str(src), data_path=[str(tmp_path / "missing")])
    with pytest.raises(ValueError, match="names no tokenizer"):
        checkpoint_perplexity(str(src), text_files=[str(tmp_path / "valid.idx")])
