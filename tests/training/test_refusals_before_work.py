"""Bad input a user hands the trainer or the preprocessor is one line, exit code 2,
before any work — the dry run included — never an assertion or a traceback per rank.

Blend weights of 0 / NaN / inf, a damaged tokenizer file, a recipe whose YAML alias refers to
itself or expands like a bomb, and a shard with no documents."""

from __future__ import annotations

import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.data import write_indexed_dataset
from tests.helpers import REPO, SMOLLM2
from tests.helpers.pretrain import TINY, write_corpus


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[str, str]:
    return write_corpus(tmp_path_factory.mktemp("corpus"))


def _pretrain_main(argv: list[str], capsys) -> str:
    """``python -m megatron_fixedcode.pretrain ARGV`` in-process: must exit 2; returns its one line."""
    from megatron_fixedcode.pretrain import main

    with pytest.raises(SystemExit) as e:
        main([*TINY, "--train-iters", "2", *argv])
    assert e.value.code == 2
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1 and ": error: " in lines[0], lines
    assert captured.out == ""  # the dry run printed no config
    return lines[0]


# --- blend weights: megatron's BlendedDataset asserted every weight > 0 on each rank


@pytest.mark.parametrize("weight", ["0", "nan", "inf", "-1"])
@pytest.mark.parametrize("dry_run", [True, False])
def test_a_blend_weight_that_is_not_a_positive_number_is_refused_naming_the_file(
    weight, dry_run, corpus, tmp_path, capsys
):
    train, valid = corpus
    args_file = tmp_path / "data_args.txt"
    args_file.write_text(f"{weight} {train} 1.0 {valid}\n")
    line = _pretrain_main(["--data-args-path", str(args_file), *(["--dry-run"] if dry_run else [])], capsys)
    assert f"--data-args-path {args_file}" in line and f"the weight of {train} is {weight}" in line, line


def test_a_bad_manifest_weight_is_refused(tmp_path):
    from megatron_fixedcode.data.manifest import blend_from_manifests

    with pytest.raises(ValueError, match=r"--data-manifest-weights: the weight of b\.json is nan"):
        blend_from_manifests(["a.json", "b.json"], [0.8, float("nan")])


def test_a_bad_weight_on_two_ranks_is_one_line_from_rank_0(corpus, tmp_path):
    train, _ = corpus
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            "-m",
            "megatron_fixedcode.pretrain",
            *TINY,
            "--train-iters",
            "2",
            "--data-path",
            "inf",
            train,
        ],
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    errors = [line for line in out.splitlines() if "pretrain: error:" in line]
    assert len(errors) == 1 and f"the weight of {train} is inf" in errors[0], out[-3000:]
    assert "AssertionError" not in out and "blended_dataset" not in out, out[-3000:]


# --- a damaged tokenizer file: the Rust parser's bare Exception, a traceback in every tool


def _damaged_tokenizers(root: Path) -> list[Path]:
    text = (SMOLLM2 / "tokenizer.json").read_text(encoding="utf-8")
    damaged = []
    for name, content in (("not_json", "{not json at all"), ("truncated", text[: len(text) // 3])):
        (root / name).mkdir()
        (root / name / "tokenizer.json").write_text(content, encoding="utf-8")
        damaged.append(root / name)
    return damaged


def test_a_damaged_tokenizer_json_is_one_line_in_trainer_dry_run_and_preprocessing(corpus, tmp_path, capsys):
    from megatron_fixedcode.cli.preprocess_data import main as preprocess

    train, _ = corpus
    (tmp_path / "in.jsonl").write_text('{"text": "hello world"}\n')
    for tok in _damaged_tokenizers(tmp_path):
        for extra in (["--dry-run"], []):
            line = _pretrain_main(["--data-path", train, "--tokenizer-model", str(tok), *extra], capsys)
            assert f"{tok / 'tokenizer.json'} is not a valid tokenizer.json" in line, line
        rc = preprocess(
            [
                "--input",
                str(tmp_path / "in.jsonl"),
                "--output-prefix",
                str(tmp_path / f"out_{tok.name}"),
                "--tokenizer-type",
                "HuggingFaceTokenizer",
                "--tokenizer-model",
                str(tok),
            ]
        )
        err = [line for line in capsys.readouterr().err.splitlines() if "error" in line.lower()]
        assert rc == 2 and len(err) == 1 and "is not a valid tokenizer.json" in err[0], err
        assert not list(tmp_path.glob(f"out_{tok.name}*.idx"))


def test_a_damaged_sentencepiece_model_names_the_file(tmp_path):
    from megatron_fixedcode.tokenizers import build_tokenizer

    bad = tmp_path / "tok.model"
    bad.write_bytes(b"garbage" * 10)
    with pytest.raises(ValueError, match=f"{bad} is not a valid SentencePiece model"):
        build_tokenizer("SentencePieceTokenizer", str(bad))


# --- recipes: a self-referencing alias recursed forever; an alias bomb took >600 MB and never ended


def test_a_recipe_with_a_self_referencing_alias_is_refused(tmp_path, capsys):
    recipe = tmp_path / "self.yaml"
    recipe.write_text("num_layers: 2\ndata_path: &loop [*loop]\n")
    line = _pretrain_main(["--config", str(recipe), "--dry-run"], capsys)
    assert f"--config {recipe}: an alias refers to the node that contains it (line 2)" in line, line


def _alias_bomb(levels: int = 9) -> str:
    parts = ['&a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    parts += [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels)]
    return "data_path: [" + ", ".join(parts) + "]\n"  # 10^9 strings once expanded


def test_a_recipe_alias_bomb_is_refused_without_expanding_it(tmp_path, capsys):
    from megatron_fixedcode.utils.yaml_files import load_yaml

    recipe = tmp_path / "bomb.yaml"
    recipe.write_text(_alias_bomb())
    tracemalloc.start()
    with pytest.raises(ValueError, match="refusing an alias bomb"):
        load_yaml(recipe)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 20 * 2**20, f"{peak / 2**20:.1f} MiB to refuse it"
    line = _pretrain_main(["--config", str(recipe), "--dry-run"], capsys)
    assert f"--config {recipe}: expands to more than" in line, line


def test_recipes_with_shared_values_still_load(tmp_path):
    """An alias used as intended (a value reused) is fine."""
    from megatron_fixedcode.utils.yaml_files import load_yaml

    recipe = tmp_path / "ok.yaml"
    recipe.write_text("lr: &peak 1.5e-4\nmin_lr: 1.0e-5\nextra: *peak\n")
    assert load_yaml(recipe) == {"lr": 1.5e-4, "min_lr": 1.0e-5, "extra": 1.5e-4}


# --- a shard with no documents: an mmap traceback (document windows) or advice to give a flag already given


@pytest.mark.parametrize("dataset_type", ["gpt", "document_windows"])
@pytest.mark.parametrize("empty_split", ["train", "valid"])
def test_a_zero_document_shard_is_named_without_advising_a_flag_already_given(
    dataset_type, empty_split, corpus, tmp_path, capsys
):
    train, valid = corpus
    empty = write_indexed_dataset(tmp_path / "empty", [], dtype=np.uint16)
    paths = {"train": train, "valid": valid, empty_split: empty}
    for extra in (["--dry-run"], []):
        line = _pretrain_main(
            [
                "--train-data-path",
                paths["train"],
                "--valid-data-path",
                paths["valid"],
                "--dataset-type",
                dataset_type,
                *extra,
            ],
            capsys,
        )
        flag = "--train-data-path" if empty_split == "train" else "--valid-data-path"
        assert f"{empty}: the shard holds no tokens" in line and f"leave it out of {flag}" in line, line
        assert "give --valid-data-path" not in line and "--split" not in line, line
