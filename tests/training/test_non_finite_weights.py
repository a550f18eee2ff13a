"""A non-finite tensor is refused where it enters — the HF import, a checkpoint
load (``--finetune``, ``tools/evaluate.py --load``, the HF converter) and an export — naming the
tensor in one line, exit code 2; an evaluation never reports a NaN loss with exit code 0."""

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.data import write_indexed_dataset
from tests.helpers.errors import one_line_error, refused
from tests.helpers.export import random_checkpoint
from tests.helpers.pretrain import data_args, pretrain, write_corpus

POISONED = "decoder.layers.1.mlp.linear_fc1.weight"


def _checkpoint_with(root: Path, value: float, **fields) -> Path:
    """A checkpoint (written as the trainer writes one) whose ``POISONED`` tensor holds ``value``."""
    from megatron_fixedcode.checkpoint.single_process import load_megatron_checkpoint, save_megatron_checkpoint

    ckpt = load_megatron_checkpoint(random_checkpoint(root.with_name(root.name + "_src"), **fields))
    with torch.no_grad():
        dict(ckpt.model.named_parameters())[POISONED][3, 5] = value
    save_megatron_checkpoint(root, ckpt.model, ckpt.trainer_state)
    return root


def test_hf_import_refuses_a_nan_tensor_naming_it(tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    from megatron_fixedcode.cli.convert_hf_to_megatron import main
    from megatron_fixedcode.export import convert_checkpoint_to_hf

    hf_dir = convert_checkpoint_to_hf(random_checkpoint(tmp_path / "src"), tmp_path / "hf")
    weights = load_file(hf_dir / "model.safetensors")
    weights["model.layers.0.self_attn.o_proj.weight"][0, 0] = float("nan")
    save_file(weights, hf_dir / "model.safetensors", metadata={"format": "pt"})
    assert main(["--hf-dir", str(hf_dir), "--save", str(tmp_path / "back"), "--make-vocab-size-divisible-by", "8"]) == 2
    one_line_error(capsys, str(hf_dir), "model.layers.0.self_attn.o_proj.weight", "not finite", "1 of 4096")
    assert not (tmp_path / "back").exists()


def test_evaluate_and_export_refuse_a_checkpoint_with_nan_weights(tmp_path, capsys):
    from megatron_fixedcode.cli.convert_checkpoint_to_hf import main as export_main
    from megatron_fixedcode.cli.evaluate import main as evaluate

    ckpt = _checkpoint_with(tmp_path / "nan", float("nan"))
    data = write_indexed_dataset(tmp_path / "docs", [np.arange(1, 40)], dtype=np.uint16)
    assert evaluate(["--load", str(ckpt), "--data-path", data, "--json"]) == 2
    one_line_error(capsys, f"--load {ckpt}", POISONED, "not finite")
    assert export_main(["--load", str(ckpt), "--output", str(tmp_path / "hf")]) == 2
    one_line_error(capsys, POISONED, "not finite")
    assert not (tmp_path / "hf").exists()


def test_export_refuses_weights_that_overflow_its_dtype(tmp_path, capsys):
    from megatron_fixedcode.cli.convert_checkpoint_to_hf import main as export_main

    ckpt = _checkpoint_with(tmp_path / "big", 1e6)  # finite in FP32, +inf in float16
    assert export_main(["--load", str(ckpt), "--output", str(tmp_path / "hf"), "--dtype", "float16"]) == 2
    one_line_error(capsys, "--dtype float16", "not finite")
    assert not (tmp_path / "hf").exists()


def test_evaluation_never_reports_a_nan_loss():
    from megatron_fixedcode.eval.perplexity import document_nll

    nan_logits = lambda ids_BS: torch.full((*ids_BS.shape, 16), float("nan"))  # noqa: E731
    with pytest.raises(ValueError, match="loss is nan"):
        document_nll(nan_logits, [[1, 2, 3, 4]], seq_length=8, eod=0)


@pytest.mark.slow
def test_finetune_from_a_checkpoint_with_nan_weights_is_refused_naming_the_tensor(tmp_path):
    ckpt = _checkpoint_with(tmp_path / "nan", float("nan"), vocab_size=1024)
    (tmp_path / "data").mkdir()
    corpus = write_corpus(tmp_path / "data")
    proc = pretrain(
        "--train-iters",
        "1",
        "--finetune",
        "--load",
        str(ckpt),
        "--save",
        str(tmp_path / "ft"),
        *data_args(corpus, "document_windows"),
        check=False,
    )
    refused(proc, POISONED, "not finite")
    assert not list((tmp_path / "ft").glob("iter_*"))


def test_evaluate_refuses_an_empty_text_file_naming_it(tmp_path):
    """An empty --text-files file was refused without naming it (or, beside
    others, silently scored nothing)."""
    from megatron_fixedcode.eval.perplexity import text_documents

    full, empty = tmp_path / "a.txt", tmp_path / "empty.txt"
    full.write_text("some words")
    empty.write_text("")
    with pytest.raises(ValueError, match=rf"^--text-files {empty}: empty"):
        text_documents([full, empty], lambda text: list(text.encode()))
